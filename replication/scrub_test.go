package replication_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

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
		// Every pass covers everything: a period shorter than a pass.
		Period: time.Nanosecond, Budget: time.Minute, Batch: 10, Metrics: replication.NewMetrics(nil), Logger: slog.New(slog.DiscardHandler),
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
	rep, err := s.scrub.Run(context.Background())
	if err != nil || rep.Checked != 1 || rep.Intact != 1 || rep.Bytes != s.sourceSize || len(*s.repairs) != 0 {
		t.Fatalf("scrub: %+v, %v, repairs %v", rep, err, *s.repairs)
	}
	cands, err := s.st.ScrubCandidates(context.Background(), "eu-1", 0, 10)
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
	rep, err := s.scrub.Run(context.Background())
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
	rep, err := s.scrub.Run(context.Background())
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
	rep, err := s.scrub.Run(context.Background())
	if err != nil || rep.Intact != 1 {
		t.Fatalf("scrub after the repair: %+v, %v", rep, err)
	}
}

// The coverage period (BLOBPLANE_SCRUB_PERIOD): with passes an hour
// apart and a four-hour period, each pass reads a quarter of the stored
// bytes, the longest unchecked first, so four passes check each of four
// equal blobs once; placements whose last check is older than the period
// are all due, and the next pass reads every one of them.
func TestScrubPacesItselfToCoverThePeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	be, digests := verifiedBlobs(t, st, 64<<10, 64<<10, 64<<10, 64<<10)
	m := replication.NewMetrics(prometheus.NewRegistry())
	s := &replication.Scrub{Ledger: st, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": be}, Repair: &repairs{},
		Period: 4 * time.Hour, Interval: time.Hour, Budget: 45 * time.Minute, Batch: 2, Metrics: m, Logger: slog.New(slog.DiscardHandler)}
	checks := func() map[blobplane.Digest]int {
		t.Helper()
		rows, err := d.Pool.Query(ctx, `SELECT digest FROM placement_checks WHERE datacenter = 'eu-1' AND outcome = 'intact'`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[blobplane.Digest]int{}
		for rows.Next() {
			var dg string
			if err := rows.Scan(&dg); err != nil {
				t.Fatal(err)
			}
			got[blobplane.Digest(dg)]++
		}
		return got
	}
	for pass := 1; pass <= 4; pass++ {
		rep, err := s.Run(ctx)
		if err != nil || rep.Checked != 1 || rep.Pace.Target != 64<<10 || rep.Pace.Short {
			t.Fatalf("pass %d: %+v, %v; want one blob of four (a quarter of the bytes)", pass, rep, err)
		}
		// The longest unchecked first: verification order.
		if got := checks(); len(got) != pass || got[digests[pass-1]] != 1 {
			t.Fatalf("after pass %d: checked %v", pass, got)
		}
	}
	// Every check now older than the period: all due at once.
	if _, err := d.Pool.Exec(ctx, `UPDATE placement_checks SET checked_at = checked_at - interval '5 hours'`); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Run(ctx)
	if err != nil || rep.Checked != 4 || rep.Pace.Target != 4*64<<10 {
		t.Fatalf("overdue pass: %+v, %v; want all four", rep, err)
	}
	if lag := testutil.ToFloat64(m.ScrubLag("eu-1")); lag < 5*3600 {
		t.Fatalf("oldest check age at the overdue pass: %v s, want over 5 h", lag)
	}
	// A cap below what the period needs: read at the cap, and say so.
	if _, err := d.Pool.Exec(ctx, `UPDATE placement_checks SET checked_at = checked_at - interval '5 hours'`); err != nil {
		t.Fatal(err)
	}
	s.MaxRate, s.Budget = 1<<20, time.Millisecond
	if rep, err := s.Run(ctx); err != nil || !rep.Pace.Short || rep.Pace.Rate != 1<<20 || rep.TooLarge != 4 || rep.Checked != 0 {
		t.Fatalf("capped pass: %+v, %v", rep, err)
	}
	if n := testutil.ToFloat64(m.Findings("eu-1", "too_large")); n != 4 {
		t.Fatalf("too_large counted: %v", n)
	}
}

// A placement that cannot be read whole within a pass at the rate cap is
// skipped, and the ones after it are still checked: a large blob first
// in line never holds up the rest.
func TestScrubSkipsWhatCannotFitAndChecksTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.NewStore(t)
	// 4 MiB first (verified first), then three of 64 KiB; at 1 MiB/s a
	// two-second pass can read the small ones, never the large one.
	be, digests := verifiedBlobs(t, st, 4<<20, 64<<10, 64<<10, 64<<10)
	s := &replication.Scrub{Ledger: st, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": be}, Repair: &repairs{},
		Period: time.Nanosecond, Budget: 2 * time.Second, MaxRate: 1 << 20, Batch: 10, Metrics: replication.NewMetrics(nil), Logger: slog.New(slog.DiscardHandler)}
	rep, err := s.Run(ctx)
	if err != nil || rep.TooLarge != 1 || rep.Checked != 3 || rep.Intact != 3 {
		t.Fatalf("pass: %+v, %v; want the large one skipped, the three small ones intact", rep, err)
	}
	cands, err := st.ScrubCandidates(ctx, "eu-1", 0, 1)
	if err != nil || len(cands) != 1 || cands[0].Key.Digest != digests[0] {
		t.Fatalf("first in line after the pass: %+v, %v; want the unchecked large blob", cands, err)
	}
}

