package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
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
	d, s := planStore(t)
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
		root, plan := explain(t, d.Pool, st)
		for _, scan := range root.seqScans() {
			if large[scan] {
				t.Errorf("%s scans %s whole:\n%s", st.Name, scan, plan)
			}
		}
	}
}

// The statements that reach one intent or one placement by its key reach
// it by that key even when the partial indexes on pending rows are full
// of dead entries and the statistics count no pending row: a busy store
// between two autovacuums, where every upload inserted a pending intent
// and a pending placement and moved both on within milliseconds. Written
// with state = 'pending', Postgres preferred the small-looking pending
// indexes (or placements' (datacenter, state)) and walked every entry in
// them, each dead one visited in the heap: ~1.4 ms per statement after
// 10,000 uploads, growing until the next vacuum (db/queries/uploads.sql,
// docs/performance.md item 29). The plans are Postgres' own, after
// ANALYZE, for the statements exactly as sqlc sends them.
func TestByKeyStatementsUseTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, s := planStore(t)
	// Statistics from a store with no pending row, then 10,000 uploads'
	// churn that no vacuum cleaned up.
	if _, err := d.Pool.Exec(ctx, `
		ALTER TABLE intents SET (autovacuum_enabled = false);
		ALTER TABLE placements SET (autovacuum_enabled = false);
		INSERT INTO repositories (name) VALUES ('r/app');
		INSERT INTO intents (repository, principal, expected_digest, expected_size, ingress_datacenter, backend, state, expires_at)
		    SELECT 'r/app', 'p', 'sha256:' || md5(g::text) || md5((-g)::text), 4096, 'eu-1', 'fs', 'admitted', now() + interval '1 hour'
		    FROM generate_series(1, 10000) g;
		INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch, verified_at)
		    SELECT expected_digest, 'fs', 'eu-1', 'sha256/' || substr(expected_digest, 8), 'verified', 4096, 0, now() FROM intents;
		ANALYZE;
		INSERT INTO intents (repository, principal, expected_digest, expected_size, ingress_datacenter, backend, expires_at)
		    SELECT 'r/app', 'p', 'sha256:' || md5(g::text) || md5((-g)::text), 4096, 'eu-1', 'fs', now() + interval '1 hour'
		    FROM generate_series(10001, 20000) g;
		INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch)
		    SELECT expected_digest, 'fs', 'eu-1', 'sha256/' || substr(expected_digest, 8), 'pending', 4096, 0 FROM intents WHERE state = 'pending';
		UPDATE intents SET state = 'admitted' WHERE state = 'pending';
		UPDATE placements SET state = 'verified', verified_at = now() WHERE state = 'pending';`); err != nil {
		t.Fatal(err)
	}
	var op, digest string
	if err := d.Pool.QueryRow(ctx, `SELECT operation_id::text, expected_digest FROM intents
		WHERE expected_digest = 'sha256:' || md5('20000') || md5('-20000')`).Scan(&op, &digest); err != nil { // one of the churned uploads
		t.Fatal(err)
	}
	// The indexes that reach rows by key (or, for a claim, by digest).
	byKey := map[string]map[string]bool{
		"intents":    {"intents_pkey": true, "intents_pending_digest_idx": true},
		"placements": {"placements_pkey": true},
	}
	for _, st := range s.HotStatementsForTest(op, "r/app", "p", "no-token", blobplane.Digest(digest)) {
		root, plan := explain(t, d.Pool, st)
		for _, n := range root.scans() {
			if ok, watched := byKey[n.Relation]; watched && !ok[n.IndexName] {
				t.Errorf("%s reaches %s through %s %q, not by its key:\n%s", st.Name, n.Relation, n.NodeType, n.IndexName, plan)
			}
		}
	}
}

