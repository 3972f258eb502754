package handlers_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/goleak"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// FuzzOCIHandlers drives the real router (the blob API, operations, the
// routing query, the operational endpoints) on a real store and a real
// filesystem backend, through a real HTTP server, with arbitrary methods,
// paths, headers and bodies (issue 26, "Done when"). For every input:
//
//   - no 5xx, except 503 or 504 with Retry-After (a retryable refusal);
//   - an error our router answers carries a JSON error document (the OCI
//     one or ErrorBody), never a stack trace nor Postgres's text;
//   - no goroutine the input started outlives it;
//   - the blobplane_http_* metrics keep bounded labels: a method of the
//     fixed set, a route the router declares, a status code, and a
//     series count under fuzzSeriesMax.
//
// The server and its database are set up once per process (a fuzz
// worker runs many inputs); at the end, with the server, the caches and
// the pool closed, no goroutine started since the target began remains.
//
// Placeholders in the path reach state a random string never would:
// {S} a fresh upload session of team/app (cancelled after the input),
// {D} the digest of the input's body, {B} a blob team/app references,
// {O} the operation that published {B}. The method and path go out
// through net/http when it can express them; otherwise, and whenever the
// input declares its own Content-Length (clen >= 0: a short body is cut
// by a half-close, a long one leaves bytes after the request), on a raw
// connection.
func FuzzOCIHandlers(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s.method, s.path, s.authn, s.contentType, s.rng, s.contentRange, s.clen, s.chunked, s.body)
	}
	e := fuzzSetup(f)
	f.Fuzz(func(t *testing.T, method, path string, authn uint8, contentType, rng, contentRange string, clen int64, chunked bool, body []byte) {
		if len(body) > 1<<20 {
			body = body[:1<<20]
		}
		before := goleak.IgnoreCurrent()
		in := e.expand(t, fuzzInput{method: method, path: path, authn: authn, contentType: contentType,
			rng: rng, contentRange: contentRange, clen: clen, chunked: chunked, body: body})
		a := e.send(t, in)
		t.Logf("%s: %s", in, a)
		e.check(t, in, a)
		e.cleanup(t, in, a)
		e.client.CloseIdleConnections()
		if err := findLeaks(append(fuzzLingering(), before)...); err != nil {
			t.Fatalf("%s: goroutines left behind: %v", in, err)
		}
		e.poolReturned(t, in)
		e.checkMetrics(t)
	})
}

// fuzzSeriesMax bounds the series of the blobplane_http_* families over a
// whole run: routes × methods × statuses is far below it, while a label
// copied from a client would pass it within seconds of fuzzing.
const fuzzSeriesMax = 1000

// The Authorization headers an input chooses from (authn mod authChoices).
const (
	authNone = iota
	authWriter
	authReader
	authAdmin
	authGarbage
	authTampered
	authBadBasic
	authEmptyBearer
	authChoices
)

type fuzzInput struct {
	method, path                   string
	authn                          uint8
	contentType, rng, contentRange string
	clen                           int64 // < 0: the body's own length
	chunked                        bool
	body                           []byte
	session                        string // the id {S} stood for
}

func (in fuzzInput) String() string {
	p := in.path
	if len(p) > 200 {
		p = p[:200] + fmt.Sprintf("...(%d bytes)", len(in.path))
	}
	m := in.method
	if len(m) > 40 {
		m = m[:40] + fmt.Sprintf("...(%d bytes)", len(in.method))
	}
	return fmt.Sprintf("%q %q auth=%d ct=%q range=%q content-range=%q clen=%d chunked=%v body=%d bytes",
		m, p, in.authn%authChoices, in.contentType, in.rng, in.contentRange, in.clen, in.chunked, len(in.body))
}

type fuzzAnswer struct {
	status int
	header http.Header
	body   []byte
	// refused: net/http refused the request before routing it and closed
	// the connection on bytes it had not read; the reset cut or lost its
	// answer (fuzzEnv.cut).
	refused bool
}

func (a fuzzAnswer) String() string {
	if a.refused {
		return "no answer (refused before routing)"
	}
	return fmt.Sprintf("%d %.300s", a.status, a.body)
}

