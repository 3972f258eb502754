package handlers_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

var (
	_ handlers.IdentityAdmin   = (*store.Store)(nil)
	_ handlers.RepositoryAdmin = (*store.Store)(nil)
	_ handlers.ClusterAdmin    = (*controller.Admin)(nil)
)

// adminAPI is an api serving the admin API (tokens, grants, repositories,
// takeover, plan, apply) and the blob API, over one database whose
// partition p-0001 is leased to node-a (homeFixture). Two tenants:
// team-a, with an admin (leadA) and a writer (writerA), and team-b; root
// holds *:admin.
type adminAPI struct {
	st                     *store.Store
	srv                    *httptest.Server
	oci                    *ociEnv
	root, leadA, writerA   string
	signer                 authority.Signer
	repoA, repoFull, repoB string
}

func adminAPISetup(t *testing.T) *adminAPI {
	t.Helper()
	st, raw, home := homeFixture(t, "team-a/x", "team-a/full", "team-b/x")
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, Repositories: st, Cluster: &controller.Admin{Store: st},
		OCI: &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": raw}, Backend: "fs", Datacenter: "eu-1", Home: home}}}))
	t.Cleanup(srv.Close)
	return &adminAPI{st: st, srv: srv, oci: &ociEnv{st: st, srv: srv, home: home},
		root: token(t, st, "root", "*:admin"), leadA: token(t, st, "lead-a", "team-a/*:admin"), writerA: token(t, st, "ci-a", "team-a/*:write"),
		repoA: "team-a/x", repoFull: "team-a/full", repoB: "team-b/x"}
}

// do sends an admin request: a write always carries the Content-Type the
// admin surface requires (issue 26 point 7), so what is checked is
// authentication and permission, not the media type.
func (e *adminAPI) do(t *testing.T, method, path, body, cred string) answer {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// decode unmarshals a's body into v, failing unless a has status.
func decode(t *testing.T, what string, a answer, status int, v any) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: %d %s; want %d", what, a.status, a.body, status)
	}
	if err := json.Unmarshal([]byte(a.body), v); err != nil {
		t.Fatalf("%s: %v in %s", what, err, a.body)
	}
}

// whoami is GET /v1/whoami as cred: the principal and its grants, sorted.
func (e *adminAPI) whoami(t *testing.T, cred string) handlers.PrincipalJSON {
	t.Helper()
	var p handlers.PrincipalJSON
	decode(t, "whoami", e.do(t, "GET", "/v1/whoami", "", cred), 200, &p)
	slices.Sort(p.Grants)
	return p
}

// publishMap publishes a signed map of four partitions served by n_a.
func (e *adminAPI) publishMap(t *testing.T) *authority.Map {
	t.Helper()
	ctx := context.Background()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	key := authority.TrustedKey{KeyID: "admin-api", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	if err := e.st.PublishSigningKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: now, SlotBits: 12, Partitions: 4,
		Nodes: []authority.NodeAddr{{Node: "n_a", Endpoint: "10.0.0.1:7443"}},
		Class: "standard", Mode: authority.ModeDerived, State: authority.PrimaryServing, Epoch: 1}.Build()
	if err != nil {
		t.Fatal(err)
	}
	e.signer = authority.Signer{KeyID: key.KeyID, Key: priv}
	if err := e.signer.SignMap(m); err != nil {
		t.Fatal(err)
	}
	if err := e.st.PublishMap(ctx, m); err != nil {
		t.Fatal(err)
	}
	return m
}

const takeoverPath = "/v1/admin/partitions/p-0001/takeover"

// newAdminRoutes are the routes this file covers, each with a request
// that would change something were it allowed: a team admin may not
// mint a *:admin token, grant itself *:admin, take a partition over or
// move partitions, nor delete team-b's repository, nor read or raise the
// cluster's format level.
var newAdminRoutes = []struct{ method, path, body string }{
	{"GET", "/v1/admin/tokens", ""},
	{"POST", "/v1/admin/tokens", `{"principal": "lead-a", "grants": ["*:admin"]}`},
	{"DELETE", "/v1/admin/tokens/aaaaaaaaaaaaaaaa", ""},
	{"GET", "/v1/admin/grants", ""},
	{"POST", "/v1/admin/grants", `{"principal": "lead-a", "grants": ["*:admin"]}`},
	{"DELETE", "/v1/admin/grants?principal=root&grant=*:admin", ""},
	{"POST", takeoverPath, `{"node": "node-b", "endpoint": "10.0.0.2:7443", "reason": "mine now"}`},
	{"GET", "/v1/admin/plan", ""},
	{"POST", "/v1/admin/plan/apply", `{"override_reason": "move everything"}`},
	{"GET", "/v1/admin/plan/apply/1", ""},
	{"DELETE", "/v1/admin/repositories/team-b/x", ""},
	{"GET", "/v1/admin/cluster/format", ""},
	{"POST", "/v1/admin/cluster/format", `{"level": 2}`},
}

