package handlers_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
)

var _ handlers.PolicyAdmin = (*store.Store)(nil)

const policiesPath = "/v1/admin/replication-policies"

// deletePolicy sends DELETE for prefix's policy, with the Content-Type
// every admin write needs and no body.
func deletePolicy(t *testing.T, srv *httptest.Server, prefix, cred string) answer {
	t.Helper()
	req, err := http.NewRequest("DELETE", srv.URL+policiesPath+"/"+prefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	return answer{resp.StatusCode, resp.Header, b.String()}
}

// wantCode checks an answer's status and stable error code.
func wantCode(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	if a.status != status || !strings.Contains(a.body, `"code": "`+code+`"`) {
		t.Errorf("%s: %d %s; want %d %s", what, a.status, a.body, status, code)
	}
}

// Two tenants (team/*, org/blue/*), an operator (*:admin), a stranger
// with write everywhere and no admin, and anonymous callers: each
// tenant sets and deletes only the policies of its own namespace, never
// the global one or the other's; the list shows each tenant what
// governs its repositories and nothing of the other's.
func TestAdminReplicationPolicies(t *testing.T) {
	t.Parallel()
	st, srv := authSetup(t)
	root := token(t, st, "root", "*:admin")
	team := token(t, st, "lead", "team/*:admin")
	blue := token(t, st, "blue-lead", "org/blue/*:admin")
	stranger := token(t, st, "ci", "*:write")
	put := func(prefix, body, cred string) answer {
		return call(t, srv, "PUT", policiesPath+"/"+prefix, body, cred)
	}

	// Anonymous: 401 with the Bearer challenge, before anything is read.
	wantAdminUnauthorized(t, "list anonymously", call(t, srv, "GET", policiesPath, "", ""))
	wantAdminUnauthorized(t, "put anonymously", put("team/", `{"datacenters": ["us-1"]}`, ""))
	wantAdminUnauthorized(t, "delete anonymously", deletePolicy(t, srv, "team/", ""))
	// No admin grant at all: 403.
	wantCode(t, "list as a stranger", call(t, srv, "GET", policiesPath, "", stranger), 403, "forbidden")
	wantCode(t, "put as a stranger", put("team/", `{"datacenters": ["us-1"]}`, stranger), 403, "forbidden")

	for _, c := range []struct {
		what, cred, prefix, body string
		status                   int
		code                     string
	}{
		{"operator sets the global policy", root, "", `{"datacenters": ["us-1", "eu-1"], "min_verified_copies": 2}`, 200, ""},
		{"team sets its namespace", team, "team/", `{"datacenters": ["us-1", "ap-1"], "min_verified_copies": 2}`, 200, ""},
		{"team sets one repository", team, "team/app", `{"datacenters": []}`, 200, ""},
		{"blue sets its namespace", blue, "org/blue/", `{"datacenters": ["eu-1"]}`, 200, ""},
		{"team may not set the global policy", team, "", `{"datacenters": []}`, 403, "forbidden"},
		{"team may not set blue's", team, "org/blue/", `{"datacenters": []}`, 403, "forbidden"},
		{"team may not set above its namespace", team, "org/", `{"datacenters": []}`, 403, "forbidden"},
		{"team/* is not teamx/", team, "teamx/", `{"datacenters": []}`, 403, "forbidden"},
		{"team/* is not the repository team", team, "team", `{"datacenters": []}`, 403, "forbidden"},
		{"blue may not set team's", blue, "team/app", `{"datacenters": []}`, 403, "forbidden"},
		{"malformed prefix", team, "Team/", `{"datacenters": []}`, 400, "invalid"},
		{"wildcard prefix", root, "team/*", `{"datacenters": []}`, 400, "invalid"},
		{"malformed JSON", team, "team/", `{`, 400, "invalid"},
		{"datacenters missing", team, "team/", `{"min_verified_copies": 1}`, 400, "invalid"},
		{"datacenters null", team, "team/", `{"datacenters": null}`, 400, "invalid"},
		{"datacenters a string", team, "team/", `{"datacenters": "us-1"}`, 400, "invalid"},
		{"a misspelt field", team, "team/", `{"datacenters": ["us-1"], "min_copies": 1}`, 400, "invalid"},
		{"two documents", team, "team/", `{"datacenters": ["us-1"]} {}`, 400, "invalid"},
		{"a bad label", team, "team/", `{"datacenters": ["US-1"]}`, 400, "invalid"},
		{"minimum above the datacenters", team, "team/", `{"datacenters": ["us-1"], "min_verified_copies": 2}`, 400, "invalid"},
		{"minimum 0", team, "team/", `{"datacenters": ["us-1"], "min_verified_copies": 0}`, 400, "invalid"},
	} {
		a := put(c.prefix, c.body, c.cred)
		if c.code != "" {
			wantCode(t, c.what, a, c.status, c.code)
		} else if a.status != c.status {
			t.Errorf("%s: %d %s", c.what, a.status, a.body)
		}
	}
	req, _ := http.NewRequest("PUT", srv.URL+policiesPath+"/team/", strings.NewReader(`{"datacenters": []}`))
	req.Header.Set("Authorization", "Bearer "+team)
	if resp, err := srv.Client().Do(req); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("put without Content-Type: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The stored policy comes back normalized, with who set it.
	var got handlers.PolicyJSON
	a := put("team/", `{"datacenters": ["us-1", "ap-1", "us-1"], "min_verified_copies": 2}`, team)
	if err := json.Unmarshal([]byte(a.body), &got); err != nil || a.status != 200 || got.Prefix != "team/" ||
		!slices.Equal(got.Datacenters, []string{"ap-1", "us-1"}) || got.MinVerifiedCopies != 2 || got.SetBy != "lead" || got.CreatedAt == nil {
		t.Fatalf("set: %d %s", a.status, a.body)
	}

	list := func(cred string) []string {
		t.Helper()
		a := call(t, srv, "GET", policiesPath, "", cred)
		var b handlers.PoliciesBody
		if err := json.Unmarshal([]byte(a.body), &b); err != nil || a.status != 200 {
			t.Fatalf("list: %d %s", a.status, a.body)
		}
		prefixes := []string{}
		for _, p := range b.Policies {
			prefixes = append(prefixes, p.Prefix)
		}
		return prefixes
	}
	for _, c := range []struct {
		who, cred string
		want      []string
	}{
		{"root", root, []string{"", "org/blue/", "team/", "team/app"}},
		{"team", team, []string{"", "team/", "team/app"}},
		{"blue", blue, []string{"", "org/blue/"}},
	} {
		if got := list(c.cred); !slices.Equal(got, c.want) {
			t.Errorf("%s sees %q, want %q", c.who, got, c.want)
		}
	}

	wantCode(t, "blue deletes team's", deletePolicy(t, srv, "team/", blue), 403, "forbidden")
	wantCode(t, "team deletes the global policy", deletePolicy(t, srv, "", team), 403, "forbidden")
	if a := deletePolicy(t, srv, "team/", team); a.status != 204 {
		t.Fatalf("team deletes its own: %d %s", a.status, a.body)
	}
	wantCode(t, "delete again", deletePolicy(t, srv, "team/", team), 404, "not_found")
	if a := deletePolicy(t, srv, "", root); a.status != 204 {
		t.Fatalf("root deletes the global policy: %d %s", a.status, a.body)
	}
	if got := list(team); !slices.Equal(got, []string{"team/app"}) {
		t.Errorf("after the deletes team sees %q", got)
	}
}
