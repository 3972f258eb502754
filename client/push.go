package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/atomicfile"
)

// Progress is a transfer's progress: Phase is "hash" (reading the file
// to learn its digest), "verify" (re-reading a partial download),
// "upload" or "download"; Done of Total bytes (Total -1 when unknown).
type Progress struct {
	Phase string
	Done  int64
	Total int64
}

// Sessions remembers open upload sessions so an interrupted push
// continues where it stopped, in this process or the next.
type Sessions interface {
	// Load is the session saved under key, if any.
	Load(key string) (location string, ok bool)
	// Save remembers location under key.
	Save(key, location string) error
	// Delete forgets key.
	Delete(key string)
}

// DirSessions keeps sessions as small files in a directory (0700, each
// file 0600: a session's location is usable by its token's holder only,
// but says what is being uploaded where).
type DirSessions string

func (d DirSessions) path(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(string(d), hex.EncodeToString(sum[:16]))
}

// Load implements Sessions.
func (d DirSessions) Load(key string) (string, bool) {
	b, err := os.ReadFile(d.path(key))
	if err != nil {
		return "", false
	}
	k, loc, ok := strings.Cut(string(b), "\n")
	return strings.TrimSpace(loc), ok && k == key
}

// Save implements Sessions.
func (d DirSessions) Save(key, location string) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return err
	}
	p := d.path(key)
	_ = os.Remove(p) // atomicfile never replaces: a stale session goes first
	return atomicfile.Create(p, []byte(key+"\n"+location+"\n"))
}

// Delete implements Sessions.
func (d DirSessions) Delete(key string) { _ = os.Remove(d.path(key)) }

// PushOptions tunes Push.
type PushOptions struct {
	// ChunkSize is the most bytes one PATCH carries; default 16 MiB. A
	// blob no larger goes in one request (POST ?digest=), which is not
	// resumable.
	ChunkSize int64
	// Sessions, when set, remembers the open session, so that a push
	// interrupted by anything (a dead connection, Ctrl-C, a crash)
	// continues where it stopped when run again.
	Sessions Sessions
	// Progress, when set, is called as bytes are hashed and sent.
	Progress func(Progress)
	// NoWait returns at a 202 (kept for its home) instead of polling the
	// operation until it is published.
	NoWait bool
	// Attempts bounds consecutive failed chunks before Push gives up
	// (the session stays saved); default 5.
	Attempts int
}

// PushResult says what a push did.
type PushResult struct {
	Repository string           `json:"repository"`
	Digest     blobplane.Digest `json:"digest"`
	Size       int64            `json:"size"`
	// Status is "exists" (the repository already referenced the blob:
	// no byte sent), "published" (201, or a 202 whose operation was
	// then published) or "accepted" (202 with NoWait: kept, the
	// operation publishes it).
	Status string `json:"status"`
	// Resumed is how many bytes an earlier, interrupted push had sent
	// that this one did not send again.
	Resumed int64 `json:"resumed_bytes"`
	// Sent is the bytes this push sent.
	Sent int64 `json:"sent_bytes"`
	// Position is the partition position the publication was applied at
	// (the 201's X-Partition-Position, ZBP-5 R107): present it as
	// X-Min-Position on a read that must see this push.
	Position string `json:"position,omitempty"`
	// Operation is the 202's operation location, when there was one.
	Operation string   `json:"operation,omitempty"`
	Outcome   *Outcome `json:"outcome,omitempty"`
}