// Two tenants and a stranger: anonymous callers get 401 (Bearer only)
// everywhere; team-a's admin gets 403 on every global route and on
// team-b's repository, and nothing changed; team-a's writer gets 403
// everywhere under /v1/admin; team-a's admin deletes its own empty
// repository.
func TestAdminAPITwoTenantsAndAStranger(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	ctx := context.Background()
	before, err := e.st.Lease(ctx, "p-0001")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range newAdminRoutes {
		what := c.method + " " + c.path
		wantAdminUnauthorized(t, what+" anonymously", e.do(t, c.method, c.path, c.body, ""))
		wantCode(t, what+" as team-a's admin", e.do(t, c.method, c.path, c.body, e.leadA), 403, "forbidden")
		wantCode(t, what+" as team-a's writer", e.do(t, c.method, c.path, c.body, e.writerA), 403, "forbidden")
	}
	wantAdminUnauthorized(t, "whoami anonymously", e.do(t, "GET", "/v1/whoami", "", ""))
	wantAdminUnauthorized(t, "whoami with garbage", e.do(t, "GET", "/v1/whoami", "", "not-a-token"))
	wantCode(t, "team-a's writer deletes team-a/x", e.do(t, "DELETE", "/v1/admin/repositories/"+e.repoA, "", e.writerA), 403, "forbidden")

	// Nothing the refused requests asked for happened.
	if p := e.whoami(t, e.leadA); !slices.Equal(p.Grants, []string{"team-a/*:admin"}) {
		t.Errorf("team-a's admin now holds %q", p.Grants)
	}
	if gs, err := e.st.ListPrincipalGrants(ctx, ""); err != nil || len(gs) != 0 {
		t.Errorf("principal grants after the refusals: %+v %v", gs, err)
	}
	if toks, err := e.st.ListTokens(ctx, "lead-a"); err != nil || len(toks) != 1 {
		t.Errorf("lead-a's tokens after the refusals: %+v %v", toks, err)
	}
	if after, err := e.st.Lease(ctx, "p-0001"); err != nil || after.Epoch != before.Epoch || after.OwnerNode != "node-a" {
		t.Errorf("lease after the refusals: %+v %v", after, err)
	}
	if ok, err := e.st.RepositoryExists(ctx, e.repoB); err != nil || !ok {
		t.Errorf("team-b/x after the refusals: %v %v", ok, err)
	}

	// Its own empty repository, team-a's admin may delete: once.
	if a := e.do(t, "DELETE", "/v1/admin/repositories/"+e.repoA, "", e.leadA); a.status != 204 {
		t.Fatalf("team-a's admin deletes team-a/x: %d %s", a.status, a.body)
	}
	if ok, err := e.st.RepositoryExists(ctx, e.repoA); err != nil || ok {
		t.Errorf("team-a/x after its deletion: %v %v", ok, err)
	}
	wantCode(t, "delete team-a/x again", e.do(t, "DELETE", "/v1/admin/repositories/"+e.repoA, "", e.leadA), 404, "not_found")
	wantCode(t, "delete a malformed name", e.do(t, "DELETE", "/v1/admin/repositories/team-a/X", "", e.root), 400, "invalid")
}

