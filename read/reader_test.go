package read_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/read"
	"github.com/blobplane/blobplane/store"
)

// A blob with verified copies in eu-1 (this datacenter) and in other
// datacenters, each on a filesystem backend of its own, over a real
// ledger. Other datacenters are reached through remotes, which read their
// backends as a node there would (through its own read.Reader).

type env struct {
	st      *store.Store
	dirs    map[string]string
	bes     map[string]*fs.Backend
	content []byte
	d       blobplane.Digest
	size    int64
	remote  *remotes
	repairs *repairs
	metrics *read.Metrics
	reader  *read.Reader
}

// remotes serves other datacenters' copies; a datacenter in down fails
// to open. opens counts the opens tried, in order.
type remotes struct {
	e     *env
	mu    sync.Mutex
	down  map[string]bool
	opens []string
}

func (r *remotes) OpenBlob(ctx context.Context, dc string, d blobplane.Digest, rng *backend.Range) (*backend.Object, error) {
	r.mu.Lock()
	r.opens = append(r.opens, dc)
	down := r.down[dc]
	r.mu.Unlock()
	if down {
		return nil, fmt.Errorf("datacenter %s unreachable", dc)
	}
	// The node there: its own reader over its own backend.
	node := &read.Reader{Datacenter: dc, Backends: map[string]backend.Backend{"fs": r.e.bes[dc]}, Ledger: r.e.st, Logger: slog.New(slog.DiscardHandler)}
	b, err := node.OpenLocal(ctx, d, rng)
	if err != nil {
		return nil, err
	}
	return &backend.Object{Body: b.Body, Length: b.Length}, nil
}

func (r *remotes) tried() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.opens
	r.opens = nil
	return out
}

// repairs records what reads asked to repair.
type repairs struct {
	mu   sync.Mutex
	into []string
}

func (r *repairs) EnqueueRepair(_ context.Context, d blobplane.Digest, _ int64, dc string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.into = append(r.into, dc)
	return nil
}