type fuzzEnv struct {
	st      *store.Store
	srv     *httptest.Server
	client  *http.Client
	metrics *handlers.Metrics
	// routes are the patterns the router declares (chi.Walk), the only
	// route label values besides "unmatched".
	routes map[string]bool
	authz  [authChoices]string // Authorization header by choice ("" none)
	blob   string              // {B}
	blobC  []byte              // its content
	op     string              // {O}
	routed atomic.Int64        // requests that reached the router
}

func fuzzSetup(f *testing.F) *fuzzEnv {
	f.Helper()
	// Registered first, so it runs last: after the server, the caches,
	// the backend and the pool are closed.
	base := goleak.IgnoreCurrent()
	f.Cleanup(func() {
		if err := findLeaks(base); err != nil {
			f.Errorf("goroutines left after the server and the pool closed: %v", err)
		}
	})
	ctx := context.Background()
	st := pgtest.NewStore(f)
	for _, repo := range []string{"team/app", "team/other", "other/x"} {
		if err := st.CreateRepository(ctx, repo); err != nil {
			f.Fatal(err)
		}
	}
	lease, err := st.AcquireLease(ctx, "p-0001", "node-a", "node-a:7443", time.Hour, 3*time.Second)
	if err != nil {
		f.Fatal(err)
	}
	raw, err := fs.Open(f.TempDir(), backend.StoreAsSubmitted)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { raw.Close() })
	home := &staticHome{lease: upload.Home{Partition: "p-0001", Node: "node-a", Epoch: lease.Epoch}}
	home.home.Store(true)

	// As app.New wires a node: metrics with the caches' and the batches'
	// collectors, both caches LISTENing, the routing query and the admin
	// routes beside the blob API.
	e := &fuzzEnv{st: st, metrics: handlers.NewMetrics(), routes: map[string]bool{}}
	e.metrics.RegisterCache("auth", st.AuthCacheStats)
	e.metrics.RegisterCache("existence", st.ExistenceCacheStats)
	e.metrics.RegisterBatches("finalize", st.FinalizeBatchStats)
	e.metrics.RegisterBatches("claim", st.ClaimBatchStats)
	e.metrics.RegisterChainedCloses(st.ChainedCloses)
	stopCaches := st.StartCaches(ctx, store.CacheOptions{Auth: &store.AuthCacheOptions{}, Existence: &store.ExistenceCacheOptions{}})
	f.Cleanup(stopCaches)
	router := handlers.NewRouter(handlers.Deps{
		Metrics: e.metrics, Readiness: st, NodeID: "node-a",
		Placements: st, Datacenter: "eu-1", Auth: st, Repositories: st,
		// Garbage credentials are part of every run: the failure limiter
		// would soon refuse this one client address everything (429,
		// which passes) and hide the handlers behind it.
		AuthFailures:    handlers.FailureLimit{Burst: 1 << 30, Per: time.Second},
		BodyIdleTimeout: 5 * time.Second,
		OCI:             &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": raw}, Backend: "fs", Datacenter: "eu-1", Home: home, MaxBlobSize: 1 << 20}},
	})
	routes, ok := router.(chi.Routes)
	if !ok {
		f.Fatalf("NewRouter returned %T, not a chi router", router)
	}
	if err := chi.Walk(routes, func(_, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		e.routes[routeLabel(route)] = true
		return nil
	}); err != nil {
		f.Fatal(err)
	}
	// The api listener's limits (app.New).
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.routed.Add(1)
		router.ServeHTTP(w, r)
	}))
	e.srv.Config.ReadHeaderTimeout = 10 * time.Second
	e.srv.Config.MaxHeaderBytes = 64 << 10
	e.srv.Config.IdleTimeout = 2 * time.Minute
	e.srv.Start()
	f.Cleanup(e.srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	f.Cleanup(tr.CloseIdleConnections)
	e.client = &http.Client{Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	writer := fuzzToken(f, st, "alice", "team/*:write")
	basic := func(tok string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("oras:"+tok)) }
	e.authz[authWriter] = basic(writer)
	e.authz[authReader] = "Bearer " + fuzzToken(f, st, "bob", "team/*:read")
	e.authz[authAdmin] = "Bearer " + fuzzToken(f, st, "root", "*:admin")
	e.authz[authGarbage] = "Bearer not-a-token"
	last := byte('A')
	if writer[len(writer)-1] == last {
		last = 'B'
	}
	e.authz[authTampered] = basic(writer[:len(writer)-1] + string(last)) // a real id, a wrong secret
	e.authz[authBadBasic] = "Basic !!!"
	e.authz[authEmptyBearer] = "Bearer "

	// {B} and {O}: a 4 KiB blob published through a session, so a
	// Range has bytes to cut.
	e.blobC = bytes.Repeat([]byte("fuzz blob 0123456789abcdef\n"), 160)
	e.blob = ociDigest(string(e.blobC))
	a := e.do(f, "POST", "/v2/team/app/blobs/uploads/", e.authz[authWriter], nil)
	e.op = a.header.Get("Docker-Upload-UUID")
	if a.status != http.StatusAccepted || e.op == "" {
		f.Fatalf("open {O}'s session: %d %s", a.status, a.body)
	}
	if a := e.do(f, "PUT", "/v2/team/app/blobs/uploads/"+e.op+"?digest="+e.blob, e.authz[authWriter], e.blobC); a.status != http.StatusCreated {
		f.Fatalf("publish {B}: %d %s", a.status, a.body)
	}
	if a := e.do(f, "GET", "/metrics", "", nil); a.status != http.StatusOK || !bytes.Contains(a.body, []byte("blobplane_http_requests_total")) {
		f.Fatalf("/metrics: %d", a.status)
	}
	tr.CloseIdleConnections()
	return e
}