// *:admin mints a token whose secret authenticates with exactly the
// grants given, lists it without its secret, revokes it, and the
// revoked token is refused; malformed requests are 400 with a stable
// code and create nothing.
func TestAdminAPITokens(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	ctx := context.Background()

	var created handlers.CreatedTokenJSON
	decode(t, "create", e.do(t, "POST", "/v1/admin/tokens", `{"principal": "deploy", "grants": ["team-a/*:write", "shared/base:read"]}`, e.root), 201, &created)
	if created.Principal != "deploy" || !auth.ValidTokenID(created.ID) || !slices.Equal(created.Grants, []string{"team-a/*:write", "shared/base:read"}) {
		t.Fatalf("created: %+v", created)
	}
	if id, err := auth.TokenIDOf(created.Token); err != nil || id != created.ID {
		t.Fatalf("the token %q is not token %s: %v", created.Token, created.ID, err)
	}
	if p := e.whoami(t, created.Token); p.Principal != "deploy" || !slices.Equal(p.Grants, []string{"shared/base:read", "team-a/*:write"}) {
		t.Fatalf("whoami with the new token: %+v", p)
	}
	var p handlers.PrincipalJSON
	if decode(t, "whoami over Basic", call(t, e.srv, "GET", "/v1/whoami", "", "basic:"+created.Token), 200, &p); p.Principal != "deploy" {
		t.Fatalf("whoami over Basic: %+v", p)
	}

	// Listed, never with its secret.
	secret := created.Token[strings.LastIndexByte(created.Token, '_')+1:]
	for _, path := range []string{"/v1/admin/tokens", "/v1/admin/tokens?principal=deploy"} {
		a := e.do(t, "GET", path, "", e.root)
		var list handlers.TokensBody
		decode(t, "list "+path, a, 200, &list)
		if strings.Contains(a.body, secret) {
			t.Fatalf("%s shows a secret: %s", path, a.body)
		}
		i := slices.IndexFunc(list.Tokens, func(tj handlers.TokenJSON) bool { return tj.ID == created.ID })
		if i < 0 || list.Tokens[i].Principal != "deploy" || list.Tokens[i].CreatedAt.IsZero() || list.Tokens[i].RevokedAt != nil ||
			!slices.Equal(list.Tokens[i].Grants, []string{"shared/base:read", "team-a/*:write"}) && !slices.Equal(list.Tokens[i].Grants, []string{"team-a/*:write", "shared/base:read"}) {
			t.Fatalf("%s: %s", path, a.body)
		}
		if path == "/v1/admin/tokens?principal=deploy" && len(list.Tokens) != 1 {
			t.Fatalf("deploy's tokens: %s", a.body)
		}
	}

	// Revoked: refused from the next request on; revoking again is fine.
	if a := e.do(t, "DELETE", "/v1/admin/tokens/"+created.ID, "", e.root); a.status != 204 {
		t.Fatalf("revoke: %d %s", a.status, a.body)
	}
	wantAdminUnauthorized(t, "whoami with the revoked token", e.do(t, "GET", "/v1/whoami", "", created.Token))
	if a := e.do(t, "DELETE", "/v1/admin/tokens/"+created.ID, "", e.root); a.status != 204 {
		t.Fatalf("revoke again: %d %s", a.status, a.body)
	}
	var list handlers.TokensBody
	decode(t, "list after the revocation", e.do(t, "GET", "/v1/admin/tokens?principal=deploy", "", e.root), 200, &list)
	if len(list.Tokens) != 1 || list.Tokens[0].RevokedAt == nil {
		t.Fatalf("after the revocation: %+v", list)
	}
	wantCode(t, "revoke an unknown id", e.do(t, "DELETE", "/v1/admin/tokens/"+auth.NewToken().ID, "", e.root), 404, "not_found")
	// The id only: a whole token in the path is refused, and not echoed.
	other := token(t, e.st, "other", "team-b/*:read")
	a := e.do(t, "DELETE", "/v1/admin/tokens/"+other, "", e.root)
	wantCode(t, "revoke by a whole token", a, 400, "invalid")
	if strings.Contains(a.body, other[len(other)-20:]) {
		t.Errorf("the refusal echoes the token: %s", a.body)
	}
	if p := e.whoami(t, other); p.Principal != "other" {
		t.Errorf("the token named in the path was revoked: %+v", p)
	}

	for _, c := range []struct{ what, body string }{
		{"malformed JSON", `{`},
		{"an invalid grant", `{"principal": "deploy", "grants": ["team-a/*:own"]}`},
		{"an invalid pattern", `{"principal": "deploy", "grants": ["Team/*:read"]}`},
		{"no principal", `{"grants": ["team-a/*:read"]}`},
		{"a malformed principal", `{"principal": "-deploy", "grants": ["team-a/*:read"]}`},
		{"a misspelt field", `{"principal": "deploy", "grant": ["*:admin"]}`},
		{"two documents", `{"principal": "deploy"} {}`},
	} {
		wantCode(t, "create with "+c.what, e.do(t, "POST", "/v1/admin/tokens", c.body, e.root), 400, "invalid")
	}
	wantCode(t, "list a malformed principal", e.do(t, "GET", "/v1/admin/tokens?principal=-x", "", e.root), 400, "invalid")
	if toks, err := e.st.ListTokens(ctx, "deploy"); err != nil || len(toks) != 1 {
		t.Errorf("deploy's tokens after the refusals: %d %v", len(toks), err)
	}
}

