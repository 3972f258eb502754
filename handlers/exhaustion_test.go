package handlers_test

// Exhaustion attacks of issue 26 (points 4, 5 and 6), each replayed
// through real HTTP; the stalled ones on raw sockets.

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// exhaustEnv is the real router with the blob API on a real store, served
// by a server that reports each request whose handler returned.
type exhaustEnv struct {
	st      *store.Store
	srv     *httptest.Server
	metrics *handlers.Metrics
	writer  string      // alice: team/*:write
	done    chan string // "METHOD path" once its handler returned
	addr    string      // the server's host:port
}

func exhaustSetup(t *testing.T, d handlers.Deps) *exhaustEnv {
	t.Helper()
	st, raw, home := homeFixture(t, "team/app")
	e := &exhaustEnv{st: st, metrics: handlers.NewMetrics(), done: make(chan string, 1024)}
	d.Auth, d.Repositories, d.Metrics = st, st, e.metrics
	d.OCI = &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": raw}, Backend: "fs", Datacenter: "eu-1", Home: home}}
	router := handlers.NewRouter(d)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { e.done <- r.Method + " " + r.URL.Path }()
		router.ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	e.addr = e.srv.Listener.Addr().String()
	e.writer = token(t, st, "alice", "team/*:write")
	return e
}

// handlerReturned waits until the handler of want ("METHOD path") has
// returned, for at most within.
func (e *exhaustEnv) handlerReturned(t *testing.T, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case got := <-e.done:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("the handler of %s still runs after %s", want, within)
		}
	}
}

func basic(tok string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("oras:"+tok))
}

