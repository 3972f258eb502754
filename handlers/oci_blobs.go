package handlers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/read"
	"github.com/blobplane/blobplane/upload"
)

// getBlob is HEAD and GET /v2/<name>/blobs/<digest>. Existence comes from
// Postgres (through the existence cache); HEAD makes no backend request.
// GET's bytes come from the nearest verified copy (read.Reader): this
// datacenter's, else another's through one of its nodes; a whole read is
// verified as it streams (issue 29).
func (h *ociHandler) getBlob(w http.ResponseWriter, r *http.Request, name string, d blobplane.Digest) {
	ctx := r.Context()
	size, err := h.Store.ReferencedBlob(ctx, name, d)
	if err != nil {
		h.fail(w, r, err, ociBlobUnknown)
		return
	}
	w.Header().Set("Docker-Content-Digest", string(d))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Accept-Ranges", "bytes")
	// The content never changes under its digest: the digest is a
	// strong validator (RFC 9110 §8.8.3).
	w.Header().Set("ETag", `"`+string(d)+`"`)
	if notModified(r, d) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		return
	}
	var rng *backend.Range
	if hv := r.Header.Get("Range"); hv != "" {
		rr, err := ParseByteRange(hv, size)
		if err != nil {
			w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			h.fail(w, r, err, ociBlobUnknown)
			return
		}
		rng = &rr
	}
	b, err := h.Reads.Open(ctx, d, size, rng)
	if err != nil {
		h.fail(w, r, err, ociBlobUnknown)
		return
	}
	h.send(w, r, d, b, rng, size)
}

// notModified reports whether r's If-None-Match names d (or is "*"): the
// client holds the content already.
func notModified(r *http.Request, d blobplane.Digest) bool {
	for _, tag := range strings.Split(r.Header.Get("If-None-Match"), ",") {
		tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/")
		if tag == "*" || tag == `"`+string(d)+`"` {
			return true
		}
	}
	return false
}

// send answers 200 with b's body, or 206 with rng of a size-byte blob,
// and closes the body.
func (h *ociHandler) send(w http.ResponseWriter, r *http.Request, d blobplane.Digest, b *read.Blob, rng *backend.Range, size int64) {
	w.Header().Set("Content-Length", strconv.FormatInt(b.Length, 10))
	status := http.StatusOK
	if rng != nil {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", rng.Offset, rng.Offset+rng.Length-1, size))
		status = http.StatusPartialContent
	}
	w.WriteHeader(status)
	h.stream(w, r, d, b.Body)
}

// stream copies body to w, then closes it: read(2)/write(2) through a
// pooled 256 KiB buffer. Hiding the writer's ReadFrom (struct{io.Writer})
// keeps net/http from handing an identity file to sendfile(2), which
// measured slower here, for 1 GiB and for 4 KiB (docs/performance.md).
// The body is closed before the buffer goes back to the pool: a verifying
// body may still be hashing the last chunk it handed over (read.Blob). A
// body that fails mid-stream (corrupt, lost, or its source gone) aborts
// the response: the client sees the connection cut short of
// Content-Length, never a complete body (S2; read.ErrCorrupt).
func (h *ociHandler) stream(w http.ResponseWriter, r *http.Request, d blobplane.Digest, body io.ReadCloser) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	defer body.Close()
	_, err := io.CopyBuffer(struct{ io.Writer }{w}, body, *bp)
	if err == nil {
		return
	}
	if !errors.Is(err, context.Canceled) {
		h.logger.WarnContext(r.Context(), "blob body failed mid-stream; the response is aborted", "digest", d, "err", err)
	}
	panic(http.ErrAbortHandler)
}

// copyBufs are getBlob's body buffers: large enough that a 1 GiB read is
// 4096 read/write pairs, reused so a 4 KiB read allocates none.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// deleteBlob is DELETE /v2/<name>/blobs/<digest>: the reference only, at
// the repository's home under its lease epoch (ZBP-5 R19; forwarded there
// from any other node).
func (h *ociHandler) deleteBlob(w http.ResponseWriter, r *http.Request, name string, d blobplane.Digest) {
	pos, err := h.flow.DeleteReference(r.Context(), name, d)
	if err != nil {
		h.fail(w, r, err, ociBlobUnknown)
		return
	}
	if pos != "" {
		w.Header().Set(partstate.PositionHeader, pos) // ZBP-5-R107
	}
	w.Header().Set("Content-Length", "0")
	w.Header().Set(CommitTierHeader, string(partstate.QuotaClass.CommitTier))
	w.WriteHeader(http.StatusAccepted)
}

// operation is GET /v1/operations/<id>: the outcome of a publication, or
// the pending intent.
func (h *ociHandler) operation(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	in, err := h.Store.GetIntent(r.Context(), id)
	if err == nil {
		err = CheckPermission(r.Context(), in.Repository, auth.Read)
	}
	if err != nil {
		switch blobplane.ErrorCode(err) {
		case blobplane.CodeNotFound, blobplane.CodeForbidden, blobplane.CodeInvalid:
			// Absent, malformed and not yours: one answer, which neither
			// echoes the id nor confirms it exists (issue 26 point 3).
			err = blobplane.Errorf(blobplane.CodeNotFound, "unknown operation")
		}
		WriteAuthError(w, r, h.logger, err)
		return
	}
	if in.State == upload.IntentAdmitted {
		o, err := h.Store.Outcome(r.Context(), in.OperationID)
		if err != nil {
			WriteError(w, r, h.logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]any{"state": in.State, "outcome": o})
		return
	}
	answer := map[string]any{"state": in.State, "repository": in.Repository, "digest": in.ExpectedDigest}
	if !in.AcceptedAt.IsZero() {
		// Answered 202: kept, awaiting publication by the home (issue 27).
		answer["accepted_at"] = in.AcceptedAt
	}
	WriteJSON(w, http.StatusOK, answer)
}

// digitsOnly reports whether s holds nothing but ASCII digits ("" too).
func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ParseByteRange parses a single-range "Range: bytes=a-b" (or "a-" or
// "-n") against a blob of size bytes.
func ParseByteRange(s string, size int64) (backend.Range, error) {
	bad := blobplane.Errorf(blobplane.CodeRangeInvalid, "Range %q is not a satisfiable single byte range of a %d-byte blob", upload.TruncateID(s), size)
	spec, ok := strings.CutPrefix(s, "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return backend.Range{}, bad
	}
	a, b, ok := strings.Cut(spec, "-")
	if !ok || !digitsOnly(a) || !digitsOnly(b) {
		// RFC 9110 §14.1.2: digits only (strconv.ParseInt would take a
		// sign; found by FuzzParseByteRange).
		return backend.Range{}, bad
	}
	var start, end int64
	var err error
	switch {
	case a == "" && b != "": // suffix
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return backend.Range{}, bad
		}
		start, end = max(size-n, 0), size-1
	case a != "":
		if start, err = strconv.ParseInt(a, 10, 64); err != nil || start < 0 {
			return backend.Range{}, bad
		}
		end = size - 1
		if b != "" {
			if end, err = strconv.ParseInt(b, 10, 64); err != nil || end < start {
				return backend.Range{}, bad
			}
			end = min(end, size-1)
		}
	default:
		return backend.Range{}, bad
	}
	if start >= size || end < start {
		return backend.Range{}, bad
	}
	return backend.Range{Offset: start, Length: end - start + 1}, nil
}
