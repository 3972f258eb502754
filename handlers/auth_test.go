package handlers_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

var (
	_ handlers.Authenticator   = (*store.Store)(nil)
	_ handlers.RepositoryAdmin = (*store.Store)(nil)
)

// authSetup serves the real router over real HTTP on a real store, with a
// stand-in River UI (the real one is exercised in app).
func authSetup(t *testing.T) (*store.Store, *httptest.Server) {
	t.Helper()
	st := pgtest.NewStore(t)
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>river") })
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, Repositories: st, RiverUI: ui}))
	t.Cleanup(srv.Close)
	return st, srv
}

func token(t *testing.T, st *store.Store, principal string, grants ...string) string {
	t.Helper()
	gs, err := auth.ParseGrants(grants)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := st.CreateToken(context.Background(), principal, gs)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type answer struct {
	status int
	header http.Header
	body   string
}

// call sends method path with body and credentials: "" none, "basic:<tok>"
// HTTP Basic, anything else a Bearer token.
func call(t *testing.T, srv *httptest.Server, method, path, body, cred string) answer {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json") // admin writes need it (issue 26 point 7)
	}
	switch {
	case cred == "":
	case strings.HasPrefix(cred, "basic:"):
		req.SetBasicAuth("whoever", strings.TrimPrefix(cred, "basic:"))
	default:
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func wantUnauthorized(t *testing.T, what string, a answer) {
	t.Helper()
	ch := a.header.Values("WWW-Authenticate")
	if a.status != 401 || !strings.Contains(a.body, `"code": "unauthorized"`) ||
		!slices.Equal(ch, []string{`Basic realm="blobplane"`, `Bearer realm="blobplane"`}) {
		t.Errorf("%s: %d %v %s; want 401 with Basic and Bearer challenges", what, a.status, ch, a.body)
	}
}

// wantAdminUnauthorized: the admin surface challenges Bearer only, so no
// browser prompts for (and caches) an admin's token (issue 26 point 7).
func wantAdminUnauthorized(t *testing.T, what string, a answer) {
	t.Helper()
	ch := a.header.Values("WWW-Authenticate")
	if a.status != 401 || !strings.Contains(a.body, `"code": "unauthorized"`) ||
		!slices.Equal(ch, []string{`Bearer realm="blobplane"`}) {
		t.Errorf("%s: %d %v %s; want 401 with the Bearer challenge only", what, a.status, ch, a.body)
	}
}

func TestAdminRoutesNeedAnAdminGrant(t *testing.T) {
	t.Parallel()
	st, srv := authSetup(t)
	admin := token(t, st, "root", "*:admin")
	writer := token(t, st, "ci", "team/*:write")
	teamAdmin := token(t, st, "lead", "team/*:admin")
	revoked := token(t, st, "gone", "*:admin")
	tok, _ := auth.ParseToken(revoked)
	if err := st.RevokeToken(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	forged := auth.Token{ID: tok.ID, Secret: auth.NewToken().Secret}.String()

	for _, path := range []string{"/v1/admin/repositories", "/riverui/", "/riverui/api/jobs"} {
		wantAdminUnauthorized(t, path+" without credentials", call(t, srv, "GET", path, "", ""))
		wantAdminUnauthorized(t, path+" with a revoked token", call(t, srv, "GET", path, "", revoked))
		wantAdminUnauthorized(t, path+" with a revoked token over Basic", call(t, srv, "GET", path, "", "basic:"+revoked))
		wantAdminUnauthorized(t, path+" with a forged secret", call(t, srv, "GET", path, "", forged))
		wantAdminUnauthorized(t, path+" with garbage", call(t, srv, "GET", path, "", "not-a-token"))
		wantAdminUnauthorized(t, path+" with an empty Basic password", call(t, srv, "GET", path, "", "basic:"))
		if a := call(t, srv, "GET", path, "", writer); a.status != 403 || !strings.Contains(a.body, `"code": "forbidden"`) || a.header.Get("WWW-Authenticate") != "" {
			t.Errorf("%s with a write-only token: %d %s; want 403 without a challenge", path, a.status, a.body)
		}
		for _, cred := range []string{admin, "basic:" + admin} {
			if a := call(t, srv, "GET", path, "", cred); a.status != 200 {
				t.Errorf("%s as *:admin (%s): %d %s", path, cred[:6], a.status, a.body)
			}
		}
	}
	// The River UI wants admin on every repository; admin of team/* is not.
	if a := call(t, srv, "GET", "/riverui/", "", teamAdmin); a.status != 403 {
		t.Errorf("riverui as team/*:admin: %d", a.status)
	}
	// Public endpoints stay public, with or without credentials.
	for _, cred := range []string{"", "garbage"} {
		if a := call(t, srv, "GET", "/healthz", "", cred); a.status != 200 {
			t.Errorf("healthz with %q: %d", cred, a.status)
		}
	}
}

func TestAdminRepositories(t *testing.T) {
	t.Parallel()
	st, srv := authSetup(t)
	admin := token(t, st, "root", "*:admin")
	teamAdmin := token(t, st, "lead", "team/*:admin")

	for _, c := range []struct {
		cred, name string
		status     int
	}{
		{admin, "other/app", 201},
		{admin, "other/app", 201}, // idempotent
		{teamAdmin, "team/app", 201},
		{"basic:" + teamAdmin, "team/a/b", 201},
		{teamAdmin, "other/x", 403},
		{teamAdmin, "teamx/app", 403},
		{admin, "Bad/Name", 400},
		{admin, "", 400},
	} {
		body, _ := json.Marshal(handlers.CreateRepositoryRequest{Name: c.name})
		if a := call(t, srv, "POST", "/v1/admin/repositories", string(body), c.cred); a.status != c.status {
			t.Errorf("create %q: %d %s, want %d", c.name, a.status, a.body, c.status)
		}
	}
	if a := call(t, srv, "POST", "/v1/admin/repositories", "{", admin); a.status != 400 {
		t.Errorf("bad JSON: %d", a.status)
	}
	list := func(cred string) []string {
		a := call(t, srv, "GET", "/v1/admin/repositories", "", cred)
		var b handlers.RepositoriesBody
		if err := json.Unmarshal([]byte(a.body), &b); err != nil || a.status != 200 {
			t.Fatalf("list: %d %s", a.status, a.body)
		}
		var names []string
		for _, r := range b.Repositories {
			if r.CreatedAt == nil || r.CreatedAt.IsZero() {
				t.Errorf("%s without created_at", r.Name)
			}
			names = append(names, r.Name)
		}
		return names
	}
	if got := list(admin); !slices.Equal(got, []string{"other/app", "team/a/b", "team/app"}) {
		t.Errorf("admin sees %v", got)
	}
	if got := list(teamAdmin); !slices.Equal(got, []string{"team/a/b", "team/app"}) {
		t.Errorf("team admin sees %v", got)
	}
}

// A blob route guarded by RequirePermission answers a caller without rights
// byte-for-byte the same whether or not the blob exists: the decision is
// made before the handler (which would look the blob up) runs.
func TestLackingRightsLooksTheSameForEveryBlob(t *testing.T) {
	t.Parallel()
	st := pgtest.NewStore(t)
	reader := token(t, st, "reader", "team/app:read")
	exists := map[string]bool{"sha256:aaaa": true}
	r := chi.NewRouter()
	r.With(handlers.Authenticate(st, nil), handlers.RequirePermission(func(r *http.Request) string { return chi.URLParam(r, "repo") + "/" + chi.URLParam(r, "name") }, auth.Write)).
		Put("/v2/{repo}/{name}/blobs/{digest}", func(w http.ResponseWriter, r *http.Request) {
			p, ok := handlers.PrincipalOf(r.Context())
			if !ok || p.Name != "reader" {
				t.Errorf("principal in context: %+v %v", p, ok)
			}
			if !exists[chi.URLParam(r, "digest")] {
				http.Error(w, "blob unknown", 404)
				return
			}
			w.WriteHeader(201)
		})
	r.With(handlers.Authenticate(st, nil), handlers.RequirePermission(func(r *http.Request) string { return chi.URLParam(r, "repo") + "/" + chi.URLParam(r, "name") }, auth.Read)).
		Get("/v2/{repo}/{name}/blobs/{digest}", func(w http.ResponseWriter, r *http.Request) {
			if p, ok := handlers.PrincipalOf(r.Context()); !ok || p.TokenID == "" {
				t.Errorf("principal in context: %+v %v", p, ok)
			}
			w.WriteHeader(200)
		})
	srv := httptest.NewServer(r)
	defer srv.Close()

	known := call(t, srv, "PUT", "/v2/team/app/blobs/sha256:aaaa", "", reader)
	unknown := call(t, srv, "PUT", "/v2/team/app/blobs/sha256:bbbb", "", reader)
	strip := func(s string) string { // the request id differs per request
		var m map[string]any
		json.Unmarshal([]byte(s), &m)
		delete(m, "request_id")
		b, _ := json.Marshal(m)
		return string(b)
	}
	if known.status != 403 || unknown.status != 403 || strip(known.body) != strip(unknown.body) {
		t.Fatalf("lacking write: existing blob %d %s; unknown blob %d %s", known.status, known.body, unknown.status, unknown.body)
	}
	if a := call(t, srv, "GET", "/v2/team/app/blobs/sha256:aaaa", "", reader); a.status != 200 {
		t.Fatalf("read with read grant: %d %s", a.status, a.body)
	}
	if a := call(t, srv, "GET", "/v2/team/other/blobs/sha256:aaaa", "", reader); a.status != 403 {
		t.Fatalf("read elsewhere: %d", a.status)
	}
	wantUnauthorized(t, "blob without credentials", call(t, srv, "GET", "/v2/team/app/blobs/sha256:aaaa", "", ""))
}

// Without an authenticator nothing that needs a principal is served.
func TestNoAuthenticatorFailsClosed(t *testing.T) {
	t.Parallel()
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "river") })
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{RiverUI: ui}))
	defer srv.Close()
	for _, path := range []string{"/riverui/", "/v1/admin/repositories"} {
		if a := call(t, srv, "GET", path, "", ""); a.status != 404 {
			t.Errorf("%s without an authenticator: %d", path, a.status)
		}
	}
	// RequirePermission without Authenticate before it refuses too.
	r := chi.NewRouter()
	r.With(handlers.RequirePermission(func(*http.Request) string { return "team/app" }, auth.Read)).Get("/x", func(w http.ResponseWriter, r *http.Request) {})
	srv2 := httptest.NewServer(r)
	defer srv2.Close()
	wantUnauthorized(t, "RequirePermission alone", call(t, srv2, "GET", "/x", "", ""))
}
