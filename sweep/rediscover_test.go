package sweep_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
)

// Issue 32, "Backup and restore": a database restored to an earlier point
// than a backend has lost the placements of copies made after that
// point. The inventory never deletes such a copy while a reference needs
// it; it re-hashes it and records it as verified, and a copy whose bytes
// are not its digest's is left unrecorded.

// lose deletes k's placement row: what a database restored from before
// the copy was made knows of it.
func (g *gc) lose(t *testing.T, k placement.Key) {
	t.Helper()
	if _, err := g.pool.Exec(context.Background(),
		`DELETE FROM placements WHERE digest = $1 AND backend = $2`, string(k.Digest), k.Backend); err != nil {
		t.Fatal(err)
	}
}

// rot flips one byte of content in d's stored object (which ends with
// the content: the representation header comes first).
func (g *gc) rot(t *testing.T, d blobplane.Digest, content string) {
	t.Helper()
	h := d.Hex()
	p := filepath.Join(g.be.Dir(), "sha256", h[:2], h[2:4], h) // the fs backend's fan-out
	b, err := os.ReadFile(p)
	if err != nil || !bytes.HasSuffix(b, []byte(content)) {
		t.Fatalf("stored object of %s: %v (does not end with its content)", d, err)
	}
	b[len(b)-1] ^= 0xFF
	if err := os.WriteFile(p, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

func TestInventoryRediscoversLostPlacements(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const (
		lost    = "a copy the restored database does not know"
		rotten  = "a lost copy whose bytes rotted"
		present = "a copy the database still knows"
	)
	for _, c := range []string{lost, rotten, present} {
		g.uploadAndPublish(t, gcRepo, c)
	}
	dl, sl := digestOf(lost)
	dr, _ := digestOf(rotten)
	dp, _ := digestOf(present)
	g.lose(t, g.key(dl))
	g.lose(t, g.key(dr))
	g.rot(t, dr, rotten)
	for _, d := range []blobplane.Digest{dl, dr} {
		if c, err := g.st.ClassifyObject(ctx, d, "fs", gcDC); err != nil || c != store.ClassUnrecorded {
			t.Fatalf("%s: class %q, %v; want unrecorded", d, c, err)
		}
	}

	reg := prometheus.NewRegistry()
	inv := g.inventory()
	inv.Metrics = sweep.NewCollectMetrics(reg)
	dry, err := inv.Run(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if dry.Unrecorded != 2 || dry.Rediscovered != 0 || g.count(t, `SELECT count(*) FROM placements WHERE digest = $1`, string(dl)) != 0 {
		t.Fatalf("a dry run recorded something: %+v", dry)
	}

	rep := g.runInventory(t, inv)
	if rep.Unrecorded != 2 || rep.Rediscovered != 1 || rep.RediscoveredBytes != sl || rep.RediscoverMismatched != 1 || rep.OrphansDeleted != 0 {
		t.Fatalf("report: %+v", rep)
	}
	got := g.placement(t, placement.Key{Digest: dl, Backend: "fs", Datacenter: gcDC, Location: placement.ObjectLocation(dl)})
	if got.State != placement.Verified || got.Size != sl {
		t.Fatalf("re-discovered placement: %+v", got)
	}
	if n := g.count(t, `SELECT count(*) FROM placements WHERE digest = $1`, string(dr)); n != 0 {
		t.Fatalf("S2: a copy whose bytes are not its digest's was recorded (%d rows)", n)
	}
	for _, d := range []blobplane.Digest{dl, dr, dp} {
		if !g.exists(t, d) {
			t.Fatalf("the inventory deleted %s, which a reference needs", d)
		}
	}
	g.readBack(t, dl, lost)
	if v := gauge(t, reg, "blobplane_inventory_unrecorded_objects"); v != 2 {
		t.Fatalf("unrecorded gauge %v, want 2", v)
	}

	again := g.runInventory(t, inv)
	if again.Unrecorded != 1 || again.Rediscovered != 0 || again.RediscoverMismatched != 1 {
		t.Fatalf("second pass: %+v", again)
	}
}

// Re-discovery is decided again under the locks: a stage of the same key
// (an upload or a transfer) made after the unlocked classification wins,
// and so does an obliteration; nothing is recorded over either.
func TestRediscoverPlacementRechecksUnderLocks(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const (
		staged      = "restaged meanwhile"
		obliterated = "obliterated meanwhile"
	)
	for _, c := range []string{staged, obliterated} {
		g.uploadAndPublish(t, gcRepo, c)
	}
	ds, ss := digestOf(staged)
	do, so := digestOf(obliterated)
	ks := placement.Key{Digest: ds, Backend: "fs", Datacenter: gcDC, Location: placement.ObjectLocation(ds)}
	ko := placement.Key{Digest: do, Backend: "fs", Datacenter: gcDC, Location: placement.ObjectLocation(do)}
	g.lose(t, ks)
	g.lose(t, ko)

	if _, err := g.st.StagePlacement(ctx, ks, ss, 7); err != nil {
		t.Fatal(err)
	}
	if _, recorded, err := g.st.RediscoverPlacement(ctx, ks, ds, ss); err != nil || recorded {
		t.Fatalf("over a stage: recorded=%v, %v", recorded, err)
	}
	if p := g.placement(t, ks); p.State != placement.Pending || p.Epoch != 7 {
		t.Fatalf("the stage was overwritten: %+v", p)
	}

	if _, err := g.pool.Exec(ctx, `UPDATE blobs SET state = 'obliterated' WHERE digest = $1`, string(do)); err != nil {
		t.Fatal(err)
	}
	if _, recorded, err := g.st.RediscoverPlacement(ctx, ko, do, so); err != nil || recorded {
		t.Fatalf("over an obliteration: recorded=%v, %v", recorded, err)
	}

	// Only the digest's own bytes are ever recorded (S2).
	if _, _, err := g.st.RediscoverPlacement(ctx, ks, do, ss); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Fatalf("other bytes: %v, want invalid", err)
	}
}

// A backend whose marker names another database is not its to record
// copies on; one the marker says the database is behind (restored) is.
func TestRediscoveryFollowsTheMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		marker func(*gc) []byte
		want   int
	}{
		{"database_behind", func(g *gc) []byte {
			rec, err := g.st.BackendRecord(ctx, gcDC, "fs")
			if err != nil {
				t.Fatal(err)
			}
			rec.Pass += 5 // the backend saw passes this database never made
			return sweep.NewMarker(rec, gcDC, "fs").Encode()
		}, 1},
		{"marker_foreign", func(g *gc) []byte {
			rec, err := g.st.BackendRecord(ctx, gcDC, "fs")
			if err != nil {
				t.Fatal(err)
			}
			rec.Cluster = "00000000-0000-4000-8000-000000000001"
			return sweep.NewMarker(rec, gcDC, "fs").Encode()
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := gcSetup(t)
			const content = "copied after the backup"
			g.uploadAndPublish(t, gcRepo, content)
			g.uploadAndPublish(t, gcRepo, "known to the database") // not database_empty
			d, _ := digestOf(content)
			g.runInventory(t, g.inventory()) // adopts the backend: marker and record agree
			g.lose(t, g.key(d))
			if err := g.be.WriteMarker(ctx, tc.marker(g)); err != nil {
				t.Fatal(err)
			}
			rep := g.runInventory(t, g.inventory())
			if rep.Backends["fs"].Refusal != sweep.Refusal(tc.name) {
				t.Fatalf("refusal %q, want %q", rep.Backends["fs"].Refusal, tc.name)
			}
			if rep.Rediscovered != tc.want || !g.exists(t, d) {
				t.Fatalf("rediscovered %d, want %d (report %+v)", rep.Rediscovered, tc.want, rep)
			}
		})
	}
}