// Push uploads the file at path into repo. It hashes the file first, so
// that a blob the repository already holds costs one HEAD, and so that a
// resumed session is found by content: a file changed since the
// interrupted push has another digest, and starts afresh.
func (a *API) Push(ctx context.Context, repo, path string, o PushOptions) (PushResult, error) {
	if o.ChunkSize <= 0 {
		o.ChunkSize = 16 << 20
	}
	if o.Attempts <= 0 {
		o.Attempts = 5
	}
	if o.Progress == nil {
		o.Progress = func(Progress) {}
	}
	f, err := os.Open(path)
	if err != nil {
		return PushResult{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return PushResult{}, err
	}
	if !fi.Mode().IsRegular() {
		return PushResult{}, blobplane.Errorf(blobplane.CodeInvalid, "%s is not a regular file", path)
	}
	size := fi.Size()
	d, err := hashFile(ctx, f, size, o.Progress)
	if err != nil {
		return PushResult{}, err
	}
	res := PushResult{Repository: repo, Digest: d, Size: size}
	switch _, err := a.Stat(ctx, repo, d); {
	case err == nil:
		res.Status = "exists"
		return res, nil
	case StatusOf(err) != http.StatusNotFound:
		return res, err
	}
	p := pusher{api: a, repo: repo, file: f, size: size, digest: d, o: o, key: a.Base + "\x00" + repo + "\x00" + string(d)}
	return p.push(ctx, res)
}

// hashFile is the sha256 digest of f's size bytes.
func hashFile(ctx context.Context, f *os.File, size int64, progress func(Progress)) (blobplane.Digest, error) {
	h := sha256.New()
	pr := &progressReader{r: io.NewSectionReader(f, 0, size), ctx: ctx, report: func(n int64) { progress(Progress{"hash", n, size}) }}
	if _, err := io.Copy(h, pr); err != nil {
		return "", err
	}
	return blobplane.Digest("sha256:" + hex.EncodeToString(h.Sum(nil))), nil
}

// pusher is one push's state.
type pusher struct {
	api    *API
	repo   string
	file   *os.File
	size   int64
	digest blobplane.Digest
	o      PushOptions
	key    string // the session's key in o.Sessions
}

func (p *pusher) push(ctx context.Context, res PushResult) (PushResult, error) {
	loc, offset := p.resume(ctx)
	res.Resumed = offset
	if loc == "" && p.size <= p.o.ChunkSize {
		// One request: POST ?digest= with the whole body.
		resp, err := p.api.send(ctx, request{method: http.MethodPost,
			ref:    "/v2/" + p.repo + "/blobs/uploads/?digest=" + url.QueryEscape(string(p.digest)),
			body:   p.section(ctx, 0, p.size, &res.Sent),
			header: octetStream})
		if err != nil {
			return res, err
		}
		return p.closed(ctx, resp, res)
	}
	if loc == "" {
		var err error
		if loc, err = p.open(ctx); err != nil {
			return res, err
		}
	}
	for failures := 0; offset < p.size; {
		end := min(offset+p.o.ChunkSize, p.size)
		next, err := p.patch(ctx, loc, offset, end, &res.Sent)
		if err == nil {
			offset, failures = next, 0
			continue
		}
		if ctx.Err() != nil {
			return res, fmt.Errorf("push interrupted at %d of %d bytes (run it again to continue): %w", offset, p.size, ctx.Err())
		}
		if failures++; failures >= p.o.Attempts || !resumable(err) {
			return res, fmt.Errorf("push stopped at %d of %d bytes (run it again to continue): %w", offset, p.size, err)
		}
		// The chunk failed: ask the server what it holds, and go on
		// from there after a pause that grows with each failure.
		if err := sleep(ctx, time.Duration(failures)*200*time.Millisecond); err != nil {
			return res, err
		}
		if at, err := p.status(ctx, loc); err == nil {
			offset = at
		}
	}
	resp, err := p.api.send(ctx, request{method: http.MethodPut,
		ref:  withQuery(loc, "digest", string(p.digest)),
		body: func() (io.Reader, int64) { return http.NoBody, 0 }})
	if err != nil {
		return res, err
	}
	return p.closed(ctx, resp, res)
}

var octetStream = http.Header{"Content-Type": {"application/octet-stream"}}

// resume finds the session an earlier push of the same content saved,
// and how many bytes the server holds of it; ("", 0) when there is none
// or it has gone (expired, cancelled, answered).
func (p *pusher) resume(ctx context.Context) (string, int64) {
	if p.o.Sessions == nil {
		return "", 0
	}
	loc, ok := p.o.Sessions.Load(p.key)
	if !ok {
		return "", 0
	}
	at, err := p.status(ctx, loc)
	if err != nil || at > p.size {
		p.o.Sessions.Delete(p.key)
		return "", 0
	}
	return loc, at
}

// open starts a session and remembers it.
func (p *pusher) open(ctx context.Context) (string, error) {
	resp, err := p.api.call(ctx, request{method: http.MethodPost, ref: "/v2/" + p.repo + "/blobs/uploads/",
		body: func() (io.Reader, int64) { return http.NoBody, 0 }}, nil, http.StatusAccepted)
	if err != nil {
		return "", err
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return "", errors.New("the server opened an upload session without a Location")
	}
	if p.o.Sessions != nil {
		if err := p.o.Sessions.Save(p.key, loc); err != nil {
			return "", fmt.Errorf("remembering the upload session: %w", err)
		}
	}
	return loc, nil
}

// status is how many bytes the session at loc holds (GET: 204 with Range).
func (p *pusher) status(ctx context.Context, loc string) (int64, error) {
	resp, err := p.api.call(ctx, request{method: http.MethodGet, ref: loc}, nil, http.StatusNoContent)
	if err != nil {
		return 0, err
	}
	return rangeEnd(resp.Header.Get("Range"))
}

// patch sends [from, to) as one chunk and returns where the session's
// bytes now end. A 416 carries where they end: the answer, not an error.
func (p *pusher) patch(ctx context.Context, loc string, from, to int64, sent *int64) (int64, error) {
	hdr := http.Header{"Content-Type": {"application/octet-stream"},
		"Content-Range": {strconv.FormatInt(from, 10) + "-" + strconv.FormatInt(to-1, 10)}}
	resp, err := p.api.send(ctx, request{method: http.MethodPatch, ref: loc, body: p.section(ctx, from, to, sent), header: hdr})
	if err != nil {
		return 0, err
	}
	if resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		// A 416 that names the offset it refused cannot be resumed from
		// ("0-0" names both 0 and 1 staged bytes): an error, not a loop.
		if at, err := rangeEnd(resp.Header.Get("Range")); err == nil && (resp.StatusCode == http.StatusAccepted || at != from) {
			resp.Body.Close()
			return at, nil
		}
	}
	return 0, errorOf(resp)
}