func setup(t *testing.T, dcs ...string) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{st: pgtest.NewStore(t), dirs: map[string]string{}, bes: map[string]*fs.Backend{},
		content: bytes.Repeat([]byte("read me "), 64<<10), repairs: &repairs{}}
	sum := sha256.Sum256(e.content)
	e.d = blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
	e.size = int64(len(e.content))
	for _, dc := range dcs {
		e.dirs[dc] = t.TempDir()
		be, err := fs.Open(e.dirs[dc], "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		e.bes[dc] = be
		if _, err := be.Write(ctx, backend.WriteRequest{Digest: e.d, Size: e.size, Body: bytes.NewReader(e.content)}); err != nil {
			t.Fatal(err)
		}
		k := e.key(dc)
		if _, err := e.st.StagePlacement(ctx, k, e.size, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.VerifyPlacement(ctx, k, e.d, e.size, 1); err != nil {
			t.Fatal(err)
		}
	}
	e.remote = &remotes{e: e, down: map[string]bool{}}
	e.metrics = read.NewMetrics(prometheus.NewRegistry())
	e.reader = &read.Reader{Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": e.bes["eu-1"]}, Ledger: e.st,
		Remote: e.remote, Repair: e.repairs, Metrics: e.metrics, Logger: slog.New(slog.DiscardHandler)}
	if e.bes["eu-1"] == nil {
		dir := t.TempDir()
		be, err := fs.Open(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		e.reader.Backends["fs"] = be
	}
	return e
}

func (e *env) key(dc string) placement.Key {
	return placement.Key{Digest: e.d, Backend: "fs", Datacenter: dc, Location: placement.ObjectLocation(e.d)}
}

func (e *env) placement(t *testing.T, dc string) placement.Placement {
	t.Helper()
	p, err := e.st.Placement(context.Background(), e.key(dc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) path(dc string) string { return filepath.Join(e.dirs[dc], fs.ObjectPath(e.d)) }

// damage rewrites dc's object file (its header and payload) through
// edit, or removes it (edit nil).
func (e *env) damage(t *testing.T, dc string, edit func([]byte) []byte) {
	t.Helper()
	if edit == nil {
		if err := os.Remove(e.path(dc)); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(e.path(dc))
	if err != nil {
		t.Fatal(err)
	}
	tmp := e.path(dc) + ".test"
	if err := os.WriteFile(tmp, edit(b), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, e.path(dc)); err != nil {
		t.Fatal(err)
	}
}

// flipLast flips a bit of the file's last byte (the payload's).
func flipLast(b []byte) []byte { b[len(b)-1] ^= 0x20; return b }

// get opens the whole blob and reads it as the handler does.
func (e *env) get(t *testing.T, rng *backend.Range) (*read.Blob, []byte, error) {
	t.Helper()
	b, err := e.reader.Open(context.Background(), e.d, e.size, rng)
	if err != nil {
		return nil, nil, err
	}
	defer b.Body.Close()
	var out bytes.Buffer
	_, err = io.CopyBuffer(struct{ io.Writer }{&out}, b.Body, make([]byte, 256<<10))
	return b, out.Bytes(), err
}

// A local verified copy is read here, whole or a range of it.
func TestReadServesTheLocalCopy(t *testing.T) {
	t.Parallel()
	e := setup(t, "eu-1", "us-1")
	b, got, err := e.get(t, nil)
	if err != nil || b.Remote || b.From.Datacenter != "eu-1" || !bytes.Equal(got, e.content) {
		t.Fatalf("whole: from %+v, %d bytes, %v", b, len(got), err)
	}
	b, got, err = e.get(t, &backend.Range{Offset: 10, Length: 100})
	if err != nil || b.Remote || !bytes.Equal(got, e.content[10:110]) {
		t.Fatalf("range: %d bytes, %v", len(got), err)
	}
	if tried := e.remote.tried(); len(tried) != 0 {
		t.Fatalf("remote opens for a local read: %v", tried)
	}
}

// A bit flipped in the local copy: the read is cut short of the blob's
// size (the client never gets a complete body), the copy is failed
// (digest_mismatch, epoch + 1), counted and its repair asked for; the
// next read comes from us-1, intact.
func TestReadFindsACorruptCopyAndTheNextReadIsRemote(t *testing.T) {
	t.Parallel()
	e := setup(t, "eu-1", "us-1")
	e.damage(t, "eu-1", flipLast)
	_, got, err := e.get(t, nil)
	if !errors.Is(err, read.ErrCorrupt) || int64(len(got)) >= e.size {
		t.Fatalf("corrupt read: %d of %d bytes, %v", len(got), e.size, err)
	}
	if p := e.placement(t, "eu-1"); p.State != placement.Failed || p.Reason != placement.DigestMismatch || p.Epoch != 2 {
		t.Fatalf("the corrupt copy: %+v", p)
	}
	if n := testutil.ToFloat64(e.metrics.Corruptions("eu-1", "fs")); n != 1 {
		t.Fatalf("corruptions counted: %v", n)
	}
	if len(e.repairs.into) != 1 || e.repairs.into[0] != "eu-1" {
		t.Fatalf("repairs: %v", e.repairs.into)
	}
	b, got, err := e.get(t, nil)
	if err != nil || !b.Remote || b.From.Datacenter != "us-1" || !bytes.Equal(got, e.content) {
		t.Fatalf("next read: %+v, %d bytes, %v", b, len(got), err)
	}
}

// A truncated local copy: the filesystem backend finds it short of its
// header's size when it opens it, before the first byte, so the same read
// is served from us-1; the copy is failed (a short stream met mid-read is
// the verifier's: TestVerifierNeverHandsOverACompleteWrongBody).
func TestReadFindsATruncatedCopy(t *testing.T) {
	t.Parallel()
	e := setup(t, "eu-1", "us-1")
	e.damage(t, "eu-1", func(b []byte) []byte { return b[:len(b)/2] })
	if b, got, err := e.get(t, nil); err != nil || !b.Remote || !bytes.Equal(got, e.content) {
		t.Fatalf("truncated read: %+v, %d bytes, %v", b, len(got), err)
	}
	if p := e.placement(t, "eu-1"); p.State != placement.Failed || p.Reason != placement.DigestMismatch {
		t.Fatalf("the truncated copy: %+v", p)
	}
	if n := testutil.ToFloat64(e.metrics.Corruptions("eu-1", "fs")); n != 1 {
		t.Fatalf("corruptions counted: %v", n)
	}
}

// A local copy whose file is gone: a detected loss, counted and failed
// (source_unavailable), and the same read is served from us-1.
func TestReadFindsALostCopyAndServesAnotherInTheSameRequest(t *testing.T) {
	t.Parallel()
	e := setup(t, "eu-1", "us-1")
	e.damage(t, "eu-1", nil)
	b, got, err := e.get(t, nil)
	if err != nil || !b.Remote || !bytes.Equal(got, e.content) {
		t.Fatalf("read: %+v, %d bytes, %v", b, len(got), err)
	}
	if p := e.placement(t, "eu-1"); p.State != placement.Failed || p.Reason != placement.SourceUnavailable || p.Epoch != 2 {
		t.Fatalf("the lost copy: %+v", p)
	}
	if n := testutil.ToFloat64(e.metrics.Losses("eu-1", "fs")); n != 1 {
		t.Fatalf("losses counted: %v", n)
	}
	if len(e.repairs.into) != 1 {
		t.Fatalf("repairs: %v", e.repairs.into)
	}
}

// Remote candidates: by preference, then the one that failed longest ago
// (never first), then by name; a datacenter that fails to open is left
// for the next in the same request.
func TestReadChoosesRemoteCopiesDeterministically(t *testing.T) {
	t.Parallel()
	e := setup(t, "us-1", "ap-1", "sa-1")
	// No preference: by name.
	if b, _, err := e.get(t, nil); err != nil || b.From.Datacenter != "ap-1" {
		t.Fatalf("no preference: %+v, %v", b, err)
	}
	if tried := e.remote.tried(); fmt.Sprint(tried) != "[ap-1]" {
		t.Fatalf("tried %v", tried)
	}
	// ap-1 down: the same read goes on to sa-1; the next read tries the
	// ones that never failed first.
	e.remote.down["ap-1"] = true
	if b, _, err := e.get(t, nil); err != nil || b.From.Datacenter != "sa-1" {
		t.Fatalf("ap-1 down: %+v, %v", b, err)
	}
	if tried := e.remote.tried(); fmt.Sprint(tried) != "[ap-1 sa-1]" {
		t.Fatalf("tried %v", tried)
	}
	if b, _, err := e.get(t, nil); err != nil || b.From.Datacenter != "sa-1" {
		t.Fatalf("after ap-1 failed: %+v, %v", b, err)
	}
	if tried := e.remote.tried(); fmt.Sprint(tried) != "[sa-1]" {
		t.Fatalf("tried %v", tried)
	}
	// A preference beats both.
	e.reader.Preference = []string{"us-1"}
	if b, _, err := e.get(t, nil); err != nil || b.From.Datacenter != "us-1" {
		t.Fatalf("preferring us-1: %+v, %v", b, err)
	}
	// Every one down: unavailable, not a 404.
	e.remote.down["us-1"], e.remote.down["sa-1"] = true, true
	if _, _, err := e.get(t, nil); blobplane.ErrorCode(err) != blobplane.CodeUnavailable {
		t.Fatalf("all down: %v", err)
	}
}

// A range from a remote copy: 206 bytes through the node.
func TestReadARangeFromARemoteCopy(t *testing.T) {
	t.Parallel()
	e := setup(t, "us-1")
	b, got, err := e.get(t, &backend.Range{Offset: e.size - 5, Length: 5})
	if err != nil || !b.Remote || b.Length != 5 || !bytes.Equal(got, e.content[e.size-5:]) {
		t.Fatalf("range: %+v, %q, %v", b, got, err)
	}
}

// Only pending copies: unavailable at once, or, with a wait, served as
// soon as one verifies.
func TestReadOfAPendingCopy(t *testing.T) {
	t.Parallel()
	e := setup(t, "us-1")
	ctx := context.Background()
	k := e.key("eu-1")
	if _, err := e.st.StagePlacement(ctx, k, e.size, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.FailPlacement(ctx, e.key("us-1"), placement.SourceUnavailable, 2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.get(t, nil); blobplane.ErrorCode(err) != blobplane.CodeUnavailable {
		t.Fatalf("pending only: %v", err)
	}
	// Now wait for it: the copy verifies while the read waits.
	e.reader.PendingWait = 30 * time.Second
	if _, err := e.reader.Backends["fs"].Write(ctx, backend.WriteRequest{Digest: e.d, Size: e.size, Body: bytes.NewReader(e.content)}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, got, err := e.get(t, nil)
		if err == nil && !bytes.Equal(got, e.content) {
			err = errors.New("wrong bytes")
		}
		done <- err
	}()
	if _, err := e.st.VerifyPlacement(ctx, k, e.d, e.size, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting read: %v", err)
	}
}

// A copy whose header does not decode is corrupt before its first byte:
// failed, and the same read is served from another copy.
func TestReadOfAnUndecodableCopyFailsOverAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, "eu-1", "us-1")
	e.damage(t, "eu-1", func([]byte) []byte { return e.content })
	b, got, err := e.get(t, nil)
	if err != nil || !b.Remote || !bytes.Equal(got, e.content) {
		t.Fatalf("read: %+v, %d bytes, %v", b, len(got), err)
	}
	if p := e.placement(t, "eu-1"); p.State != placement.Failed || p.Reason != placement.DigestMismatch {
		t.Fatalf("the undecodable copy: %+v", p)
	}
}

// No copy at all, or every copy damaged: not found.
func TestReadOfNoCopyIsNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t, "eu-1")
	e.damage(t, "eu-1", nil)
	if _, _, err := e.get(t, nil); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("the only copy lost: %v", err)
	}
	if _, _, err := e.get(t, nil); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("after: %v", err)
	}
}
