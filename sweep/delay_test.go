package sweep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blobplane/blobplane/store"
)

// Issue 32, "Backup and restore": the collection delete delay keeps a
// collected copy's bytes for BLOBPLANE_COLLECT_DELETE_DELAY after the
// decision, by the database clock, so that a database restored from a
// backup taken within it finds the bytes of every reference it holds.
// Meanwhile the inventory counts the copy as the collector's and keeps
// it. An obliterated digest's bytes never wait.
func TestCollectDeleteDelayKeepsBytesUntilDue(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	const (
		collected   = "collected, kept for the delay"
		obliterated = "collected, then obliterated"
	)
	dc := g.dereferenced(t, collected).Digest
	do := g.dereferenced(t, obliterated).Digest
	if rep, err := g.collector(g.enq).RunOnce(ctx); err != nil || len(rep.Collected) != 2 {
		t.Fatalf("collected %+v, %v", rep.Collected, err)
	}
	owed := g.enq.take()
	del := g.deleter()
	del.Delay = time.Hour
	for _, d := range owed {
		if d.Key.Digest != dc {
			continue
		}
		_, err := del.Delete(ctx, d.Key)
		var nd *store.NotDueError
		if !errors.As(err, &nd) || nd.Wait <= 59*time.Minute || nd.Wait > time.Hour {
			t.Fatalf("a deletion decided just now: %v, want not due for about an hour", err)
		}
	}
	if !g.exists(t, dc) {
		t.Fatal("the delay did not keep the bytes")
	}
	if c, err := g.st.ClassifyObject(ctx, dc, "fs", gcDC); err != nil || c != store.ClassStaged {
		t.Fatalf("a copy whose deletion is owed: class %q, %v; want staged (the collector's)", c, err)
	}
	if rep := g.runInventory(t, g.inventory()); rep.OrphansDeleted != 0 || !g.exists(t, dc) {
		t.Fatalf("the inventory deleted a copy the delay keeps: %+v", rep)
	}

	if _, err := g.pool.Exec(ctx, `UPDATE blobs SET state = 'obliterated' WHERE digest = $1`, string(do)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.pool.Exec(ctx, `UPDATE deletions SET decided_at = now() - interval '61 minutes' WHERE digest = $1`, string(dc)); err != nil {
		t.Fatal(err)
	}
	for _, d := range owed {
		if res, err := del.Delete(ctx, d.Key); err != nil || res != store.DeletionDeleted {
			t.Fatalf("%s: %q, %v; want deleted (due, or obliterated)", d.Key.Digest, res, err)
		}
	}
	for _, d := range owed {
		if g.exists(t, d.Key.Digest) {
			t.Fatalf("%s remains after its due deletion", d.Key.Digest)
		}
	}
}
