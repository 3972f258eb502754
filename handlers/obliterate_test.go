package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// obliterationEnv is two api processes on one database, each with its
// existence cache kept by LISTEN/NOTIFY: srv serves the admin API and
// the blob API, other the blob API only (it hears of an obliteration
// through the notifications alone).
type obliterationEnv struct {
	*ociEnv
	other      *httptest.Server
	flow       *upload.Flow
	root, lead string
}

func obliterationSetup(t *testing.T) *obliterationEnv {
	t.Helper()
	ctx := context.Background()
	st, raw, home := homeFixture(t, "team/app", "team/other")
	be := &countingBackend{Backend: raw}
	cfg := upload.Config{Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1", Home: home}
	metrics := handlers.NewMetrics()
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, Repositories: st, Metrics: metrics, OCI: &handlers.OCI{Store: st, Config: cfg}}))
	t.Cleanup(srv.Close)
	st2 := store.New(st.Pool(), nil) // another api process's store
	other := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st2, OCI: &handlers.OCI{Store: st2, Config: cfg}}))
	t.Cleanup(other.Close)
	for _, s := range []*store.Store{st, st2} {
		stop := s.StartCaches(ctx, store.CacheOptions{Existence: &store.ExistenceCacheOptions{TTL: time.Minute}})
		t.Cleanup(stop)
		deadline := time.Now().Add(15 * time.Second)
		for !s.ExistenceCacheStats().Listening {
			if time.Now().After(deadline) {
				t.Fatal("the cache listener did not come up")
			}
			time.Sleep(5 * time.Millisecond) // poll interval
		}
	}
	e := &obliterationEnv{
		ociEnv: &ociEnv{st: st, srv: srv, be: be, fs: raw, home: home,
			writer: token(t, st, "alice", "team/*:write"), reader: token(t, st, "bob", "team/*:read")},
		other: other, flow: upload.NewFlow(st, cfg),
		root: token(t, st, "root", "*:admin"), lead: token(t, st, "lead", "team/*:admin"),
	}
	return e
}

// head asks srv for repo's blob d.
func (e *obliterationEnv) head(t *testing.T, srv *httptest.Server, repo, d string) int {
	t.Helper()
	req, _ := http.NewRequest("HEAD", srv.URL+"/v2/"+repo+"/blobs/"+d, nil)
	req.SetBasicAuth("oras", e.reader)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func obliteratePath(d string) string { return "/v1/admin/blobs/" + d + "/obliterate" }

func decodeStatus(t *testing.T, a answer) handlers.ObliterationStatusJSON {
	t.Helper()
	var s handlers.ObliterationStatusJSON
	if err := json.Unmarshal([]byte(a.body), &s); err != nil {
		t.Fatalf("not an obliteration status (%d): %s", a.status, a.body)
	}
	return s
}

// runObliteration runs the obliterate job's steps for the current mark
// of d and the byte deletion of its eu-1 placement (what a worker of
// eu-1 does), through the store.
func (e *obliterationEnv) runObliteration(t *testing.T, d blobplane.Digest) {
	t.Helper()
	ctx := context.Background()
	st, err := e.st.ObliterationStatus(ctx, d)
	if err != nil || st.Mark == nil {
		t.Fatalf("status: %+v %v", st, err)
	}
	args := store.ObliterateArgs{Digest: d, Mark: st.Mark.ID}
	for _, step := range store.ObliterationSteps {
		if _, err := e.st.ObliterationStep(ctx, args, step, nil, nil); err != nil {
			t.Fatalf("step %s: %v", step, err)
		}
	}
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: "eu-1", Location: placement.ObjectLocation(d)}
	if res, _, err := e.st.DeleteCollectedBytes(ctx, k, func(ctx context.Context) error { return e.fs.Delete(ctx, d) }); err != nil || res != store.DeletionDeleted {
		t.Fatalf("byte deletion: %q %v", res, err)
	}
}

