package handlers_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
)

// Issue 26 point 7: a browser of an admin. Every request below carries a
// valid *:admin token, as a browser that cached it would attach it.

// browserCall sends method path with body, Content-Type ctype (none when
// empty), the admin's Bearer token and the browser headers hdr.
func browserCall(t *testing.T, srv *httptest.Server, method, path, body, ctype, tok string, hdr map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func repositoryExists(t *testing.T, st *store.Store, name string) bool {
	t.Helper()
	repos, err := st.ListRepositories(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(repos, func(r store.Repository) bool { return r.Name == name })
}

// A page on another site makes the admin's browser POST to
// /v1/admin/repositories (and drive the River UI): refused 403 before
// anything runs, whether the browser marks it with Sec-Fetch-Site, with
// Origin only (older browsers), or both.
func TestAttackCrossSiteAdminRequest(t *testing.T) {
	t.Parallel()
	st, srv := authSetup(t)
	admin := token(t, st, "root", "*:admin")
	for name, hdr := range map[string]map[string]string{
		"cross-site":             {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
		"same-site":              {"Sec-Fetch-Site": "same-site", "Origin": "https://sub." + strings.TrimPrefix(srv.URL, "http://")},
		"origin only":            {"Origin": "https://evil.example"},
		"null origin":            {"Origin": "null"},
		"same host, other port":  {"Origin": "http://127.0.0.1:1"},
		"sec-fetch, same origin": {"Sec-Fetch-Site": "cross-site", "Origin": srv.URL},
	} {
		a := browserCall(t, srv, "POST", "/v1/admin/repositories", `{"name":"evil/app"}`, "application/json", admin, hdr)
		if a.status != 403 || !strings.Contains(a.body, `"code": "forbidden"`) || !strings.Contains(a.body, "cross-site") {
			t.Errorf("%s: POST /v1/admin/repositories: %d %s, want 403", name, a.status, a.body)
		}
		for _, m := range []string{"GET", "POST"} {
			if a := browserCall(t, srv, m, "/riverui/api/jobs/cancel", `{"job_ids":["1"]}`, "application/json", admin, hdr); a.status != 403 {
				t.Errorf("%s: %s /riverui/: %d %s, want 403", name, m, a.status, a.body)
			}
		}
	}
	if repositoryExists(t, st, "evil/app") {
		t.Fatal("a cross-site request created a repository")
	}
}

// The classic form CSRF: a cross-site form (or fetch in no-cors mode) can
// only send text/plain, form-urlencoded or multipart bodies, so an admin
// write with any Content-Type but application/json is 415, even from a
// client that sends no browser headers at all.
func TestAttackTextPlainAdminWrite(t *testing.T) {
	t.Parallel()
	st, srv := authSetup(t)
	admin := token(t, st, "root", "*:admin")
	for _, ctype := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx", "text/json"} {
		a := browserCall(t, srv, "POST", "/v1/admin/repositories", `{"name":"evil/app"}`, ctype, admin, nil)
		if a.status != http.StatusUnsupportedMediaType || !strings.Contains(a.body, `"code": "unsupported_media_type"`) || !strings.Contains(a.body, `"request_id"`) {
			t.Errorf("Content-Type %q: %d %s, want 415 with the error body", ctype, a.status, a.body)
		}
	}
	if repositoryExists(t, st, "evil/app") {
		t.Fatal("a non-JSON write created a repository")
	}
}

// What the admin surface must still do: a same-origin JSON write (the
// admin's own page, a typed URL) and a CLI without browser headers work;
// reads need no Content-Type.
func TestSameOriginJSONAdminWriteWorks(t *testing.T) {
	t.Parallel()
	st, srv := authSetup(t)
	admin := token(t, st, "root", "*:admin")
	for name, hdr := range map[string]map[string]string{
		"same-origin": {"Sec-Fetch-Site": "same-origin", "Origin": srv.URL},
		"typed URL":   {"Sec-Fetch-Site": "none"},
		"CLI":         nil,
	} {
		repo := "team/" + strings.ReplaceAll(strings.ToLower(name), " ", "-")
		for _, ctype := range []string{"application/json", "application/json; charset=utf-8"} {
			if a := browserCall(t, srv, "POST", "/v1/admin/repositories", `{"name":"`+repo+`"}`, ctype, admin, hdr); a.status != 201 {
				t.Errorf("%s, %s: %d %s, want 201", name, ctype, a.status, a.body)
			}
		}
		if !repositoryExists(t, st, repo) {
			t.Errorf("%s: repository not created", name)
		}
		if a := browserCall(t, srv, "GET", "/v1/admin/repositories", "", "", admin, hdr); a.status != 200 {
			t.Errorf("%s: GET: %d %s", name, a.status, a.body)
		}
		if a := browserCall(t, srv, "GET", "/riverui/", "", "", admin, hdr); a.status != 200 {
			t.Errorf("%s: GET /riverui/: %d %s", name, a.status, a.body)
		}
	}
}

// A 401 on the admin surface challenges Bearer only: a browser has no
// Basic prompt to show and so never caches an admin's token for the
// origin. /v2/ keeps Basic first, for oras and crane.
func TestAttackBrowserCachesAdminBasicCredentials(t *testing.T) {
	t.Parallel()
	_, srv := authSetup(t)
	for _, path := range []string{"/v1/admin/repositories", "/riverui/"} {
		a := call(t, srv, "GET", path, "", "")
		if ch := a.header.Values("WWW-Authenticate"); a.status != 401 || !slices.Equal(ch, []string{`Bearer realm="blobplane"`}) {
			t.Errorf("%s: %d %v, want 401 challenging Bearer only", path, a.status, ch)
		}
	}
}

// CrossSite, cell by cell.
func TestCrossSite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		host, site, origin string
		cross              bool
	}{
		{"api.example", "", "", false},
		{"api.example", "none", "", false},
		{"api.example", "same-origin", "https://api.example", false},
		{"api.example", "cross-site", "", true},
		{"api.example", "same-site", "", true},
		{"api.example", "", "https://api.example", false},
		{"api.example:443", "", "https://api.example", false},
		{"api.example", "", "https://api.example:443", false},
		{"api.example", "", "http://api.example", false}, // behind a TLS proxy the scheme is not ours to compare
		{"API.example", "", "https://api.EXAMPLE", false},
		{"api.example:8443", "", "https://api.example", true},
		{"api.example", "", "https://api.example:8443", true},
		{"api.example", "", "https://evil.example", true},
		{"api.example", "", "null", true},
		{"api.example", "", "https://", true},
		{"[::1]:8080", "", "http://[::1]:8080", false},
		{"[::1]:8080", "", "http://[::2]:8080", true},
	} {
		r := httptest.NewRequest("POST", "/v1/admin/repositories", nil)
		r.Host = tc.host
		if tc.site != "" {
			r.Header.Set("Sec-Fetch-Site", tc.site)
		}
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if why := handlers.CrossSite(r); (why != "") != tc.cross {
			t.Errorf("Host %s, Sec-Fetch-Site %q, Origin %q: %q, want cross=%v", tc.host, tc.site, tc.origin, why, tc.cross)
		}
	}
}
