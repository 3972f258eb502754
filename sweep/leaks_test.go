package sweep_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

// Issue 29, "No leaked bytes": a crash between writing bytes and verifying
// them, residue of killed writers, and an inventory pointed at a database
// that cannot vouch for the backend. Real Postgres, real filesystem;
// races forced with row and advisory locks held in the test's own
// connection.

// orphan writes content's bytes with nothing in Postgres naming them.
func (g *gc) orphan(t *testing.T, content string) blobplane.Digest {
	t.Helper()
	d, size := digestOf(content)
	if _, err := g.be.Write(context.Background(), backend.WriteRequest{Digest: d, Size: size, Body: strings.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	return d
}

// backdate sets the modification time of rel (under the backend's root)
// to age ago: what a file left for that long looks like, without waiting.
func (g *gc) backdate(t *testing.T, rel string, age time.Duration) {
	t.Helper()
	at := time.Now().Add(-age)
	if err := os.Chtimes(filepath.Join(g.be.Dir(), rel), at, at); err != nil {
		t.Fatal(err)
	}
}

// closeUnverified is a close cut short between its write and its
// verification (an api killed there): the claim and the stage committed,
// the bytes are at the key, the placement is pending.
func (g *gc) closeUnverified(t *testing.T, in upload.Intent, content string) placement.Key {
	t.Helper()
	ctx := context.Background()
	d, size := digestOf(content)
	k := g.key(d)
	if _, err := g.st.ClaimAndStage(ctx, in.OperationID, k, size); err != nil {
		t.Fatal(err)
	}
	if _, err := g.be.PromoteUpload(ctx, in.StagedLocation, backend.WriteRequest{Digest: d, Size: size}); err != nil {
		t.Fatal(err)
	}
	return k
}

func (g *gc) placement(t *testing.T, k placement.Key) placement.Placement {
	t.Helper()
	p, err := g.st.Placement(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (g *gc) collect(t *testing.T) sweep.CollectReport {
	t.Helper()
	rep, err := g.collector(g.enq).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g.runDeletions(t)
	return rep
}

func (g *gc) runInventory(t *testing.T, inv *sweep.Inventory) sweep.InventoryReport {
	t.Helper()
	rep, err := inv.Run(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// L1: an upload cut between its write and its verification leaves a
// pending placement and its bytes. While its intent is pending the
// pending row owns the digest; once the intent is abandoned nothing can
// verify it, the collector fails it under a new epoch (a late
// verification of the dead writer is refused) and the inventory deletes
// the bytes. No operator, no timer: the reaper's decision on the intent
// is what ends the row's ownership.
func TestCrashBetweenWriteAndVerifyIsReclaimedL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "written, never verified"
	in, _ := g.chunked(t, gcRepo, content)
	k := g.closeUnverified(t, in, content)

	if rep := g.collect(t); len(rep.StalePlacements) != 0 {
		t.Fatalf("S6: the collector failed the stage of a pending upload: %+v", rep)
	}
	if irep := g.runInventory(t, g.inventory()); irep.OrphansDeleted != 0 || !g.exists(t, k.Digest) {
		t.Fatalf("S6: the inventory took the bytes of a pending upload: %+v", irep)
	}
	g.expire(t, in)
	if rep := g.reap(t); len(rep.Reaped) != 1 {
		t.Fatalf("reaped %+v, want the cut upload", rep)
	}
	rep := g.collect(t)
	if len(rep.StalePlacements) != 1 || rep.StalePlacements[0] != k {
		t.Fatalf("collector: stale %+v, want %v", rep.StalePlacements, k)
	}
	p := g.placement(t, k)
	if p.State != placement.Failed || p.Reason != placement.SourceUnavailable || p.Epoch != 1 {
		t.Fatalf("the stale row is %+v, want failed/source_unavailable under epoch 1", p)
	}
	irep := g.runInventory(t, g.inventory())
	if irep.OrphansDeleted != 1 || g.exists(t, k.Digest) {
		t.Fatalf("L1: inventory after the collector: %+v; bytes exist %v", irep, g.exists(t, k.Digest))
	}
	// The dead writer wakes: its verification under its old epoch changes
	// nothing (S3), and its publication fails on the row (S5).
	if _, err := g.st.VerifyPlacement(ctx, k, k.Digest, int64(len(content)), 0); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("S3: late verification: %v, want stale_epoch", err)
	}
	if p2 := g.placement(t, k); p2.Generation != p.Generation {
		t.Fatalf("S3: the late verification changed the row: %+v", p2)
	}
	// A new upload of the content takes the failed row over and publishes.
	g.uploadAndPublish(t, gcOther, content)
	g.sweepAll(t)
	g.readBack(t, k.Digest, content)
}

// The collector decides a stale pending row while another upload of the
// same content re-stages the same key. Whichever order the row and stage
// locks give, the newer upload's bytes are never deleted: the decision is
// fenced by the generation it read and re-checks the claims after the
// digest's stage lock.
func TestStaleStageDecisionRacingANewUploadS6(t *testing.T) {
	t.Parallel()
	const content = "staged twice"
	// setup: upload A cut between write and verify, then abandoned; B an
	// upload session of the same content, staged, not closed.
	setup := func(t *testing.T) (*gc, placement.Key, upload.Intent) {
		g := gcSetup(t)
		a, _ := g.chunked(t, gcRepo, content)
		k := g.closeUnverified(t, a, content)
		if _, err := g.st.AbandonIntent(context.Background(), a.OperationID); err != nil {
			t.Fatal(err)
		}
		b, _ := g.chunked(t, gcOther, content)
		return g, k, b
	}
	hold := func(t *testing.T, g *gc, k placement.Key) pgx.Tx {
		tx, err := g.pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(context.Background(), `SELECT 1 FROM placements WHERE digest = $1 AND backend = $2 AND datacenter = $3 AND location = $4 FOR UPDATE`,
			string(k.Digest), k.Backend, k.Datacenter, k.Location); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	// finish closes B on the stage it got and publishes; its bytes must
	// survive every sweep.
	finish := func(t *testing.T, g *gc, k placement.Key, b upload.Intent, st upload.Stage) {
		ctx := context.Background()
		info, err := g.be.PromoteUpload(ctx, b.StagedLocation, backend.WriteRequest{Digest: k.Digest, Size: int64(len(content))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.st.VerifyPlacement(ctx, k, info.Digest, info.Repr.ContentSize, st.Epoch); err != nil {
			t.Fatalf("the newer upload's verification: %v", err)
		}
		if _, err := g.st.Finalize(ctx, g.request(b.OperationID, k.Digest, int64(len(content)))); err != nil {
			t.Fatal(err)
		}
		g.sweepAll(t)
		g.sweepAll(t)
		if p := g.placement(t, k); p.State != placement.Verified {
			t.Fatalf("S1: the newer upload's placement is %+v", p)
		}
		g.readBack(t, k.Digest, content)
	}

	t.Run("decision first", func(t *testing.T) {
		t.Parallel()
		g, k, b := setup(t)
		ctx := context.Background()
		old := g.placement(t, k)
		h := hold(t, g, k)
		type result struct {
			failed []placement.Placement
			err    error
		}
		decided := make(chan result, 1)
		go func() { f, err := g.st.SettleStalePlacements(ctx, 10); decided <- result{f, err} }()
		pgtest.WaitForLockWaiters(t, g.pool, 1) // the decision holds the stage lock and waits on the row
		staged := make(chan error, 1)
		var st upload.Stage
		go func() {
			var err error
			st, err = g.st.ClaimAndStage(ctx, b.OperationID, k, int64(len(content)))
			staged <- err
		}()
		pgtest.WaitForLockWaiters(t, g.pool, 2) // B's claim waits on the stage lock
		if err := h.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-decided
		if r.err != nil || len(r.failed) != 1 || r.failed[0].Generation != old.Generation+1 {
			t.Fatalf("decision: %+v, %v; want the stale stage failed", r.failed, r.err)
		}
		if err := <-staged; err != nil {
			t.Fatal(err)
		}
		// B took the failed row over under the decision's newer epoch.
		if p := g.placement(t, k); p.State != placement.Pending || p.Epoch != 1 || st.Epoch != 1 || st.Generation != p.Generation {
			t.Fatalf("B's stage: %+v (stage %+v), want pending under epoch 1", p, st)
		}
		finish(t, g, k, b, st)
	})

	t.Run("stage first", func(t *testing.T) {
		t.Parallel()
		g, k, b := setup(t)
		ctx := context.Background()
		cands, err := g.st.StalePlacements(ctx, 10) // the decision's unlocked read, before B's claim
		if err != nil || len(cands) != 1 || cands[0].Key != k {
			t.Fatalf("candidates %+v, %v", cands, err)
		}
		h := hold(t, g, k)
		staged := make(chan error, 1)
		var st upload.Stage
		go func() {
			var err error
			st, err = g.st.ClaimAndStage(ctx, b.OperationID, k, int64(len(content)))
			staged <- err
		}()
		pgtest.WaitForLockWaiters(t, g.pool, 1) // B claimed, holds the stage lock, waits on the row
		decided := make(chan error, 1)
		var failed []placement.Placement
		go func() { var err error; failed, err = g.st.FailStalePlacements(ctx, cands); decided <- err }()
		pgtest.WaitForLockWaiters(t, g.pool, 2) // the decision waits on the stage lock
		if err := h.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-staged; err != nil {
			t.Fatal(err)
		}
		if err := <-decided; err != nil || len(failed) != 0 {
			t.Fatalf("decision after B's stage: failed %+v, %v; want none", failed, err)
		}
		if p := g.placement(t, k); p.State != placement.Pending || p.Generation != cands[0].Generation+1 {
			t.Fatalf("B's stage: %+v", p)
		}
		finish(t, g, k, b, st)
	})
}

// A replication transfer stages a pending row with no intent: its row is
// not failed while its River job is unfinished (it may still write and
// verify, retries included), and is once the job finished without
// verifying it.
func TestTransferStageKeptWhileItsJobIsUnfinished(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "copied in"
	d, size := digestOf(content)
	k := g.key(d)
	if _, err := g.st.StagePlacement(ctx, k, size, 1); err != nil { // the transfer's stage, epoch 1
		t.Fatal(err)
	}
	g.orphan(t, content) // its bytes landed; it was killed before verifying
	args, _ := json.Marshal(map[string]any{"digest": d, "size": size, "source_datacenter": "us-1", "target_datacenter": gcDC})
	var job int64
	if err := g.pool.QueryRow(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt, attempted_at)
		VALUES ($1, 'replicate', 25, 'replicate_eu-1', 'running', 1, now()) RETURNING id`, args).Scan(&job); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{"running", "retryable", "available", "scheduled"} {
		if _, err := g.pool.Exec(ctx, `UPDATE river_job SET state = $2 WHERE id = $1`, job, state); err != nil {
			t.Fatal(err)
		}
		if rep := g.collect(t); len(rep.StalePlacements) != 0 {
			t.Fatalf("job %s: the collector failed the transfer's row: %+v", state, rep)
		}
		if irep := g.runInventory(t, g.inventory()); irep.OrphansDeleted != 0 || !g.exists(t, d) {
			t.Fatalf("job %s: the inventory deleted the transfer's bytes: %+v", state, irep)
		}
	}
	// The job is discarded (its attempts spent, the last one killed); a
	// copy of the digest into another datacenter does not protect this
	// one's row.
	elsewhere, _ := json.Marshal(map[string]any{"digest": d, "size": size, "source_datacenter": gcDC, "target_datacenter": "us-1"})
	if _, err := g.pool.Exec(ctx, `INSERT INTO river_job (args, kind, max_attempts, queue, state, attempt, attempted_at)
		VALUES ($1, 'replicate', 25, 'replicate_us-1', 'running', 1, now())`, elsewhere); err != nil {
		t.Fatal(err)
	}
	if _, err := g.pool.Exec(ctx, `UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	rep := g.collect(t)
	if len(rep.StalePlacements) != 1 || rep.StalePlacements[0] != k {
		t.Fatalf("after the job was discarded: %+v", rep)
	}
	if p := g.placement(t, k); p.State != placement.Failed || p.Epoch != 2 {
		t.Fatalf("the transfer's row is %+v, want failed under epoch 2", p)
	}
	if irep := g.runInventory(t, g.inventory()); irep.OrphansDeleted != 1 || g.exists(t, d) {
		t.Fatalf("L1: %+v", irep)
	}
}

// L1: an upload abandoned after its verification committed (a late
// verification: Finalize refused on the abandoned intent records it
// alone) leaves a verified copy with no blob row, which nothing collected
// and the inventory kept as staged. The inventory now hands it back to the
// collector, which revokes the placement and deletes the bytes.
func TestVerifiedCopyOfAnAbandonedUploadIsHandedBackL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "verified after the reap"
	in, _ := g.chunked(t, gcRepo, content)
	k := g.closeUnverified(t, in, content)
	if _, err := g.st.AbandonIntent(ctx, in.OperationID); err != nil {
		t.Fatal(err)
	}
	req := g.request(in.OperationID, k.Digest, int64(len(content)))
	req.Verify = &upload.Verification{Key: k, Digest: k.Digest, Size: int64(len(content)), Hashed: true}
	if _, err := g.st.Finalize(ctx, req); !errors.Is(err, upload.ErrIntentClosed) {
		t.Fatalf("late close: %v, want ErrIntentClosed", err)
	}
	if p := g.placement(t, k); p.State != placement.Verified {
		t.Fatalf("the refused finalization did not record its verification: %+v", p)
	}
	irep := g.runInventory(t, g.inventory())
	if irep.Classes[store.ClassUnowned] != 1 || irep.HandedBack != 1 || irep.OrphansDeleted != 0 {
		t.Fatalf("inventory: %+v, want the verified copy handed back", irep)
	}
	crep := g.collect(t)
	if len(crep.Collected) != 1 || g.exists(t, k.Digest) {
		t.Fatalf("L1: collection after the hand-back: %+v; bytes exist %v", crep, g.exists(t, k.Digest))
	}
	if p := g.placement(t, k); p.State != placement.Revoked {
		t.Fatalf("the placement is %+v, want revoked before its bytes went", p)
	}
}

// The test: an inventory pointed at a fresh database deletes
// nothing, nor on a restored one (its record behind the marker), nor on a
// backend whose marker vanished; an operator's re-adoption lets it
// proceed.
func TestInventoryDeletesNothingForAnotherOrRestoredDatabaseL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	g.uploadAndPublish(t, gcRepo, "published")
	first := g.orphan(t, "orphan one")
	reg := prometheus.NewRegistry()
	inv := g.inventory()
	inv.Metrics = sweep.NewCollectMetrics(reg)

	// The first pass adopts the backend and deletes the orphan.
	rep := g.runInventory(t, inv)
	if bp := rep.Backends["fs"]; bp.Marker != sweep.Adopt || bp.Pass != 1 || rep.OrphansDeleted != 1 || g.exists(t, first) {
		t.Fatalf("first pass: %+v %+v", rep, rep.Backends["fs"])
	}
	data, err := g.be.ReadMarker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sweep.ParseMarker(data)
	if err != nil || m.Datacenter != gcDC || m.Backend != "fs" || m.Pass != 1 || m.Cluster == "" {
		t.Fatalf("marker %q: %+v, %v", data, m, err)
	}
	rep = g.runInventory(t, inv)
	if bp := rep.Backends["fs"]; bp.Marker != sweep.Advance || bp.Pass != 2 {
		t.Fatalf("second pass: %+v", bp)
	}

	// The same backend under a fresh database: the marker names another.
	second := g.orphan(t, "orphan two")
	fresh := store.New(pgtest.New(t).Pool, nil)
	for _, dryRun := range []bool{true, false} {
		other := &sweep.Inventory{Store: fresh, Backends: map[string]sweep.Lister{"fs": g.be}, Datacenter: gcDC, MinAge: time.Nanosecond,
			Metrics: sweep.NewCollectMetrics(nil)}
		rep, err := other.Run(ctx, dryRun)
		if err != nil {
			t.Fatal(err)
		}
		if bp := rep.Backends["fs"]; bp.Marker != sweep.Refuse || bp.Refusal != sweep.RefuseForeign || rep.OrphansDeleted != 0 || rep.Orphans != 2 {
			t.Fatalf("fresh database (dry run %v): %+v %+v", dryRun, rep, bp)
		}
	}
	if !g.exists(t, second) || len(backendtestList(t, g.be)) != 2 {
		t.Fatal("L1: an inventory on a fresh database deleted objects")
	}

	// A fresh database with a fresh backend: empty, so nothing is adopted.
	newBackend, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer newBackend.Close()
	rep, err = (&sweep.Inventory{Store: fresh, Backends: map[string]sweep.Lister{"fs": newBackend}, Datacenter: gcDC, MinAge: time.Nanosecond}).Run(ctx, false)
	if err != nil || rep.Backends["fs"].Refusal != sweep.RefuseEmpty {
		t.Fatalf("empty database: %+v, %v", rep.Backends["fs"], err)
	}
	if _, err := newBackend.ReadMarker(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("an empty database adopted a backend: %v", err)
	}

	// Restored from a backup taken after the first pass: the record is
	// behind the marker.
	if _, err := g.pool.Exec(ctx, `UPDATE backend_markers SET pass = 1`); err != nil {
		t.Fatal(err)
	}
	rep = g.runInventory(t, inv)
	if bp := rep.Backends["fs"]; bp.Refusal != sweep.RefuseBehind || rep.OrphansDeleted != 0 || !g.exists(t, second) {
		t.Fatalf("restored database: %+v %+v", rep, bp)
	}
	if got := counterVec(t, reg, "blobplane_inventory_refused_passes_total", "reason", string(sweep.RefuseBehind)); got != 1 {
		t.Fatalf("refusals counted %v, want 1", got)
	}

	// The marker vanishes (the backend replaced under the same name).
	if err := os.Remove(filepath.Join(g.be.Dir(), "marker.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.pool.Exec(ctx, `UPDATE backend_markers SET pass = 5`); err != nil {
		t.Fatal(err)
	}
	if rep = g.runInventory(t, inv); rep.Backends["fs"].Refusal != sweep.RefuseMissing || !g.exists(t, second) {
		t.Fatalf("marker missing: %+v", rep.Backends["fs"])
	}

	// The operator checked the backend belongs here and re-adopts it.
	rec, err := inv.Adopt(ctx, "fs")
	if err != nil || !rec.MarkerWritten || rec.Pass != 6 {
		t.Fatalf("adopt: %+v, %v", rec, err)
	}
	if rep = g.runInventory(t, inv); rep.Backends["fs"].Marker != sweep.Advance || rep.OrphansDeleted != 1 || g.exists(t, second) {
		t.Fatalf("after the re-adoption: %+v %+v", rep, rep.Backends["fs"])
	}
}

func backendtestList(t *testing.T, be *fs.Backend) []backend.Entry {
	t.Helper()
	page, err := be.List(context.Background(), backend.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return page.Entries
}

// Nothing younger than the minimum age is deleted, on the backend's
// clock: an orphan and residue written a moment ago stay, the same backdated
// past it go.
func TestInventoryMinimumAge(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	g.uploadAndPublish(t, gcRepo, "published")
	d := g.orphan(t, "an orphan")
	inv := g.inventory()
	inv.MinAge = time.Hour
	rep := g.runInventory(t, inv)
	if rep.Orphans != 1 || rep.Young != 1 || rep.OrphansDeleted != 0 || !g.exists(t, d) {
		t.Fatalf("young orphan: %+v", rep)
	}
	g.backdate(t, fs.ObjectPath(d), 2*time.Hour)
	if rep = g.runInventory(t, inv); rep.OrphansDeleted != 1 || rep.Young != 0 || g.exists(t, d) {
		t.Fatalf("old orphan: %+v", rep)
	}
}

// Residue: a killed writer's temp file, a staged upload no intent names
// (its writer died between creating it and recording it) and one a
// promotion could not remove are reclaimed past the minimum age; a staged
// upload of a pending intent, one the reaper still owes, and young residue
// stay.
func TestInventoryReclaimsResidueL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	g.uploadAndPublish(t, gcRepo, "published")
	const old = 2 * time.Hour
	// A killed writer's temp file, old, and a live writer's, young.
	d, _ := digestOf("killed mid-write")
	dir := filepath.Dir(fs.ObjectPath(d))
	if err := os.MkdirAll(filepath.Join(g.be.Dir(), dir), 0o750); err != nil {
		t.Fatal(err)
	}
	deadTmp, liveTmp := filepath.Join(dir, ".tmp-dead"), filepath.Join(dir, ".tmp-live")
	for _, f := range []string{deadTmp, liveTmp} {
		if err := os.WriteFile(filepath.Join(g.be.Dir(), f), []byte("partial"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	g.backdate(t, deadTmp, old)
	// Staged uploads: one nobody recorded, one of a pending intent, one of
	// an abandoned intent whose delete the reaper still owes, one of an
	// admitted intent (promoted, but not removed); all old.
	unnamed, err := g.be.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, pending := g.chunked(t, gcRepo, "still uploading")
	abandonedIn, abandoned := g.chunked(t, gcRepo, "abandoned")
	if _, err := g.st.AbandonIntent(ctx, abandonedIn.OperationID); err != nil {
		t.Fatal(err)
	}
	admittedIn, admitted := g.chunked(t, gcRepo, "admitted")
	req := g.close(t, admittedIn, "admitted")
	if _, err := g.st.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := g.be.AppendUpload(ctx, admitted, 0, strings.NewReader("left behind")); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("promoted upload: %v", err)
	}
	// Recreate what a promotion interrupted before its removal leaves.
	if err := os.WriteFile(filepath.Join(g.be.Dir(), "staging", admitted), []byte("admitted"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{unnamed, pending, abandoned, admitted} {
		g.backdate(t, filepath.Join("staging", id), old)
	}

	reg := prometheus.NewRegistry()
	inv := g.inventory()
	inv.MinAge = time.Hour
	inv.Metrics = sweep.NewCollectMetrics(reg)
	dry, err := inv.Run(ctx, true)
	if err != nil || dry.Residue[backend.ResidueTemp] != 2 || dry.Residue[backend.ResidueStaged] != 2 || len(dry.ResidueDeleted) != 0 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	rep := g.runInventory(t, inv)
	if rep.ResidueDeleted[backend.ResidueTemp] != 1 || rep.ResidueDeleted[backend.ResidueStaged] != 2 || rep.Young != 1 {
		t.Fatalf("inventory: %+v", rep)
	}
	for _, f := range []string{deadTmp, filepath.Join("staging", unnamed), filepath.Join("staging", admitted)} {
		if _, err := os.Stat(filepath.Join(g.be.Dir(), f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("L1: %s remains: %v", f, err)
		}
	}
	for _, f := range []string{liveTmp, filepath.Join("staging", pending), filepath.Join("staging", abandoned)} {
		if _, err := os.Stat(filepath.Join(g.be.Dir(), f)); err != nil {
			t.Errorf("%s was deleted: %v", f, err)
		}
	}
	if got := counterVec(t, reg, "blobplane_inventory_reclaimed_total", "kind", "staged"); got != 2 {
		t.Fatalf("reclaimed staged %v, want 2", got)
	}
	// The reaper takes its own: nothing is left for a second pass.
	g.reap(t)
	if rep := g.runInventory(t, inv); len(rep.ResidueDeleted) != 0 {
		t.Fatalf("second pass: %+v", rep)
	}
}

// The cap: with more deletions due than MaxDeletes, the first pass
// deletes nothing and reports them (a dry run); later passes delete up to
// the cap each, and a pass within the cap clears the report.
func TestInventoryCapReportsADryRunFirst(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	g.uploadAndPublish(t, gcRepo, "published")
	var orphans []blobplane.Digest
	for _, c := range []string{"orphan a", "orphan b", "orphan c", "orphan d", "orphan e"} {
		orphans = append(orphans, g.orphan(t, c))
	}
	reg := prometheus.NewRegistry()
	inv := g.inventory()
	inv.MaxDeletes = 2
	inv.Metrics = sweep.NewCollectMetrics(reg)
	left := func() int {
		n := 0
		for _, d := range orphans {
			if g.exists(t, d) {
				n++
			}
		}
		return n
	}
	rep := g.runInventory(t, inv)
	if bp := rep.Backends["fs"]; !bp.Capped || !bp.DryRunFirst || bp.Due != 5 || rep.Held != 5 || rep.OrphansDeleted != 0 || left() != 5 {
		t.Fatalf("first pass over the cap: %+v %+v", rep, bp)
	}
	if got := gauge(t, reg, "blobplane_inventory_held_objects"); got != 5 {
		t.Fatalf("held gauge %v, want 5", got)
	}
	for i, want := range []int{3, 1} {
		rep = g.runInventory(t, inv)
		if bp := rep.Backends["fs"]; !bp.Capped || bp.DryRunFirst || rep.OrphansDeleted != 2 || left() != want {
			t.Fatalf("pass %d over the cap: %+v %+v; %d left", i+2, rep, bp, left())
		}
	}
	rep = g.runInventory(t, inv)
	if bp := rep.Backends["fs"]; bp.Capped || rep.OrphansDeleted != 1 || left() != 0 {
		t.Fatalf("pass within the cap: %+v %+v", rep, bp)
	}
	if n := g.count(t, `SELECT count(*) FROM backend_markers WHERE capped_pass IS NOT NULL`); n != 0 {
		t.Fatal("the cap's report was not cleared")
	}
	// A new burst over the cap is reported first again.
	for _, c := range []string{"orphan f", "orphan g", "orphan h"} {
		g.orphan(t, c)
	}
	if rep = g.runInventory(t, inv); !rep.Backends["fs"].DryRunFirst || rep.OrphansDeleted != 0 {
		t.Fatalf("a new burst: %+v", rep.Backends["fs"])
	}
}

func counterVec(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}
