package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/replication/policy"
	"github.com/blobplane/blobplane/store"
)

// The reconciler (issue 28) against a real ledger and River: a blob
// published in eu-1 before its repository's policy asked for us-1 and
// ap-1 gets both copies enqueued into their datacenters' queues; asking
// again adds nothing while they are unfinished; a copy verified since is
// not asked for again.
func TestReconcilerEnqueuesWhatThePolicyMisses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	for _, dc := range []string{"eu-1", "us-1", "ap-1"} {
		if _, err := st.RegisterNode(ctx, store.Node{ID: "api-" + dc, Datacenter: dc, Role: "api", Endpoint: "127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateRepository(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	content := "published before the policy"
	sum := sha256.Sum256([]byte(content))
	dg := blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
	if _, err := d.Pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2)`, string(dg), len(content)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `INSERT INTO blob_references (repository, digest, operation_id) VALUES ('team/app', $1, gen_random_uuid())`, string(dg)); err != nil {
		t.Fatal(err)
	}
	verify := func(dc string) {
		k := placement.Key{Digest: dg, Backend: "fs", Datacenter: dc, Location: placement.ObjectLocation(dg)}
		if _, err := st.StagePlacement(ctx, k, int64(len(content)), 1); err != nil {
			t.Fatal(err)
		}
		if _, err := st.VerifyPlacement(ctx, k, dg, int64(len(content)), 1); err != nil {
			t.Fatal(err)
		}
	}
	verify("eu-1")
	if _, err := st.SetPolicy(ctx, policy.Policy{Prefix: "team/", Datacenters: []string{"ap-1", "eu-1", "us-1"}, MinVerifiedCopies: 3}, "admin"); err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r := &replication.Reconciler{Ledger: st, Copies: CopyQueue{Client: rc}, Logger: slog.New(slog.DiscardHandler)}
	count := func(queue string) int {
		var n int
		if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'replicate' AND queue = $1 AND args->>'digest' = $2`, queue, string(dg)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rep, err := r.Run(ctx, 10)
	if err != nil || rep.Blobs != 1 || rep.Enqueued != 2 || !rep.Wrapped {
		t.Fatalf("first pass: %+v, %v", rep, err)
	}
	if count(ReplicationQueue("us-1")) != 1 || count(ReplicationQueue("ap-1")) != 1 || count(ReplicationQueue("eu-1")) != 0 {
		t.Fatalf("jobs after the first pass: us-1 %d, ap-1 %d, eu-1 %d", count(ReplicationQueue("us-1")), count(ReplicationQueue("ap-1")), count(ReplicationQueue("eu-1")))
	}
	// The backlog the metrics export: one unfinished copy into ap-1 and
	// us-1 each, and 0 (not a missing series) for eu-1.
	bl, err := ReplicationBacklog(d.Pool)(ctx)
	if err != nil || len(bl) != 3 || bl[0].Datacenter != "ap-1" || bl[0].Jobs != 1 || bl[1].Datacenter != "eu-1" || bl[1].Jobs != 0 || bl[1].OldestAge != 0 ||
		bl[2].Datacenter != "us-1" || bl[2].Jobs != 1 || bl[0].OldestAge < 0 {
		t.Fatalf("backlog: %+v, %v", bl, err)
	}
	if n := testutil.CollectAndCount(replication.NewBacklogCollector(ReplicationBacklog(d.Pool), slog.New(slog.DiscardHandler))); n != 6 {
		t.Fatalf("backlog metrics: %d series, want depth and age for three datacenters", n)
	}
	// Again: the copies are in flight (unique among unfinished jobs).
	if _, err := r.Run(ctx, 10); err != nil || count(ReplicationQueue("us-1")) != 1 || count(ReplicationQueue("ap-1")) != 1 {
		t.Fatalf("second pass: %v; us-1 %d, ap-1 %d", err, count(ReplicationQueue("us-1")), count(ReplicationQueue("ap-1")))
	}
	// Both jobs finished, but only us-1's copy arrived (ap-1's attempt
	// gave up, say): only ap-1 is asked for again.
	verify("us-1")
	if _, err := d.Pool.Exec(ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE kind = 'replicate'`); err != nil {
		t.Fatal(err)
	}
	rep, err = r.Run(ctx, 10)
	if err != nil || rep.Enqueued != 1 || count(ReplicationQueue("ap-1")) != 2 || count(ReplicationQueue("us-1")) != 1 {
		t.Fatalf("third pass: %+v, %v; ap-1 %d, us-1 %d", rep, err, count(ReplicationQueue("ap-1")), count(ReplicationQueue("us-1")))
	}
	var after string
	if err := d.Pool.QueryRow(ctx, `SELECT after_digest FROM replication_cursor`).Scan(&after); err != nil || after != "" {
		t.Fatalf("cursor after a short pass: %q, %v; want wrapped", after, err)
	}
}
