package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// Migration 00013 moves the label and digest columns of intents, blobs
// and placements from table CHECK constraints onto domains: same rules,
// same check_violation, rows kept. A placement ledger created before it
// (by the earlier db/schema/placements.sql) is converted too, and its
// view, which the conversion drops, comes back with the next first write.
// Down restores the CHECK constraints.
func TestLabelDomainsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	if _, err := d.Pool.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public;`); err != nil {
		t.Fatal(err)
	}
	if err := store.MigrateToForTest(ctx, d.Pool, 12); err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	// The ledger as db/schema/placements.sql created it before 00013 (its
	// label columns and their constraints; the rest as today).
	if _, err := d.Pool.Exec(ctx, `
		CREATE TABLE placements (
		    digest     text NOT NULL CONSTRAINT placements_digest_canonical CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
		    backend    text NOT NULL CONSTRAINT placements_backend_label CHECK (backend ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
		    datacenter text NOT NULL CONSTRAINT placements_datacenter_label CHECK (datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
		    location   text NOT NULL CONSTRAINT placements_location_shape CHECK (octet_length(location) BETWEEN 1 AND 1024 AND location !~ '[[:cntrl:]]'),
		    state      text NOT NULL, reason text, revoke_reason text, size_bytes bigint NOT NULL, epoch bigint NOT NULL,
		    generation bigint NOT NULL DEFAULT 1, created_at timestamptz NOT NULL DEFAULT now(),
		    updated_at timestamptz NOT NULL DEFAULT now(), verified_at timestamptz,
		    CONSTRAINT placements_pkey PRIMARY KEY (digest, backend, datacenter, location));
		CREATE VIEW placement_summary AS SELECT digest, datacenter, count(*) AS total FROM placements GROUP BY digest, datacenter;
		INSERT INTO repositories (name) VALUES ('team/app');
		INSERT INTO intents (repository, principal, expected_digest, expected_size, ingress_datacenter, backend, staged_location, expires_at)
		    VALUES ('team/app', 'alice', '`+digest+`', 3, 'eu-1', 'fs', 'staged/1', now() + interval '1 hour');
		INSERT INTO blobs (digest, size_bytes) VALUES ('`+digest+`', 3);
		INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch)
		    VALUES ('`+digest+`', 'fs', 'eu-1', 'sha256/aa', 'pending', 3, 0);`); err != nil {
		t.Fatal(err)
	}
	types := func() map[string]string {
		t.Helper()
		rows, err := d.Pool.Query(ctx, `SELECT c.relname || '.' || a.attname, format_type(a.atttypid, a.atttypmod)
			FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
			WHERE (c.relname, a.attname) IN (('intents', 'principal'), ('intents', 'expected_digest'), ('intents', 'ingress_datacenter'),
			      ('intents', 'backend'), ('intents', 'staged_location'), ('blobs', 'digest'), ('placements', 'digest'),
			      ('placements', 'backend'), ('placements', 'datacenter'), ('placements', 'location'))`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var col, typ string
			if err := rows.Scan(&col, &typ); err != nil {
				t.Fatal(err)
			}
			got[col] = typ
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	domains := map[string]string{
		"intents.principal": "principal_name", "intents.expected_digest": "sha256_digest", "intents.ingress_datacenter": "dc_label",
		"intents.backend": "backend_label", "intents.staged_location": "object_location", "blobs.digest": "sha256_digest",
		"placements.digest": "sha256_digest", "placements.backend": "backend_label", "placements.datacenter": "dc_label",
		"placements.location": "object_location",
	}
	checkTypes := func(when string, want func(domain string) string) {
		t.Helper()
		got := types()
		for col, domain := range domains {
			if got[col] != want(domain) {
				t.Errorf("%s: %s is %q, want %q", when, col, got[col], want(domain))
			}
		}
	}
	// What each rule refuses, and the check_violation it is refused with.
	refusals := map[string]string{
		"intent digest":      `UPDATE intents SET expected_digest = 'sha256:AA'`,
		"intent principal":   `UPDATE intents SET principal = ' alice'`,
		"intent datacenter":  `UPDATE intents SET ingress_datacenter = 'EU_1'`,
		"intent backend":     `UPDATE intents SET backend = '-fs'`,
		"intent location":    `UPDATE intents SET staged_location = E'a\nb'`,
		"blob digest":        `INSERT INTO blobs (digest, size_bytes) VALUES ('md5:abc', 1)`,
		"placement digest":   `UPDATE placements SET digest = upper(digest)`,
		"placement backend":  `UPDATE placements SET backend = ''`,
		"placement location": `UPDATE placements SET location = ''`,
	}
	refused := func(when string) {
		t.Helper()
		for name, stmt := range refusals {
			_, err := d.Pool.Exec(ctx, stmt)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
				t.Errorf("%s: %s: %v, want a check_violation", when, name, err)
			}
		}
	}
	kept := func(when string) {
		t.Helper()
		var n int
		if err := d.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM intents WHERE expected_digest = $1 AND staged_location = 'staged/1')
			+ (SELECT count(*) FROM blobs WHERE digest = $1) + (SELECT count(*) FROM placements WHERE digest = $1)`, digest).Scan(&n); err != nil || n != 3 {
			t.Fatalf("%s: %d of the 3 rows kept (%v)", when, n, err)
		}
	}

	if err := store.MigrateToForTest(ctx, d.Pool, 13); err != nil {
		t.Fatal(err)
	}
	checkTypes("up", func(domain string) string { return domain })
	kept("up")
	refused("up")
	var oldChecks int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conname IN ('intents_expected_digest_check', 'blobs_digest_check', 'placements_digest_canonical')`).Scan(&oldChecks); err != nil || oldChecks != 0 {
		t.Fatalf("%d table CHECKs left beside the domains (%v)", oldChecks, err)
	}
	// The first placement write through a Store recreates the view.
	if _, err := store.New(d.Pool, nil).StagePlacement(ctx, pkey(digestOf("after 00013"), "eu-1", "b"), 1, 1); err != nil {
		t.Fatal(err)
	}
	var view bool
	if err := d.Pool.QueryRow(ctx, `SELECT to_regclass('placement_summary') IS NOT NULL`).Scan(&view); err != nil || !view {
		t.Fatalf("placement_summary after the first write: %v (%v)", view, err)
	}

	if err := store.MigrateToForTest(ctx, d.Pool, 12); err != nil {
		t.Fatal(err)
	}
	checkTypes("down", func(string) string { return "text" })
	kept("down")
	refused("down")
	if err := store.MigrateToForTest(ctx, d.Pool, 13); err != nil {
		t.Fatal(err)
	}
	checkTypes("up again", func(domain string) string { return domain })
}
