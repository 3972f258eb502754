package fs_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
)

// blobWhere returns the first small blob whose digest's hex satisfies ok.
func blobWhere(t *testing.T, ok func(hex string) bool) (blobplane.Digest, []byte) {
	t.Helper()
	for i := 0; i < 1<<22; i++ {
		content := []byte(fmt.Sprintf("fan-out blob %d", i))
		d := blobplane.Digest(fmt.Sprintf("sha256:%x", sha256.Sum256(content)))
		if ok(d.Hex()) {
			return d, content
		}
	}
	t.Fatal("no such blob")
	return "", nil
}

type syncRecorder struct {
	mu   sync.Mutex
	dirs []string
	fail string // the next sync of this directory fails
}

func (r *syncRecorder) hook(dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dirs = append(r.dirs, dir)
	if dir == r.fail {
		r.fail = ""
		return errors.New("injected sync failure")
	}
	return nil
}

// take returns the directories synced since the last call, sorted.
func (r *syncRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.dirs
	r.dirs = nil
	slices.Sort(d)
	return d
}

// openRecorded opens a backend on root that fsyncs each file and
// directory (backend.SyncFile) and records its directory syncs.
func openRecorded(t *testing.T, root string) (*fs.Backend, *syncRecorder) {
	t.Helper()
	b, err := fs.OpenWith(root, fs.Options{Sync: backend.SyncFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	rec := &syncRecorder{}
	fs.SetSyncHook(b, rec.hook)
	return b, rec
}

func write(t *testing.T, b backend.Backend, d blobplane.Digest, content []byte) error {
	t.Helper()
	_, err := b.Write(t.Context(), backend.WriteRequest{Digest: d, Size: int64(len(content)), Body: strings.NewReader(string(content))})
	return err
}

// An object's name is durable only when the fan-out directories above it
// are entries their parents have synced: the first write below a
// directory in a process syncs its parents, later ones only the leaf; a
// failed sync fails the write and is retried by the next one; a directory
// another process made is synced again (it may not be yet).
func TestWriteSyncsNewFanoutDirectories(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	b, rec := openRecorded(t, root)

	a, ac := blobWhere(t, func(string) bool { return true })
	ab, cd := a.Hex()[0:2], a.Hex()[2:4]
	leaf := "sha256/" + ab + "/" + cd
	if err := write(t, b, a, ac); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.take(), []string{"sha256", "sha256/" + ab, leaf}; !slices.Equal(got, want) {
		t.Fatalf("first write synced %v, want %v", got, want)
	}

	sameLeaf, slc := blobWhere(t, func(h string) bool { return h[0:4] == ab+cd && h != a.Hex() })
	if err := write(t, b, sameLeaf, slc); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.take(), []string{leaf}; !slices.Equal(got, want) {
		t.Fatalf("a write into a synced leaf synced %v, want %v", got, want)
	}

	sameL1, s1c := blobWhere(t, func(h string) bool { return h[0:2] == ab && h[2:4] != cd })
	leaf2 := "sha256/" + ab + "/" + sameL1.Hex()[2:4]
	if err := write(t, b, sameL1, s1c); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.take(), []string{"sha256/" + ab, leaf2}; !slices.Equal(got, want) {
		t.Fatalf("a new leaf under a synced directory synced %v, want %v", got, want)
	}

	// A failed parent sync fails the write (deferred: the sync it hands
	// over fails) and is not remembered as done.
	other, oc := blobWhere(t, func(h string) bool { return h[0:2] != ab })
	rec.fail = "sha256/" + other.Hex()[0:2]
	var deferred func() error
	_, err := b.Write(t.Context(), backend.WriteRequest{Digest: other, Size: int64(len(oc)), Body: strings.NewReader(string(oc)),
		DeferSync: func(sync func() error) { deferred = sync }})
	if err != nil {
		t.Fatal(err)
	}
	if err := deferred(); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("deferred sync with a failing parent: %v, want the injected failure", err)
	}
	rec.take()
	if err := write(t, b, other, oc); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.take(), []string{"sha256", "sha256/" + other.Hex()[0:2], "sha256/" + other.Hex()[0:2] + "/" + other.Hex()[2:4]}; !slices.Equal(got, want) {
		t.Fatalf("the write after a failed sync synced %v, want %v", got, want)
	}

	// Another process (here: another Backend on the same root) does not
	// know whether the directories it finds were synced.
	b2, rec2 := openRecorded(t, root)
	third, tc := blobWhere(t, func(h string) bool { return h[0:4] == ab+cd && h != a.Hex() && h != sameLeaf.Hex() })
	if err := write(t, b2, third, tc); err != nil {
		t.Fatal(err)
	}
	if got, want := rec2.take(), []string{"sha256", "sha256/" + ab, leaf}; !slices.Equal(got, want) {
		t.Fatalf("another process's first write synced %v, want %v", got, want)
	}
}

// Open creates a missing root with its missing parents (syncing each
// new directory's parent) and stores into it.
func TestOpenCreatesNestedRoot(t *testing.T) {
	t.Parallel()
	for _, rel := range []string{"a", "a/b/c"} {
		root := filepath.Join(t.TempDir(), rel)
		b, rec := openRecorded(t, root)
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			t.Fatalf("Open(%s): root %v, %v", rel, fi, err)
		}
		d, content := blobWhere(t, func(string) bool { return true })
		if err := write(t, b, d, content); err != nil {
			t.Fatal(err)
		}
		if got := rec.take(); len(got) != 3 {
			t.Fatalf("first write into a new root synced %v, want the leaf and its two parents", got)
		}
	}
}