// The same statements keep reaching their rows by key in a store that is
// new: Postgres plans a prepared statement with its arguments five times,
// then settles on the generic plan (no argument values) when that costs no
// more, and keeps it for the connection's life, until a relation's
// statistics change. In a new store, with tables of a few pages and never
// analyzed, a key lookup and a scan of any index on an equality cost the
// same; written with datacenter = @datacenter, VerifyPendingPlacement's
// generic plan reached its placement through placements (datacenter,
// state) and visited every placement of the datacenter, each upload's
// verification walking all earlier ones until autovacuum's first ANALYZE
// replanned it: 348 µs per call on average over a 20 s bench run of
// 28,000 uploads, 49 µs with the key (docs/performance.md item 33). The
// plans are Postgres' generic ones, as a pooled connection caches them:
// each statement PREPAREd exactly as sqlc sends it (a merged batch's with
// its settings, as that batch plans it), then EXPLAIN EXECUTE
// under plan_cache_mode = force_generic_plan, in a store whose tables hold
// nothing but the one placement planStore stages.
func TestByKeyStatementsUseTheKeyInANewStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, s := planStore(t)
	pooled, err := d.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pooled.Hijack() // its settings and statements are this test's: closed, not pooled again
	defer conn.Close(ctx)   //nolint:errcheck
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	digest := blobplane.Digest("sha256:" + strings.Repeat("ab", 32))
	byKey := map[string]map[string]bool{
		"intents":    {"intents_pkey": true, "intents_pending_digest_idx": true},
		"placements": {"placements_pkey": true},
	}
	for i, st := range s.HotStatementsForTest("00000000-0000-0000-0000-000000000001", "r/app", "p", "no-token", digest) {
		name := fmt.Sprintf("hot_%d", i)
		// Planned as the store sends it: a merged batch's statement in a
		// transaction that begins with the batch's settings (sequential
		// scans off, and with them JIT).
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.SeqScanOff {
			if _, err := tx.Exec(ctx, store.MergedBatchSettingsForTest); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+st.SQL); err != nil {
			t.Fatalf("%s: %v", st.Name, err)
		}
		var params int
		if err := tx.QueryRow(ctx, "SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = $1", name).Scan(&params); err != nil {
			t.Fatal(err)
		}
		// A generic plan does not depend on the values: NULL for each.
		args := strings.TrimSuffix(strings.Repeat("NULL, ", params), ", ")
		var plan []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+name+"("+args+")").Scan(&plan); err != nil {
			t.Fatalf("%s: %v", st.Name, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		var nodes []struct {
			Plan planNode
			JIT  json.RawMessage
		}
		if err := json.Unmarshal(plan, &nodes); err != nil || len(nodes) != 1 {
			t.Fatalf("%s: plan %s: %v", st.Name, plan, err)
		}
		// A plan costed past jit_above_cost is compiled by LLVM at every
		// run: 0.35-0.5 s of CPU per merged PublishMany, once sequential
		// scans off priced replication_policies' scan at 10^10.
		if nodes[0].JIT != nil {
			t.Errorf("%s is compiled by JIT (%s) at every run:\n%s", st.Name, nodes[0].JIT, plan)
		}
		for _, n := range nodes[0].Plan.scans() {
			if ok, watched := byKey[n.Relation]; watched && !ok[n.IndexName] {
				t.Errorf("%s's generic plan reaches %s through %s %q, not by its key:\n%s", st.Name, n.Relation, n.NodeType, n.IndexName, plan)
			}
		}
	}
}

// planStore is a Store on a database of its own whose placement ledger
// exists (it does once something is staged).
func planStore(t *testing.T) (*pgtest.DB, *store.Store) {
	t.Helper()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	if _, err := s.StagePlacement(context.Background(), placement.Key{Digest: blobplane.Digest("sha256:" + strings.Repeat("0", 64)),
		Backend: "fs", Datacenter: "eu-1", Location: "x"}, 1, 0); err != nil {
		t.Fatal(err)
	}
	return d, s
}

// explain is Postgres' plan for st (EXPLAIN with its arguments), parsed
// and as text.
func explain(t *testing.T, pool *pgxpool.Pool, st store.HotStatementForTest) (planNode, []byte) {
	t.Helper()
	var plan []byte
	if err := pool.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+st.SQL, st.Args...).Scan(&plan); err != nil {
		t.Fatalf("%s: %v", st.Name, err)
	}
	var nodes []struct{ Plan planNode }
	if err := json.Unmarshal(plan, &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("%s: plan %s: %v", st.Name, plan, err)
	}
	return nodes[0].Plan, plan
}

// planNode is the part of EXPLAIN (FORMAT JSON) the tests read.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

