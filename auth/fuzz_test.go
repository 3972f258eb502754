package auth_test

import (
	"strings"
	"testing"

	"github.com/blobplane/blobplane/auth"
)

// FuzzParseGrant: the parser never panics, what it accepts round-trips
// through String, and an accepted pattern never covers a name outside its
// own namespace.
func FuzzParseGrant(f *testing.F) {
	// The committed corpus in testdata/fuzz/FuzzParseGrant holds the
	// interesting cases; these are the everyday ones.
	for _, s := range []string{"team/*:write", "*:admin", "team/app:read", "a:b:c", ""} {
		f.Add(s, "team/app")
	}
	f.Fuzz(func(t *testing.T, s, repo string) {
		g, err := auth.ParseGrant(s)
		if err != nil {
			return
		}
		if g.String() != s {
			t.Fatalf("ParseGrant(%q).String() = %q", s, g.String())
		}
		if g.Check() != nil {
			t.Fatalf("accepted grant %q fails Check", s)
		}
		again, err := auth.ParseGrant(g.String())
		if err != nil || again != g {
			t.Fatalf("round trip of %q: %+v %v", s, again, err)
		}
		if !auth.Covers(g.Pattern, repo) {
			return
		}
		switch {
		case g.Pattern == "*":
		case strings.HasSuffix(g.Pattern, "/*"):
			if !strings.HasPrefix(repo, strings.TrimSuffix(g.Pattern, "*")) || !auth.ValidRepository(repo) {
				t.Fatalf("%q covers %q outside its prefix", g.Pattern, repo)
			}
		default:
			if repo != g.Pattern {
				t.Fatalf("exact %q covers %q", g.Pattern, repo)
			}
		}
	})
}

// FuzzParseToken: never panics; an accepted token round-trips.
func FuzzParseToken(f *testing.F) {
	f.Add(auth.NewToken().String())
	f.Add("bp_aaaaaaaaaaaaaaaa_" + strings.Repeat("a", 52))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := auth.ParseToken(s)
		if err != nil {
			return
		}
		if tok.String() != s {
			t.Fatalf("round trip %q -> %q", s, tok.String())
		}
	})
}