// A group sync (backend.SyncFilesystem) makes the fan-out directories of
// the objects it covers durable too, and the backend remembers them as
// it does after syncing them itself: once the group has failed and
// writes fsync their own files and directories, a write below a leaf a
// group sync covered syncs only the leaf, while a write below a leaf no
// sync covered syncs its parents as well.
func TestGroupSyncMakesFanoutDirectoriesDurable(t *testing.T) {
	t.Parallel()
	var failGroup atomic.Bool
	b, _, _ := openGroup(t, func() error {
		if failGroup.Load() {
			return errors.New("injected group sync failure")
		}
		return nil
	})
	rec := &syncRecorder{}
	fs.SetSyncHook(b, rec.hook)

	a, ac := blobWhere(t, func(string) bool { return true })
	ab, cd := a.Hex()[0:2], a.Hex()[2:4]
	if err := write(t, b, a, ac); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("a group-synced write synced directories itself: %v", got)
	}
	// The group fails (sticky): this write fails, later ones fsync.
	other, oc := blobWhere(t, func(h string) bool { return h[0:2] != ab })
	failGroup.Store(true)
	if err := write(t, b, other, oc); err == nil {
		t.Fatal("a write whose group sync failed succeeded")
	}
	rec.take()

	sameLeaf, slc := blobWhere(t, func(h string) bool { return h[0:4] == ab+cd && h != a.Hex() })
	if err := write(t, b, sameLeaf, slc); err != nil {
		t.Fatal(err)
	}
	leaf := "sha256/" + ab + "/" + cd
	if got, want := rec.take(), []string{leaf}; !slices.Equal(got, want) {
		t.Fatalf("a write below a leaf the group sync covered synced %v, want %v", got, want)
	}
	fresh, fc := blobWhere(t, func(h string) bool { return h[0:2] != ab && h[0:2] != other.Hex()[0:2] })
	if err := write(t, b, fresh, fc); err != nil {
		t.Fatal(err)
	}
	l1 := "sha256/" + fresh.Hex()[0:2]
	if got, want := rec.take(), []string{"sha256", l1, l1 + "/" + fresh.Hex()[2:4]}; !slices.Equal(got, want) {
		t.Fatalf("a write below a new leaf synced %v, want %v", got, want)
	}
}
