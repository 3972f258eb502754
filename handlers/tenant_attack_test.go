package handlers_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// Issue 26, "Tenant isolation": alice writes repository victim, mallory
// writes repository attacker, and nothing mallory does with a digest she
// names (a claim, a stalled body, garbage) gains her alice's bytes or
// costs alice her copy (DESIGN S8, S9).

type tenants struct {
	st               *store.Store
	srv              *httptest.Server
	home             *staticHome
	alice, mallory   string // tokens
	victim, attack   string // repositories
	aliceE, malloryE *ociEnv
}

func tenantSetup(t *testing.T, opts ...func(*handlers.OCI)) *tenants {
	t.Helper()
	st, raw, home := homeFixture(t, "victim", "attacker")
	oci := &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": raw}, Backend: "fs", Datacenter: "eu-1", Home: home}}
	for _, o := range opts {
		o(oci)
	}
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, OCI: oci}))
	t.Cleanup(srv.Close)
	tn := &tenants{st: st, srv: srv, home: home, victim: "victim", attack: "attacker",
		alice: token(t, st, "alice", "victim:write"), mallory: token(t, st, "mallory", "attacker:write")}
	tn.aliceE = &ociEnv{st: st, srv: srv, home: home}
	tn.malloryE = tn.aliceE
	return tn
}

// blobOf is random content larger than the close's read-ahead (64 KiB),
// so a PUT claims its digest before it reads the body: the window the
// attacks below stall in.
func blobOf(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b, ociDigest(string(b))
}

// stalled is a raw connection that sent a request's headers and part of
// its body, and then stopped: what an HTTP client library cannot do.
type stalled struct {
	conn net.Conn
	r    *bufio.Reader
}

