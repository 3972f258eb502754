package handlers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	iofs "io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// countingBackend counts every call into the byte store.
type countingBackend struct {
	backend.Backend
	calls atomic.Int64
}

func (c *countingBackend) Write(ctx context.Context, req backend.WriteRequest) (backend.Info, error) {
	c.calls.Add(1)
	return c.Backend.Write(ctx, req)
}
func (c *countingBackend) Read(ctx context.Context, d blobplane.Digest, o backend.ReadOptions) (*backend.Object, error) {
	c.calls.Add(1)
	return c.Backend.Read(ctx, d, o)
}
func (c *countingBackend) Stat(ctx context.Context, d blobplane.Digest) (backend.Info, error) {
	c.calls.Add(1)
	return c.Backend.Stat(ctx, d)
}
func (c *countingBackend) Delete(ctx context.Context, d blobplane.Digest) error {
	c.calls.Add(1)
	return c.Backend.Delete(ctx, d)
}
func (c *countingBackend) List(ctx context.Context, o backend.ListOptions) (backend.Page, error) {
	c.calls.Add(1)
	return c.Backend.List(ctx, o)
}
func (c *countingBackend) CreateUpload(ctx context.Context) (string, error) {
	c.calls.Add(1)
	return c.Backend.CreateUpload(ctx)
}
func (c *countingBackend) AppendUpload(ctx context.Context, id string, off int64, r io.Reader) (int64, error) {
	c.calls.Add(1)
	return c.Backend.AppendUpload(ctx, id, off, r)
}
func (c *countingBackend) UploadSize(ctx context.Context, id string) (int64, error) {
	c.calls.Add(1)
	return c.Backend.UploadSize(ctx, id)
}
func (c *countingBackend) PromoteUpload(ctx context.Context, id string, req backend.WriteRequest) (backend.Info, error) {
	c.calls.Add(1)
	return c.Backend.PromoteUpload(ctx, id, req)
}
func (c *countingBackend) AbortUpload(ctx context.Context, id string) error {
	c.calls.Add(1)
	return c.Backend.AbortUpload(ctx, id)
}

// staticHome is this node's lease, acquired for real in the lease table;
// home false plays a node that is not the repository's home.
type staticHome struct {
	mu    sync.Mutex
	lease upload.Home
	home  atomic.Bool
}

func (h *staticHome) Home(string) (upload.Home, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease, h.home.Load()
}

func (h *staticHome) setEpoch(epoch uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lease.Epoch = epoch
}

type ociEnv struct {
	st   *store.Store
	srv  *httptest.Server
	be   *countingBackend
	fs   *fs.Backend
	home *staticHome
	// writer may push and pull team/*; reader may only pull.
	writer, reader string
}

func ociSetup(t *testing.T, maxBlob int64) *ociEnv {
	t.Helper()
	st, raw, home := homeFixture(t, "team/app", "team/other")
	be := &countingBackend{Backend: raw}
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, OCI: &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1", Home: home, MaxBlobSize: maxBlob}}}))
	t.Cleanup(srv.Close)
	return &ociEnv{
		st: st, srv: srv, be: be, fs: raw, home: home,
		writer: token(t, st, "alice", "team/*:write"),
		reader: token(t, st, "bob", "team/*:read"),
	}
}

func ociDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// do sends a request with a header map.
func (e *ociEnv) do(t *testing.T, method, path, body, cred string, hdr map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.SetBasicAuth("oras", cred)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func ociCode(t *testing.T, a answer) string {
	t.Helper()
	var body handlers.OCIErrorBody
	if err := json.Unmarshal([]byte(a.body), &body); err != nil || len(body.Errors) != 1 {
		t.Fatalf("not an OCI error body (%d): %q", a.status, a.body)
	}
	return body.Errors[0].Code
}

func TestOCIBase(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	if a := e.do(t, "GET", "/v2/", "", "", nil); a.status != 401 || len(a.header.Values("WWW-Authenticate")) == 0 || ociCode(t, a) != "UNAUTHORIZED" {
		t.Fatalf("anonymous /v2/: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/", "", e.reader, nil); a.status != 200 || a.header.Get("Docker-Distribution-API-Version") != "registry/2.0" {
		t.Fatalf("/v2/: %+v", a)
	}
	if a := e.do(t, "POST", "/v2/Team/App/blobs/uploads/", "", e.writer, nil); a.status != 400 || ociCode(t, a) != "NAME_INVALID" {
		t.Fatalf("bad name: %+v", a)
	}
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.reader, nil); a.status != 403 || ociCode(t, a) != "DENIED" {
		t.Fatalf("push without write: %+v", a)
	}
	// Issue 31: a push creates its repository when the principal's grant
	// covers the name (alice: team/*:write), recorded with who; a reader
	// of the same names, a writer elsewhere and a stranger create nothing.
	other := token(t, e.st, "carol", "other/*:write")
	if a := e.do(t, "POST", "/v2/team/fresh/blobs/uploads/", "", e.reader, nil); a.status != 403 || ociCode(t, a) != "DENIED" {
		t.Fatalf("a reader's push into a new repository: %+v", a)
	}
	if a := e.do(t, "POST", "/v2/team/fresh/blobs/uploads/", "", other, nil); a.status != 403 || ociCode(t, a) != "DENIED" {
		t.Fatalf("another tenant's push into a new repository: %+v", a)
	}
	if a := e.do(t, "POST", "/v2/team/fresh/blobs/uploads/", "", "", nil); a.status != 401 {
		t.Fatalf("an anonymous push into a new repository: %+v", a)
	}
	assertRepo := func(name, by string) {
		t.Helper()
		repos, err := e.st.ListRepositories(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range repos {
			if r.Name == name {
				if r.CreatedBy != by {
					t.Fatalf("%s created by %q, want %q", name, r.CreatedBy, by)
				}
				return
			}
		}
		if by != "" {
			t.Fatalf("%s does not exist", name)
		}
	}
	assertRepo("team/fresh", "")
	if a := e.do(t, "POST", "/v2/team/fresh/blobs/uploads/", "", e.writer, nil); a.status != 202 || a.header.Get("Location") == "" {
		t.Fatalf("first push into a repository alice may write: %+v", a)
	}
	assertRepo("team/fresh", "alice")
}

// Monolithic POST ?digest=, then HEAD, GET, ranged GET and DELETE.
func TestOCIMonolithicUploadAndRead(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	content := "hello, blobplane"
	d := ociDigest(content)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, content, e.writer, nil)
	if a.status != 201 || a.header.Get("Location") != "/v2/team/app/blobs/"+d || a.header.Get("Docker-Content-Digest") != d {
		t.Fatalf("monolithic: %+v", a)
	}
	if a := e.do(t, "HEAD", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.header.Get("Content-Length") != fmt.Sprint(len(content)) || a.header.Get("Docker-Content-Digest") != d {
		t.Fatalf("head: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("get: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, map[string]string{"Range": "bytes=7-"}); a.status != 206 || a.body != "blobplane" ||
		a.header.Get("Content-Range") != fmt.Sprintf("bytes 7-%d/%d", len(content)-1, len(content)) {
		t.Fatalf("ranged get: %+v", a)
	}
	// Another repository does not see it: references are per repository.
	if a := e.do(t, "GET", "/v2/team/other/blobs/"+d, "", e.reader, nil); a.status != 404 || ociCode(t, a) != "BLOB_UNKNOWN" {
		t.Fatalf("other repository: %+v", a)
	}
	if a := e.do(t, "DELETE", "/v2/team/app/blobs/"+d, "", e.writer, nil); a.status != 202 {
		t.Fatalf("delete: %+v", a)
	}
	if a := e.do(t, "HEAD", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 404 {
		t.Fatalf("head after delete: %+v", a)
	}
	// Only the reference went: the bytes stay for other references.
	if _, err := e.fs.Stat(context.Background(), blobplane.Digest(d)); err != nil {
		t.Fatalf("bytes after reference delete: %v", err)
	}
}

// Chunked upload: a bad Content-Range is 416 with the valid Range, and the
// client resumes from the status the session reports.
func TestOCIChunkedBadRangeThenResume(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc := a.header.Get("Location")
	if a.status != 202 || !strings.HasPrefix(loc, "/v2/team/app/blobs/uploads/") || a.header.Get("Docker-Upload-UUID") == "" || a.header.Get("Range") != "0-0" {
		t.Fatalf("start: %+v", a)
	}
	if a := e.do(t, "PATCH", loc, "01234", e.writer, map[string]string{"Content-Range": "0-4", "Content-Type": "application/octet-stream"}); a.status != 202 || a.header.Get("Range") != "0-4" {
		t.Fatalf("chunk 1: %+v", a)
	}
	a = e.do(t, "PATCH", loc, "zzzzz", e.writer, map[string]string{"Content-Range": "10-14"})
	if a.status != 416 || a.header.Get("Range") != "0-4" || ociCode(t, a) != "BLOB_UPLOAD_INVALID" {
		t.Fatalf("bad range: %+v", a)
	}
	if a := e.do(t, "GET", loc, "", e.writer, nil); a.status != 204 || a.header.Get("Range") != "0-4" || a.header.Get("Location") != loc {
		t.Fatalf("status: %+v", a)
	}
	if a := e.do(t, "PATCH", loc, "56789", e.writer, map[string]string{"Content-Range": "5-9"}); a.status != 202 || a.header.Get("Range") != "0-9" {
		t.Fatalf("chunk 2: %+v", a)
	}
	d := ociDigest("0123456789abc")
	// Issue 31: the closing PUT's last chunk out of order is 416 with
	// the Range to resume from, as a PATCH's; in order, it closes.
	if a := e.do(t, "PUT", loc+"?digest="+d, "abc", e.writer, map[string]string{"Content-Range": "11-13"}); a.status != 416 || a.header.Get("Range") != "0-9" || ociCode(t, a) != "BLOB_UPLOAD_INVALID" {
		t.Fatalf("out-of-order closing chunk: %+v", a)
	}
	if a := e.do(t, "PUT", loc+"?digest="+d, "abc", e.writer, map[string]string{"Content-Range": "10-12"}); a.status != 201 || a.header.Get("Docker-Content-Digest") != d {
		t.Fatalf("close: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.body != "0123456789abc" {
		t.Fatalf("read back: %+v", a)
	}
	// A closed session is gone.
	if a := e.do(t, "PATCH", loc, "x", e.writer, nil); a.status != 404 || ociCode(t, a) != "BLOB_UPLOAD_UNKNOWN" {
		t.Fatalf("patch after close: %+v", a)
	}
	// A fresh session's closing PUT must start at byte 0 (the
	// conformance suite's out-of-order case), and a malformed range is
	// refused the same way.
	a = e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	fresh := a.header.Get("Location")
	for _, cr := range []string{"5-7", "nonsense", "0-9"} { // 0-9 disagrees with the 3-byte body
		if a := e.do(t, "PUT", fresh+"?digest="+ociDigest("xyz"), "xyz", e.writer, map[string]string{"Content-Range": cr}); a.status != 416 || a.header.Get("Range") != "0-0" {
			t.Fatalf("fresh session closed at %q: %+v", cr, a)
		}
	}
	if a := e.do(t, "PUT", fresh+"?digest="+ociDigest("xyz"), "xyz", e.writer, map[string]string{"Content-Range": "0-2"}); a.status != 201 {
		t.Fatalf("fresh session closed in order: %+v", a)
	}
}

// S2: a digest mismatch leaves no verified placement and no staged bytes.
func TestOCIDigestMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc, id := a.header.Get("Location"), a.header.Get("Docker-Upload-UUID")
	e.do(t, "PATCH", loc, "actual bytes", e.writer, nil)
	in, err := e.st.GetIntent(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	claimed := ociDigest("claimed bytes")
	a = e.do(t, "PUT", loc+"?digest="+claimed, "", e.writer, nil)
	if a.status != 400 || ociCode(t, a) != "DIGEST_INVALID" {
		t.Fatalf("mismatch: %+v", a)
	}
	ps, err := e.st.Placements(ctx, blobplane.Digest(claimed))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.State == placement.Verified {
			t.Fatalf("verified placement after a mismatch: %+v", p)
		}
	}
	if _, err := e.fs.UploadSize(ctx, in.StagedLocation); err == nil {
		t.Fatal("staged bytes kept after a mismatch")
	}
	if got, _ := e.st.GetIntent(ctx, id); got.State != upload.IntentAbandoned {
		t.Fatalf("intent after mismatch: %s", got.State)
	}
	if a := e.do(t, "HEAD", "/v2/team/app/blobs/"+claimed, "", e.reader, nil); a.status != 404 {
		t.Fatalf("head of mismatched digest: %+v", a)
	}
}

// ADR-00018: existence is answered from Postgres; HEAD makes no backend call.
func TestOCIHeadMakesNoBackendCalls(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	d := ociDigest("head")
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, "head", e.writer, nil); a.status != 201 {
		t.Fatalf("upload: %+v", a)
	}
	before := e.be.calls.Load()
	for _, repo := range []string{"team/app", "team/other"} {
		e.do(t, "HEAD", "/v2/"+repo+"/blobs/"+d, "", e.reader, nil)
	}
	if n := e.be.calls.Load() - before; n != 0 {
		t.Fatalf("HEAD made %d backend calls", n)
	}
}

func TestOCIOversizeIs413(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 8)
	d := ociDigest("123456789")
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, "123456789", e.writer, nil); a.status != 413 || ociCode(t, a) != "SIZE_INVALID" {
		t.Fatalf("monolithic oversize: %+v", a)
	}
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc := a.header.Get("Location")
	if a := e.do(t, "PATCH", loc, "12345", e.writer, nil); a.status != 202 {
		t.Fatalf("chunk within the limit: %+v", a)
	}
	if a := e.do(t, "PATCH", loc, "6789", e.writer, nil); a.status != 413 || ociCode(t, a) != "SIZE_INVALID" {
		t.Fatalf("chunk past the limit: %+v", a)
	}
	if a := e.do(t, "GET", loc, "", e.writer, nil); a.status != 404 {
		t.Fatalf("session after oversize: %+v", a)
	}
}

// S8: a caller without read access gets the same answer whether or not the
// blob exists.
func TestOCIDeniedIsIndistinguishable(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	d := ociDigest("secret")
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, "secret", e.writer, nil); a.status != 201 {
		t.Fatalf("upload: %+v", a)
	}
	outsider := token(t, e.st, "eve", "elsewhere/*:write")
	known := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", outsider, nil)
	unknown := e.do(t, "GET", "/v2/team/app/blobs/"+ociDigest("nothing"), "", outsider, nil)
	if known.status != 403 || known.status != unknown.status || known.body != unknown.body {
		t.Fatalf("existing: %d %q; unknown: %d %q", known.status, known.body, unknown.status, unknown.body)
	}
}