// routeLabel is the label chi's RoutePattern gives a request the route
// pattern matched: no inner "/*/", no trailing slash.
func routeLabel(pattern string) string {
	for strings.Contains(pattern, "/*/") {
		pattern = strings.ReplaceAll(pattern, "/*/", "/")
	}
	if pattern != "/" {
		pattern = strings.TrimSuffix(strings.TrimSuffix(pattern, "//"), "/")
	}
	return pattern
}

// fuzzLingering are goroutines that outlive an input by design and end
// on their own, checked once everything is closed: a pooled connection's
// (pgx's background reader waits for the next byte from Postgres; a
// connection closed on a cancelled context sends its cancel request), and
// a connection net/http answered with an error of its own, which it
// keeps half a second before closing (conn.closeWriteAndWait). Other
// pool goroutines (a connection being built) end while goleak retries.
func fuzzLingering() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn.(*PgConn).asyncClose.func1"),
		goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"),
	}
}

// findLeaks is goleak.Find for up to 5 seconds, longer than goleak's own
// retries wait (under half a second): at the end, connections net/http
// answered with an error of its own linger half a second
// (conn.closeWriteAndWait).
func findLeaks(opts ...goleak.Option) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

func fuzzToken(tb testing.TB, st *store.Store, principal string, grants ...string) string {
	tb.Helper()
	gs, err := auth.ParseGrants(grants)
	if err != nil {
		tb.Fatal(err)
	}
	tok, _, err := st.CreateToken(context.Background(), principal, gs)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// do is a well-formed request of the harness itself (setup, {S},
// cleanup), checked like an input's.
func (e *fuzzEnv) do(tb testing.TB, method, path, authz string, body []byte) fuzzAnswer {
	tb.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	a := fuzzAnswer{status: resp.StatusCode, header: resp.Header, body: b}
	if err := answerProblem(method, path, a); err != nil {
		tb.Fatalf("harness request %s %s: %v", method, path, err)
	}
	return a
}

// expand replaces the placeholders of in.path; {S} opens a session.
func (e *fuzzEnv) expand(t *testing.T, in fuzzInput) fuzzInput {
	if strings.Contains(in.path, "{S}") {
		a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", e.authz[authWriter], nil)
		in.session = a.header.Get("Docker-Upload-UUID")
		if a.status != http.StatusAccepted || in.session == "" {
			t.Fatalf("open {S}: %d %s", a.status, a.body)
		}
	}
	in.path = strings.NewReplacer("{S}", in.session, "{D}", ociDigest(string(in.body)), "{B}", e.blob, "{O}", e.op).Replace(in.path)
	return in
}

// header is in's header, values stripped of CR and LF: request framing
// is net/http's to defend, not the handlers'.
func (e *fuzzEnv) header(in fuzzInput) http.Header {
	h := http.Header{}
	clean := strings.NewReplacer("\r", "", "\n", "")
	set := func(k, v string) {
		if v = clean.Replace(v); v != "" {
			h.Set(k, v)
		}
	}
	set("Authorization", e.authz[in.authn%authChoices])
	set("Content-Type", in.contentType)
	set("Range", in.rng)
	set("Content-Range", in.contentRange)
	return h
}

// send sends in through net/http when it can express it, else on a raw
// connection.
func (e *fuzzEnv) send(t *testing.T, in fuzzInput) fuzzAnswer {
	h := e.header(in)
	if in.clen >= 0 || !clientCanSend(in.method, in.path, h) {
		return e.sendRaw(t, in, h)
	}
	var body io.Reader = bytes.NewReader(in.body)
	if in.chunked {
		body = io.MultiReader(body) // no length: chunked
	}
	req, err := http.NewRequest(in.method, e.srv.URL+in.path, body)
	if err != nil {
		t.Fatalf("%s: %v", in, err)
	}
	req.Header = h
	routed := e.routed.Load()
	resp, err := e.client.Do(req)
	if err != nil {
		return e.cut(t, in, routed, "no answer", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return e.cut(t, in, routed, "answer cut short", err)
	}
	return fuzzAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *fuzzEnv) sendRaw(t *testing.T, in fuzzInput, h http.Header) fuzzAnswer {
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n", in.method, in.path)
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&req, "%s: %s\r\n", k, v)
		}
	}
	switch {
	case in.chunked:
		req.WriteString("Transfer-Encoding: chunked\r\n")
		if in.clen >= 0 { // both, as a smuggling attempt sends them
			fmt.Fprintf(&req, "Content-Length: %d\r\n", in.clen)
		}
	case in.clen >= 0:
		fmt.Fprintf(&req, "Content-Length: %d\r\n", in.clen)
	default:
		fmt.Fprintf(&req, "Content-Length: %d\r\n", len(in.body))
	}
	req.WriteString("\r\n")
	if in.chunked {
		cw := httputil.NewChunkedWriter(&req)
		cw.Write(in.body)
		cw.Close()
		req.WriteString("\r\n")
	} else {
		req.Write(in.body)
	}
	routed := e.routed.Load()
	cut := func(what string, err error) fuzzAnswer { return e.cut(t, in, routed, what, err) }
	if _, err := conn.Write(req.Bytes()); err != nil {
		return cut("send", err)
	}
	if !in.chunked && in.clen > int64(len(in.body)) {
		// A body shorter than declared: the client is done sending.
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			return cut("half-close", err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: in.method})
	if err != nil {
		return cut("no answer on the raw connection", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return cut("answer cut short", err)
	}
	return fuzzAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// cut is the answer to a request whose connection failed: a request
// net/http refuses before routing it (a malformed request line, a header
// past MaxHeaderBytes) is answered with its own text and the connection
// closed on whatever was not read, and the reset may cut or lose that
// answer. An answer of the router (routed moved) must never be cut.
func (e *fuzzEnv) cut(t *testing.T, in fuzzInput, routed int64, what string, err error) fuzzAnswer {
	if e.routed.Load() != routed {
		t.Fatalf("%s: %s: %v", in, what, err)
	}
	t.Logf("%s: refused by net/http before routing, connection reset: %v", in, err)
	return fuzzAnswer{refused: true}
}

// clientCanSend reports whether net/http sends method, path and h as
// they are.
func clientCanSend(method, path string, h http.Header) bool {
	if method == "" || strings.IndexFunc(method, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
		return false
	}
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") {
		return false
	}
	for i := 0; i < len(path); i++ {
		if path[i] <= ' ' || path[i] >= 0x7f { // net/http would send it as it is
			return false
		}
	}
	u, err := url.Parse("http://fuzz" + path)
	if err != nil || u.RequestURI() != path {
		return false
	}
	for _, vs := range h {
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
					return false
				}
			}
		}
	}
	return true
}

