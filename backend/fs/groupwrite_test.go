package fs_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// openGroup opens a backend in backend.SyncFilesystem that counts its
// per-file syncs (files and directories) and runs groupHook before each
// group sync. Skipped where syncfs cannot stand in for fsync.
func openGroup(t *testing.T, groupHook func() error) (b *fs.Backend, fileSyncs, dirSyncs *atomic.Int64) {
	t.Helper()
	b, err := fs.OpenWith(t.TempDir(), fs.Options{Sync: backend.SyncFilesystem})
	if errors.Is(err, backend.ErrInvalid) {
		t.Skipf("sync=filesystem is not supported here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	fileSyncs, dirSyncs = new(atomic.Int64), new(atomic.Int64)
	fs.SetObjectSyncHook(b, func(string) error { fileSyncs.Add(1); return nil })
	fs.SetSyncHook(b, func(string) error { dirSyncs.Add(1); return nil })
	fs.SetGroupSyncHook(b, groupHook)
	return b, fileSyncs, dirSyncs
}

// In backend.SyncFilesystem a small write fsyncs neither its file nor any
// directory: its deferred sync is the group sync, and it returns only
// when that sync did. A write larger than fs.GroupMax fsyncs its own file
// and directories, as in backend.SyncFile.
func TestSmallWriteIsDurableWithTheGroupSync(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan error)
	held := atomic.Bool{}
	b, fileSyncs, dirSyncs := openGroup(t, func() error {
		if !held.Load() {
			return nil
		}
		entered <- struct{}{}
		return <-release
	})
	if b.SyncMode() != backend.SyncFilesystem {
		t.Fatalf("mode %q", b.SyncMode())
	}

	blob := backendtest.NewBlob(41, 4096)
	req := blob.Identity()
	var deferred func() error
	req.DeferSync = func(sync func() error) { deferred = sync }
	if _, err := b.Write(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if deferred == nil {
		t.Fatal("Write did not defer its sync")
	}
	if fs.GroupSyncs(b) != 0 {
		t.Fatal("Write synced before returning, though it deferred the sync")
	}
	held.Store(true)
	done := make(chan error, 1)
	go func() { done <- deferred() }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the deferred sync ran no group sync")
	}
	if len(done) != 0 {
		t.Fatal("the deferred sync returned while the group sync was held")
	}
	release <- nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	held.Store(false)
	if n, f, d := fs.GroupSyncs(b), fileSyncs.Load(), dirSyncs.Load(); n != 1 || f != 0 || d != 0 {
		t.Fatalf("a small write ran %d group syncs, %d file and %d directory fsyncs; want 1, 0, 0", n, f, d)
	}
	readBack(t, b, blob.Content)

	big := backendtest.NewBlob(42, fs.GroupMax+1)
	if _, err := b.Write(t.Context(), big.Identity()); err != nil {
		t.Fatal(err)
	}
	if n, f, d := fs.GroupSyncs(b), fileSyncs.Load(), dirSyncs.Load(); n != 1 || f != 1 || d == 0 {
		t.Fatalf("a write of %d bytes ran %d group syncs (want still 1), %d file fsyncs (want 1), %d directory fsyncs (want some)", fs.GroupMax+1, n, f, d)
	}
	readBack(t, b, big.Content)
}

// A failed group sync fails the write that waited for it, and the
// backend goes back to fsyncing each file: the next writes, of the same
// digest (its name is taken by the file the failed write linked) and of
// another, succeed with their own fsyncs and run no group sync.
func TestGroupSyncFailureFallsBackToFileSyncs(t *testing.T) {
	t.Parallel()
	eio := errors.New("injected syncfs failure")
	var fail atomic.Bool
	fail.Store(true)
	b, fileSyncs, _ := openGroup(t, func() error {
		if fail.Swap(false) {
			return eio
		}
		return nil
	})
	blob := backendtest.NewBlob(43, 4096)
	if _, err := b.Write(t.Context(), blob.Identity()); !errors.Is(err, eio) {
		t.Fatalf("write whose group sync failed: %v, want the failure", err)
	}
	for _, bl := range []backendtest.Blob{blob, backendtest.NewBlob(44, 4096)} {
		if _, err := b.Write(t.Context(), bl.Identity()); err != nil {
			t.Fatalf("write after the failure: %v", err)
		}
		readBack(t, b, bl.Content)
	}
	if n, f := fs.GroupSyncs(b), fileSyncs.Load(); n != 1 || f != 2 {
		t.Fatalf("after the failure: %d group syncs (want 1, the failed one), %d file fsyncs (want 2)", n, f)
	}
}

// readBack checks that b serves data under its digest.
func readBack(t *testing.T, b *fs.Backend, data []byte) {
	t.Helper()
	d := backendtest.DigestOf(data)
	obj, err := b.Read(t.Context(), d, backend.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj.Body)
	_ = obj.Body.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(data))
	}
	if _, err := os.Stat(filepath.Join(b.Dir(), fs.ObjectPath(d))); err != nil {
		t.Fatal(err)
	}
}