// scans lists the plan's nodes that read a relation; a bitmap heap scan
// is named by the index of its bitmap index scan.
func (n planNode) scans() []planNode {
	var out []planNode
	if n.Relation != "" && n.NodeType != "ModifyTable" {
		if n.NodeType == "Bitmap Heap Scan" && len(n.Plans) == 1 && n.Plans[0].NodeType == "Bitmap Index Scan" {
			n.IndexName = n.Plans[0].IndexName
		}
		out = append(out, n)
	}
	for _, c := range n.Plans {
		out = append(out, c.scans()...)
	}
	return out
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

// The reaper's UPDATE reaches the intents it claimed by primary key even
// when the statistics predate a burst of new pending intents (autovacuum
// has not analyzed them yet): the planner then believes there is about
// one pending intent, and a join on the claimed rows scanned every
// pending intent once per claimed one (11 s per pass of 1000 among
// 100,000, docs/sweeps.md). EXPLAIN ANALYZE runs the statement, in a
// transaction rolled back; the assertion is on the plan Postgres chose
// and the rows it visited, not on time.
func TestReaperPlanSurvivesStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	if _, err := d.Pool.Exec(ctx, `
		ALTER TABLE intents SET (autovacuum_enabled = false);
		INSERT INTO repositories (name) VALUES ('r/app');
		INSERT INTO intents (repository, principal, ingress_datacenter, backend, state, expires_at)
		    SELECT 'r/app', 'p', 'eu-1', 'fs', 'admitted', now() + interval '1 hour' FROM generate_series(1, 20000);
		ANALYZE intents;
		INSERT INTO intents (repository, principal, ingress_datacenter, backend, state, expires_at, created_at)
		    SELECT 'r/app', 'p', 'eu-1', 'fs', 'pending', now() - interval '1 minute', now() - interval '2 hours'
		    FROM generate_series(1, 10000);`); err != nil {
		t.Fatal(err)
	}
	st := s.ReapStatementForTest("eu-1", 1000)
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var plan []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+st.SQL, st.Args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var nodes []struct{ Plan analyzedNode }
	if err := json.Unmarshal(plan, &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	root := nodes[0].Plan
	if root.NodeType != "ModifyTable" || root.ActualRows != 1000 {
		t.Fatalf("the pass reaped %v rows, want 1000:\n%s", root.ActualRows, plan)
	}
	// Every node under the UPDATE (outside the claiming CTE) returns at
	// most the claimed rows: no scan of every pending intent.
	for _, n := range root.Plans {
		if n.ParentRelationship == "InitPlan" || n.ParentRelationship == "SubPlan" {
			continue
		}
		if max := n.maxRows(); max > 1000 {
			t.Errorf("the UPDATE's plan visits %v rows in one node, want at most the 1000 claimed:\n%s", max, plan)
		}
	}
}

// analyzedNode is the part of EXPLAIN (ANALYZE, FORMAT JSON) the reaper
// test reads.
type analyzedNode struct {
	NodeType           string         `json:"Node Type"`
	ParentRelationship string         `json:"Parent Relationship"`
	ActualRows         float64        `json:"Actual Rows"`
	ActualLoops        float64        `json:"Actual Loops"`
	RowsRemoved        float64        `json:"Rows Removed by Filter"`
	JoinRemoved        float64        `json:"Rows Removed by Join Filter"`
	Plans              []analyzedNode `json:"Plans"`
}

// maxRows is the most rows any node of the subtree produced or discarded
// over all its loops.
func (n analyzedNode) maxRows() float64 {
	loops := max(n.ActualLoops, 1)
	m := (n.ActualRows + n.RowsRemoved) * loops
	m = max(m, n.JoinRemoved)
	for _, c := range n.Plans {
		m = max(m, c.maxRows())
	}
	return m
}

// The hot paths' transactions run the generic plans the test above
// checks, from their first call on a connection: no plan is made again
// for a call's arguments. Left to choose (plan_cache_mode = auto),
// Postgres plans a prepared statement afresh for its first five runs on
// each connection, and for good when it costs a plan with the arguments
// below the generic one: over a 15 s put4k-16 run it planned PublishMany
// at every call (0.34 ms each, more than half its execution) and
// FinalizeContexts at three calls in four (0.42 ms) (docs/performance.md
// item 35). After closes of every kind (a session claimed and finalized
// alone, a merged Finalize batch, a chained single-request close), every
// connection's prepared statements of those paths (pg_prepared_statements)
// show generic plans only.
func TestHotPathsRunGenericPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	for _, req := range u.closings(t, "alone", 3) {
		if _, err := u.s.Finalize(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	r := parkFinalizeSlots(t, u, u.s, "holder")
	_, errs := r.finalizeQueued(t, u.closings(t, "merged", 3))
	for i, err := range errs {
		if err != nil {
			t.Fatalf("merged call %d: %v", i, err)
		}
	}
	ch, _, req := u.chainWith(t, "chained", func(*upload.FinalizeRequest) {})
	if _, err := ch.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	hot := map[string]bool{"CreateIntent": true, "ClaimIntentContent": true, "LockPlacementDigest": true,
		"InsertPlacementIfAbsent": true, "FinalizeContext": true, "VerifyPendingPlacement": true,
		"EnsureBlobUnderLease": true, "Publish": true, "FinalizeContexts": true, "VerifyPendingPlacements": true,
		"EnsureBlobsUnderLease": true, "PublishMany": true}
	generic := map[string]bool{}
	conns := u.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		rows, err := c.Query(ctx, `SELECT substring(statement FROM '^-- name: (\w+)'), generic_plans, custom_plans
			FROM pg_prepared_statements WHERE statement LIKE '-- name: %'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name string
			var genericPlans, customPlans int64
			if err := rows.Scan(&name, &genericPlans, &customPlans); err != nil {
				t.Fatal(err)
			}
			if !hot[name] {
				continue
			}
			if customPlans != 0 {
				t.Errorf("%s: %d plans made for a call's arguments (and %d runs of the generic plan) on one connection", name, customPlans, genericPlans)
			}
			if genericPlans > 0 {
				generic[name] = true
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	for name := range hot {
		if !generic[name] {
			t.Errorf("%s never ran: the closes above did not take every hot path", name)
		}
	}
}
