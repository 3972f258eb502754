package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

func grants(t *testing.T, ss ...string) []auth.Grant {
	t.Helper()
	gs, err := auth.ParseGrants(ss)
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

func isCode(err error, code blobplane.Code) bool {
	return errors.Is(err, &blobplane.Error{Code: code})
}

func TestRepositories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	for _, name := range []string{"team/app", "alpha", "team/app"} { // the repeat is a no-op
		if err := s.CreateRepository(ctx, name); err != nil {
			t.Fatalf("create %q: %v", name, err)
		}
	}
	var repos []store.Repository
	var err error
	repos, err = s.ListRepositories(ctx)
	if err != nil || len(repos) != 2 || repos[0].Name != "alpha" || repos[1].Name != "team/app" || repos[0].CreatedAt.IsZero() {
		t.Fatalf("list: %+v %v", repos, err)
	}
	if ok, err := s.RepositoryExists(ctx, "team/app"); !ok || err != nil {
		t.Fatalf("exists: %v %v", ok, err)
	}
	if ok, err := s.RepositoryExists(ctx, "team/other"); ok || err != nil {
		t.Fatalf("exists(other): %v %v", ok, err)
	}
	if ok, err := s.RepositoryExists(ctx, "Bad Name"); ok || err != nil {
		t.Fatalf("exists(invalid): %v %v", ok, err)
	}
	if err := s.CreateRepository(ctx, "Team/App"); !isCode(err, blobplane.CodeInvalid) {
		t.Fatalf("invalid name: %v", err)
	}
}

// The schema enforces the OCI grammar and the grant shapes on its own, for
// anyone writing SQL by hand.
func TestAuthSchemaChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	for _, stmt := range []string{
		`INSERT INTO repositories (name) VALUES ('Team/app')`,
		`INSERT INTO repositories (name) VALUES ('team//app')`,
		`INSERT INTO repositories (name) VALUES ('team/')`,
		`INSERT INTO repositories (name) VALUES ('` + strings.Repeat("a", 256) + `')`,
		`INSERT INTO principals (name) VALUES ('')`,
		`INSERT INTO grants (principal, pattern, permission) VALUES ('p', 'team/*', 'owner')`,
		`INSERT INTO grants (principal, pattern, permission) VALUES ('p', 'team*', 'read')`,
		`INSERT INTO grants (principal, pattern, permission) VALUES (NULL, '*', 'read')`,
	} {
		if _, err := s.Pool().Exec(ctx, `INSERT INTO principals (name) VALUES ('p') ON CONFLICT DO NOTHING`); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Pool().Exec(ctx, stmt); err == nil {
			t.Errorf("accepted: %s", stmt)
		}
	}
	for _, stmt := range []string{
		`INSERT INTO repositories (name) VALUES ('a.b_c__d--e/f')`,
		`INSERT INTO grants (principal, pattern, permission) VALUES ('p', 'team/*', 'read')`,
		`INSERT INTO grants (principal, pattern, permission) VALUES ('p', '*', 'admin')`,
	} {
		if _, err := s.Pool().Exec(ctx, stmt); err != nil {
			t.Errorf("refused %s: %v", stmt, err)
		}
	}
}

func TestTokenSecretIsNeverStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	tokStr, id, err := s.CreateToken(ctx, "ci", grants(t, "team/*:write"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := auth.ParseToken(tokStr)
	if err != nil || tok.ID != id {
		t.Fatalf("token %q id %q: %v", tokStr, id, err)
	}
	// Every column of every auth table, as text and as hex: neither the
	// token nor its secret appears anywhere.
	for _, table := range []string{"tokens", "grants", "principals"} {
		rows, err := s.Pool().Query(ctx, `SELECT t::text FROM `+table+` t`)
		if err != nil {
			t.Fatal(err)
		}
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range texts {
			if strings.Contains(row, tok.Secret) || strings.Contains(row, tokStr) {
				t.Fatalf("%s row holds the secret: %s", table, row)
			}
		}
	}
	var stored []byte
	if err := s.Pool().QueryRow(ctx, `SELECT secret_sha256 FROM tokens WHERE id = $1`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !tok.Matches(stored) || strings.Contains(string(stored), tok.Secret) {
		t.Fatal("stored hash is not the secret's SHA-256")
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	tokStr, id, err := s.CreateToken(ctx, "ci", grants(t, "team/*:write", "shared/base:read"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Authenticate(ctx, tokStr)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "ci" || p.TokenID != id || len(p.Grants) != 2 {
		t.Fatalf("principal %+v", p)
	}
	if !p.Allowed("team/app", auth.Write) || !p.Allowed("team/a/b", auth.Read) || p.Allowed("teamx/app", auth.Read) || p.Allowed("shared/base", auth.Write) {
		t.Fatalf("grants decide wrongly: %+v", p.Grants)
	}
	var used bool
	if err := s.Pool().QueryRow(ctx, `SELECT last_used_at IS NOT NULL FROM tokens WHERE id = $1`, id).Scan(&used); err != nil || !used {
		t.Fatalf("last_used_at not recorded: %v", err)
	}

	t.Run("wrong secret, unknown id, garbage are one answer", func(t *testing.T) {
		tok, _ := auth.ParseToken(tokStr)
		wrong := auth.Token{ID: tok.ID, Secret: auth.NewToken().Secret}.String()
		unknown := auth.Token{ID: auth.NewToken().ID, Secret: tok.Secret}.String()
		for _, bad := range []string{wrong, unknown, "", "bp_x", tokStr + "x"} {
			_, err := s.Authenticate(ctx, bad)
			if !isCode(err, blobplane.CodeUnauthorized) {
				t.Errorf("Authenticate(%q) = %v, want unauthorized", bad, err)
			}
		}
		_, e1 := s.Authenticate(ctx, wrong)
		_, e2 := s.Authenticate(ctx, unknown)
		if blobplane.ErrorMessage(e1) != blobplane.ErrorMessage(e2) {
			t.Errorf("wrong secret %q and unknown id %q answer differently", e1, e2)
		}
	})

	t.Run("principal grants apply to every token", func(t *testing.T) {
		if err := s.GrantPrincipal(ctx, "ci", grants(t, "ops/*:admin")); err != nil {
			t.Fatal(err)
		}
		p, err := s.Authenticate(ctx, tokStr)
		if err != nil || !p.Allowed("ops/db", auth.Admin) {
			t.Fatalf("principal grant missing: %+v %v", p, err)
		}
		if err := s.RevokePrincipalGrants(ctx, "ci", grants(t, "ops/*:admin")); err != nil {
			t.Fatal(err)
		}
		if p, _ := s.Authenticate(ctx, tokStr); p.Allowed("ops/db", auth.Read) {
			t.Fatal("revoked principal grant still applies")
		}
	})

	t.Run("revoked token is unauthorized", func(t *testing.T) {
		tok2, id2, err := s.CreateToken(ctx, "ci", grants(t, "other/*:read"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeToken(ctx, id2); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeToken(ctx, id2); err != nil { // idempotent
			t.Fatal(err)
		}
		if _, err := s.Authenticate(ctx, tok2); !isCode(err, blobplane.CodeUnauthorized) {
			t.Fatalf("revoked token: %v", err)
		}
		// The principal no longer holds the revoked token's grants; the
		// first token's are untouched.
		lp, err := s.LoadPrincipal(ctx, "ci")
		if err != nil || lp.Allowed("other/x", auth.Read) || !lp.Allowed("team/app", auth.Write) {
			t.Fatalf("LoadPrincipal after revoke: %+v %v", lp, err)
		}
		if ok, err := s.Allowed(ctx, "ci", "team/app", auth.Write); !ok || err != nil {
			t.Fatalf("Allowed: %v %v", ok, err)
		}
		if _, err := s.Authenticate(ctx, tokStr); err != nil {
			t.Fatalf("the other token stops working: %v", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		if err := s.RevokeToken(ctx, "aaaaaaaaaaaaaaaa"); !isCode(err, blobplane.CodeNotFound) {
			t.Errorf("revoke unknown: %v", err)
		}
		if _, _, err := s.CreateToken(ctx, "bad name", nil); !isCode(err, blobplane.CodeInvalid) {
			t.Errorf("bad principal: %v", err)
		}
		if _, _, err := s.CreateToken(ctx, "ok", []auth.Grant{{Pattern: "team*", Permission: auth.Read}}); !isCode(err, blobplane.CodeInvalid) {
			t.Errorf("bad grant: %v", err)
		}
		if _, _, err := s.CreateToken(ctx, "ok", []auth.Grant{{Pattern: "team/*"}}); !isCode(err, blobplane.CodeInvalid) {
			t.Errorf("grant without permission: %v", err)
		}
	})
}

// Bootstrap prints one admin token, ever: concurrent callers serialize and
// only one creates; once that token is revoked a new bootstrap works again.
func TestBootstrapAdminToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	type result struct {
		secret, id string
		created    bool
		err        error
	}
	results := make([]result, 4)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r := &results[i]
			r.secret, r.id, r.created, r.err = s.BootstrapAdminToken(ctx, "admin")
		})
	}
	wg.Wait()
	var winner result
	for _, r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.created {
			if winner.created {
				t.Fatal("two bootstrap tokens")
			}
			winner = r
		} else if r.secret != "" {
			t.Fatal("a non-creating bootstrap returned a secret")
		}
	}
	if !winner.created {
		t.Fatal("no bootstrap token")
	}
	p, err := s.Authenticate(ctx, winner.secret)
	if err != nil || !p.Allowed(auth.AllRepositories, auth.Admin) || p.Name != "admin" {
		t.Fatalf("bootstrap principal %+v %v", p, err)
	}
	if err := s.RevokeToken(ctx, winner.id); err != nil {
		t.Fatal(err)
	}
	if _, _, created, err := s.BootstrapAdminToken(ctx, "admin"); err != nil || !created {
		t.Fatalf("bootstrap after revoking the only admin token: %v %v", created, err)
	}
}
