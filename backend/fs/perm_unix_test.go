//go:build unix

package fs_test

import (
	"bytes"
	iofs "io/fs"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// Issue 26 point 9: another local user must not read stored blobs. Under
// umask 0, the most permissive a process can run with, every file and
// directory the backend creates — its root, the fan-out, objects written
// directly and past the page cache, objects promoted from staging, a
// staged upload still open — is 0640 or 0750: nothing for "other".
// Not parallel: the umask is the process's.
func TestAttackBlobFilesWorldReadable(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	root := filepath.Join(t.TempDir(), "blobs", "fs") // created by Open
	b, err := fs.Open(root, backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	backendtest.MustWrite(t, b, backendtest.NewBlob(1, 5000).Identity())
	fs.SetDirectMin(b, 0) // every later write past the page cache (or its fallback)
	backendtest.MustWrite(t, b, backendtest.NewBlob(2, 1<<20).Identity())
	promoted := backendtest.NewBlob(3, 3000)
	id, err := b.CreateUpload(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AppendUpload(t.Context(), id, 0, bytes.NewReader(promoted.Content)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PromoteUpload(t.Context(), id, promoted.Identity()); err != nil {
		t.Fatal(err)
	}
	open, err := b.CreateUpload(t.Context()) // left staged
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AppendUpload(t.Context(), open, 0, bytes.NewReader([]byte("partial"))); err != nil {
		t.Fatal(err)
	}

	files, dirs := 0, 0
	// From the parent Open created for the root, down.
	err = filepath.WalkDir(filepath.Dir(root), func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := iofs.FileMode(0o640)
		if d.IsDir() {
			want, dirs = 0o750, dirs+1
		} else {
			files++
		}
		if perm := info.Mode().Perm(); perm&0o007 != 0 || perm != want {
			t.Errorf("%s: mode %v, want %v (nothing for other)", p, info.Mode(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Three objects and one staged upload; the root, its parent, the
	// staging directory and the fan-out directories.
	if files != 4 || dirs < 5 {
		t.Fatalf("walked %d files and %d directories; want 4 files and the backend's directories", files, dirs)
	}
}