func isTokenChar(r rune) bool {
	return r < 0x7f && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

func (e *fuzzEnv) check(t *testing.T, in fuzzInput, a fuzzAnswer) {
	echo := strings.Join([]string{in.method, in.path, in.contentType, in.rng, in.contentRange}, "\n")
	if err := answerProblem(in.method, echo, a); err != nil {
		t.Fatalf("%s: %v", in, err)
	}
}

// answerProblem says what is wrong with an answer to method, nil when
// nothing is; echo is what the request said, which an answer may repeat.
func answerProblem(method, echo string, a fuzzAnswer) error {
	switch {
	case a.status < 500:
	case (a.status == http.StatusServiceUnavailable || a.status == http.StatusGatewayTimeout) && a.header.Get("Retry-After") != "":
	default:
		return fmt.Errorf("status %d (Retry-After %q): %.2000s", a.status, a.header.Get("Retry-After"), a.body)
	}
	for _, leak := range []string{"goroutine ", "panic", "runtime error", "SQLSTATE", ".go:"} {
		if bytes.Contains(a.body, []byte(leak)) && !strings.Contains(echo, leak) {
			return fmt.Errorf("status %d: the answer shows %q: %.2000s", a.status, leak, a.body)
		}
	}
	// Answers of net/http itself (a malformed request, a header too
	// large) carry no request id and are its own text.
	if a.status < 400 || a.header.Get("X-Request-Id") == "" || method == http.MethodHead {
		return nil
	}
	if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("status %d: error answer of type %q: %.2000s", a.status, ct, a.body)
	}
	var doc struct {
		handlers.OCIErrorBody
		handlers.ErrorBody
	}
	dec := json.NewDecoder(bytes.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("status %d: error answer is not a JSON error document (%v): %.2000s", a.status, err, a.body)
	}
	switch {
	case len(doc.Errors) > 0 && doc.Code == "":
		for _, x := range doc.Errors {
			if x.Code == "" {
				return fmt.Errorf("status %d: OCI error without a code: %s", a.status, a.body)
			}
		}
	case len(doc.Errors) == 0 && doc.Code != "":
	default:
		return fmt.Errorf("status %d: neither an OCI error document nor ErrorBody: %s", a.status, a.body)
	}
	return nil
}