// Principal grants: given, listed, held by the principal's tokens,
// removed; malformed requests are 400.
func TestAdminAPIGrants(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	var got handlers.PrincipalJSON
	decode(t, "grant", e.do(t, "POST", "/v1/admin/grants", `{"principal": "ci-a", "grants": ["team-b/*:read", "team-b/x:write"]}`, e.root), 200, &got)
	if got.Principal != "ci-a" || !slices.Equal(got.Grants, []string{"team-b/*:read", "team-b/x:write"}) {
		t.Fatalf("grant: %+v", got)
	}
	if p := e.whoami(t, e.writerA); !slices.Equal(p.Grants, []string{"team-a/*:write", "team-b/*:read", "team-b/x:write"}) {
		t.Fatalf("ci-a's token after the grant: %+v", p)
	}
	var list handlers.PrincipalGrantsBody
	decode(t, "list", e.do(t, "GET", "/v1/admin/grants?principal=ci-a", "", e.root), 200, &list)
	if len(list.Grants) != 2 || list.Grants[0].Principal != "ci-a" || list.Grants[0].CreatedAt.IsZero() {
		t.Fatalf("list: %+v", list)
	}
	decode(t, "list everyone's", e.do(t, "GET", "/v1/admin/grants", "", e.root), 200, &list)
	if len(list.Grants) != 2 {
		t.Fatalf("list everyone's: %+v", list)
	}

	if a := e.do(t, "DELETE", "/v1/admin/grants?principal=ci-a&grant=team-b/*:read&grant=team-b/x:write", "", e.root); a.status != 204 {
		t.Fatalf("remove: %d %s", a.status, a.body)
	}
	if p := e.whoami(t, e.writerA); !slices.Equal(p.Grants, []string{"team-a/*:write"}) {
		t.Fatalf("ci-a's token after the removal: %+v", p)
	}
	decode(t, "list after the removal", e.do(t, "GET", "/v1/admin/grants?principal=ci-a", "", e.root), 200, &list)
	if len(list.Grants) != 0 {
		t.Fatalf("after the removal: %+v", list)
	}
	if a := e.do(t, "DELETE", "/v1/admin/grants?principal=ci-a&grant=team-b/*:read", "", e.root); a.status != 204 {
		t.Fatalf("remove a grant not held: %d %s", a.status, a.body)
	}

	for _, c := range []struct{ what, body string }{
		{"malformed JSON", `{"principal": `},
		{"no grants", `{"principal": "ci-a", "grants": []}`},
		{"an invalid grant", `{"principal": "ci-a", "grants": ["team-b/*"]}`},
		{"no principal", `{"grants": ["team-b/*:read"]}`},
	} {
		wantCode(t, "grant with "+c.what, e.do(t, "POST", "/v1/admin/grants", c.body, e.root), 400, "invalid")
	}
	for _, q := range []string{"", "?principal=ci-a", "?grant=team-b/*:read", "?principal=ci-a&grant=nope", "?principal=-x&grant=team-b/*:read"} {
		wantCode(t, "remove "+q, e.do(t, "DELETE", "/v1/admin/grants"+q, "", e.root), 400, "invalid")
	}
}

// A repository that still holds a blob reference is not deleted: the
// store's refusal (409 conflict), and it is still there.
func TestAdminAPIDeleteRepositoryWithReferences(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	content := "a blob that keeps its repository"
	if a := e.oci.do(t, "POST", "/v2/"+e.repoFull+"/blobs/uploads/?digest="+ociDigest(content), content, e.writerA, nil); a.status != 201 {
		t.Fatalf("push: %+v", a)
	}
	for _, cred := range []string{e.root, e.leadA} {
		wantCode(t, "delete a repository with a reference", e.do(t, "DELETE", "/v1/admin/repositories/"+e.repoFull, "", cred), 409, "conflict")
	}
	if ok, err := e.st.RepositoryExists(context.Background(), e.repoFull); err != nil || !ok {
		t.Fatalf("after the refusal: %v %v", ok, err)
	}
	if _, err := e.st.ReferencedBlob(context.Background(), e.repoFull, blobplane.Digest(ociDigest(content))); err != nil {
		t.Fatalf("the reference after the refusal: %v", err)
	}
}

