package auth_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
)

func TestRepositoryGrammar(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "team/app", "team/a/b", "a.b", "a_b", "a__b", "a---b", "x9/y-z/w.v", strings.Repeat("a", 255)} {
		if !auth.ValidRepository(ok) {
			t.Errorf("%q rejected", ok)
		}
	}
	for _, bad := range []string{"", "Team", "a/", "/a", "a//b", "a___b", "a._b", "-a", "a-", "a..b", "*", "team/*", "a b", "a:b", strings.Repeat("a", 256)} {
		if auth.ValidRepository(bad) {
			t.Errorf("%q accepted", bad)
		}
		if err := auth.CheckRepository(bad); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid}) {
			t.Errorf("CheckRepository(%q) = %v", bad, err)
		}
	}
}

func TestPermissionOrder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		have, want auth.Permission
		ok         bool
	}{
		{auth.Admin, auth.Admin, true}, {auth.Admin, auth.Write, true}, {auth.Admin, auth.Read, true},
		{auth.Write, auth.Admin, false}, {auth.Write, auth.Write, true}, {auth.Write, auth.Read, true},
		{auth.Read, auth.Admin, false}, {auth.Read, auth.Write, false}, {auth.Read, auth.Read, true},
		{0, auth.Read, false}, {auth.Admin, 0, false}, {auth.Admin, 7, false}, {7, auth.Read, false},
	}
	for _, c := range cases {
		if got := c.have.Implies(c.want); got != c.ok {
			t.Errorf("%v implies %v = %v, want %v", c.have, c.want, got, c.ok)
		}
	}
	for _, s := range []string{"read", "write", "admin"} {
		p, err := auth.ParsePermission(s)
		if err != nil || p.String() != s {
			t.Errorf("ParsePermission(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := auth.ParsePermission("Admin"); err == nil {
		t.Error("permissions are lowercase")
	}
}

func TestParseGrant(t *testing.T) {
	t.Parallel()
	good := map[string]auth.Grant{
		"team/*:write":    {Pattern: "team/*", Permission: auth.Write},
		"*:admin":         {Pattern: "*", Permission: auth.Admin},
		"team/app:read":   {Pattern: "team/app", Permission: auth.Read},
		"a/b/c/*:read":    {Pattern: "a/b/c/*", Permission: auth.Read},
		"x.y_z--w:write":  {Pattern: "x.y_z--w", Permission: auth.Write},
		"team/app/*:read": {Pattern: "team/app/*", Permission: auth.Read},
	}
	for s, want := range good {
		g, err := auth.ParseGrant(s)
		if err != nil || g != want || g.String() != s {
			t.Errorf("ParseGrant(%q) = %+v, %v", s, g, err)
		}
	}
	for _, bad := range []string{"", ":", "team", "team/*", "team/*:", ":read", "team/*:Write", "team*:read", "team/x*:read",
		"*/x:read", "**:read", "/*:read", "team/**:read", "Team/app:read", "team/app:read ", " team/app:read", "team/app:read:write", "team//*:read"} {
		if g, err := auth.ParseGrant(bad); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid}) {
			t.Errorf("ParseGrant(%q) = %+v, %v; want invalid", bad, g, err)
		}
	}
}

func TestCovers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		pattern, target string
		ok              bool
	}{
		{"team/*", "team/app", true},
		{"team/*", "team/a/b", true},
		{"team/*", "teamx/app", false},
		{"team/*", "team", false},
		{"team/*", "team/", false},
		{"team/*", "other/team/app", false},
		{"team/*", "*", false},
		{"team/app", "team/app", true},
		{"team/app", "team/app/x", false},
		{"team/app", "team/ap", false},
		{"*", "anything/at/all", true},
		{"*", "*", true},
		{"team/app", "*", false},
		{"Team/*", "Team/app", false}, // invalid pattern covers nothing
		{"team/*", "team/App", false}, // invalid target
	}
	for _, c := range cases {
		if got := auth.Covers(c.pattern, c.target); got != c.ok {
			t.Errorf("Covers(%q, %q) = %v, want %v", c.pattern, c.target, got, c.ok)
		}
	}
}

func TestPrincipalAllowed(t *testing.T) {
	t.Parallel()
	p := auth.Principal{Name: "ci", Grants: []auth.Grant{
		{Pattern: "team/*", Permission: auth.Write},
		{Pattern: "shared/base", Permission: auth.Read},
	}}
	for _, c := range []struct {
		repo string
		perm auth.Permission
		ok   bool
	}{
		{"team/app", auth.Read, true}, {"team/app", auth.Write, true}, {"team/app", auth.Admin, false},
		{"shared/base", auth.Read, true}, {"shared/base", auth.Write, false},
		{"teamx/app", auth.Read, false}, {"*", auth.Read, false},
	} {
		if got := p.Allowed(c.repo, c.perm); got != c.ok {
			t.Errorf("Allowed(%q, %v) = %v, want %v", c.repo, c.perm, got, c.ok)
		}
	}
	if p.HasAny(auth.Admin) || !p.HasAny(auth.Write) {
		t.Error("HasAny")
	}
	root := auth.Principal{Grants: []auth.Grant{{Pattern: "*", Permission: auth.Admin}}}
	if !root.Allowed("*", auth.Admin) || !root.Allowed("x/y", auth.Read) {
		t.Error("*:admin covers everything")
	}
	if (auth.Principal{}).Allowed("x", auth.Read) {
		t.Error("no grants allow nothing")
	}
}

func TestTokenRoundTrip(t *testing.T) {
	t.Parallel()
	tok := auth.NewToken()
	s := tok.String()
	if !strings.HasPrefix(s, "bp_") || len(s) != 72 {
		t.Fatalf("token %q", s)
	}
	parsed, err := auth.ParseToken(s)
	if err != nil || parsed != tok {
		t.Fatalf("ParseToken: %+v %v", parsed, err)
	}
	if !parsed.Matches(tok.Hash()) {
		t.Fatal("hash mismatch")
	}
	other := auth.NewToken()
	if other.ID == tok.ID || other.Secret == tok.Secret || other.Matches(tok.Hash()) {
		t.Fatal("two tokens collide")
	}
	if bytes.Contains(tok.Hash(), []byte(tok.Secret)) || len(tok.Hash()) != 32 {
		t.Fatal("hash must be a 32-byte digest")
	}
	if id, err := auth.TokenIDOf(s); err != nil || id != tok.ID {
		t.Fatalf("TokenIDOf(token) = %q %v", id, err)
	}
	if id, err := auth.TokenIDOf(tok.ID); err != nil || id != tok.ID {
		t.Fatalf("TokenIDOf(id) = %q %v", id, err)
	}
	for _, bad := range []string{"", "bp_", s[:71], s + "a", "xx" + s[2:], strings.ToUpper(s), s[:19] + "-" + s[20:], s[:20] + "1" + s[21:]} {
		if _, err := auth.ParseToken(bad); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeUnauthorized}) {
			t.Errorf("ParseToken(%q) = %v; want unauthorized", bad, err)
		} else if len(bad) > 20 && strings.Contains(err.Error(), bad[20:]) {
			t.Errorf("error echoes the secret: %v", err)
		}
	}
}