// Issue 26 point 4: every request method used to become a label value
// before authentication, so distinct long methods minted series without
// bound. The series count stays bounded, and every label value is short.
func TestAttackMetricLabelFromMethod(t *testing.T) {
	t.Parallel()
	m := handlers.NewMetrics()
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Metrics: m}))
	defer srv.Close()
	client := srv.Client()
	const attempts = 200
	for i := range attempts {
		method := fmt.Sprintf("X%04d%s", i, strings.Repeat("M", 4<<10))
		for _, path := range []string{"/healthz", fmt.Sprintf("/no/such/%d", i)} {
			req, err := http.NewRequest(method, srv.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true, "OTHER": true}
	series := 0
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "blobplane_http_") {
			continue
		}
		for _, metric := range f.GetMetric() {
			if f.GetName() == "blobplane_http_requests_total" {
				series++
			}
			for _, l := range metric.GetLabel() {
				if len(l.GetValue()) > 64 || l.GetName() == "method" && !methods[l.GetValue()] {
					t.Fatalf("%s has label %s=%.80q", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	// GET /healthz, GET /metrics, OTHER on /healthz (405), OTHER unmatched
	// (404): four series, whatever the number of methods sent.
	if series == 0 || series > 8 {
		t.Fatalf("blobplane_http_requests_total has %d series after %d distinct methods", series, 2*attempts)
	}
}

// Issue 26 point 5: a client declares a body, sends a few bytes and
// stalls, holding the handler, its goroutine and its connection for as long
// as it likes. The read fails once the body stalls for the idle timeout:
// the server answers or closes within it, and the handler returns.
func TestAttackStalledRequestBody(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	e := exhaustSetup(t, handlers.Deps{BodyIdleTimeout: idle})
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	path := "/v2/team/app/blobs/uploads/"
	d := ociDigest(strings.Repeat("x", 1000))
	fmt.Fprintf(conn, "POST %s?digest=%s HTTP/1.1\r\nHost: blobplane\r\nAuthorization: %s\r\nContent-Length: 1000\r\n\r\n%s", path, d, basic(e.writer), strings.Repeat("x", 10))
	sent := time.Now()

	// No sleep: the connection's own deadline bounds the wait. The
	// close reads the body twice over (a small body is read whole first
	// for the chained close, then streamed to the backend), so the
	// handler gives up after twice the idle timeout at most.
	_ = conn.SetReadDeadline(time.Now().Add(2*idle + 10*time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("no answer and no close %s after the body stalled", time.Since(sent))
	case err == nil:
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("a stalled body was answered %d", resp.StatusCode)
		}
	}
	if elapsed := time.Since(sent); elapsed < idle {
		t.Fatalf("the upload was cut after %s, before the idle timeout %s", elapsed, idle)
	}
	e.handlerReturned(t, "POST "+path, 10*time.Second)
	// The connection is closed, not kept for a next request.
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("the connection stays open after the stalled body: %v", err)
	}
}

// Issue 26 point 5, before authentication: an anonymous client declares a
// body and stalls. The handler refuses it (401) without reading the body,
// and net/http would then read what is left of it, to reuse the
// connection, before and after sending the answer, with no deadline. The
// answer goes out at once ("Connection: close"), the read after it gives up
// after the idle timeout, and the connection closes.
func TestAttackStalledBodyBeforeAuthentication(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	e := exhaustSetup(t, handlers.Deps{BodyIdleTimeout: idle})
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v2/team/app/blobs/uploads/ HTTP/1.1\r\nHost: blobplane\r\nContent-Length: 1000\r\n\r\n%s", strings.Repeat("x", 10))
	_ = conn.SetReadDeadline(time.Now().Add(idle + 10*time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a stalled anonymous body: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous upload: %d", resp.StatusCode)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("the connection stays open after the stalled body: %v", err)
	}
}

// A large upload that keeps moving is never cut, however long it lasts in
// all: only a stall longer than the idle timeout is.
func TestSlowButSteadyUploadIsNotCut(t *testing.T) {
	t.Parallel()
	// Each gap leaves 1.6 s of slack under the idle timeout: a CI run
	// hashing a 512 MiB copy on both cores beside this test stalled a
	// 100 ms gap past a 500 ms timeout.
	const idle = 2 * time.Second
	e := exhaustSetup(t, handlers.Deps{BodyIdleTimeout: idle})
	content := strings.Repeat("steady", 1000)
	pr, pw := io.Pipe()
	go func() {
		// Pacing the client, not waiting for the server: 12 pieces,
		// 400 ms apart, 4.8 s in all, more than twice the idle timeout.
		piece := len(content) / 12
		for i := 0; i < len(content); i += piece {
			time.Sleep(400 * time.Millisecond)
			if _, err := pw.Write([]byte(content[i:min(i+piece, len(content))])); err != nil {
				return
			}
		}
		pw.Close()
	}()
	req, err := http.NewRequest("POST", e.srv.URL+"/v2/team/app/blobs/uploads/?digest="+ociDigest(content), pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(content))
	req.SetBasicAuth("oras", e.writer)
	start := time.Now()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("a steady upload lasting %s was answered %d: %s", time.Since(start), resp.StatusCode, b)
	}
}

// Issue 26 point 5: a client asks for a large blob and never reads the
// answer. The write fails once the answer cannot move for the idle
// timeout, the handler returns and the connection is closed. A reader that
// is slow but keeps reading gets the whole blob.
func TestAttackSlowReaderOfResponse(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	e := exhaustSetup(t, handlers.Deps{BodyIdleTimeout: idle})
	// Larger than what the kernel buffers between the two ends while
	// the client reads nothing (the server's send buffer grows to 4 MiB
	// at most, the client's receive buffer only as it reads).
	blob := make([]byte, 24<<20)
	_, _ = rand.Read(blob)
	d := ociDigest(string(blob))
	req, _ := http.NewRequest("POST", e.srv.URL+"/v2/team/app/blobs/uploads/?digest="+d, strings.NewReader(string(blob)))
	req.SetBasicAuth("oras", e.writer)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	path := "/v2/team/app/blobs/" + d
	get := func(t *testing.T) (net.Conn, *bufio.Reader) {
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: blobplane\r\nAuthorization: %s\r\n\r\n", path, basic(e.writer))
		return conn, bufio.NewReaderSize(conn, 4<<10)
	}

	t.Run("steady", func(t *testing.T) {
		conn, br := get(t)
		_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Pacing the reader: a pause of a quarter of the idle timeout
		// after every 2 MiB.
		var got int64
		for {
			n, err := io.CopyN(io.Discard, resp.Body, 2<<20)
			got += n
			if err != nil {
				break
			}
			time.Sleep(idle / 4)
		}
		if got != int64(len(blob)) {
			t.Fatalf("a steady reader got %d of %d bytes", got, len(blob))
		}
		e.handlerReturned(t, "GET "+path, 10*time.Second)
	})
	t.Run("stalled request body", func(t *testing.T) {
		// A GET that declares a body and stalls it: the handler never
		// reads it, but net/http reads what is left of it before it
		// sends the header. That read gives up after the idle
		// timeout, and the blob goes out on a connection closed after.
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: blobplane\r\nAuthorization: %s\r\nContent-Length: 1000\r\n\r\n0123456789", path, basic(e.writer))
		_ = conn.SetReadDeadline(time.Now().Add(idle + 30*time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != int64(len(blob)) || !resp.Close {
			t.Fatalf("got %d of %d bytes (%v), Connection: close %v", n, len(blob), err, resp.Close)
		}
		e.handlerReturned(t, "GET "+path, 10*time.Second)
	})
	t.Run("stalled", func(t *testing.T) {
		conn, br := get(t)
		// The client reads nothing; the server's write must give up.
		e.handlerReturned(t, "GET "+path, idle+20*time.Second)
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := io.Copy(io.Discard, br)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the connection stays open after the write stalled (%d bytes read)", n)
		}
		if n >= int64(len(blob)) {
			t.Fatalf("the whole blob was sent to a client that read nothing (%d bytes)", n)
		}
	})
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip (any of 127.0.0.0/8 is this host), so one test plays several
// client addresses.
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: dialer.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (e *exhaustEnv) get(t *testing.T, c *http.Client, path, tok string) answer {
	t.Helper()
	req, err := http.NewRequest("GET", e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.SetBasicAuth("oras", tok)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// Issue 26 point 6: guessing tokens, from one address or at one token id
// from many. Failures past the limit are refused unchecked (429 with
// Retry-After) per client address; at a token id over its limit, from any
// address that failed recently. Clients elsewhere, and the owner of the
// targeted id from a clean address, still get in.
func TestAttackBruteForceTokens(t *testing.T) {
	t.Parallel()
	e := exhaustSetup(t, handlers.Deps{AuthFailures: handlers.FailureLimit{Burst: 3, Per: time.Hour}})
	guess := func() string { return auth.NewToken().String() }
	tooMany := func(t *testing.T, a answer, what string) {
		t.Helper()
		secs, err := strconv.Atoi(a.header.Get("Retry-After"))
		if a.status != http.StatusTooManyRequests || err != nil || secs < 1 {
			t.Fatalf("%s: %d Retry-After %q, want 429 with a delay: %s", what, a.status, a.header.Get("Retry-After"), a.body)
		}
	}

	// One address guessing: three failures are checked, the fourth
	// attempt is refused unchecked, and so is a correct token from there
	// (checking it would tell a guesser when it hit).
	mallory := clientFrom(t, "127.0.0.2")
	for i := range 3 {
		if a := e.get(t, mallory, "/v2/", guess()); a.status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, a.status)
		}
	}
	a := e.get(t, mallory, "/v2/", guess())
	tooMany(t, a, "fourth guess")
	if code := ociCode(t, a); code == "" {
		t.Fatalf("429 without an OCI error code: %s", a.body)
	}
	tooMany(t, e.get(t, mallory, "/v2/", e.writer), "a correct token from the guessing address")
	// The admin API answers in its own error format.
	admin := e.get(t, mallory, "/v1/admin/repositories", guess())
	tooMany(t, admin, "admin guess")
	var body handlers.ErrorBody
	if err := json.Unmarshal([]byte(admin.body), &body); err != nil || body.Code != "too_many_requests" {
		t.Fatalf("admin 429 body: %s", admin.body)
	}
	// Asking for the challenge (no credentials) is not an attempt.
	if a := e.get(t, mallory, "/v2/", ""); a.status != http.StatusUnauthorized || len(a.header.Values("WWW-Authenticate")) == 0 {
		t.Fatalf("anonymous from the guessing address: %d", a.status)
	}
	// Another address is not affected.
	if a := e.get(t, clientFrom(t, "127.0.0.3"), "/v2/", e.writer); a.status != http.StatusOK {
		t.Fatalf("alice from another address: %d", a.status)
	}

	// Many addresses guessing alice's secret at her (public) token id:
	// one failure each drains the id's bucket.
	alice, err := auth.ParseToken(e.writer)
	if err != nil {
		t.Fatal(err)
	}
	atAlice := func() string { return "bp_" + alice.ID + "_" + auth.NewToken().Secret }
	bots := []*http.Client{clientFrom(t, "127.0.0.4"), clientFrom(t, "127.0.0.5"), clientFrom(t, "127.0.0.6")}
	for i, bot := range bots {
		if a := e.get(t, bot, "/v2/", atAlice()); a.status != http.StatusUnauthorized {
			t.Fatalf("bot %d: %d, want 401", i, a.status)
		}
	}
	// A bot that failed recently is refused unchecked at that id, though
	// its own address is under its limit...
	tooMany(t, e.get(t, bots[0], "/v2/", atAlice()), "a bot's second guess at alice's id")
	tooMany(t, e.get(t, bots[0], "/v2/", e.writer), "alice's token from a bot's address")
	// ...but other tokens from it are still checked...
	other := token(t, e.st, "bob", "team/*:read")
	if a := e.get(t, bots[0], "/v2/", other); a.status != http.StatusOK {
		t.Fatalf("bob from a bot's address: %d", a.status)
	}
	// ...and alice, from an address without failures, still gets in:
	// knowing a token id does not lock its owner out.
	clean := clientFrom(t, "127.0.0.7")
	if a := e.get(t, clean, "/v2/", e.writer); a.status != http.StatusOK {
		t.Fatalf("alice from a clean address: %d", a.status)
	}
	// A guess from a clean address is checked once, then refused.
	if a := e.get(t, clean, "/v2/", atAlice()); a.status != http.StatusUnauthorized {
		t.Fatalf("first guess from a clean address: %d", a.status)
	}
	tooMany(t, e.get(t, clean, "/v2/", atAlice()), "second guess from that address")

	for limit, want := range map[string]float64{"address": 3, "token": 3} {
		if got := counter(t, e.metrics, "blobplane_auth_refused_total", "limit", limit); got != want {
			t.Errorf("blobplane_auth_refused_total{limit=%q} = %v, want %v", limit, got, want)
		}
	}
}

// counter reads the counter name{label=value} from m's registry.
func counter(t *testing.T, m *handlers.Metrics, name, label, value string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return metric.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