// Issue 29, "obliteration end to end", over real HTTP: only *:admin may
// obliterate, and nobody else learns anything; a malformed request is a
// 400 with a stable code; once the mark is taken the blob is gone from
// every repository on every api (the existence caches forget it: this
// process at once, the other through the notification), and every
// upload of it (monolithic, chunked, a session closed with its body) and
// every mount is refused with a 409 naming the obliteration; its job
// revokes the placements and its bytes go; the admin GET shows the mark
// and its history; unmark re-allows the digest, and a re-upload stores
// the bytes again and publishes (no re-put no-op); every action counts.
func TestObliterationOverHTTP(t *testing.T) {
	t.Parallel()
	e := obliterationSetup(t)
	ctx := context.Background()
	content := "a blob an operator must remove"
	d := ociDigest(content)
	for _, repo := range []string{"team/app", "team/other"} {
		if a := e.do(t, "POST", "/v2/"+repo+"/blobs/uploads/?digest="+d, content, e.writer, nil); a.status != 201 {
			t.Fatalf("upload to %s: %+v", repo, a)
		}
		for _, srv := range []*httptest.Server{e.srv, e.other} { // cached on both apis
			if s := e.head(t, srv, repo, d); s != 200 {
				t.Fatalf("HEAD %s before: %d", repo, s)
			}
		}
	}
	path := obliteratePath(d)
	body := `{"reason": "the blob holds a leaked credential"}`

	// Authorization first: nobody but *:admin learns anything, not even
	// whether the digest is well formed.
	wantAdminUnauthorized(t, "anonymous", call(t, e.srv, "POST", path, body, ""))
	for _, c := range []struct{ who, cred string }{{"a writer", e.writer}, {"a reader", e.reader}, {"a team admin", e.lead}} {
		for _, m := range []string{"POST", "DELETE", "GET"} {
			b := body
			if m == "GET" {
				b = ""
			}
			a := call(t, e.srv, m, path, b, c.cred)
			wantCode(t, c.who+" "+m, a, 403, "forbidden")
			if strings.Contains(a.body, d) || strings.Contains(a.body, "obliterat") {
				t.Errorf("%s %s learns about the digest: %s", c.who, m, a.body)
			}
		}
		wantCode(t, c.who+" with a malformed digest", call(t, e.srv, "POST", obliteratePath("sha256:zz"), body, c.cred), 403, "forbidden")
	}
	// Validation.
	for _, c := range []struct{ what, path, body string }{
		{"malformed digest", obliteratePath("sha256:abc"), body},
		{"uppercase digest", obliteratePath(strings.ToUpper(d)), body},
		{"no reason", path, `{}`},
		{"empty reason", path, `{"reason": ""}`},
		{"blank reason", path, `{"reason": "   "}`},
		{"oversized reason", path, `{"reason": "` + strings.Repeat("x", store.MaxObliterationReason+1) + `"}`},
		{"control characters", path, `{"reason": "a\nb"}`},
		{"unknown field", path, `{"reason": "x", "force": true}`},
		{"not JSON", path, `reason=x`},
		{"two documents", path, body + body},
	} {
		wantCode(t, c.what, call(t, e.srv, "POST", c.path, c.body, e.root), 400, "invalid")
	}
	wantCode(t, "unknown digest", call(t, e.srv, "POST", obliteratePath(ociDigest("never uploaded")), body, e.root), 404, "not_found")
	wantCode(t, "unmark of a live digest", call(t, e.srv, "DELETE", path, body, e.root), 404, "not_found")

	// The mark.
	a := call(t, e.srv, "POST", path, body, e.root)
	st := decodeStatus(t, a)
	if a.status != 202 || !st.Obliterated || st.Mark == nil || st.Mark.Principal != "root" || st.Mark.Reason != "the blob holds a leaked credential" ||
		st.Left.References != 0 || st.Left.Placements != 1 || len(st.History) != 1 {
		t.Fatalf("obliterate: %d %s", a.status, a.body)
	}
	if a := call(t, e.srv, "POST", path, `{"reason": "again"}`, e.root); a.status != 200 || len(decodeStatus(t, a).History) != 1 {
		t.Fatalf("obliterate again: %d %s", a.status, a.body)
	}

	// Reads: 404 BLOB_UNKNOWN everywhere, on this api at once, on the
	// other once its notification arrives.
	for _, repo := range []string{"team/app", "team/other"} {
		if a := e.do(t, "GET", "/v2/"+repo+"/blobs/"+d, "", e.reader, nil); a.status != 404 || ociCode(t, a) != "BLOB_UNKNOWN" {
			t.Fatalf("GET %s after the mark: %+v", repo, a)
		}
		if s := e.head(t, e.srv, repo, d); s != 404 {
			t.Fatalf("HEAD %s after the mark: %d", repo, s)
		}
		deadline := time.Now().Add(10 * time.Second)
		for e.head(t, e.other, repo, d) != 404 {
			if time.Now().After(deadline) {
				t.Fatalf("the other api still finds %s in %s", d, repo)
			}
			time.Sleep(10 * time.Millisecond) // poll interval: the notification is asynchronous
		}
	}

	// Uploads and mounts: refused, 409, naming the obliteration.
	refused := func(what string, a answer) {
		t.Helper()
		if a.status != 409 || ociCode(t, a) != "BLOB_UPLOAD_INVALID" || !strings.Contains(a.body, "obliterated") {
			t.Errorf("%s: %d %s; want 409 naming the obliteration", what, a.status, a.body)
		}
	}
	refused("monolithic upload", e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, content, e.writer, nil))
	loc := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil).header.Get("Location")
	refused("session closed with its body", e.do(t, "PUT", loc+"?digest="+d, content, e.writer, nil))
	loc = e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil).header.Get("Location")
	if a := e.do(t, "PATCH", loc, content, e.writer, nil); a.status != 202 {
		t.Fatalf("chunk: %+v", a)
	}
	refused("chunked upload's close", e.do(t, "PUT", loc+"?digest="+d, "", e.writer, nil))
	refused("mount", e.do(t, "POST", "/v2/team/app/blobs/uploads/?mount="+d+"&from=team/other", "", e.writer, nil))
	if _, ok, err := e.flow.Mount(ctx, "team/app", "alice", blobplane.Digest(d), "team/other"); ok || !errors.Is(err, upload.ErrObliterated) ||
		blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Errorf("mount: ok %v, %v", ok, err)
	}
	if _, err := e.fs.Stat(ctx, blobplane.Digest(d)); err != nil {
		t.Fatalf("the bytes before the job: %v", err)
	}

	// The job, then the status.
	e.runObliteration(t, blobplane.Digest(d))
	if _, err := e.fs.Stat(ctx, blobplane.Digest(d)); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("the bytes after the job: %v", err)
	}
	a = call(t, e.srv, "GET", path, "", e.root)
	if st := decodeStatus(t, a); a.status != 200 || !st.Obliterated || st.Left != (handlers.ObliterationLeftJSON{}) || st.Mark == nil {
		t.Fatalf("status after the job: %d %s", a.status, a.body)
	}

	// Unmark, then a re-upload stores the bytes again and publishes.
	wantCode(t, "unmark without a reason", call(t, e.srv, "DELETE", path, `{}`, e.root), 400, "invalid")
	a = call(t, e.srv, "DELETE", path, `{"reason": "the credential was rotated"}`, e.root)
	if st := decodeStatus(t, a); a.status != 200 || st.Obliterated || st.State != "collected" || len(st.History) != 2 ||
		st.History[0].Action != "unmark" || st.History[0].Principal != "root" || st.History[0].Reason != "the credential was rotated" {
		t.Fatalf("unmark: %d %s", a.status, a.body)
	}
	wantCode(t, "unmark twice", call(t, e.srv, "DELETE", path, body, e.root), 404, "not_found")
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, content, e.writer, nil); a.status != 201 {
		t.Fatalf("re-upload after the unmark: %+v", a)
	}
	if _, err := e.fs.Stat(ctx, blobplane.Digest(d)); err != nil {
		t.Fatalf("the re-upload did not store the bytes: %v", err)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("GET after the re-upload: %+v", a)
	}
	if a := call(t, e.srv, "GET", path, "", e.root); decodeStatus(t, a).State != "live" {
		t.Fatalf("state after the re-upload: %s", a.body)
	}

	// Counted: one obliteration (the repeat took no new mark), one unmark.
	resp, err := e.srv.Client().Get(e.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`blobplane_obliterations_total{action="obliterate"} 1`, `blobplane_obliterations_total{action="unmark"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
