package fs_test

import (
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// openGroupAt opens a backend in backend.SyncFilesystem on dir whose
// settler never runs a sync of its own, so only the test's writes and
// Settle calls decide when pending names go. Every group sync sends on
// the returned channel as it starts.
func openGroupAt(t *testing.T, dir string) (*fs.Backend, chan struct{}) {
	t.Helper()
	b, err := fs.OpenWith(dir, fs.Options{Sync: backend.SyncFilesystem})
	if errors.Is(err, backend.ErrInvalid) {
		t.Skipf("sync=filesystem is not supported here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	fs.SetSettleMax(b, time.Hour)
	started := make(chan struct{}, 1024)
	fs.SetGroupSyncHook(b, func() error { started <- struct{}{}; return nil })
	t.Cleanup(func() { _ = b.Close() })
	return b, started
}

// writeDuringSync writes blob to b with a claim that returns only once a
// group sync has started (started is b's, from openGroupAt): the write's
// own sync, so the object is linked after it started, and only a later
// sync settles its pending name.
func writeDuringSync(t *testing.T, b *fs.Backend, started chan struct{}, blob backendtest.Blob) {
	t.Helper()
	for len(started) > 0 {
		<-started
	}
	req := blob.Identity()
	req.BeforeVisible = func() error {
		select {
		case <-started:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("no group sync started while the claim ran")
		}
	}
	backendtest.MustWrite(t, b, req)
}

// pendingFiles lists the files in b's pending directory.
func pendingFiles(t *testing.T, b *fs.Backend) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(b.Dir(), fs.PendingDir(b)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A small write in backend.SyncFilesystem waits for one group sync, and
// that sync runs while the caller's claim does (BeforeVisible), before
// the object is linked: the publishing commit that follows waits for no
// second device flush. The bytes stay under their pending name, the same
// file as the object, until a later sync made the object's name durable.
func TestPendingWriteWaitsForOneSyncThatRanDuringTheClaim(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 16)
	b, fileSyncs, dirSyncs := openGroup(t, func() error { started <- struct{}{}; return nil })
	fs.SetSettleMax(b, time.Hour)
	blob := backendtest.NewBlob(51, 4096)
	req := blob.Identity()
	req.BeforeVisible = func() error {
		select {
		case <-started:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("no group sync started while the claim ran")
		}
	}
	var deferred func() error
	req.DeferSync = func(sync func() error) { deferred = sync }
	if _, err := b.Write(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if err := deferred(); err != nil {
		t.Fatal(err)
	}
	if n, f, d := fs.GroupSyncs(b), fileSyncs.Load(), dirSyncs.Load(); n != 1 || f != 0 || d != 0 {
		t.Fatalf("a pending write ran %d group syncs, %d file and %d directory fsyncs; want 1, 0, 0", n, f, d)
	}
	readBack(t, b, blob.Content)
	names := pendingFiles(t, b)
	if len(names) != 1 {
		t.Fatalf("pending files %v, want the write's", names)
	}
	pfi, err := os.Stat(filepath.Join(b.Dir(), fs.PendingDir(b), names[0]))
	if err != nil {
		t.Fatal(err)
	}
	ofi, err := os.Stat(filepath.Join(b.Dir(), fs.ObjectPath(blob.Digest)))
	if err != nil || !os.SameFile(pfi, ofi) {
		t.Fatalf("the pending file is not the object (%v)", err)
	}
	// The sync that ran during the claim started before the link: it
	// does not settle the name; the next one does.
	if left := fs.Settle(b, false); left != 1 {
		t.Fatalf("%d names left after no new sync, want 1", left)
	}
	if left := fs.Settle(b, true); left != 0 || len(pendingFiles(t, b)) != 0 {
		t.Fatalf("after a later sync: %d names left, files %v", left, pendingFiles(t, b))
	}
	readBack(t, b, blob.Content)
}

// Writers settle each other's names: the group sync of a write started
// after an earlier write's link makes that link durable, so its pending
// name goes without a sync of the settler's own.
func TestPendingNamesSettleWithLaterWrites(t *testing.T) {
	t.Parallel()
	b, started := openGroupAt(t, t.TempDir())
	first, second := backendtest.NewBlob(52, 4096), backendtest.NewBlob(53, 4096)
	writeDuringSync(t, b, started, first)
	writeDuringSync(t, b, started, second)
	syncs := fs.GroupSyncs(b)
	if left := fs.Settle(b, false); left != 1 {
		t.Fatalf("%d names left, want the second write's", left)
	}
	if fs.GroupSyncs(b) != syncs {
		t.Fatal("settling ran a sync of its own")
	}
	names := pendingFiles(t, b)
	if len(names) != 1 || names[0][:64] != second.Digest.Hex() {
		t.Fatalf("pending files %v, want only the second write's", names)
	}
}

// A refused claim leaves nothing: no object, no pending file. A digest
// written twice takes the name the first one linked by renaming its own
// durable file over it, and leaves no pending file either.
func TestPendingWriteRefusedAndTaken(t *testing.T) {
	t.Parallel()
	b, _ := openGroupAt(t, t.TempDir())
	blob := backendtest.NewBlob(54, 4096)
	refused := errors.New("claim refused")
	req := blob.Identity()
	req.BeforeVisible = func() error { return refused }
	if _, err := b.Write(t.Context(), req); !errors.Is(err, refused) {
		t.Fatalf("write with a refused claim: %v", err)
	}
	backendtest.RequireAbsent(t, b, blob.Digest)
	if names := pendingFiles(t, b); len(names) != 0 {
		t.Fatalf("a refused write left pending files %v", names)
	}

	backendtest.MustWrite(t, b, blob.Identity())
	backendtest.MustWrite(t, b, blob.Identity())
	readBack(t, b, blob.Content)
	if left := fs.Settle(b, true); left != 0 || len(pendingFiles(t, b)) != 0 {
		t.Fatalf("%d names left, files %v", left, pendingFiles(t, b))
	}
}

// Close settles every pending name and removes the pending directory.
func TestCloseSettlesPendingNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, started := openGroupAt(t, dir)
	blob := backendtest.NewBlob(55, 4096)
	writeDuringSync(t, b, started, blob)
	if n := len(pendingFiles(t, b)); n != 1 {
		t.Fatalf("%d pending files before Close, want 1", n)
	}
	pdir := filepath.Join(dir, fs.PendingDir(b))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pdir); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("pending directory after Close: %v", err)
	}
	b2, _ := openGroupAt(t, dir)
	readBack(t, b2, blob.Content)
}

// After a crash, Open links the whole pending files of the dead process
// at the names the crash may have lost: an object whose name is missing
// comes back, one whose name holds a file that is not whole is replaced,
// and a pending file that is not whole (an unfinished write) is removed,
// not linked. The dead process's pending directory goes; a live one's,
// still locked, is left alone.
func TestOpenRecoversADeadProcessesPendingWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// Two dead processes, so that neither write's sync settles the
	// other's name.
	dead1, started1 := openGroupAt(t, dir)
	dead2, started2 := openGroupAt(t, dir)
	lost, torn, unfinished := backendtest.NewBlob(56, 4096), backendtest.NewBlob(57, 4096), backendtest.NewBlob(58, 4096)
	writeDuringSync(t, dead1, started1, lost)
	writeDuringSync(t, dead2, started2, torn)
	deadDirs := []string{filepath.Join(dir, fs.PendingDir(dead1)), filepath.Join(dir, fs.PendingDir(dead2))}
	// The unfinished write's file: its name, half its bytes.
	part := filepath.Join(deadDirs[0], unfinished.Digest.Hex()+"-0123456789abcdef")
	if err := os.WriteFile(part, make([]byte, 2048), 0o644); err != nil {
		t.Fatal(err)
	}
	live, liveStarted := openGroupAt(t, dir)
	other := backendtest.NewBlob(59, 4096)
	writeDuringSync(t, live, liveStarted, other)
	for _, b := range []*fs.Backend{dead1, dead2} {
		if n := len(pendingFiles(t, b)); n == 0 {
			t.Fatal("no pending file to recover")
		}
		fs.Crash(b)
	}

	// What the crash lost: the name of one object; the other's name
	// holds a file that is not whole (a different file).
	objPath := func(b backendtest.Blob) string { return filepath.Join(dir, fs.ObjectPath(b.Digest)) }
	if err := os.Remove(objPath(lost)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(objPath(torn)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(objPath(torn), []byte("not whole"), 0o644); err != nil {
		t.Fatal(err)
	}

	b, _ := openGroupAt(t, dir)
	readBack(t, b, lost.Content)
	readBack(t, b, torn.Content)
	backendtest.RequireAbsent(t, b, unfinished.Digest)
	for _, d := range deadDirs {
		if _, err := os.Stat(d); !errors.Is(err, iofs.ErrNotExist) {
			t.Fatalf("a dead process's pending directory after recovery: %v", err)
		}
	}
	if names := pendingFiles(t, live); len(names) != 1 {
		t.Fatalf("the live process's pending files %v, want its write's", names)
	}
	readBack(t, live, other.Content)
}

// A failed group sync settles nothing: the pending file stays through
// Close (its object's name may not be durable), and the next Open's
// recovery removes it once it finds the object in place.
func TestFailedSyncLeavesPendingFilesToRecovery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, _ := openGroupAt(t, dir)
	eio := errors.New("injected syncfs failure")
	fs.SetGroupSyncHook(b, func() error { return eio })
	blob := backendtest.NewBlob(60, 4096)
	if _, err := b.Write(t.Context(), blob.Identity()); !errors.Is(err, eio) {
		t.Fatalf("write whose sync failed: %v", err)
	}
	pdir := filepath.Join(dir, fs.PendingDir(b))
	if n := len(pendingFiles(t, b)); n != 1 {
		t.Fatalf("%d pending files after the failed sync, want 1", n)
	}
	if left := fs.Settle(b, true); left != 0 {
		t.Fatalf("%d names still waiting after the sync failed", left)
	}
	_ = b.Close()
	if ents, err := os.ReadDir(pdir); err != nil || len(ents) != 1 {
		t.Fatalf("pending directory after Close: %d files, %v; want the file kept", len(ents), err)
	}
	b2, _ := openGroupAt(t, dir)
	if _, err := os.Stat(pdir); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("pending directory after recovery: %v", err)
	}
	readBack(t, b2, blob.Content)
}