// Cancel abandons on the row, then removes the staged bytes.
func TestOCICancelUpload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc, id := a.header.Get("Location"), a.header.Get("Docker-Upload-UUID")
	e.do(t, "PATCH", loc, "partial", e.writer, nil)
	in, _ := e.st.GetIntent(ctx, id)
	if a := e.do(t, "DELETE", loc, "", e.writer, nil); a.status != 204 {
		t.Fatalf("cancel: %+v", a)
	}
	if got, _ := e.st.GetIntent(ctx, id); got.State != upload.IntentAbandoned {
		t.Fatalf("intent: %s", got.State)
	}
	if _, err := e.fs.UploadSize(ctx, in.StagedLocation); err == nil {
		t.Fatal("staged bytes kept after cancel")
	}
	if a := e.do(t, "PUT", loc+"?digest="+ociDigest("partial"), "", e.writer, nil); a.status != 404 || ociCode(t, a) != "BLOB_UPLOAD_UNKNOWN" {
		t.Fatalf("close after cancel: %+v", a)
	}
}

// Not the home: the content is admitted and verified, the answer is 202
// with the operation to watch, and nothing is published here.
func TestOCINotHomeAnswers202(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	e.home.home.Store(false)
	d := ociDigest("elsewhere")
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, "elsewhere", e.writer, nil)
	loc := a.header.Get("Location")
	if a.status != 202 || !strings.HasPrefix(loc, "/v1/operations/") {
		t.Fatalf("not home: %+v", a)
	}
	if a := e.do(t, "HEAD", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 404 {
		t.Fatalf("published without the home: %+v", a)
	}
	a = e.do(t, "GET", loc, "", e.reader, nil)
	if a.status != 200 || !strings.Contains(a.body, `"state": "pending"`) {
		t.Fatalf("operation: %+v", a)
	}
	if a := e.do(t, "GET", loc, "", token(t, e.st, "eve", "elsewhere/*:read"), nil); a.status != 404 {
		t.Fatalf("operation for an outsider: %+v", a)
	}
	// The same operation published by the home shows its outcome.
	id := strings.TrimPrefix(loc, "/v1/operations/")
	good, _ := e.home.Home("team/app")
	if _, err := e.st.Finalize(context.Background(), upload.FinalizeRequest{OperationID: id, Digest: blobplane.Digest(d), Size: int64(len("elsewhere")),
		Partition: "p-0001", Node: "node-a", Epoch: good.Epoch}); err != nil {
		t.Fatal(err)
	}
	if a := e.do(t, "GET", loc, "", e.reader, nil); a.status != 200 || !strings.Contains(a.body, `"state": "admitted"`) || !strings.Contains(a.body, d) {
		t.Fatalf("operation after publication: %+v", a)
	}
}

