package fs_test

import (
	"bytes"
	"errors"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

func newFS(t *testing.T, policy backend.StorePolicy) backend.Backend {
	t.Helper()
	b, err := fs.Open(t.TempDir(), policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// harness opens backends in one sync mode ("" picks, as Open does).
func harness(mode backend.SyncMode) backendtest.Harness {
	return harnessWith(mode, func(*fs.Backend) {})
}

// harnessWith is harness with setup applied to every backend opened.
func harnessWith(mode backend.SyncMode, setup func(*fs.Backend)) backendtest.Harness {
	open := func(t *testing.T, dir string, policy backend.StorePolicy) backend.Backend {
		t.Helper()
		b, err := fs.OpenWith(dir, fs.Options{Store: policy, Sync: mode})
		if err != nil {
			t.Fatal(err)
		}
		setup(b)
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	return backendtest.Harness{
		New: func(t *testing.T, policy backend.StorePolicy) backend.Backend { return open(t, t.TempDir(), policy) },
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			return open(t, old.(*fs.Backend).Dir(), backend.StoreAsSubmitted)
		},
	}
}

func TestConformance(t *testing.T) {
	for _, mode := range []backend.SyncMode{backend.SyncFile, backend.SyncFilesystem} {
		t.Run("sync="+string(mode), func(t *testing.T) {
			backendtest.Run(t, harness(mode))
		})
	}
	// Every write past the page cache, whatever its size (direct.go).
	t.Run("direct", func(t *testing.T) {
		backendtest.Run(t, harnessWith(backend.SyncFile, func(b *fs.Backend) { fs.SetDirectMin(b, 0) }))
	})
}

func TestOpenViaSpec(t *testing.T) {
	dir := t.TempDir()
	specs, err := backend.ParseSpecs("local=filesystem:" + dir + "?store=zstd")
	if err != nil {
		t.Fatal(err)
	}
	b, err := backend.Open(t.Context(), specs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	blob := backendtest.NewBlob(1, 5000)
	if info := backendtest.MustWrite(t, b, blob.Identity()); info.Repr.Codec != backend.CodecZstd {
		t.Fatalf("store=zstd stored %v", info.Repr)
	}
}

// TestHeaderOnDisk pins the on-disk format documented in
// docs/adr/0001-filesystem-representation-header.md: a 64-byte text header,
// legible with head -c 64, then the payload.
func TestHeaderOnDisk(t *testing.T) {
	b := newFS(t, backend.StoreAsSubmitted).(*fs.Backend)
	blob := backendtest.NewBlob(2, 16384)
	info := backendtest.MustWrite(t, b, blob.ZstdRequest())
	raw, err := os.ReadFile(filepath.Join(b.Dir(), fs.ObjectPath(blob.Digest)))
	if err != nil {
		t.Fatal(err)
	}
	want := "blobplane-repr " + info.Repr.String()
	want += strings.Repeat(" ", fs.HeaderSize-1-len(want)) + "\n"
	if got := string(raw[:fs.HeaderSize]); got != want {
		t.Fatalf("header %q, want %q", got, want)
	}
	if !bytes.Equal(raw[fs.HeaderSize:], blob.Zstd) {
		t.Fatal("payload after the header is not the submitted zstd payload")
	}
	if p := fs.ObjectPath(blob.Digest); p != "sha256/"+blob.Digest.Hex()[:2]+"/"+blob.Digest.Hex()[2:4]+"/"+blob.Digest.Hex() {
		t.Fatalf("object path %s", p)
	}
}

// TestCorruptObjects: an object whose header disagrees with its bytes is
// reported as corrupt, never decoded as something else.
func TestCorruptObjects(t *testing.T) {
	ctx := t.Context()
	b := newFS(t, backend.StoreAsSubmitted).(*fs.Backend)
	blob := backendtest.NewBlob(3, 10000)
	backendtest.MustWrite(t, b, blob.ZstdRequest())
	p := filepath.Join(b.Dir(), fs.ObjectPath(blob.Digest))
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"truncated":   raw[:len(raw)-1],
		"no header":   raw[fs.HeaderSize:],
		"tiny":        raw[:10],
		"bad payload": append(append([]byte{}, raw[:fs.HeaderSize]...), bytes.Repeat([]byte{'x'}, len(raw)-fs.HeaderSize)...),
	} {
		if err := os.WriteFile(p, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		obj, err := b.Read(ctx, blob.Digest, backend.ReadOptions{})
		if err == nil {
			_, err = io.ReadAll(obj.Body)
			obj.Body.Close()
		}
		if !errors.Is(err, backend.ErrCorrupt) || blobplane.IsRetryable(err) {
			t.Fatalf("%s: %v, want terminal corrupt", name, err)
		}
	}
}

// TestPathTraversal: locations derive only from validated digests and
// everything is opened under an os.Root, so neither a crafted digest nor a
// symlink planted in the tree reaches outside the root.
func TestPathTraversal(t *testing.T) {
	ctx := t.Context()
	b := newFS(t, backend.StoreAsSubmitted).(*fs.Backend)
	blob := backendtest.NewBlob(4, 100)

	for _, d := range []blobplane.Digest{
		"sha256:../../../../../../etc/passwd",
		"../../etc/passwd",
		"/etc/passwd",
		blobplane.Digest("sha256:" + strings.Repeat("../", 21) + "a"),
		blobplane.Digest("/" + blob.Digest),
	} {
		_, err := b.Write(ctx, backend.WriteRequest{Digest: d, Size: 100, Body: bytes.NewReader(blob.Content)})
		backendtest.RequireCode(t, err, backend.ErrInvalid, false)
		_, err = b.Read(ctx, d, backend.ReadOptions{})
		backendtest.RequireCode(t, err, backend.ErrInvalid, false)
	}

	// A symlink in the fan-out tree pointing outside the root.
	outside := t.TempDir()
	fan := filepath.Join(b.Dir(), "sha256", blob.Digest.Hex()[:2])
	if err := os.MkdirAll(filepath.Dir(fan), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, fan); err != nil {
		t.Fatal(err)
	}
	_, err := b.Write(ctx, blob.Identity())
	backendtest.RequireCode(t, err, backend.ErrRefused, false)
	// Classified by identity, not message: the refusal still wraps the very
	// error os.Root returns for an escaping name.
	if escape := rootEscapeError(t); !errors.Is(err, escape) {
		t.Fatalf("refusal %v does not wrap os.Root's escape error %v", err, escape)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("write escaped the root: %v", entries)
	}
	// Plant an object outside and try to read it through the link.
	if err := os.MkdirAll(filepath.Join(outside, blob.Digest.Hex()[2:4]), 0o755); err != nil {
		t.Fatal(err)
	}
	planted := append([]byte("blobplane-repr identity:100:100"+strings.Repeat(" ", 32)+"\n"), blob.Content...)
	if err := os.WriteFile(filepath.Join(outside, blob.Digest.Hex()[2:4], blob.Digest.Hex()), planted, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = b.Read(ctx, blob.Digest, backend.ReadOptions{})
	backendtest.RequireCode(t, err, backend.ErrRefused, false)
	_, err = b.Stat(ctx, blob.Digest)
	backendtest.RequireCode(t, err, backend.ErrRefused, false)
	err = b.Delete(ctx, blob.Digest)
	backendtest.RequireCode(t, err, backend.ErrRefused, false)
	if _, err := os.Stat(filepath.Join(outside, blob.Digest.Hex()[2:4], blob.Digest.Hex())); err != nil {
		t.Fatalf("delete through a symlink touched a file outside the root: %v", err)
	}

	// A symlinked object file pointing outside.
	other := backendtest.NewBlob(5, 100)
	dir := filepath.Join(b.Dir(), filepath.Dir(fs.ObjectPath(other.Digest)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, other.Digest.Hex())); err != nil {
		t.Fatal(err)
	}
	_, err = b.Read(ctx, other.Digest, backend.ReadOptions{})
	backendtest.RequireCode(t, err, backend.ErrRefused, false)

	// The staging area too.
	staging := filepath.Join(b.Dir(), "staging")
	if err := os.RemoveAll(staging); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, staging); err != nil {
		t.Fatal(err)
	}
	_, err = b.CreateUpload(ctx)
	backendtest.RequireCode(t, err, backend.ErrRefused, false)
}

// rootEscapeError returns the error os.Root wraps when a name leaves the
// root, taken from a root of the test's own.
func rootEscapeError(t *testing.T) error {
	t.Helper()
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	_, err = root.Lstat("..")
	var pe *iofs.PathError
	if !errors.As(err, &pe) {
		t.Fatalf("Lstat(\"..\") in a root: %v, want an *fs.PathError", err)
	}
	return pe.Err
}

const killHelperEnv = "BLOBPLANE_FS_KILL_HELPER_DIR"

// TestKilledWriter re-executes this test binary as a writer, kills it with
// SIGKILL in the middle of a write, and checks the crash left nothing
// visible and that a re-write succeeds.
func TestKilledWriter(t *testing.T) {
	if os.Getenv(killHelperEnv) != "" {
		t.Skip("running as the helper")
	}
	dir := t.TempDir()
	cmd := backendtest.StartKilledWriter(t, killHelperEnv+"="+dir)
	blob := killBlob()
	// The write really is in flight: a temp file holds part of it.
	tmps, _ := filepath.Glob(filepath.Join(dir, filepath.Dir(fs.ObjectPath(blob.Digest)), ".tmp-*"))
	if len(tmps) != 1 {
		t.Fatalf("want one temp file mid-write, found %v", tmps)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	b, err := fs.Open(dir, backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	backendtest.RequireAbsent(t, b, blob.Digest)
	if got := backendtest.ListAll(t, b, 10); len(got) != 0 {
		t.Fatalf("killed write is listed: %v", got)
	}
	// Its temp file is residue for the inventory (issue 29), dated by its
	// last write; deleting it leaves nothing behind.
	rs, now := backendtest.ListResidue(t, b)
	want, _ := filepath.Rel(dir, tmps[0])
	r, ok := backendtest.FindResidue(rs, backend.ResidueTemp, func(name string) bool { return name == filepath.ToSlash(want) })
	if !ok || len(rs) != 1 || r.Size < 1<<20 || r.Modified.After(now) {
		t.Fatalf("residue %+v at %v: want the killed writer's temp file %s alone", rs, now, want)
	}
	if err := b.DeleteResidue(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, filepath.Dir(fs.ObjectPath(blob.Digest)), ".tmp-*")); len(left) != 0 {
		t.Fatalf("temp files after DeleteResidue: %v", left)
	}
	backendtest.MustWrite(t, b, blob.Identity())
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("re-write read back %d bytes, %v", len(body), err)
	}
}

func killBlob() backendtest.Blob { return backendtest.NewBlob(77, 4<<20) }

// stallingReader yields its first n bytes, then announces on stdout that
// the write is under way and blocks until the process is killed.
type stallingReader struct {
	r io.Reader
	n int
}

func (s *stallingReader) Read(p []byte) (int, error) {
	if s.n <= 0 {
		os.Stdout.WriteString("\nWRITING\n")
		// The parent never writes to or closes our stdin: block here
		// until killed.
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0, errors.New("stdin closed: parent went away")
	}
	if len(p) > s.n {
		p = p[:s.n]
	}
	n, err := s.r.Read(p)
	s.n -= n
	return n, err
}

func TestKilledWriterHelper(t *testing.T) {
	dir := os.Getenv(killHelperEnv)
	if dir == "" {
		t.Skip("helper for TestKilledWriter")
	}
	b, err := fs.Open(dir, backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	blob := killBlob()
	req := blob.Identity()
	req.Body = &stallingReader{r: req.Body, n: 1 << 20}
	_, err = b.Write(t.Context(), req)
	t.Fatalf("helper write returned: %v", err)
}

// The filesystem backend defers its directory sync when asked: exactly
// one handed over, and Write returns with the object in place.
func TestWriteDefersDirectorySync(t *testing.T) {
	t.Parallel()
	b := newFS(t, backend.StoreAsSubmitted)
	blob := backendtest.NewBlob(21, 4096)
	req := blob.Identity()
	var syncs []func() error
	req.DeferSync = func(sync func() error) { syncs = append(syncs, sync) }
	backendtest.MustWrite(t, b, req)
	if len(syncs) != 1 {
		t.Fatalf("%d deferred syncs, want 1", len(syncs))
	}
	if _, err := b.Stat(t.Context(), blob.Digest); err != nil {
		t.Fatalf("object before its deferred sync: %v", err)
	}
	if err := syncs[0](); err != nil {
		t.Fatal(err)
	}
}

// A write larger than the writeback chunk (its pages written out while the
// body still streams) stores exactly the body.
func TestWriteLargerThanWritebackChunk(t *testing.T) {
	t.Parallel()
	b := newFS(t, backend.StoreAsSubmitted)
	fs.SetDirectMin(b.(*fs.Backend), -1) // through the page cache
	blob := backendtest.NewBlob(22, 20<<20+12345)
	backendtest.MustWrite(t, b, blob.Identity())
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("read back: %d bytes, %v", len(body), err)
	}
}
