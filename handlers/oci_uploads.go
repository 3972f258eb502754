package handlers

import (
	"net/http"
	"strconv"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/upload"
)

// The upload endpoints of the blob API: each parses its request, calls
// upload.Flow, and writes its answer (answer) or refusal (fail).

// startUpload is POST /v2/<name>/blobs/uploads/[?digest=|?mount=&from=].
func (h *ociHandler) startUpload(w http.ResponseWriter, r *http.Request, name string) {
	ctx := r.Context()
	p, _ := PrincipalOf(ctx)
	q := r.URL.Query()
	if m := q.Get("mount"); m != "" {
		// A mount needs the right to read from, and falls back to a plain
		// session otherwise: the same answer whether or not the digest
		// exists elsewhere (S8). An obliterated digest is refused here
		// rather than by the close of that session (issue 29).
		from := q.Get("from")
		if d, err := blobplane.ParseDigest(m); err == nil && auth.ValidRepository(from) && CheckPermission(ctx, from, auth.Read) == nil {
			res, ok, err := h.flow.Mount(ctx, name, p.Name, d, from)
			if err != nil {
				h.refused(w, r, err)
				return
			}
			if ok {
				h.answer(w, res, http.StatusAccepted)
				return
			}
		}
	}
	req := upload.OpenRequest{Repository: name, Principal: p.Name, Body: r.Body, Length: r.ContentLength}
	if v := q.Get("digest"); v != "" {
		var err error
		if req.Digest, err = blobplane.ParseDigest(v); err != nil {
			h.fail(w, r, err, ociDigestInvalid)
			return
		}
	}
	res, err := h.flow.Open(ctx, req)
	if err != nil {
		h.refused(w, r, err)
		return
	}
	h.answer(w, res, http.StatusAccepted)
}

// patchUpload is PATCH /v2/<name>/blobs/uploads/<id>: one chunk, in order.
func (h *ociHandler) patchUpload(w http.ResponseWriter, r *http.Request, name, id string) {
	res, err := h.flow.Append(r.Context(), upload.AppendRequest{Repository: name, OperationID: id,
		Body: r.Body, Length: r.ContentLength, ContentRange: r.Header.Get("Content-Range")})
	if err != nil {
		h.refused(w, r, err)
		return
	}
	h.answer(w, res, http.StatusAccepted)
}

// putUpload is PUT /v2/<name>/blobs/uploads/<id>?digest=: an optional last
// chunk, then close.
func (h *ociHandler) putUpload(w http.ResponseWriter, r *http.Request, name, id string) {
	d, err := blobplane.ParseDigest(r.URL.Query().Get("digest"))
	if err != nil {
		h.fail(w, r, err, ociDigestInvalid)
		return
	}
	res, err := h.flow.Close(r.Context(), upload.CloseRequest{Repository: name, OperationID: id, Digest: d,
		Body: r.Body, Length: r.ContentLength, ContentRange: r.Header.Get("Content-Range")})
	if err != nil {
		h.refused(w, r, err)
		return
	}
	h.answer(w, res, http.StatusAccepted)
}

// uploadStatus is GET /v2/<name>/blobs/uploads/<id>: where to resume.
func (h *ociHandler) uploadStatus(w http.ResponseWriter, r *http.Request, name, id string) {
	res, err := h.flow.Status(r.Context(), name, id)
	if err != nil {
		h.refused(w, r, err)
		return
	}
	h.answer(w, res, http.StatusNoContent)
}

// cancelUpload is DELETE /v2/<name>/blobs/uploads/<id>.
func (h *ociHandler) cancelUpload(w http.ResponseWriter, r *http.Request, name, id string) {
	if err := h.flow.Cancel(r.Context(), name, id); err != nil {
		h.refused(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// CommitTierHeader reports on each write the blob API acknowledges the
// commit tier it achieved (ZBP-5 R69): DURABLE, in Postgres.
const CommitTierHeader = "Blobplane-Commit-Tier"

// answer writes res: 201 with the blob's location when it was
// published; 202 with the operation when it was kept for the home; an
// open session's headers with inProgress (202 after a chunk, 204 for a
// status).
func (h *ociHandler) answer(w http.ResponseWriter, res upload.Result, inProgress int) {
	hd := w.Header()
	hd.Set("Content-Length", "0")
	switch res.Answer {
	case upload.AnswerPublished, upload.AnswerKept:
		// ZBP-5 R69: the tier the write achieved (a publication, or the
		// intent kept for its home: committed in Postgres either way).
		hd.Set(CommitTierHeader, string(partstate.QuotaClass.CommitTier))
	}
	switch res.Answer {
	case upload.AnswerPublished:
		hd.Set("Location", "/v2/"+res.Repository+"/blobs/"+string(res.Digest))
		hd.Set("Docker-Content-Digest", string(res.Digest))
		if res.Position != "" {
			hd.Set(partstate.PositionHeader, res.Position) // ZBP-5-R107
		}
		w.WriteHeader(http.StatusCreated)
	case upload.AnswerKept:
		hd.Set("Location", "/v1/operations/"+res.OperationID)
		hd.Set("Docker-Upload-UUID", res.OperationID)
		hd.Set("Docker-Content-Digest", string(res.Digest))
		w.WriteHeader(http.StatusAccepted)
	default:
		setSessionHeaders(hd, res.Repository, res.OperationID, res.Received)
		w.WriteHeader(inProgress)
	}
}

// setSessionHeaders are the headers naming an open upload session and
// the bytes it holds.
func setSessionHeaders(hd http.Header, repo, op string, received int64) {
	hd.Set("Location", "/v2/"+repo+"/blobs/uploads/"+op)
	hd.Set("Docker-Upload-UUID", op)
	hd.Set("Range", uploadRange(received))
}

// uploadRange is the Range header of a session holding size bytes
// ("0-0" for none, as distribution answers).
func uploadRange(size int64) string {
	if size == 0 {
		return "0-0"
	}
	return "0-" + strconv.FormatInt(size-1, 10)
}