// verifiedBlobs writes blobs of the given sizes to a new filesystem
// backend and verifies an eu-1 placement of each, in order.
func verifiedBlobs(t *testing.T, st *store.Store, sizes ...int) (*fs.Backend, []blobplane.Digest) {
	t.Helper()
	ctx := context.Background()
	be, err := fs.Open(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	var digests []blobplane.Digest
	for i, size := range sizes {
		content := bytes.Repeat([]byte{byte('a' + i)}, size)
		sum := sha256.Sum256(content)
		dg := blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
		if _, err := be.Write(ctx, backend.WriteRequest{Digest: dg, Size: int64(len(content)), Body: bytes.NewReader(content)}); err != nil {
			t.Fatal(err)
		}
		k := placement.Key{Digest: dg, Backend: "fs", Datacenter: "eu-1", Location: placement.ObjectLocation(dg)}
		if _, err := st.StagePlacement(ctx, k, int64(len(content)), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := st.VerifyPlacement(ctx, k, dg, int64(len(content)), 0); err != nil {
			t.Fatal(err)
		}
		digests = append(digests, dg)
	}
	return be, digests
}

// PlanPass's arithmetic: share, due, floor and cap.
func TestPlanPass(t *testing.T) {
	t.Parallel()
	const GiB = 1 << 30
	week, tenMin := 7*24*time.Hour, 10*time.Minute
	for _, c := range []struct {
		name                 string
		load                 store.ScrubLoad
		interval, period, bu time.Duration
		cap                  int64
		want                 replication.Pace
	}{
		{"share of a week", store.ScrubLoad{TotalBytes: 1008 * GiB}, tenMin, week, 500 * time.Second, 0,
			replication.Pace{Target: 1 * GiB, Rate: GiB / 500.0}},
		{"due beats share", store.ScrubLoad{TotalBytes: 1008 * GiB, DueBytes: 5 * GiB}, tenMin, week, 500 * time.Second, 0,
			replication.Pace{Target: 5 * GiB, Rate: 5 * GiB / 500.0}},
		{"small: the floor", store.ScrubLoad{TotalBytes: GiB}, tenMin, week, 500 * time.Second, 0,
			replication.Pace{Target: GiB / 1008, Rate: replication.MinScrubRate}},
		{"over the cap", store.ScrubLoad{TotalBytes: 1008 * GiB}, tenMin, week, 500 * time.Second, 1 << 20,
			replication.Pace{Target: 1 * GiB, Rate: 1 << 20, Short: true}},
		{"period under the interval: all", store.ScrubLoad{TotalBytes: GiB}, time.Hour, time.Minute, 1000 * time.Second, 0,
			replication.Pace{Target: GiB, Rate: GiB / 1000.0}},
		{"nothing stored", store.ScrubLoad{}, tenMin, week, 500 * time.Second, 64 << 20,
			replication.Pace{Rate: replication.MinScrubRate}},
	} {
		if got := replication.PlanPass(c.load, c.interval, c.period, c.bu, c.cap); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A placement that fits the pass's budget is read whole within it: its
// rate is raised to finish before the deadline, and the read that meets
// the end waits for nothing (found by the soak: the last wait ran past a
// 1.5 s pass's deadline, so a 4 MiB blob was never checked).
func TestScrubFinishesAPlacementWithinTheDeadline(t *testing.T) {
	t.Parallel()
	st := pgtest.NewStore(t)
	be, _ := verifiedBlobs(t, st, 4<<20)
	s := &replication.Scrub{Ledger: st, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": be}, Repair: &repairs{},
		Period: time.Minute, Interval: 2 * time.Second, Budget: 1500 * time.Millisecond, MaxRate: 64 << 20, Batch: 10,
		Metrics: replication.NewMetrics(nil), Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), s.Budget)
	defer cancel()
	// Due: verified longer ago than the period.
	if _, err := st.Pool().Exec(ctx, `UPDATE placements SET verified_at = now() - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if rep, err := s.Run(ctx); err != nil || rep.Intact != 1 || rep.Skipped != 0 {
		t.Fatalf("pass: %+v, %v; want the 4 MiB placement checked within 1.5 s", rep, err)
	}
}
