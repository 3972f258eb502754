package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// A large write with the spec's direct=<bytes> leaves its bytes out of
// the page cache (it went past it); without the option (the default) the
// same write leaves them in. The residency is read with mincore(2)
// over a mapping of the object.
func TestDirectWriteBypassesPageCache(t *testing.T) {
	t.Parallel()
	resident := func(t *testing.T, option string) (cached, pages int) {
		dir := t.TempDir()
		if unsupported(dir) {
			t.Skip("the test directory's filesystem has no O_DIRECT")
		}
		spec, err := backend.ParseSpec("local=filesystem:" + dir + "?store=identity" + option)
		if err != nil {
			t.Fatal(err)
		}
		b, err := backend.Open(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		blob := backendtest.NewBlob(7, 3*fs.DirectBufSize+999)
		backendtest.MustWrite(t, b, blob.Identity())
		f, err := os.Open(filepath.Join(dir, fs.ObjectPath(blob.Digest)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(m)
		vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Fatal(e)
		}
		for _, v := range vec {
			cached += int(v & 1)
		}
		return cached, len(vec)
	}
	if cached, pages := resident(t, "&direct=8388608"); cached != 0 {
		t.Fatalf("direct=8388608: %d of %d pages in the page cache, want 0", cached, pages)
	}
	// A buffered write leaves its pages cached, but memory reclaim (a
	// cgroup's limit, under a whole test run) may take a few before they
	// are counted: nearly all of them is the mark of the page cache.
	nearlyAll := func(cached, pages int) bool { return cached*10 >= pages*9 }
	if cached, pages := resident(t, "&direct=16777216"); !nearlyAll(cached, pages) {
		t.Fatalf("direct=16777216 (above the blob's size): %d of %d pages in the page cache, want (nearly) all", cached, pages)
	}
	if cached, pages := resident(t, ""); !nearlyAll(cached, pages) {
		t.Fatalf("default: %d of %d pages in the page cache, want (nearly) all", cached, pages)
	}
}

// unsupported reports whether dir's filesystem refuses O_DIRECT.
func unsupported(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_WRONLY|os.O_CREATE|unix.O_DIRECT, 0o644)
	if err != nil {
		return true
	}
	_ = f.Close()
	_ = os.Remove(filepath.Join(dir, "probe"))
	return false
}

// On a filesystem without O_DIRECT (ramfs refuses it at open) a large
// write goes through the page cache and stores the same bytes. The test
// mounts one (root only; skipped where it cannot).
func TestDirectWriteWithoutODirect(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("ramfs", dir, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount a ramfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if !unsupported(dir) {
		t.Skip("this ramfs takes O_DIRECT")
	}
	b, err := fs.Open(dir, backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	fs.SetDirectMin(b, 0)
	blob := backendtest.NewBlob(9, fs.DirectBufSize+5)
	backendtest.MustWrite(t, b, blob.Identity())
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("read back %d bytes, %v", len(body), err)
	}
}

// A filesystem that takes O_DIRECT at open but refuses a write's alignment
// (EINVAL) gets that write and the rest through the page cache: the
// object is stored whole, and no later write is attempted past the cache.
func TestDirectWriteFallsBackOnEINVAL(t *testing.T) {
	t.Parallel()
	b := newFS(t, backend.StoreAsSubmitted).(*fs.Backend)
	fs.SetDirectMin(b, 0)
	var offsets []int64
	fs.SetDirectHook(b, func(off int64) error {
		offsets = append(offsets, off)
		if off == int64(fs.DirectBufSize) {
			return unix.EINVAL
		}
		return nil
	})
	blob := backendtest.NewBlob(13, 3*fs.DirectBufSize+100)
	backendtest.MustWrite(t, b, blob.Identity())
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("read back %d bytes, %v", len(body), err)
	}
	// Offsets past the cache: the first buffer (after its first block),
	// the refused one; none after it.
	if want := []int64{4096, int64(fs.DirectBufSize)}; !slices.Equal(offsets, want) {
		t.Fatalf("writes past the cache at %v, want %v", offsets, want)
	}
}
