package policy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/replication/policy"
)

func TestMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		prefix, repo string
		want         bool
	}{
		{"", "team/app", true},
		{"", "x", true},
		{"team/", "team/app", true},
		{"team/", "team/a/b", true},
		{"team/", "team", false},
		{"team/", "teamx/app", false},
		{"team/app", "team/app", true},
		{"team/app", "team/apple", false},
		{"team/app", "team/app/sub", false},
		{"team/app/", "team/app", false},
		{"team/app/", "team/app/sub", true},
	} {
		if got := policy.Matches(tc.prefix, tc.repo); got != tc.want {
			t.Errorf("Matches(%q, %q) = %v", tc.prefix, tc.repo, got)
		}
	}
}

func TestForLongestPrefixWins(t *testing.T) {
	t.Parallel()
	ps := []policy.Policy{{Prefix: ""}, {Prefix: "team/"}, {Prefix: "team/a/"}, {Prefix: "team/app"}}
	for repo, want := range map[string]string{"team/app": "team/app", "team/a/b": "team/a/", "team/b": "team/", "other": ""} {
		if p, ok := policy.For(ps, repo); !ok || p.Prefix != want {
			t.Errorf("For(%q) = %q %v, want %q", repo, p.Prefix, ok, want)
		}
	}
	if _, ok := policy.For(ps[1:], "other"); ok {
		t.Error("For matched without a global policy")
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	dcs := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("dc-%d", i)
		}
		return policy.Normalize(out)
	}
	for _, tc := range []struct {
		name string
		p    policy.Policy
		ok   bool
	}{
		{"global, none", policy.Policy{Prefix: "", Datacenters: []string{}, MinVerifiedCopies: 1}, true},
		{"prefix", policy.Policy{Prefix: "team/", Datacenters: []string{"ap-1", "us-1"}, MinVerifiedCopies: 2}, true},
		{"repository", policy.Policy{Prefix: "team/app", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, true},
		{"the most datacenters", policy.Policy{Prefix: "team/", Datacenters: dcs(policy.MaxDatacenters), MinVerifiedCopies: 64}, true},
		{"too many datacenters", policy.Policy{Prefix: "team/", Datacenters: dcs(policy.MaxDatacenters + 1), MinVerifiedCopies: 1}, false},
		{"wildcard", policy.Policy{Prefix: "team/*", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, false},
		{"leading slash", policy.Policy{Prefix: "/team/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, false},
		{"two slashes", policy.Policy{Prefix: "team//", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, false},
		{"too long", policy.Policy{Prefix: strings.Repeat("a", 256) + "/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, false},
		{"bad label", policy.Policy{Prefix: "team/", Datacenters: []string{"us_1"}, MinVerifiedCopies: 1}, false},
		{"unsorted", policy.Policy{Prefix: "team/", Datacenters: []string{"us-1", "ap-1"}, MinVerifiedCopies: 1}, false},
		{"minimum 0", policy.Policy{Prefix: "team/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 0}, false},
		{"minimum above", policy.Policy{Prefix: "team/", Datacenters: []string{"ap-1", "us-1"}, MinVerifiedCopies: 3}, false},
		{"none, minimum 2", policy.Policy{Prefix: "team/", Datacenters: []string{}, MinVerifiedCopies: 2}, false},
	} {
		err := policy.Check(tc.p)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid})) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestTargets(t *testing.T) {
	t.Parallel()
	p := policy.Policy{Datacenters: []string{"ap-1", "eu-1", "us-1"}}
	if got := policy.Targets(p, "eu-1"); !slices.Equal(got, []string{"ap-1", "us-1"}) {
		t.Errorf("less the ingress: %v", got)
	}
	if got := policy.Targets(p, "xx-1"); !slices.Equal(got, p.Datacenters) {
		t.Errorf("ingress outside the policy: %v", got)
	}
	if got := policy.Targets(policy.Policy{Datacenters: []string{}}, "eu-1"); got == nil || len(got) != 0 {
		t.Errorf("none: %#v", got)
	}
	if got := policy.Targets(policy.Default(nil), "eu-1"); got != nil {
		t.Errorf("every registered datacenter: %#v", got)
	}
}

// Two tenants (team and org/blue), an operator and a stranger: each
// tenant administers and sees its own namespace and the policies above
// it, never the global one's or the other's to change.
func TestGovernsAndConcerns(t *testing.T) {
	t.Parallel()
	principal := func(gs ...string) auth.Principal {
		grants, err := auth.ParseGrants(gs)
		if err != nil {
			t.Fatal(err)
		}
		return auth.Principal{Name: "p", Grants: grants}
	}
	root := principal("*:admin")
	team := principal("team/*:admin")
	blue := principal("org/blue/*:admin", "org/blue:admin")
	app := principal("shop/app:admin")
	stranger := principal("*:write", "team/*:write")
	for _, tc := range []struct {
		who      string
		p        auth.Principal
		prefix   string
		governs  bool
		concerns bool
	}{
		{"root", root, "", true, true},
		{"root", root, "team/", true, true},
		{"team", team, "", false, true},
		{"team", team, "team/", true, true},
		{"team", team, "team/a/", true, true},
		{"team", team, "team/app", true, true},
		{"team", team, "team", false, false}, // the repository team is not under team/*
		{"team", team, "teamx/", false, false},
		{"team", team, "org/blue/", false, false},
		{"blue", blue, "org/blue/", true, true},
		{"blue", blue, "org/blue", true, true},
		{"blue", blue, "org/", false, true}, // applies to blue's repositories
		{"blue", blue, "org/red/", false, false},
		{"blue", blue, "team/", false, false},
		{"app", app, "shop/app", true, true},
		{"app", app, "shop/", false, true},
		{"app", app, "shop/app/", false, false},
		{"app", app, "shop/apple", false, false},
		{"stranger", stranger, "", false, false},
		{"stranger", stranger, "team/", false, false},
		{"anyone", root, "Bad/", false, false},
	} {
		if got := policy.Governs(tc.p, tc.prefix); got != tc.governs {
			t.Errorf("%s governs %q: %v", tc.who, tc.prefix, got)
		}
		if got := policy.Concerns(tc.p, tc.prefix); got != tc.concerns {
			t.Errorf("%s concerns %q: %v", tc.who, tc.prefix, got)
		}
	}
}