// The same content uploaded concurrently into two repositories: two
// references, one stored copy.
func TestOCISameContentTwoRepositories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	content := "shared layer"
	d := ociDigest(content)
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i, repo := range []string{"team/app", "team/other"} {
		wg.Go(func() {
			answers[i] = e.do(t, "POST", "/v2/"+repo+"/blobs/uploads/?digest="+d, content, e.writer, nil)
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.status != 201 {
			t.Fatalf("upload %d: %+v", i, a)
		}
	}
	for _, repo := range []string{"team/app", "team/other"} {
		if a := e.do(t, "GET", "/v2/"+repo+"/blobs/"+d, "", e.reader, nil); a.body != content {
			t.Fatalf("%s: %+v", repo, a)
		}
	}
	page, err := e.fs.List(ctx, backend.ListOptions{})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("stored objects: %+v %v", page.Entries, err)
	}
}

func TestParseByteRange(t *testing.T) {
	t.Parallel()
	for s, want := range map[string][2]int64{"bytes=0-0": {0, 1}, "bytes=2-": {2, 8}, "bytes=-3": {7, 3}, "bytes=5-100": {5, 5}} {
		r, err := handlers.ParseByteRange(s, 10)
		if err != nil || r.Offset != want[0] || r.Length != want[1] {
			t.Errorf("%q: %+v %v", s, r, err)
		}
	}
	for _, s := range []string{"bytes=10-", "bytes=3-2", "bytes=0-1,3-4", "items=0-1", "bytes=-0", "bytes=-"} {
		if _, err := handlers.ParseByteRange(s, 10); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// Cross-repository mount publishes without bytes when the caller can read
// the source; without read access the answer is the same upload session a
// mount of an unknown digest gets (S8), and nothing is published.
func TestOCIMount(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	d := ociDigest("mounted")
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, "mounted", e.writer, nil); a.status != 201 {
		t.Fatalf("upload: %+v", a)
	}
	pushOnly := token(t, e.st, "mallory", "team/other:write")
	denied := e.do(t, "POST", "/v2/team/other/blobs/uploads/?mount="+d+"&from=team/app", "", pushOnly, nil)
	unknown := e.do(t, "POST", "/v2/team/other/blobs/uploads/?mount="+ociDigest("nothing")+"&from=team/app", "", pushOnly, nil)
	for _, a := range []answer{denied, unknown} {
		if a.status != 202 || !strings.HasPrefix(a.header.Get("Location"), "/v2/team/other/blobs/uploads/") || a.header.Get("Range") != "0-0" || a.body != "" {
			t.Fatalf("mount fallback: %+v", a)
		}
	}
	if a := e.do(t, "HEAD", "/v2/team/other/blobs/"+d, "", e.reader, nil); a.status != 404 {
		t.Fatalf("mount without read access published: %+v", a)
	}
	before := e.be.calls.Load()
	a := e.do(t, "POST", "/v2/team/other/blobs/uploads/?mount="+d+"&from=team/app", "", e.writer, nil)
	if a.status != 201 || a.header.Get("Location") != "/v2/team/other/blobs/"+d || a.header.Get("Docker-Content-Digest") != d {
		t.Fatalf("mount: %+v", a)
	}
	if n := e.be.calls.Load() - before; n != 0 {
		t.Fatalf("mount made %d backend calls", n)
	}
	if a := e.do(t, "GET", "/v2/team/other/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != "mounted" {
		t.Fatalf("read after mount: %+v", a)
	}
}

// A refused publication stores nothing and leaves the session open: the
// client's retried close publishes once the cause clears.
func TestOCIRetriedCloseAfterRefusal(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	good, _ := e.home.Home("team/app")
	e.home.setEpoch(good.Epoch + 7) // a superseded view of the lease
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc := a.header.Get("Location")
	e.do(t, "PATCH", loc, "retry me", e.writer, nil)
	d := ociDigest("retry me")
	if a := e.do(t, "PUT", loc+"?digest="+d, "", e.writer, nil); a.status != 503 || a.header.Get("Retry-After") == "" {
		t.Fatalf("refused close: %+v", a)
	}
	if a := e.do(t, "HEAD", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 404 {
		t.Fatalf("published after a refusal: %+v", a)
	}
	e.home.setEpoch(good.Epoch)
	if a := e.do(t, "PUT", loc+"?digest="+d, "", e.writer, nil); a.status != 201 {
		t.Fatalf("retried close: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.body != "retry me" {
		t.Fatalf("read: %+v", a)
	}
}

// A single-request upload writes its body while its intent, claim and
// stage are recorded (OpenAndStage); when that is refused, or the bytes
// are not the digest, nothing appears at the key and no temp file stays.
func TestOCIMonolithicRefusedStoresNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	files := func() []string {
		t.Helper()
		var out []string
		err := filepath.WalkDir(e.fs.Dir(), func(p string, de iofs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() {
				out = append(out, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	// A repository deleted after this node saw it exist: the open is
	// refused (NAME_UNKNOWN) and stores nothing; the next push creates
	// the repository again.
	if a := e.do(t, "POST", "/v2/team/gone/blobs/uploads/", "", e.writer, nil); a.status != 202 {
		t.Fatalf("session in a new repository: %+v", a)
	}
	if _, err := e.st.Pool().Exec(ctx, `DELETE FROM intents WHERE repository = 'team/gone'; DELETE FROM repositories WHERE name = 'team/gone'`); err != nil {
		t.Fatal(err)
	}
	content := "no such repository"
	d := ociDigest(content)
	if a := e.do(t, "POST", "/v2/team/gone/blobs/uploads/?digest="+d, content, e.writer, nil); a.status != 404 || ociCode(t, a) != "NAME_UNKNOWN" {
		t.Fatalf("a repository deleted since: %+v", a)
	}
	if ps, err := e.st.Placements(ctx, blobplane.Digest(d)); err != nil || len(ps) != 0 {
		t.Fatalf("placements after a refused open: %+v, %v", ps, err)
	}

	claimed := ociDigest("claimed bytes")
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+claimed, "actual bytes", e.writer, nil); a.status != 400 || ociCode(t, a) != "DIGEST_INVALID" {
		t.Fatalf("mismatch: %+v", a)
	}
	ps, err := e.st.Placements(ctx, blobplane.Digest(claimed))
	if err != nil || len(ps) != 1 || ps[0].State != placement.Failed || ps[0].Reason != placement.DigestMismatch {
		t.Fatalf("placements after a mismatch: %+v, %v", ps, err)
	}
	if got := files(); len(got) != 0 {
		t.Fatalf("files left by refused uploads: %v", got)
	}

	// And the same request shape publishes when all is well: the
	// deleted repository is created again.
	if a := e.do(t, "POST", "/v2/team/gone/blobs/uploads/?digest="+d, content, e.writer, nil); a.status != 201 {
		t.Fatalf("upload: %+v", a)
	}
	if got := files(); len(got) != 1 {
		t.Fatalf("files after one upload: %v", got)
	}
}

// Concurrent closes, single-request and POST+PUT, each content twice,
// whichever way each goes (chained, batched, alone, or finding its key
// staged by its twin): every one publishes, every blob reads back, no
// connection is left in a transaction, and once all are done a close
// chains again (every slot and connection was given back).
func TestOCIConcurrentClosesAllPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 1<<20)
	send := func(method, path, body string) (int, http.Header, error) {
		req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.SetBasicAuth("oras", e.writer)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header, nil
	}
	upload := func(content string, single bool) error {
		d := ociDigest(content)
		if single {
			status, _, err := send("POST", "/v2/team/app/blobs/uploads/?digest="+d, content)
			if err == nil && status != http.StatusCreated {
				err = fmt.Errorf("single-request %s: %d", d, status)
			}
			return err
		}
		status, hdr, err := send("POST", "/v2/team/app/blobs/uploads/", "")
		if err != nil || status != http.StatusAccepted {
			return fmt.Errorf("POST: %d, %v", status, err)
		}
		loc := hdr.Get("Location")
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		if status, _, err = send("PUT", strings.TrimPrefix(loc, e.srv.URL)+sep+"digest="+d, content); err == nil && status != http.StatusCreated {
			err = fmt.Errorf("PUT %s: %d", d, status)
		}
		return err
	}
	var contents []string
	for i := range 12 {
		contents = append(contents, fmt.Sprintf("concurrent close %d %s", i, strings.Repeat("x", i*300)))
	}
	errs := make(chan error, 2*len(contents))
	var wg sync.WaitGroup
	for i, c := range contents {
		for twin := range 2 {
			wg.Go(func() { errs <- upload(c, (i+twin)%2 == 0) })
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for _, c := range contents {
		if a := e.do(t, "GET", "/v2/team/app/blobs/"+ociDigest(c), "", e.writer, nil); a.status != http.StatusOK || a.body != c {
			t.Fatalf("GET %s: %d, %d bytes", ociDigest(c), a.status, len(a.body))
		}
	}
	var open int
	if err := e.st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil || open != 0 {
		t.Fatalf("%d connections left in a transaction, %v", open, err)
	}
	before := e.st.ChainedCloses()
	if err := upload("after the concurrent closes", true); err != nil {
		t.Fatal(err)
	}
	if e.st.ChainedCloses() != before+1 {
		t.Fatal("a close with nothing in flight did not chain: a slot was not given back")
	}
}

// homeFixture is what a handler test's server stands on: a store on a
// database of its own with repos created, this node ("node-a") holding
// partition p-0001's lease for real, a filesystem backend in a temp dir,
// and the home resolver naming the lease.
func homeFixture(t *testing.T, repos ...string) (*store.Store, *fs.Backend, *staticHome) {
	t.Helper()
	ctx := context.Background()
	st := pgtest.NewStore(t)
	for _, repo := range repos {
		if err := st.CreateRepository(ctx, repo); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := st.AcquireLease(ctx, "p-0001", "node-a", "node-a:7443", 15*time.Second, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := fs.Open(t.TempDir(), backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	home := &staticHome{lease: upload.Home{Partition: "p-0001", Node: "node-a", Epoch: lease.Epoch}}
	home.home.Store(true)
	return st, raw, home
}
