package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// BenchmarkPrincipalGrants measures reading the grants a principal holds
// now (its own and its valid tokens': what Finalize re-checks on every
// publication, and LoadPrincipal) in a store with 20,000 principals,
// 60,000 tokens and 80,000 grants: as PrincipalGrants reads them (two
// index lookups) against the single join with an OR it replaced, in
// alternating rounds in one process. docs/performance.md, item 24.
func BenchmarkPrincipalGrants(b *testing.B) {
	ctx := context.Background()
	d := pgtest.New(b)
	seedGrants(b, d.Pool, 20000, 60000)
	s := store.New(d.Pool, nil)
	const before = `SELECT (g.pattern || ':' || g.permission)::text FROM grants g
		LEFT JOIN tokens t ON t.id = g.token_id
		WHERE g.principal = $1::text OR (t.principal = $1::text AND t.revoked_at IS NULL)
		ORDER BY g.id`
	orJoin := func() int {
		rows, err := d.Pool.Query(ctx, before, "p42")
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		return n
	}
	p, err := s.LoadPrincipal(ctx, "p42")
	if err != nil {
		b.Fatal(err)
	}
	if n := orJoin(); n != len(p.Grants) || n != 4 {
		b.Fatalf("the OR join found %d grants, LoadPrincipal %d, want 4 each", n, len(p.Grants))
	}
	joins, lookups := alternateRounds(b, 10,
		func(int) { orJoin() },
		func(int) {
			if _, err := s.LoadPrincipal(ctx, "p42"); err != nil {
				b.Fatal(err)
			}
		})
	b.ReportMetric(float64(lookups.Microseconds())/float64(b.N), "µs/read-lookups")
	b.ReportMetric(float64(joins.Microseconds())/float64(b.N), "µs/read-or-join")
	b.ReportMetric(float64(joins)/float64(lookups), "or-join/lookups")
}

// seedGrants fills a store with principals p1..pN, each holding
// team/app:read, and tokens spread over them, each holding team/*:write:
// principals + tokens grants in all, analyzed.
func seedGrants(tb testing.TB, pool *pgxpool.Pool, principals, tokens int) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`
		INSERT INTO principals (name) SELECT 'p' || g FROM generate_series(1, %[1]d) g;
		INSERT INTO tokens (id, principal, secret_sha256)
		    SELECT translate(lpad(to_hex(g), 16, '0'), '0123456789abcdef', 'abcdefghijklmnop'), 'p' || (g %% %[1]d + 1), sha256(g::text::bytea)
		    FROM generate_series(1, %[2]d) g;
		INSERT INTO grants (token_id, pattern, permission) SELECT id, 'team/*', 'write' FROM tokens;
		INSERT INTO grants (principal, pattern, permission) SELECT name, 'team/app', 'read' FROM principals;
		ANALYZE principals; ANALYZE tokens; ANALYZE grants;`, principals, tokens)); err != nil {
		tb.Fatal(err)
	}
}
