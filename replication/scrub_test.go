package replication_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/replication"
)

// repairs records what a scrub asked to repair.
type repairs []blobplane.Digest

func (r *repairs) EnqueueRepair(_ context.Context, d blobplane.Digest, _ int64, _ string) error {
	*r = append(*r, d)
	return nil
}

// scrubEnv is a blob verified in eu-1 (its bytes on dir) and copied into
// us-1 by a transfer.
type scrubEnv struct {
	*env
	dir     string
	scrub   *replication.Scrub
	repairs *repairs
}

func setupScrub(t *testing.T) *scrubEnv {
	t.Helper()
	e := setup(t)
	if _, err := e.transfer.Run(context.Background(), e.request(false)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	be, err := fs.Open(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	// eu-1's bytes, on a backend whose files the test can reach.
	ctx := context.Background()
	if _, err := be.Write(ctx, backend.WriteRequest{Digest: e.d, Size: e.sourceSize, Body: bytesReader(e.content)}); err != nil {
		t.Fatal(err)
	}
	r := &repairs{}
	return &scrubEnv{env: e, dir: dir, repairs: r, scrub: &replication.Scrub{
		Ledger: e.st, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": be}, Repair: r,
		Limiter: rate.NewLimiter(rate.Limit(1<<30), 64<<10), Metrics: replication.NewMetrics(nil), Logger: slog.New(slog.DiscardHandler),
	}}
}

func (s *scrubEnv) source(t *testing.T) placement.Placement {
	t.Helper()
	p, err := s.st.Placement(context.Background(), s.sourceKey)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// An intact copy is recorded as checked and stays verified.
func TestScrubRecordsIntactCopies(t *testing.T) {
	t.Parallel()
	s := setupScrub(t)
	rep, err := s.scrub.Run(context.Background(), 10)
	if err != nil || rep.Checked != 1 || rep.Intact != 1 || rep.Bytes != s.sourceSize || len(*s.repairs) != 0 {
		t.Fatalf("scrub: %+v, %v, repairs %v", rep, err, *s.repairs)
	}
	cands, err := s.st.ScrubCandidates(context.Background(), "eu-1", 10)
	if err != nil || len(cands) != 1 || cands[0].LastChecked.IsZero() {
		t.Fatalf("candidates after a check: %+v, %v", cands, err)
	}
	if p := s.source(t); p.State != placement.Verified {
		t.Fatalf("intact copy: %+v", p)
	}
}

// A bit flipped on disk: the copy is failed/digest_mismatch under a new
// epoch, a repair is enqueued, and the repair (a transfer into eu-1 from
// us-1's verified copy) makes it verified and intact again.
func TestScrubFindsABitFlipAndTheRepairRestoresIt(t *testing.T) {
	t.Parallel()
	s := setupScrub(t)
	path := filepath.Join(s.dir, fs.ObjectPath(s.d))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	epoch := s.source(t).Epoch
	rep, err := s.scrub.Run(context.Background(), 10)
	if err != nil || rep.Mismatched != 1 || len(*s.repairs) != 1 || (*s.repairs)[0] != s.d {
		t.Fatalf("scrub: %+v, %v, repairs %v", rep, err, *s.repairs)
	}
	p := s.source(t)
	if p.State != placement.Failed || p.Reason != placement.DigestMismatch || p.Epoch != epoch+1 {
		t.Fatalf("flipped copy: %+v; want failed/digest_mismatch at epoch %d", p, epoch+1)
	}
	if got := testutil.ToFloat64(s.scrub.Metrics.Findings("eu-1", "digest_mismatch")); got != 1 {
		t.Fatalf("mismatches counted: %v", got)
	}
	s.repair(t)
}

// A deleted file: failed/source_unavailable, repaired likewise.
func TestScrubFindsAMissingFileAndTheRepairRestoresIt(t *testing.T) {
	t.Parallel()
	s := setupScrub(t)
	if err := os.Remove(filepath.Join(s.dir, fs.ObjectPath(s.d))); err != nil {
		t.Fatal(err)
	}
	rep, err := s.scrub.Run(context.Background(), 10)
	if err != nil || rep.Missing != 1 || len(*s.repairs) != 1 {
		t.Fatalf("scrub: %+v, %v", rep, err)
	}
	if p := s.source(t); p.State != placement.Failed || p.Reason != placement.SourceUnavailable {
		t.Fatalf("missing copy: %+v", p)
	}
	s.repair(t)
}

// repair runs the repair's transfer into eu-1, reading us-1's copy.
func (s *scrubEnv) repair(t *testing.T) {
	t.Helper()
	fix := &replication.Transfer{Ledger: s.st, Datacenter: "eu-1", BackendName: "fs", Backend: s.scrub.Backends["fs"],
		Remote: &switchSource{be: s.dst}, Logger: slog.New(slog.DiscardHandler)}
	res, err := fix.Run(context.Background(), replication.Request{Digest: s.d, Size: s.sourceSize})
	if err != nil || !res.Done || res.Source.Datacenter != "us-1" {
		t.Fatalf("repair: %+v, %v", res, err)
	}
	if p := s.source(t); p.State != placement.Verified {
		t.Fatalf("repaired copy: %+v", p)
	}
	rep, err := s.scrub.Run(context.Background(), 10)
	if err != nil || rep.Intact != 1 {
		t.Fatalf("scrub after the repair: %+v, %v", rep, err)
	}
}
