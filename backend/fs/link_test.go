package fs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// fileAt returns what os.Stat says of the file at p, to compare with
// os.SameFile.
func fileAt(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// A new object's file fsync overlaps the caller's BeforeVisible, the link
// at its name and the directory's sync: the name is taken
// (RENAME_NOREPLACE) and the directory synced while the file's sync is
// still running, and the deferred sync returns only after it.
func TestWriteLinksNewNameBeforeFileSync(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	b, _ := openRecorded(t, root)
	entered, release := make(chan string, 1), make(chan struct{})
	fs.SetObjectSyncHook(b, func(name string) error {
		entered <- name
		<-release
		return nil
	})
	blob := backendtest.NewBlob(31, 4096)
	leaf := filepath.Dir(fs.ObjectPath(blob.Digest))
	leafSynced := make(chan struct{}, 1)
	fs.SetSyncHook(b, func(dir string) error {
		if dir == leaf {
			leafSynced <- struct{}{}
		}
		return nil
	})
	req := blob.Identity()
	var synced string
	req.BeforeVisible = func() error {
		synced = <-entered // the file's sync started before the caller's step ended
		return nil
	}
	var deferred func() error
	req.DeferSync = func(sync func() error) { deferred = sync }
	wrote := make(chan error, 1)
	go func() {
		_, err := b.Write(t.Context(), req)
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a failure detector: nothing waits on it to pass
		close(release)
		t.Fatal("Write waited for its file's fsync before linking the name")
	}
	if filepath.Dir(synced) != leaf || !strings.HasPrefix(filepath.Base(synced), ".tmp-") {
		t.Fatalf("synced %q, want a temp file in %s", synced, leaf)
	}
	// Held in its fsync, the file is at its name already.
	if _, err := os.Stat(filepath.Join(root, fs.ObjectPath(blob.Digest))); err != nil {
		t.Fatalf("object during its file's sync: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- deferred() }()
	select {
	case <-leafSynced: // the directory's sync, while the file's is held
	case err := <-done:
		t.Fatalf("deferred sync returned (%v) while the file's fsync is held", err)
	case <-time.After(time.Minute): // a failure detector, as above
		close(release)
		t.Fatal("the directory's sync waited for the file's")
	}
	select {
	case err := <-done:
		t.Fatalf("deferred sync returned (%v) while the file's fsync is held", err)
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("read back %d bytes, %v", len(body), err)
	}
}

// A file found at the name proves nothing (a crash between a link and its
// file's fsync can leave a torn one): a write replaces it, and only with a
// file whose fsync returned. A failed file sync fails the (deferred) write.
func TestWriteReplacesFileFoundAtName(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	b, _ := openRecorded(t, root)
	blob := backendtest.NewBlob(32, 4096)
	name := filepath.Join(root, fs.ObjectPath(blob.Digest))

	// A first write whose file's sync fails: linked, but not durable.
	fs.SetObjectSyncHook(b, func(string) error { return errors.New("injected file sync failure") })
	req := blob.Identity()
	var deferred func() error
	req.DeferSync = func(sync func() error) { deferred = sync }
	backendtest.MustWrite(t, b, req)
	if err := deferred(); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("deferred sync after a failed file sync: %v, want the injected failure", err)
	}

	// What such a crash leaves: a torn file under the name.
	if err := os.WriteFile(name, []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	torn := fileAt(t, name)
	var stillTorn bool
	fs.SetObjectSyncHook(b, func(string) error {
		stillTorn = os.SameFile(fileAt(t, name), torn) // not replaced before this file is durable
		return nil
	})
	backendtest.MustWrite(t, b, blob.Identity())
	if !stillTorn {
		t.Fatal("the file at the name was replaced before the new file's fsync")
	}
	if os.SameFile(fileAt(t, name), torn) {
		t.Fatal("the torn file was kept")
	}
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("read back %d bytes, %v", len(body), err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(name), ".tmp-*")); len(tmps) != 0 {
		t.Fatalf("temp files left: %v", tmps)
	}
}