func (tn *tenants) stall(t *testing.T, method, path, cred string, contentLength int, first []byte) *stalled {
	t.Helper()
	conn, err := net.Dial("tcp", tn.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := base64.StdEncoding.EncodeToString([]byte("x:" + cred))
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: blobplane\r\nAuthorization: Basic %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", method, path, auth, contentLength)
	if _, err := conn.Write(first); err != nil {
		t.Fatal(err)
	}
	return &stalled{conn: conn, r: bufio.NewReader(conn)}
}

// finish sends the rest of the body and reads the answer.
func (s *stalled) finish(t *testing.T, rest []byte) *http.Response {
	t.Helper()
	if _, err := s.conn.Write(rest); err != nil {
		t.Fatal(err)
	}
	s.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(s.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// waitFor polls cond until it holds (a deadline, not a sleep that hopes).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitClaimed waits until mallory's session op claims d: the PUT is
// stalled inside its body, after its claim committed.
func (tn *tenants) waitClaimed(t *testing.T, op string, d string) upload.Intent {
	t.Helper()
	var in upload.Intent
	waitFor(t, "the stalled PUT's claim", func() bool {
		var err error
		in, err = tn.st.GetIntent(context.Background(), op)
		return err == nil && string(in.ExpectedDigest) == d
	})
	return in
}

func (tn *tenants) openSession(t *testing.T, repo, cred string) (loc, op string) {
	t.Helper()
	a := tn.aliceE.do(t, "POST", "/v2/"+repo+"/blobs/uploads/", "", cred, nil)
	if a.status != http.StatusAccepted {
		t.Fatalf("open session in %s: %+v", repo, a)
	}
	loc = a.header.Get("Location")
	return loc, a.header.Get("Docker-Upload-UUID")
}

// Attack 1: mallory claims alice's digest D in her own session with a
// stalled PUT (Content-Length = D's size, a few bytes sent), then closes
// the session again with an empty PUT. The claim recorded D and its size
// before a byte was verified; the empty close used to take it as a
// "retried close" and publish D into attacker on the strength of alice's
// verified placement. Now possession is required (S9): the close is
// refused and mallory cannot read D.
func TestAttackPublishBlobNeverUploaded(t *testing.T) {
	t.Parallel()
	tn := tenantSetup(t)
	content, d := blobOf(t, 100<<10)
	if a := tn.aliceE.do(t, "POST", "/v2/victim/blobs/uploads/?digest="+d, string(content), tn.alice, nil); a.status != http.StatusCreated {
		t.Fatalf("alice's push: %+v", a)
	}
	loc, op := tn.openSession(t, tn.attack, tn.mallory)
	tn.stall(t, "PUT", loc+"?digest="+d, tn.mallory, len(content), []byte("only a few bytes"))
	in := tn.waitClaimed(t, op, d)
	if in.Possession != "" {
		t.Fatalf("a claim recorded possession: %+v", in)
	}

	a := tn.malloryE.do(t, "PUT", loc+"?digest="+d, "", tn.mallory, nil)
	if a.status == http.StatusCreated || a.status/100 == 5 {
		t.Fatalf("mallory's empty close of a claimed session: %+v; want a refusal", a)
	}
	for _, m := range []string{"HEAD", "GET"} {
		if a := tn.malloryE.do(t, m, "/v2/attacker/blobs/"+d, "", tn.mallory, nil); a.status != http.StatusNotFound {
			t.Fatalf("mallory's %s of D in attacker: %+v; want 404", m, a)
		}
	}

	// The same rule at the home, whoever asks: the forwarded
	// /internal/v1/finalize/{op} and the finalize job both call
	// Store.Finalize without Proven for exactly this intent.
	home, _ := tn.home.Home(tn.attack)
	_, err := tn.st.Finalize(context.Background(), upload.FinalizeRequest{OperationID: op, Digest: blobplane.Digest(d), Size: int64(len(content)),
		Partition: home.Partition, Node: home.Node, Epoch: home.Epoch, Targets: []string{}})
	if !errors.Is(err, upload.ErrNotProven) {
		t.Fatalf("finalize of the claimed, never uploaded session: %v; want ErrNotProven", err)
	}
	if _, err := tn.st.ReferencedBlob(context.Background(), tn.attack, blobplane.Digest(d)); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("attacker references D: %v", err)
	}
}

// Attack 1, the legitimate twin: an upload that sent and hashed its bytes
// may publish later, by a retried empty close, after its first close's
// publication was refused (here: a stale epoch). Dedup against alice's
// verified copy stays, once mallory streamed and hashed the full body.
func TestUploaderWithItsOwnBytesStillPublishesLaterAndDedups(t *testing.T) {
	t.Parallel()
	tn := tenantSetup(t)
	content, d := blobOf(t, 100<<10)
	if a := tn.aliceE.do(t, "POST", "/v2/victim/blobs/uploads/?digest="+d, string(content), tn.alice, nil); a.status != http.StatusCreated {
		t.Fatalf("alice's push: %+v", a)
	}
	loc, op := tn.openSession(t, tn.attack, tn.mallory)
	good, _ := tn.home.Home(tn.attack)
	tn.home.setEpoch(good.Epoch + 7) // refused by the fence
	if a := tn.malloryE.do(t, "PUT", loc+"?digest="+d, string(content), tn.mallory, nil); a.status != http.StatusServiceUnavailable {
		t.Fatalf("close under a stale epoch: %+v", a)
	}
	if in, err := tn.st.GetIntent(context.Background(), op); err != nil || in.Possession != upload.PossessionUploaded {
		t.Fatalf("after the refused close: %+v, %v; want its possession recorded", in, err)
	}
	tn.home.setEpoch(good.Epoch)
	if a := tn.malloryE.do(t, "PUT", loc+"?digest="+d, "", tn.mallory, nil); a.status != http.StatusCreated {
		t.Fatalf("retried close: %+v", a)
	}
	if a := tn.malloryE.do(t, "GET", "/v2/attacker/blobs/"+d, "", tn.mallory, nil); a.status != 200 || a.body != string(content) {
		t.Fatalf("mallory's own upload: %d", a.status)
	}
	ps, err := tn.st.Placements(context.Background(), blobplane.Digest(d))
	if err != nil || len(ps) != 1 || ps[0].State != placement.Verified {
		t.Fatalf("one verified copy for both: %+v, %v", ps, err)
	}
}

// Attack 2: mallory claims digest E and stalls mid-body; alice pushes E
// (201); mallory then sends garbage. The mismatch used to fail E's row,
// which alice's upload had verified meanwhile: alice's HEAD said 200 and
// her GET 503 for ever. A close now fails only the stage it made.
func TestAttackPoisonAnotherTenantsCopy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		size func(n int) int // the size mallory declares for E
	}{
		{"same size", func(n int) int { return n }},
		// Her stage records the wrong size first; alice's re-stage must
		// not fail on it, and mallory's must not change alice's.
		{"wrong size", func(n int) int { return n + 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tn := tenantSetup(t)
			content, e := blobOf(t, 100<<10)
			loc, op := tn.openSession(t, tn.attack, tn.mallory)
			garbage := bytes.Repeat([]byte{'g'}, tc.size(len(content)))
			s := tn.stall(t, "PUT", loc+"?digest="+e, tn.mallory, len(garbage), garbage[:10])
			tn.waitClaimed(t, op, e)
			waitFor(t, "mallory's stage", func() bool {
				ps, err := tn.st.Placements(context.Background(), blobplane.Digest(e))
				return err == nil && len(ps) == 1 && ps[0].State == placement.Pending
			})

			if a := tn.aliceE.do(t, "POST", "/v2/victim/blobs/uploads/?digest="+e, string(content), tn.alice, nil); a.status != http.StatusCreated {
				t.Fatalf("alice's push while mallory stalls: %+v", a)
			}
			if resp := s.finish(t, garbage[10:]); resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("mallory's garbage: %d; want 400", resp.StatusCode)
			}
			if a := tn.aliceE.do(t, "HEAD", "/v2/victim/blobs/"+e, "", tn.alice, nil); a.status != 200 {
				t.Fatalf("alice's HEAD: %+v", a)
			}
			if a := tn.aliceE.do(t, "GET", "/v2/victim/blobs/"+e, "", tn.alice, nil); a.status != 200 || a.body != string(content) {
				t.Fatalf("alice's GET after mallory's garbage: %d", a.status)
			}
			ps, err := tn.st.Placements(context.Background(), blobplane.Digest(e))
			if err != nil || len(ps) != 1 || ps[0].State != placement.Verified || ps[0].Size != int64(len(content)) {
				t.Fatalf("E's placement: %+v, %v; want verified with %d bytes", ps, err, len(content))
			}
		})
	}
}

