package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/pgtest"
)

// BenchmarkLabelDomains measures what migration 00013 saves Postgres per
// upload on the intents table: an upload's intent insert and its update
// to admitted, on a copy of intents with the domains (as migrated) and on
// a copy with the table CHECKs it had before, in alternating rounds on one
// connection (commits asynchronous: CPU, not the WAL flush). It reports
// the time of each and the ratio; docs/performance.md, item 23.
func BenchmarkLabelDomains(b *testing.B) {
	ctx := context.Background()
	d := pgtest.New(b)
	if _, err := d.Pool.Exec(ctx, `
		CREATE TABLE intents_domains (LIKE intents INCLUDING ALL);
		CREATE TABLE intents_checks (LIKE intents INCLUDING ALL);
		ALTER TABLE intents_checks
		    ALTER COLUMN principal TYPE text, ALTER COLUMN expected_digest TYPE text, ALTER COLUMN ingress_datacenter TYPE text,
		    ALTER COLUMN backend TYPE text, ALTER COLUMN staged_location TYPE text,
		    ADD CHECK (principal ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$'),
		    ADD CHECK (expected_digest ~ '^sha256:[0-9a-f]{64}$'),
		    ADD CHECK (ingress_datacenter ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
		    ADD CHECK (backend ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
		    ADD CHECK (octet_length(staged_location) BETWEEN 1 AND 1024 AND staged_location !~ '[[:cntrl:]]')`); err != nil {
		b.Fatal(err)
	}
	conn, err := d.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		b.Fatal(err)
	}
	upload := func(table string, i int) {
		var id [16]byte
		err := conn.QueryRow(ctx, `INSERT INTO `+table+` (repository, principal, expected_digest, expected_size, ingress_datacenter, backend, expires_at)
			VALUES ('team/app', 'alice', $1, 4096, 'eu-1', 'fs', now() + interval '1 hour') RETURNING operation_id`,
			fmt.Sprintf("sha256:%064x", uint64(i))).Scan(&id)
		if err == nil {
			_, err = conn.Exec(ctx, `UPDATE `+table+` SET state = 'admitted', updated_at = now() WHERE operation_id = $1 AND state = 'pending'`, id)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	upload("intents_domains", 0) // prepare both statements on both tables
	upload("intents_checks", 0)
	checks, domains := alternateRounds(b, 50,
		func(i int) { upload("intents_checks", i) },
		func(i int) { upload("intents_domains", i) })
	b.ReportMetric(float64(domains.Microseconds())/float64(b.N), "µs/upload-domains")
	b.ReportMetric(float64(checks.Microseconds())/float64(b.N), "µs/upload-checks")
	b.ReportMetric(float64(checks)/float64(domains), "checks/domains")
}

// alternateRounds runs b.N ops of baseline and b.N of candidate (each
// given the op's index) in alternating rounds of round ops, so that both
// see the same machine, and returns the time each took: the same-process
// A/B of a benchmark that reports a ratio.
func alternateRounds(b *testing.B, round int, baseline, candidate func(i int)) (base, cand time.Duration) {
	b.ResetTimer()
	for i := 0; i < b.N; i += round {
		n := min(round, b.N-i)
		start := time.Now()
		for j := range n {
			baseline(i + j)
		}
		base += time.Since(start)
		start = time.Now()
		for j := range n {
			candidate(i + j)
		}
		cand += time.Since(start)
	}
	return base, cand
}

// BenchmarkDomainChecks measures what migration 00015 saves per value
// checked: one statement casting 1,000 sets of values (a digest, a
// datacenter, a principal, a backend: what an upload binds several times
// over) to the domains as migrated and to copies of them checked by the
// regular expressions they had before, in alternating rounds. It reports
// the time per set of four values for each and the ratio;
// docs/performance.md, item 26.
func BenchmarkDomainChecks(b *testing.B) {
	ctx := context.Background()
	d := pgtest.New(b)
	if _, err := d.Pool.Exec(ctx, `
		CREATE DOMAIN re_sha256_digest AS text CHECK (VALUE ~ '^sha256:[0-9a-f]{64}$');
		CREATE DOMAIN re_dc_label AS text CHECK (VALUE ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$');
		CREATE DOMAIN re_principal_name AS text CHECK (VALUE ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$');
		CREATE DOMAIN re_backend_label AS text CHECK (VALUE ~ '^[a-z0-9][a-z0-9_-]{0,31}$')`); err != nil {
		b.Fatal(err)
	}
	const sets = 1000
	cast := func(prefix string) func(int) {
		// The sum uses every value, so the planner cannot drop a cast.
		q := fmt.Sprintf(`SELECT count(*) FILTER (WHERE octet_length(d) + octet_length(dc) + octet_length(p) + octet_length(be) > 0)
			FROM (SELECT ('sha256:' || md5(g::text) || md5((g + 1)::text))::%[1]ssha256_digest AS d,
			('eu-' || g %% 100)::%[1]sdc_label AS dc, ('bench-principal-' || g)::%[1]sprincipal_name AS p, ('fs' || g %% 10)::%[1]sbackend_label AS be
			FROM generate_series($1::int, $1::int + %[2]d - 1) g) x`, prefix, sets)
		return func(i int) {
			var n int
			if err := d.Pool.QueryRow(ctx, q, i).Scan(&n); err != nil || n != sets {
				b.Fatalf("%d values (%v)", n, err)
			}
		}
	}
	regex, plain := cast("re_"), cast("")
	regex(0)
	plain(0)
	regexTime, plainTime := alternateRounds(b, 5, regex, plain)
	per := float64(b.N * sets)
	b.ReportMetric(float64(plainTime.Nanoseconds())/per/1000, "µs/set-plain")
	b.ReportMetric(float64(regexTime.Nanoseconds())/per/1000, "µs/set-regex")
	b.ReportMetric(float64(regexTime)/float64(plainTime), "regex/plain")
}
