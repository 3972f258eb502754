package sweep_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

// Schedule 12 (L1): a crash between the byte write and the ledger write
// leaves bytes nothing in Postgres accounts for. The inventory classifies
// every object (several pages), deletes only the orphan, counts it in its
// report and metrics, and a second pass finds nothing.
func TestSchedule12CrashBetweenByteAndLedgerWriteInventoryRemovesOrphanL1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const (
		published = "published content"
		claimed   = "claimed by a pending upload"
		staged    = "a close in progress"
		orphan    = "written, then the process crashed"
	)
	g.uploadAndPublish(t, gcRepo, published)
	// Claimed: a monolithic upload named the digest, then wrote bytes.
	dc, sc := digestOf(claimed)
	if _, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: gcRepo, Principal: gcPrincipal, ExpectedDigest: dc, ExpectedSize: sc,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.be.Write(ctx, backend.WriteRequest{Digest: dc, Size: sc, Body: strings.NewReader(claimed)}); err != nil {
		t.Fatal(err)
	}
	// Staged: a chunked close staged its placement and promoted; the
	// intent has no digest yet.
	in, _ := g.chunked(t, gcRepo, staged)
	ds, ss := digestOf(staged)
	if _, err := g.st.StagePlacement(ctx, g.key(ds), ss, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.be.PromoteUpload(ctx, in.StagedLocation, backend.WriteRequest{Digest: ds, Size: ss}); err != nil {
		t.Fatal(err)
	}
	// Orphan: an upload session promoted its bytes, then crashed before
	// any ledger write; its intent was later abandoned.
	crashed, _ := g.chunked(t, gcRepo, orphan)
	do, so := digestOf(orphan)
	if _, err := g.be.PromoteUpload(ctx, crashed.StagedLocation, backend.WriteRequest{Digest: do, Size: so}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.AbandonIntent(ctx, crashed.OperationID); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	inv := g.inventory()
	inv.Metrics = sweep.NewCollectMetrics(reg)
	dry, err := inv.Run(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if dry.Orphans != 1 || dry.OrphansDeleted != 0 || !g.exists(t, do) {
		t.Fatalf("dry run: %+v", dry)
	}
	rep, err := inv.Run(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[store.ObjectClass]int{store.ClassReferenced: 1, store.ClassClaimed: 1, store.ClassStaged: 1, store.ClassOrphan: 1}
	for c, n := range want {
		if rep.Classes[c] != n {
			t.Errorf("class %s: %d objects, want %d (report %+v)", c, rep.Classes[c], n, rep)
		}
	}
	if rep.Objects != 4 || rep.Orphans != 1 || rep.OrphansDeleted != 1 || rep.OrphanBytes <= 0 || rep.OrphanBytesDeleted != rep.OrphanBytes {
		t.Fatalf("report: %+v", rep)
	}
	if g.exists(t, do) {
		t.Fatal("L1: the orphan remains")
	}
	for _, c := range []string{published, claimed, staged} {
		d, _ := digestOf(c)
		g.readBack(t, d, c)
	}
	if got := gauge(t, reg, "blobplane_inventory_orphan_objects"); got != 1 {
		t.Fatalf("orphan gauge %v, want 1", got)
	}
	again, err := inv.Run(ctx, false)
	if err != nil || again.Orphans != 0 || again.Objects != 3 {
		t.Fatalf("second pass: %+v, %v", again, err)
	}
	if got := gauge(t, reg, "blobplane_inventory_orphan_objects"); got != 0 {
		t.Fatalf("orphan gauge after the second pass %v, want 0", got)
	}
}

// An object that looked orphaned on the unlocked read is re-classified
// under the locks: an upload of the same content that staged its
// placement meanwhile wins, and nothing is deleted.
func TestInventoryRechecksUnderLocks(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const content = "looks orphaned"
	d, size := digestOf(content)
	if _, err := g.be.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: strings.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	if c, err := g.st.ClassifyObject(ctx, d, "fs", gcDC); err != nil || c != store.ClassOrphan {
		t.Fatalf("unlocked read: %q, %v", c, err)
	}
	if _, err := g.st.StagePlacement(ctx, g.key(d), size, 0); err != nil {
		t.Fatal(err)
	}
	c, err := g.st.DeleteIfOrphan(ctx, d, "fs", gcDC, func(context.Context) error { t.Error("deleted staged bytes"); return nil })
	if err != nil || c != store.ClassStaged {
		t.Fatalf("locked re-check: %q, %v", c, err)
	}
	g.readBack(t, d, content)
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// The inventory's page classification (one statement) agrees with the
// per-object classification on every class, in the page's order.
func TestClassifyObjectsMatchesClassifyObject(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	referenced := g.uploadAndPublish(t, gcRepo, "referenced").Digest
	claimedIn, _ := g.chunked(t, gcRepo, "claimed")
	claimed := g.close(t, claimedIn, "claimed").Digest
	staged, size := digestOf("staged")
	if _, err := g.st.StagePlacement(ctx, g.key(staged), size, 0); err != nil {
		t.Fatal(err)
	}
	orphan, _ := digestOf("orphan")
	page := []blobplane.Digest{orphan, referenced, staged, claimed}
	want := []store.ObjectClass{store.ClassOrphan, store.ClassReferenced, store.ClassStaged, store.ClassClaimed}
	got, err := g.st.ClassifyObjects(ctx, page, "fs", gcDC)
	if err != nil || len(got) != len(page) {
		t.Fatalf("classify page: %v, %v", got, err)
	}
	for i, d := range page {
		one, err := g.st.ClassifyObject(ctx, d, "fs", gcDC)
		if err != nil || got[i] != want[i] || one != want[i] {
			t.Errorf("%s: page %q, one %q (%v), want %q", d, got[i], one, err, want[i])
		}
	}
	// Another datacenter holds no placement: staged there is an orphan here.
	if got, err := g.st.ClassifyObjects(ctx, []blobplane.Digest{staged}, "fs", "us-1"); err != nil || got[0] != store.ClassOrphan {
		t.Fatalf("other datacenter: %v, %v", got, err)
	}
}