// Attack 2, the other order: alice stalls mid-body first, mallory claims
// the same digest after her (re-staging the pending row) and sends
// garbage, which fails the row mallory staged last; alice's bytes then
// arrive, hash to E, and her close verifies and publishes all the same.
func TestAttackGarbageAfterAnotherTenantsStage(t *testing.T) {
	t.Parallel()
	tn := tenantSetup(t)
	content, e := blobOf(t, 100<<10)
	aliceLoc, aliceOp := tn.openSession(t, tn.victim, tn.alice)
	s := tn.stall(t, "PUT", aliceLoc+"?digest="+e, tn.alice, len(content), content[:10])
	tn.waitClaimed(t, aliceOp, e)

	loc, _ := tn.openSession(t, tn.attack, tn.mallory)
	garbage := bytes.Repeat([]byte{'g'}, len(content)-1)
	if a := tn.malloryE.do(t, "PUT", loc+"?digest="+e, string(garbage), tn.mallory, nil); a.status != http.StatusBadRequest {
		t.Fatalf("mallory's garbage: %+v", a)
	}
	ps, err := tn.st.Placements(context.Background(), blobplane.Digest(e))
	if err != nil || len(ps) != 1 || ps[0].State == placement.Verified {
		t.Fatalf("E's row after mallory's garbage: %+v, %v", ps, err)
	}
	if resp := s.finish(t, content[10:]); resp.StatusCode != http.StatusCreated {
		t.Fatalf("alice's close after mallory's garbage: %d; want 201", resp.StatusCode)
	}
	if a := tn.aliceE.do(t, "GET", "/v2/victim/blobs/"+e, "", tn.alice, nil); a.status != 200 || a.body != string(content) {
		t.Fatalf("alice's GET: %d", a.status)
	}
	if got := strings.Count(fmt.Sprint(ps), "sha256"); got < 1 {
		t.Fatal("no placement")
	}
}