// ZBP-5 R28: a takeover records the authenticated principal as its
// operator, whatever the body says; reason and node are required; an
// unknown partition gets no lease.
func TestAdminAPITakeover(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	ctx := context.Background()
	if _, err := e.st.RegisterNode(ctx, store.Node{ID: "node-b", Datacenter: "eu-1", Role: "api", Endpoint: "http://10.0.0.2:7443"}); err != nil {
		t.Fatal(err)
	}
	before, err := e.st.Lease(ctx, "p-0001")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, path, body string }{
		{"malformed JSON", takeoverPath, `{"node": `},
		{"no reason", takeoverPath, `{"node": "node-b"}`},
		{"an empty reason", takeoverPath, `{"node": "node-b", "reason": ""}`},
		{"no node", takeoverPath, `{"reason": "node-a is wedged"}`},
		{"a node without an endpoint", takeoverPath, `{"node": "node-z", "reason": "node-a is wedged"}`},
	} {
		wantCode(t, "takeover with "+c.what, e.do(t, "POST", c.path, c.body, e.root), 400, "invalid")
	}
	wantCode(t, "takeover of an unknown partition", e.do(t, "POST", "/v1/admin/partitions/p-9999/takeover", `{"node": "node-b", "reason": "typo"}`, e.root), 404, "not_found")
	if _, err := e.st.Lease(ctx, "p-9999"); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("the unknown partition got a lease: %v", err)
	}
	if l, err := e.st.Lease(ctx, "p-0001"); err != nil || l.Epoch != before.Epoch {
		t.Fatalf("the refusals moved the lease: %+v %v", l, err)
	}

	var rec struct {
		Partition     string     `json:"partition"`
		Epoch         uint64     `json:"epoch"`
		OwnerNode     string     `json:"owner_node"`
		OwnerEndpoint string     `json:"owner_endpoint"`
		TakenBy       string     `json:"taken_by"`
		TakenReason   string     `json:"taken_reason"`
		TakenAt       *time.Time `json:"taken_at"`
		ExpiresAt     time.Time  `json:"expires_at"`
	}
	body := `{"node": "node-b", "reason": "node-a is wedged", "operator": "mallory", "taken_by": "mallory"}`
	decode(t, "takeover", e.do(t, "POST", takeoverPath, body, e.root), 200, &rec)
	if rec.Partition != "p-0001" || rec.Epoch != before.Epoch+1 || rec.OwnerNode != "node-b" || rec.OwnerEndpoint != "10.0.0.2:7443" ||
		rec.TakenBy != "root" || rec.TakenReason != "node-a is wedged" || rec.TakenAt == nil || rec.ExpiresAt.IsZero() {
		t.Fatalf("takeover: %+v", rec)
	}
	stored, err := e.st.Lease(ctx, "p-0001")
	if err != nil || stored.TakenBy != "root" || stored.OwnerNode != "node-b" || stored.Epoch != rec.Epoch {
		t.Fatalf("the stored lease: %+v %v", stored, err)
	}
	// An explicit endpoint wins over the registered one.
	decode(t, "takeover back", e.do(t, "POST", takeoverPath, `{"node": "node-a", "endpoint": "node-a:7443", "reason": "node-a is back"}`, e.root), 200, &rec)
	if rec.OwnerNode != "node-a" || rec.OwnerEndpoint != "node-a:7443" || rec.Epoch != before.Epoch+2 || rec.TakenBy != "root" {
		t.Fatalf("takeover back: %+v", rec)
	}
}