// uploadPath matches the Location of an open upload session.
var uploadPath = regexp.MustCompile(`^/v2/(.+)/blobs/uploads/([^/?]+)$`)

// cleanup cancels the sessions the input opened (the per-principal bound
// on open sessions would otherwise end every later POST at 429) and
// publishes {B} again after a DELETE.
func (e *fuzzEnv) cleanup(t *testing.T, in fuzzInput, a fuzzAnswer) {
	if in.session != "" {
		e.do(t, "DELETE", "/v2/team/app/blobs/uploads/"+in.session, e.authz[authAdmin], nil)
	}
	if m := uploadPath.FindStringSubmatch(a.header.Get("Location")); m != nil && m[2] != in.session {
		e.do(t, "DELETE", m[0], e.authz[authAdmin], nil)
	}
	if in.method == http.MethodDelete {
		if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+e.blob, e.authz[authWriter], e.blobC); a.status != http.StatusCreated {
			t.Fatalf("publish {B} again: %d %s", a.status, a.body)
		}
	}
}

// poolReturned fails when a connection the input's requests acquired is
// still held once they were answered (a chained close not released, a
// transaction left open), polling while a handler that answered first
// finishes.
func (e *fuzzEnv) poolReturned(t *testing.T, in fuzzInput) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := e.st.Pool().Stat().AcquiredConns()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d database connections still held after the answer", in, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// fuzzMethods are the method label's values (handlers.methodLabel).
var fuzzMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true, "OTHER": true}

