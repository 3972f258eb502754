package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// Every statement an upload, a read or an authentication sends reaches
// the rows it needs through an index: in a store with tens of thousands
// of rows in each table they touch, none of their plans scans one of
// those tables whole. A statement that did would cost more with every
// upload ever made (as FinalizeContext's grants did, docs/performance.md
// item 24), which the bench, with its small store, cannot see. The plans
// are Postgres' own (EXPLAIN with the statement's arguments, after
// ANALYZE), not timings.
func TestHotStatementsUseIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	// The placement ledger exists once something is staged.
	if _, err := s.StagePlacement(ctx, placement.Key{Digest: blobplane.Digest("sha256:" + strings.Repeat("0", 64)), Backend: "fs", Datacenter: "eu-1", Location: "x"}, 1, 0); err != nil {
		t.Fatal(err)
	}
	seedGrants(t, d.Pool, 5000, 20000)
	if _, err := d.Pool.Exec(ctx, `
		INSERT INTO repositories (name) SELECT 'r' || g || '/app' FROM generate_series(1, 2000) g;
		INSERT INTO intents (repository, principal, expected_digest, expected_size, ingress_datacenter, backend, state, expires_at)
		    SELECT 'r' || (g % 2000 + 1) || '/app', 'p' || (g % 5000 + 1), 'sha256:' || md5(g::text) || md5((-g)::text), 4096,
		           'eu-1', 'fs', 'admitted', now() + interval '1 hour'
		    FROM generate_series(1, 20000) g;
		INSERT INTO blobs (digest, size_bytes) SELECT expected_digest, 4096 FROM intents;
		INSERT INTO blob_references (repository, digest, operation_id) SELECT repository, expected_digest, operation_id FROM intents;
		INSERT INTO operation_outcomes (operation_id, repository, digest, size_bytes, result)
		    SELECT operation_id, repository, expected_digest, 4096, '{}' FROM intents;
		INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch, verified_at)
		    SELECT digest, 'fs', 'eu-1', 'sha256/' || substr(digest, 8), 'verified', 4096, 0, now() FROM blobs;
		ANALYZE;`); err != nil {
		t.Fatal(err)
	}
	var op, repo, principal, token, digest string
	if err := d.Pool.QueryRow(ctx, `SELECT i.operation_id::text, i.repository, i.principal, t.id, i.expected_digest
		FROM intents i JOIN tokens t ON t.principal = i.principal ORDER BY i.created_at LIMIT 1`).Scan(&op, &repo, &principal, &token, &digest); err != nil {
		t.Fatal(err)
	}
	large := map[string]bool{"repositories": true, "principals": true, "tokens": true, "grants": true, "intents": true,
		"blobs": true, "blob_references": true, "operation_outcomes": true, "placements": true}
	for _, st := range s.HotStatementsForTest(op, repo, principal, token, blobplane.Digest(digest)) {
		var plan []byte
		if err := d.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+st.SQL, st.Args...).Scan(&plan); err != nil {
			t.Fatalf("%s: %v", st.Name, err)
		}
		var nodes []struct{ Plan planNode }
		if err := json.Unmarshal(plan, &nodes); err != nil || len(nodes) != 1 {
			t.Fatalf("%s: plan %s: %v", st.Name, plan, err)
		}
		for _, scan := range nodes[0].Plan.seqScans() {
			if large[scan] {
				t.Errorf("%s scans %s whole:\n%s", st.Name, scan, plan)
			}
		}
	}
}

// planNode is the part of EXPLAIN (FORMAT JSON) the test reads.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Plans    []planNode `json:"Plans"`
}

// seqScans lists the relations a plan scans sequentially.
func (n planNode) seqScans() []string {
	var out []string
	if n.NodeType == "Seq Scan" {
		out = append(out, n.Relation)
	}
	for _, c := range n.Plans {
		out = append(out, c.seqScans()...)
	}
	return out
}