// The dry-run plan is the controller's (what `controller plan --json`
// prints); an apply is queued for the running service only, recorded as
// the caller with its override reason (R119), and its state follows the
// round that takes it.
func TestAdminAPIPlanAndApply(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	ctx := context.Background()
	m := e.publishMap(t)

	a := e.do(t, "GET", "/v1/admin/plan", "", e.root)
	var plan controller.Plan
	decode(t, "plan", a, 200, &plan)
	want, err := (&controller.Service{Store: e.st}).DryRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(plan)
	if plan.MapVersion != m.Version || plan.TotalSlots != authority.SlotCount(m.SlotBits) || string(gotJSON) != string(wantJSON) {
		t.Fatalf("plan: %s\nwant %s", gotJSON, wantJSON)
	}
	// n_a never claimed its partitions and is gone: each needs a
	// recovery, which the default policy applies automatically, so it
	// waits for a target, not for an operator.
	if len(plan.Held) != len(m.Partitions) {
		t.Fatalf("plan holds %d moves, want %d: %s", len(plan.Held), len(m.Partitions), a.body)
	}
	for _, h := range plan.Held {
		if h.Trigger != controller.TriggerRecover || !strings.HasPrefix(h.Held, "no target") {
			t.Errorf("held: %+v", h)
		}
	}

	// No controller service: nothing would take the request.
	a = e.do(t, "POST", "/v1/admin/plan/apply", `{}`, e.root)
	wantCode(t, "apply without a controller", a, 503, "unavailable")
	if a.header.Get("Retry-After") != "" {
		// A second's wait brings no controller: clients must not loop.
		t.Errorf("apply without a controller: Retry-After %q", a.header.Get("Retry-After"))
	}

	// The service's leader lock, held as `controller run` holds it.
	lock, err := e.st.TryControllerLock(ctx)
	if err != nil || lock == nil {
		t.Fatalf("controller lock: %v %v", lock, err)
	}
	t.Cleanup(lock.Release)
	wantCode(t, "apply with a misspelt field", e.do(t, "POST", "/v1/admin/plan/apply", `{"override": "x"}`, e.root), 400, "invalid")
	wantCode(t, "apply with malformed JSON", e.do(t, "POST", "/v1/admin/plan/apply", `{"override_reason": `, e.root), 400, "invalid")

	var queued handlers.ApplyQueuedJSON
	a = e.do(t, "POST", "/v1/admin/plan/apply", `{"override_reason": "rebalance after the migration"}`, e.root)
	decode(t, "apply", a, 202, &queued)
	loc := a.header.Get("Location")
	if queued.RequestID <= 0 || loc != "/v1/admin/plan/apply/"+strconv.FormatInt(queued.RequestID, 10) {
		t.Fatalf("apply: %+v Location %q", queued, loc)
	}
	var state handlers.ApplyStateJSON
	decode(t, "state before the round", e.do(t, "GET", loc, "", e.root), 200, &state)
	if state != (handlers.ApplyStateJSON{RequestID: queued.RequestID}) {
		t.Fatalf("state before the round: %+v", state)
	}
	// An empty body is an apply without override.
	var second handlers.ApplyQueuedJSON
	decode(t, "apply with an empty body", e.do(t, "POST", "/v1/admin/plan/apply", "", e.root), 202, &second)

	// Recorded as the caller, with every kind and the override reason.
	for _, c := range []struct {
		id     int64
		reason string
	}{{queued.RequestID, "rebalance after the migration"}, {second.RequestID, ""}} {
		var by, reason string
		var kinds []string
		if err := e.st.Pool().QueryRow(ctx, `SELECT requested_by, coalesce(override_reason, ''), kinds FROM controller_apply_requests WHERE request_id = $1`, c.id).Scan(&by, &reason, &kinds); err != nil {
			t.Fatal(err)
		}
		if by != "api by root" || reason != c.reason || !slices.Equal(kinds, controller.Kinds) {
			t.Fatalf("request %d: by %q, reason %q, kinds %q", c.id, by, reason, kinds)
		}
	}
	// The service's next round takes both (its plan starts nothing: no
	// node is up to take a partition).
	if _, err := (&controller.Service{Store: e.st, Signer: e.signer}).Round(ctx, nil, controller.Override{}); err != nil {
		t.Fatal(err)
	}
	decode(t, "state after the round", e.do(t, "GET", loc, "", e.root), 200, &state)
	if !state.Taken || state.RequestID != queued.RequestID || state.PlanID != 0 {
		t.Fatalf("state after the round: %+v", state)
	}
	wantCode(t, "state of an unknown request", e.do(t, "GET", "/v1/admin/plan/apply/999999", "", e.root), 404, "not_found")
	wantCode(t, "state of a malformed id", e.do(t, "GET", "/v1/admin/plan/apply/abc", "", e.root), 404, "not_found")
}
