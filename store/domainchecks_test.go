package store_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// domainRegexps are the regular expressions the label and digest domains
// checked before migration 00015 (00013's), which its checks must agree
// with on every string.
var domainRegexps = map[string]string{
	"sha256_digest":  `^sha256:[0-9a-f]{64}$`,
	"principal_name": `^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$`,
	"dc_label":       `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`,
	"backend_label":  `^[a-z0-9][a-z0-9_-]{0,31}$`,
}

// domainCorpus returns strings at and around each domain's edges, and
// random ones over an alphabet of the allowed characters, their
// neighbours and a few that are never allowed.
func domainCorpus() []string {
	hex := "0123456789abcdef"
	rep := func(s string, n int) string { return strings.Repeat(s, n) }
	c := []string{
		"", "a", "-", "_", ".", "A", "0", "a-", "-a", "a_", "_a", ".a", "a.", "a-b", "a_b",
		"sha256:" + rep("a", 64), "sha256:" + rep("a", 63), "sha256:" + rep("a", 65), "sha256:" + rep("A", 64),
		"sha256:" + rep("a", 63) + "g", "sha256:" + rep("a", 63) + "é", "sha256:" + rep("a", 62) + "é",
		"sha256:" + rep("a", 64) + "\n", "SHA256:" + rep("a", 64), "sha512:" + rep("a", 64), "sha256;" + rep("a", 64),
		" sha256:" + rep("a", 63), "sha256:" + rep(hex, 4),
		rep("a", 32), rep("a", 33), rep("a", 63), rep("a", 64), rep("a", 127), rep("a", 128), rep("a", 129),
		rep("a", 62) + "-", "a" + rep("-", 61) + "a", "a" + rep("-", 62) + "a", "a" + rep("_", 31), "a" + rep("_", 32),
		"alice@example.com", "svc:deploy", "bench-principal-1", "Alice", "eu-1", "fs", "s3main", "eu-1\n", "eu 1",
		"é", "aé", "eé-1", "a\tb", "a/b", "a\\b", "a%", "a*", "a'b",
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcfgz09AFZ-_.@:/ é\n" + hex)
	for range 1200 {
		n := r.IntN(70)
		if r.IntN(4) == 0 {
			n = 60 + r.IntN(75)
		}
		var b strings.Builder
		if r.IntN(3) == 0 {
			b.WriteString("sha256:")
			n = 62 + r.IntN(4)
		}
		for range n {
			if r.IntN(3) == 0 {
				b.WriteByte(hex[r.IntN(len(hex))])
			} else {
				b.WriteRune(alphabet[r.IntN(len(alphabet))])
			}
		}
		c = append(c, b.String())
	}
	// Digests: 64 hex digits, half of them with one character changed.
	for i := range 400 {
		h := []rune(strings.Map(func(rune) rune { return rune(hex[r.IntN(len(hex))]) }, rep("x", 64)))
		if i%2 == 1 {
			h[r.IntN(len(h))] = alphabet[r.IntN(len(alphabet))]
		}
		c = append(c, "sha256:"+string(h))
	}
	return c
}

// Migration 00015 replaces the domains' regular expressions with string
// functions that accept exactly the same values: for every domain and
// every string of the corpus, a cast to the domain succeeds if and only
// if the old expression matches (Postgres' own ~), and a refusal is a
// check_violation. Down brings the regular expressions back.
func TestDomainChecksMatchTheirRegularExpressions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	corpus := domainCorpus()
	agree := func(when string) {
		t.Helper()
		for domain, re := range domainRegexps {
			accepted, refused := 0, 0
			for _, s := range corpus {
				var want bool
				if err := d.Pool.QueryRow(ctx, `SELECT $1::text ~ $2`, s, re).Scan(&want); err != nil {
					t.Fatal(err)
				}
				_, err := d.Pool.Exec(ctx, `SELECT $1::text::`+domain, s)
				var pgErr *pgconn.PgError
				switch {
				case err == nil && want:
					accepted++
				case want:
					t.Errorf("%s: %s refuses %q (%v), which %s matches", when, domain, s, err, re)
				case errors.As(err, &pgErr) && pgErr.Code == "23514":
					refused++
				default:
					t.Errorf("%s: %s: %q, which %s does not match: %v, want a check_violation", when, domain, s, re, err)
				}
			}
			if accepted < 5 || refused < 5 {
				t.Errorf("%s: %s: the corpus has %d accepted and %d refused strings, too few to compare", when, domain, accepted, refused)
			}
		}
	}
	defs := func() string {
		var s string
		if err := d.Pool.QueryRow(ctx, `SELECT string_agg(pg_get_constraintdef(c.oid), ' ') FROM pg_constraint c
			JOIN pg_type t ON t.oid = c.contypid WHERE t.typname IN ('sha256_digest', 'principal_name', 'dc_label', 'backend_label')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	if strings.Contains(defs(), "~") {
		t.Fatalf("after 00015 a domain still has a regular expression: %s", defs())
	}
	agree("00015")
	if err := store.MigrateToForTest(ctx, d.Pool, 14); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(defs(), "~"); got != 4 {
		t.Fatalf("after 00015's down, %d regular expressions in the domains, want 4: %s", got, defs())
	}
	agree("00015 down")
	if err := store.MigrateToForTest(ctx, d.Pool, 15); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(defs(), "~") {
		t.Fatalf("after 00015 up again: %s", defs())
	}
}