// Issue 26 point 5: one principal cannot hold unbounded upload sessions
// or staged bytes. mallory at her bounds gets 429 TOOMANYREQUESTS; alice, another
// principal, is not affected; closing sessions frees mallory's room.
func TestAttackExhaustSessionsAndStaging(t *testing.T) {
	t.Parallel()
	const maxOpen, maxStaged = 3, 1000
	tn := tenantSetup(t, func(o *handlers.OCI) {
		o.MaxOpenUploads, o.MaxStagedBytes = maxOpen, maxStaged
		o.UsagePeriod = -1 // read at every check: the test sees each close at once
	})
	var locs []string
	for range maxOpen {
		loc, _ := tn.openSession(t, tn.attack, tn.mallory)
		locs = append(locs, loc)
	}
	for _, path := range []string{"/v2/attacker/blobs/uploads/", "/v2/attacker/blobs/uploads/?digest=" + ociDigest("x")} {
		a := tn.malloryE.do(t, "POST", path, "x", tn.mallory, nil)
		if a.status != http.StatusTooManyRequests || ociCode(t, a) != "TOOMANYREQUESTS" || a.header.Get("Retry-After") == "" {
			t.Fatalf("session past mallory's bound (%s): %+v", path, a)
		}
	}
	if _, op := tn.openSession(t, tn.victim, tn.alice); op == "" {
		t.Fatal("alice cannot open a session while mallory is at her bound")
	}

	// Staged bytes: 600 fit, 600 more do not (refused before a byte is
	// written: the session keeps its 600), and the bound is mallory's
	// across her sessions.
	chunk := strings.Repeat("s", 600)
	if a := tn.malloryE.do(t, "PATCH", locs[0], chunk, tn.mallory, nil); a.status != http.StatusAccepted {
		t.Fatalf("first chunk: %+v", a)
	}
	a := tn.malloryE.do(t, "PATCH", locs[1], chunk, tn.mallory, nil)
	if a.status != http.StatusTooManyRequests || ociCode(t, a) != "TOOMANYREQUESTS" {
		t.Fatalf("chunk past the staging bound: %+v", a)
	}
	if a := tn.malloryE.do(t, "GET", locs[0], "", tn.mallory, nil); a.status != http.StatusNoContent || a.header.Get("Range") != "0-599" {
		t.Fatalf("the first session after the refusal: %+v", a)
	}
	// Cancelling frees both bounds.
	if a := tn.malloryE.do(t, "DELETE", locs[0], "", tn.mallory, nil); a.status != http.StatusNoContent {
		t.Fatalf("cancel: %+v", a)
	}
	if a := tn.malloryE.do(t, "PATCH", locs[1], chunk, tn.mallory, nil); a.status != http.StatusAccepted {
		t.Fatalf("chunk after a cancel: %+v", a)
	}
	tn.openSession(t, tn.attack, tn.mallory)
}

// Issue 26 point 12: a DELETE of a reference one does not have (a 404)
// used to notify every api to empty its existence cache. Only a deletion
// that removed a reference notifies now.
func TestAttackDeleteNothingEmptiesEveryCache(t *testing.T) {
	t.Parallel()
	tn := tenantSetup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, tn.st.Pool().Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN "+store.RefsChannel); err != nil {
		t.Fatal(err)
	}
	if a := tn.malloryE.do(t, "DELETE", "/v2/attacker/blobs/"+ociDigest("never"), "", tn.mallory, nil); a.status != http.StatusNotFound {
		t.Fatalf("delete of nothing: %+v", a)
	}
	// A marker notification after it: if the DELETE had notified, its
	// notification would arrive first (notifications are delivered in
	// commit order).
	if _, err := tn.st.Pool().Exec(ctx, "SELECT pg_notify($1, 'marker')", store.RefsChannel); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil || n.Payload != "marker" {
		t.Fatalf("first notification after a DELETE that removed nothing: %+v, %v; want the marker", n, err)
	}
	// A DELETE that removes a reference does notify.
	content := "referenced"
	d := ociDigest(content)
	if a := tn.aliceE.do(t, "POST", "/v2/victim/blobs/uploads/?digest="+d, content, tn.alice, nil); a.status != http.StatusCreated {
		t.Fatalf("push: %+v", a)
	}
	if a := tn.aliceE.do(t, "DELETE", "/v2/victim/blobs/"+d, "", tn.alice, nil); a.status != http.StatusAccepted {
		t.Fatalf("delete: %+v", a)
	}
	if n, err := conn.WaitForNotification(wctx); err != nil || n.Payload != "" {
		t.Fatalf("after a DELETE that removed a reference: %+v, %v", n, err)
	}
}

// A body shorter than its Content-Length is the client's fault: 400
// BLOB_UPLOAD_INVALID, not a retryable 503 that blames the backend
// (found by FuzzOCIHandlers), for a whole-body close and for a chunk.
func TestShortBodyIsTheClientsFault(t *testing.T) {
	t.Parallel()
	tn := tenantSetup(t)
	content, d := blobOf(t, 100<<10)
	for name, path := range map[string]func() string{
		"monolithic POST": func() string { return "/v2/victim/blobs/uploads/?digest=" + d },
		"PATCH chunk":     func() string { loc, _ := tn.openSession(t, tn.victim, tn.alice); return loc },
	} {
		method := "POST"
		if name == "PATCH chunk" {
			method = "PATCH"
		}
		s := tn.stall(t, method, path(), tn.alice, len(content), content[:10])
		s.conn.(*net.TCPConn).CloseWrite()
		s.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(s.r, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s cut short: %d; want 400", name, resp.StatusCode)
		}
	}
}