// checkMetrics fails when a blobplane_http_* label holds anything but a
// bounded value, or the series outnumber fuzzSeriesMax.
func (e *fuzzEnv) checkMetrics(t *testing.T) {
	mfs, err := e.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "blobplane_http_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			series++
			for _, l := range m.GetLabel() {
				v := l.GetValue()
				switch l.GetName() {
				case "method":
					if !fuzzMethods[v] {
						t.Fatalf("%s: method label %.200q", mf.GetName(), v)
					}
				case "route":
					if v != "unmatched" && !e.routes[v] {
						t.Fatalf("%s: route label %.200q is no route of the router", mf.GetName(), v)
					}
				case "status":
					if n, err := strconv.Atoi(v); err != nil || n < 100 || n > 599 {
						t.Fatalf("%s: status label %.200q", mf.GetName(), v)
					}
				default:
					t.Fatalf("%s: unexpected label %s=%.200q", mf.GetName(), l.GetName(), v)
				}
			}
		}
	}
	if series > fuzzSeriesMax {
		t.Fatalf("%d blobplane_http_* series, more than %d", series, fuzzSeriesMax)
	}
}

type fuzzSeed struct {
	method, path                   string
	authn                          uint8
	contentType, rng, contentRange string
	clen                           int64
	chunked                        bool
	body                           []byte
}

