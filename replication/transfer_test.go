package replication_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
)

// A transfer into us-1 of blobs published in eu-1, over a real ledger
// and real filesystem backends (one per datacenter). Sources are the
// eu-1 backend read directly (the remote path over HTTP is tested in
// app: TestReplicationAcrossDatacenters).

type env struct {
	st         *store.Store
	src, dst   *fs.Backend
	transfer   *replication.Transfer
	remote     *switchSource
	content    []byte
	d          blobplane.Digest
	sourceKey  placement.Key
	targetKey  placement.Key
	sourceSize int64
	metrics    *replication.Metrics
}

// switchSource reads eu-1's backend, or answers what a test asks.
type switchSource struct {
	be      *fs.Backend
	opens   int
	failing error
	alter   bool
	// alterFrom alters only reads of that datacenter's copy.
	alterFrom string
}

func (s *switchSource) Open(ctx context.Context, p placement.Placement) (io.ReadCloser, error) {
	s.opens++
	if s.failing != nil {
		return nil, s.failing
	}
	obj, err := s.be.Read(ctx, p.Digest, backend.ReadOptions{})
	if err != nil {
		return nil, err
	}
	if !s.alter && p.Datacenter != s.alterFrom {
		return obj.Body, nil
	}
	b, err := io.ReadAll(obj.Body)
	obj.Body.Close()
	if err != nil {
		return nil, err
	}
	b[0] ^= 0xff // a bit flipped in flight
	return io.NopCloser(bytes.NewReader(b)), nil
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	st := pgtest.NewStore(t)
	src, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close(); dst.Close() })
	e := &env{st: st, src: src, dst: dst, content: []byte(strings.Repeat("replicated bytes ", 4096))}
	sum := sha256.Sum256(e.content)
	e.d = blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
	e.sourceSize = int64(len(e.content))
	e.sourceKey = placement.Key{Digest: e.d, Backend: "fs", Datacenter: "eu-1", Location: placement.ObjectLocation(e.d)}
	// The published copy in eu-1: bytes written, placement verified.
	if _, err := src.Write(ctx, backend.WriteRequest{Digest: e.d, Size: e.sourceSize, Body: bytes.NewReader(e.content)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.StagePlacement(ctx, e.sourceKey, e.sourceSize, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.VerifyPlacement(ctx, e.sourceKey, e.d, e.sourceSize, 0); err != nil {
		t.Fatal(err)
	}
	e.remote = &switchSource{be: src}
	e.metrics = replication.NewMetrics(prometheus.NewRegistry())
	e.transfer = &replication.Transfer{Ledger: st, Datacenter: "us-1", BackendName: "fs", Backend: dst,
		Remote: e.remote, Metrics: e.metrics, Logger: slog.New(slog.DiscardHandler)}
	e.targetKey = e.transfer.Key(e.d)
	return e
}

func (e *env) request(takeOver bool) replication.Request {
	return replication.Request{Digest: e.d, Size: e.sourceSize, SourceDatacenter: "eu-1", TakeOver: takeOver}
}

func (e *env) target(t *testing.T) placement.Placement {
	t.Helper()
	p, err := e.st.Placement(context.Background(), e.targetKey)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The target's bytes are the source's, hashed on arrival.
func (e *env) requireCopied(t *testing.T) {
	t.Helper()
	obj, err := e.dst.Read(context.Background(), e.d, backend.ReadOptions{})
	if err != nil {
		t.Fatalf("target object: %v", err)
	}
	defer obj.Body.Close()
	got, _ := io.ReadAll(obj.Body)
	if !bytes.Equal(got, e.content) {
		t.Fatalf("target object: %d bytes, not the source's", len(got))
	}
}

func TestTransferCopiesAndVerifies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	res, err := e.transfer.Run(context.Background(), e.request(false))
	if err != nil || !res.Done || res.AlreadyVerified || res.Source.Key != e.sourceKey || res.Bytes != e.sourceSize {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if p := e.target(t); p.State != placement.Verified || p.Epoch != 1 || p.Size != e.sourceSize {
		t.Fatalf("target row: %+v", p)
	}
	e.requireCopied(t)
	if got := testutil.ToFloat64(e.metrics.Copies("eu-1", "us-1")); got != 1 {
		t.Fatalf("copies counted: %v", got)
	}
	if got := testutil.ToFloat64(e.metrics.Bytes("eu-1", "us-1")); got != float64(e.sourceSize) {
		t.Fatalf("bytes counted: %v", got)
	}
	// A second run (a duplicate job, a repair that finds it done) copies
	// nothing.
	opens := e.remote.opens
	if res, err := e.transfer.Run(context.Background(), e.request(true)); err != nil || !res.AlreadyVerified || e.remote.opens != opens {
		t.Fatalf("second run: %+v, %v (opens %d → %d)", res, err, opens, e.remote.opens)
	}
}

// S2: bytes altered in flight never become verified: the target write
// keeps nothing, the row is failed/digest_mismatch, and the retry (under
// a newer epoch) verifies the good bytes.
func TestTransferMismatchInFlightFailsThenRetryVerifies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.remote.alter = true
	_, err := e.transfer.Run(context.Background(), e.request(false))
	var f *replication.Failure
	if !errors.As(err, &f) || f.Reason != placement.DigestMismatch || !errors.Is(err, backend.ErrMismatch) {
		t.Fatalf("altered bytes: %v", err)
	}
	if p := e.target(t); p.State != placement.Failed || p.Reason != placement.DigestMismatch {
		t.Fatalf("target row after a mismatch: %+v", p)
	}
	if got := testutil.ToFloat64(e.metrics.Failures("us-1", placement.DigestMismatch)); got != 1 {
		t.Fatalf("mismatches counted: %v", got)
	}
	if _, err := e.dst.Stat(context.Background(), e.d); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("target object after a mismatch: %v; want none (S2)", err)
	}
	e.remote.alter = false
	res, err := e.transfer.Run(context.Background(), e.request(true))
	if err != nil || !res.Done || res.Placement.Epoch != 2 {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	e.requireCopied(t)
}

// A source whose bytes do not hash to the digest does not end the
// attempt: the next verified copy is tried, and the copy verifies from it.
func TestTransferMismatchFromOneSourceTriesTheNext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	if _, err := e.transfer.Run(ctx, e.request(false)); err != nil { // us-1 now holds a verified copy too
		t.Fatal(err)
	}
	ap, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ap.Close() })
	e.remote.alterFrom = "eu-1" // the ingress copy is bad
	into := &replication.Transfer{Ledger: e.st, Datacenter: "ap-1", BackendName: "fs", Backend: ap,
		Remote: e.remote, Metrics: e.metrics, Logger: slog.New(slog.DiscardHandler)}
	res, err := into.Run(ctx, e.request(false))
	if err != nil || !res.Done || res.Source.Datacenter != "us-1" {
		t.Fatalf("copy into ap-1: %+v, %v; want verified from us-1", res, err)
	}
	if got := testutil.ToFloat64(e.metrics.Copies("us-1", "ap-1")); got != 1 {
		t.Fatalf("copies from us-1 counted: %v", got)
	}
}

