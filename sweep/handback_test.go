package sweep_test

import (
	"context"
	"testing"
	"time"

	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

// Uploads that closed (verified bytes at the content-addressed key) and
// were then abandoned without publishing: before the hand-back no blob
// state row named their digest, so the collector never considered it and
// the inventory kept the bytes as "staged" forever (an L1 leak). The
// abandoning transaction now hands the digest back to the collector.

// reaperWith is a reaper of the gc fixture's datacenter and backend;
// batch 0 is the default.
func (g *gc) reaperWith(batch int) *sweep.Reaper {
	return &sweep.Reaper{Store: g.st, Backends: map[string]sweep.StagedDeleter{"fs": g.be}, Datacenter: gcDC, Batch: batch}
}

func (g *gc) reap(t *testing.T) sweep.Report {
	t.Helper()
	rep, err := g.reaperWith(10).RunOnce(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func (g *gc) expire(t *testing.T, in upload.Intent) {
	t.Helper()
	if _, err := g.pool.Exec(context.Background(), `UPDATE intents SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE operation_id = $1`, in.OperationID); err != nil {
		t.Fatal(err)
	}
}

// L1: a closed upload whose client walked away is reaped, and the next
// sweep collects its bytes.
func TestClosedNeverPublishedReapedThenCollectedL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	const content = "closed, never published"
	in, _ := g.chunked(t, gcRepo, content)
	req := g.close(t, in, content)
	// Claimed while pending: a sweep keeps it.
	if crep, irep := g.sweepAll(t); len(crep.Collected) != 0 || irep.Orphans != 0 || !g.exists(t, req.Digest) {
		t.Fatalf("sweep while the intent is pending: %+v %+v", crep, irep)
	}
	g.expire(t, in)
	if rep := g.reap(t); len(rep.Reaped) != 1 {
		t.Fatalf("reaped %+v, want 1", rep)
	}
	crep, irep := g.sweepAll(t)
	if len(crep.Collected) != 1 || crep.Collected[0].Digest != req.Digest {
		t.Fatalf("L1: collection after the reap: %+v", crep)
	}
	if g.exists(t, req.Digest) || irep.Orphans != 0 {
		t.Fatalf("L1: bytes remain after the sweep (inventory %+v)", irep)
	}
	// The late writer fails on the row (S5) and publishes nothing.
	if _, err := g.st.Finalize(context.Background(), req); err == nil {
		t.Fatal("S5: a reaped intent published")
	}
}

// L1: the digest was published, dereferenced and collected; a new upload
// re-stored its bytes (re-staged and verified the revoked placement) and
// was cancelled. The hand-back makes the collected row a candidate again,
// and a later upload of the same content still publishes (S1).
func TestClosedNeverPublishedAfterCollectionL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "collected, re-stored, cancelled"
	first := g.dereferenced(t, content)
	if crep, _ := g.sweepAll(t); len(crep.Collected) != 1 || g.exists(t, first.Digest) {
		t.Fatalf("first collection: %+v", crep)
	}
	in, _ := g.chunked(t, gcOther, content)
	g.close(t, in, content)
	if !g.exists(t, first.Digest) {
		t.Fatal("the close did not re-store the bytes")
	}
	if _, err := g.st.AbandonIntent(ctx, in.OperationID); err != nil {
		t.Fatal(err)
	}
	if got := g.count(t, `SELECT count(*) FROM blobs WHERE digest = $1 AND state = 'live'`, string(first.Digest)); got != 1 {
		t.Fatalf("hand-back: %d live rows, want 1", got)
	}
	crep, irep := g.sweepAll(t)
	if len(crep.Collected) != 1 || g.exists(t, first.Digest) || irep.Orphans != 0 {
		t.Fatalf("L1: second collection: %+v %+v; bytes exist %v", crep, irep, g.exists(t, first.Digest))
	}
	g.uploadAndPublish(t, gcRepo, content)
	g.sweepAll(t)
	g.readBack(t, first.Digest, content)
}

// An abandoned intent that claimed content it never verified hands back
// nothing, and a claim can never set a digest's recorded size: the row is
// sized from a verified placement. Otherwise a client could claim a
// digest with a wrong size, cancel, and make every later publication of
// the real content fail on "recorded with a different size".
func TestFalseClaimCannotPoisonTheDigest(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "the real content"
	d, size := digestOf(content)
	// A claim of d with a false size, then a cancel.
	lie := func() {
		t.Helper()
		liar, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: gcRepo, Principal: gcPrincipal, ExpectedDigest: d, ExpectedSize: size + 1000,
			IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.st.AbandonIntent(ctx, liar.OperationID); err != nil {
			t.Fatal(err)
		}
	}
	lie()
	if got := g.count(t, `SELECT count(*) FROM blobs WHERE digest = $1`, string(d)); got != 0 {
		t.Fatalf("an unverified claim created %d blob rows", got)
	}
	// With verified bytes present (an honest upload closed, still
	// pending), the false claim's abandonment sizes the row from them.
	honest, _ := g.chunked(t, gcOther, content)
	req := g.close(t, honest, content)
	lie()
	if got := g.count(t, `SELECT count(*) FROM blobs WHERE digest = $1 AND size_bytes = $2`, string(d), size); got != 1 {
		t.Fatalf("hand-back row: %d rows of %d bytes, want 1", got, size)
	}
	// The honest upload still owns the digest and publishes.
	if crep, _ := g.sweepAll(t); len(crep.Collected) != 0 {
		t.Fatalf("S6: collected a claimed digest: %+v", crep)
	}
	if _, err := g.st.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	g.readBack(t, d, content)
}