// fuzzSeeds cover every route and method of the blob API, the operation
// and routing queries, and the malformed requests the issue names.
func fuzzSeeds() []fuzzSeed {
	const oct = "application/octet-stream"
	chunk := []byte("0123456789")
	s := func(method, path string, authn uint8) fuzzSeed {
		return fuzzSeed{method: method, path: path, authn: authn, clen: -1}
	}
	with := func(x fuzzSeed, mod func(*fuzzSeed)) fuzzSeed { mod(&x); return x }
	return []fuzzSeed{
		// The base and the upload flows.
		s("GET", "/v2/", authReader),
		s("GET", "/v2/", authNone),
		s("POST", "/v2/team/app/blobs/uploads/", authWriter),
		with(s("POST", "/v2/team/app/blobs/uploads/?digest={D}", authWriter), func(x *fuzzSeed) { x.body, x.contentType = chunk, oct }),
		with(s("POST", "/v2/team/app/blobs/uploads/?digest={D}", authWriter), func(x *fuzzSeed) { x.body, x.chunked = chunk, true }),
		with(s("POST", "/v2/team/app/blobs/uploads/?digest=sha256:"+strings.Repeat("0", 64), authWriter), func(x *fuzzSeed) { x.body = chunk }),
		with(s("PATCH", "/v2/team/app/blobs/uploads/{S}", authWriter), func(x *fuzzSeed) { x.body, x.contentRange, x.contentType = chunk, "0-9", oct }),
		with(s("PATCH", "/v2/team/app/blobs/uploads/{S}", authWriter), func(x *fuzzSeed) { x.body, x.contentRange = chunk, "5-14" }),
		with(s("PATCH", "/v2/team/app/blobs/uploads/{S}", authWriter), func(x *fuzzSeed) { x.body, x.contentRange = chunk, "bytes=-3-99999999999999999999" }),
		with(s("PATCH", "/v2/team/app/blobs/uploads/{S}", authWriter), func(x *fuzzSeed) { x.body, x.chunked = chunk, true }),
		with(s("PUT", "/v2/team/app/blobs/uploads/{S}?digest={D}", authWriter), func(x *fuzzSeed) { x.body = chunk }),
		s("PUT", "/v2/team/app/blobs/uploads/{S}?digest={D}", authWriter),
		with(s("PUT", "/v2/team/app/blobs/uploads/{S}?digest={B}", authWriter), func(x *fuzzSeed) { x.body = chunk }),
		with(s("PUT", "/v2/team/app/blobs/uploads/{S}?digest=sha256:xyz", authWriter), func(x *fuzzSeed) { x.body = chunk }),
		s("GET", "/v2/team/app/blobs/uploads/{S}", authWriter),
		s("DELETE", "/v2/team/app/blobs/uploads/{S}", authWriter),
		s("GET", "/v2/team/app/blobs/uploads/not-a-session", authWriter),
		s("POST", "/v2/team/other/blobs/uploads/?mount={B}&from=team/app", authWriter),
		s("POST", "/v2/team/other/blobs/uploads/?mount={B}&from=other/x", authWriter),
		s("POST", "/v2/team/other/blobs/uploads/?mount=sha256:zz&from=..", authWriter),
		// Reads.
		s("GET", "/v2/team/app/blobs/{B}", authReader),
		s("HEAD", "/v2/team/app/blobs/{B}", authReader),
		with(s("GET", "/v2/team/app/blobs/{B}", authReader), func(x *fuzzSeed) { x.rng = "bytes=7-" }),
		with(s("GET", "/v2/team/app/blobs/{B}", authReader), func(x *fuzzSeed) { x.rng = "bytes=-5" }),
		with(s("GET", "/v2/team/app/blobs/{B}", authReader), func(x *fuzzSeed) { x.rng = "bytes=99999-" }),
		with(s("GET", "/v2/team/app/blobs/{B}", authReader), func(x *fuzzSeed) { x.rng = "bytes=0-1,5-9" }),
		with(s("GET", "/v2/team/app/blobs/{B}", authReader), func(x *fuzzSeed) { x.rng = "bytes=9223372036854775807-" }),
		s("GET", "/v2/team/other/blobs/{B}", authReader),
		s("GET", "/v2/team/app/blobs/sha256:abc", authReader),
		s("GET", "/v2/Team/App/blobs/{B}", authReader),
		s("DELETE", "/v2/team/app/blobs/{B}", authWriter),
		s("DELETE", "/v2/team/app/blobs/{B}", authReader),
		// Operations and the routing query.
		s("GET", "/v1/operations/{O}", authReader),
		s("GET", "/v1/operations/{S}", authWriter),
		s("GET", "/v1/operations/x", authGarbage),
		s("GET", "/v1/blobs/{B}/placements", authReader),
		s("GET", "/v1/blobs/{B}/placements?datacenter=EU", authAdmin),
		s("GET", "/v1/blobs/sha256:0/placements", authNone),
		// Operational endpoints and strangers.
		s("GET", "/healthz", authNone),
		s("GET", "/readyz", authNone),
		s("GET", "/v1/admin/repositories", authAdmin),
		s("OPTIONS", "/v2/team/app/blobs/uploads/", authWriter),
		s("BREW", "/v2/team/app/blobs/{B}", authWriter),
		s("PROPFIND", "/v2/", authReader),
		s("G\x00T", "/v2/", authWriter),
		s("GET POST", "/v2/", authWriter),
		s(strings.Repeat("M", 4096), "/v2/team/app/blobs/uploads/", authWriter),
		s("GET", "/v2/"+strings.Repeat("a/", 4000)+"blobs/{B}", authReader),
		s("GET", "/v2/"+strings.Repeat("b", 70<<10), authReader), // past MaxHeaderBytes
		s("GET", "/v2/team/app/blobs/%zz", authReader),
		s("GET", "/v2/team%2Fapp/blobs/{B}", authReader),
		s("GET", "http://elsewhere/v2/team/app/blobs/{B}", authReader),
		s("GET", "*", authNone),
		// Credentials.
		s("POST", "/v2/team/app/blobs/uploads/", authTampered),
		s("POST", "/v2/team/app/blobs/uploads/", authBadBasic),
		s("POST", "/v2/team/app/blobs/uploads/", authEmptyBearer),
		s("POST", "/v2/team/app/blobs/uploads/", authReader),
		s("POST", "/v2/other/x/blobs/uploads/", authWriter),
		// Bodies that lie about their length.
		with(s("POST", "/v2/team/app/blobs/uploads/?digest={D}", authWriter), func(x *fuzzSeed) { x.body, x.clen = chunk, 1<<40 }),
		with(s("POST", "/v2/team/app/blobs/uploads/?digest={D}", authWriter), func(x *fuzzSeed) { x.body, x.clen = chunk, 100 }),
		with(s("PUT", "/v2/team/app/blobs/uploads/{S}?digest={D}", authWriter), func(x *fuzzSeed) { x.body, x.clen = chunk, 3 }),
		with(s("PATCH", "/v2/team/app/blobs/uploads/{S}", authWriter), func(x *fuzzSeed) { x.body, x.clen, x.contentRange = chunk, 64, "0-63" }),
		with(s("PATCH", "/v2/team/app/blobs/uploads/{S}", authWriter), func(x *fuzzSeed) { x.body, x.clen, x.chunked = chunk, 10, true }),
	}
}