// S3: a stale transfer's late verification changes nothing. Transfer 1
// stages under epoch 1 and is cut off before it verifies; the retry takes
// the row over under epoch 2 and verifies; then transfer 1's late
// verification (epoch 1) is refused and the row stays as the retry left
// it.
func TestStaleTransferIsFenced(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	if _, err := e.st.StagePlacement(ctx, e.targetKey, e.sourceSize, 1); err != nil {
		t.Fatal(err)
	}
	// The first attempt of a copy leaves a pending row alone.
	if _, err := e.transfer.Run(ctx, e.request(false)); !errors.Is(err, replication.ErrInProgress) {
		t.Fatalf("first attempt on a pending row: %v", err)
	}
	res, err := e.transfer.Run(ctx, e.request(true))
	if err != nil || !res.Done || res.Placement.Epoch != 2 {
		t.Fatalf("take-over: %+v, %v", res, err)
	}
	before := e.target(t)
	_, err = e.st.VerifyPlacement(ctx, e.targetKey, e.d, e.sourceSize, 1)
	if blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("late verification under epoch 1: %v; want stale_epoch", err)
	}
	_, err = e.st.FailPlacement(ctx, e.targetKey, placement.BackendRefused, 1)
	if blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("late failure under epoch 1: %v; want stale_epoch", err)
	}
	if after := e.target(t); after.State != placement.Verified || after.Generation != before.Generation || after.Epoch != 2 {
		t.Fatalf("row after the stale writes: %+v, before %+v", after, before)
	}
}

// Failures are classified on the row: an unreadable source is
// source_unavailable; no verified source at all stages nothing.
func TestTransferClassifiesFailures(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.remote.failing = errors.New("connection refused")
	_, err := e.transfer.Run(ctx, e.request(false))
	var f *replication.Failure
	if !errors.As(err, &f) || f.Reason != placement.SourceUnavailable {
		t.Fatalf("unreadable source: %v", err)
	}
	if p := e.target(t); p.State != placement.Failed || p.Reason != placement.SourceUnavailable {
		t.Fatalf("row: %+v", p)
	}

	other := setup(t)
	if _, err := other.st.FailPlacement(ctx, other.sourceKey, placement.SourceUnavailable, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := other.transfer.Run(ctx, other.request(false)); !errors.Is(err, replication.ErrNoSource) || replication.Classify(err) != placement.SourceUnavailable {
		t.Fatalf("no verified source: %v", err)
	}
	if _, err := other.st.Placement(ctx, other.targetKey); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("target row without a source: %v; want none staged", err)
	}
}

// A target backend that refuses the write is backend_refused.
func TestTransferBackendRefused(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.transfer.Backend = refusing{e.dst}
	_, err := e.transfer.Run(context.Background(), e.request(false))
	var f *replication.Failure
	if !errors.As(err, &f) || f.Reason != placement.BackendRefused {
		t.Fatalf("refused write: %v", err)
	}
	if p := e.target(t); p.State != placement.Failed || p.Reason != placement.BackendRefused {
		t.Fatalf("row: %+v", p)
	}
}

type refusing struct{ *fs.Backend }

func (refusing) Write(context.Context, backend.WriteRequest) (backend.Info, error) {
	return backend.Info{}, backend.ErrRefused
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
