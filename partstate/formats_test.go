package partstate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/quota"
)

// brokenFormats cannot read the level.
type brokenFormats struct{}

func (brokenFormats) FormatLevel(context.Context) (int, error) {
	return 0, errors.New("the database is down")
}

// ZBP-5 R44, R88: below cluster format level 2 an incremental class
// writes full (format 1) checkpoints only, which the release before
// reads, and restores from them; so it does without a level to read
// (Formats nil) or when the level cannot be read. Once finalize raises
// the level, the next checkpoint is a delta on the last full one.
func TestCheckpointsStayFullBelowFormatLevel2(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	_, arch := f.archive(t)
	if _, err := f.db.Pool.Exec(ctx, `UPDATE cluster_format SET level = 1`); err != nil {
		t.Fatal(err)
	}
	p, first := f.checkpointed(t, arch, 3)
	names := []string{first}
	for i, set := range []func(){
		func() {},                              // level 1
		func() { p.Formats = nil },             // no level to read
		func() { p.Formats = brokenFormats{} }, // the level unreadable
	} {
		set()
		names = append(names, f.step(t, p, arch, rec(t, quota.Record{Op: quota.RefAdded, Repository: fmt.Sprintf("team/r%d", i), Digest: digestN(70 + i), Size: 5})))
	}
	for _, name := range names {
		if m := manifest(t, arch, name); m.Kind != "full" || m.FormatVersion != 1 || m.Base != "" || len(m.Deltas) != 0 || len(m.Parts) != 1 {
			t.Fatalf("checkpoint %s below level 2: %s format %d, want full format 1", name, m.Kind, m.FormatVersion)
		}
	}
	if got, want := string(f.restoreAt(t, arch, 5).Snapshot(12)), string(p.Snapshot(12)); got != want {
		t.Fatalf("restored from a full checkpoint written below level 2:\n%s\nwant\n%s", got, want)
	}

	// Finalize (no node registered in this database reads less).
	p.Formats = f.st
	if before, after, err := f.st.RaiseFormatLevel(ctx, formats.Level2, "test"); err != nil || before != 1 || after != 2 {
		t.Fatalf("finalize: %d -> %d (%v)", before, after, err)
	}
	// restoreAt moved the lease to epoch 5: p (epoch 4) cannot move the
	// pointer any more, so the next checkpoints are the new epoch's.
	next := f.archived(5, arch)
	if err := next.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	base, err := next.Checkpoint(ctx, arch, f.st, "api-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.append(t, 5, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/after", Digest: digestN(80), Size: 7})); err != nil {
		t.Fatal(err)
	}
	if _, err := next.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	delta, err := next.Checkpoint(ctx, arch, f.st, "api-a")
	if err != nil {
		t.Fatal(err)
	}
	if m := manifest(t, arch, delta); m.Kind != "incremental" || m.FormatVersion != 2 || m.Base != base || len(m.Deltas) != 1 {
		t.Fatalf("the checkpoint after finalize: %s format %d on %q, want a delta on %s", m.Kind, m.FormatVersion, m.Base, base)
	}
	if got, want := string(f.restoreAt(t, arch, 6).Snapshot(12)), string(next.Snapshot(12)); got != want {
		t.Fatalf("restored through the delta:\n%s\nwant\n%s", got, want)
	}
}