// section is a request body of the file's [from, to), counted into sent
// and reported as upload progress.
func (p *pusher) section(ctx context.Context, from, to int64, sent *int64) func() (io.Reader, int64) {
	return func() (io.Reader, int64) {
		base := *sent
		return &progressReader{r: io.NewSectionReader(p.file, from, to-from), ctx: ctx, report: func(n int64) {
			*sent = base + n
			p.o.Progress(Progress{"upload", from + n, p.size})
		}}, to - from
	}
}

// closed reads the closing answer: 201 published; 202 kept, followed
// to its operation unless NoWait.
func (p *pusher) closed(ctx context.Context, resp *http.Response, res PushResult) (PushResult, error) {
	switch resp.StatusCode {
	case http.StatusCreated:
		resp.Body.Close()
		p.forget()
		res.Status = "published"
		res.Position = resp.Header.Get("X-Partition-Position")
		return res, nil
	case http.StatusAccepted:
		resp.Body.Close()
		p.forget()
		res.Operation = resp.Header.Get("Location")
		res.Status = "accepted"
		if p.o.NoWait || res.Operation == "" {
			return res, nil
		}
		op, err := p.api.WaitOperation(ctx, res.Operation, 0)
		if err != nil {
			return res, fmt.Errorf("the upload was accepted (%s) but waiting for its publication failed: %w", res.Operation, err)
		}
		res.Status, res.Outcome = "published", op.Outcome
		return res, nil
	}
	err := errorOf(resp)
	if StatusOf(err) == http.StatusNotFound || StatusOf(err) == http.StatusBadRequest {
		p.forget() // the session is gone or refused its close: start afresh next time
	}
	return res, err
}

func (p *pusher) forget() {
	if p.o.Sessions != nil {
		p.o.Sessions.Delete(p.key)
	}
}

// resumable reports whether a failed chunk is worth another try: the
// connection failed, or the server was unavailable; not a refusal.
func resumable(err error) bool {
	s := StatusOf(err)
	return s == 0 || s == http.StatusTooManyRequests || s >= 500
}

// rangeEnd reads a session's Range header ("0-N" holds N+1 bytes; "0-0"
// as distribution answers for an empty session, which holds 0).
func rangeEnd(v string) (int64, error) {
	v = strings.TrimPrefix(v, "bytes=")
	a, b, ok := strings.Cut(v, "-")
	if !ok || a != "0" {
		return 0, fmt.Errorf("the server's Range %q is not 0-N", v)
	}
	n, err := strconv.ParseInt(b, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("the server's Range %q is not 0-N", v)
	}
	if n == 0 {
		return 0, nil
	}
	return n + 1, nil
}

// withQuery adds k=v to the query of ref.
func withQuery(ref, k, v string) string {
	sep := "?"
	if strings.Contains(ref, "?") {
		sep = "&"
	}
	return ref + sep + url.QueryEscape(k) + "=" + url.QueryEscape(v)
}

// progressReader reports the bytes read through it, at most every 50 ms
// and at the end, and stops when ctx ends or once detached.
type progressReader struct {
	r      io.Reader
	ctx    context.Context
	report func(n int64)

	mu       sync.Mutex // the transport may read a request body from its own goroutine
	n        int64
	last     time.Time
	detached bool
}

// errDetached ends a request body read after its attempt was answered.
var errDetached = errors.New("request body read after its answer")

func (pr *progressReader) Read(b []byte) (int, error) {
	if err := pr.ctx.Err(); err != nil {
		return 0, err
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.detached {
		return 0, errDetached
	}
	n, err := pr.r.Read(b)
	pr.n += int64(n)
	if now := time.Now(); err != nil || now.Sub(pr.last) >= 50*time.Millisecond {
		pr.last = now
		pr.report(pr.n)
	}
	return n, err
}

// detach implements detacher: nothing is read or reported after it.
func (pr *progressReader) detach() {
	pr.mu.Lock()
	pr.detached = true
	pr.mu.Unlock()
}
