package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"time"

	"golang.org/x/time/rate"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// ScrubLedger is what a scrub needs of the ledger (store.Store).
type ScrubLedger interface {
	ScrubLoad(ctx context.Context, datacenter string, dueIn time.Duration) (store.ScrubLoad, error)
	ScrubCandidates(ctx context.Context, datacenter string, skip, limit int) ([]store.ScrubCandidate, error)
	RecordPlacementChecks(ctx context.Context, ks []placement.Key, outcome string) error
	FailPlacement(ctx context.Context, k placement.Key, reason placement.Reason, epoch int64) (placement.Placement, error)
}

// Repairer enqueues the copy that repairs a failed placement of d (size
// bytes) in datacenter, from another verified copy (the replicate job).
type Repairer interface {
	EnqueueRepair(ctx context.Context, d blobplane.Digest, size int64, datacenter string) error
}

// Scrub re-reads the verified placements of one datacenter, the longest
// unchecked first, and re-hashes their bytes. A missing object fails its
// placement (source_unavailable), an altered or short one too
// (digest_mismatch), each under a new epoch, and a repair is enqueued.
//
// Each pass paces itself (PlanPass) so that every stored byte is checked
// at least once per Period: it reads its share of the datacenter's bytes,
// and more when placements would otherwise go unchecked past the period,
// at the rate that fits that into the pass's budget.
type Scrub struct {
	Ledger     ScrubLedger
	Datacenter string
	Backends   map[string]backend.Backend
	Repair     Repairer
	// Period: every verified placement is checked at least once per
	// Period (BLOBPLANE_SCRUB_PERIOD). Interval is the time between two
	// passes (the scrub's schedule); Budget how long a pass may read.
	Period, Interval, Budget time.Duration
	// MaxRate caps the bytes read per second (0: no cap); a pass that
	// needs more says so and reads at the cap.
	MaxRate int64
	// Batch is how many placements one ledger read lists.
	Batch   int
	Metrics *Metrics
	Logger  *slog.Logger
}

// ScrubReport is what one pass found.
type ScrubReport struct {
	Checked, Intact, Mismatched, Missing, Skipped int
	// TooLarge counts placements skipped because no pass can read them
	// whole at the rate cap (among Skipped).
	TooLarge int
	Bytes    int64
	Pace     Pace
}

// Pace is one pass's plan.
type Pace struct {
	// Target is the bytes the pass reads: its share of the datacenter's
	// bytes (total × interval / period), or all that falls due before the
	// next pass if that is more.
	Target int64
	// Rate is the bytes per second it reads at: the target over the
	// budget, at least MinScrubRate, at most the cap.
	Rate float64
	// Short: the cap is too low to cover the period; the pass reads at
	// the cap and the scrub falls behind (its oldest check ages past the
	// period).
	Short bool
}

// MinScrubRate is the slowest a pass reads (bytes/s): a small target is
// read quickly, not spread thinly over the whole budget.
const MinScrubRate = 1 << 20

// PlanPass plans a pass over load: interval is the time to the next pass,
// period the coverage period, budget the time the pass may read, maxRate
// the cap (0: none).
func PlanPass(load store.ScrubLoad, interval, period, budget time.Duration, maxRate int64) Pace {
	share := load.TotalBytes
	if period > interval {
		share = int64(float64(load.TotalBytes) * (float64(interval) / float64(period)))
	}
	p := Pace{Target: max(share, load.DueBytes)}
	p.Rate = max(float64(p.Target)/max(budget.Seconds(), 1e-3), MinScrubRate)
	if maxRate > 0 && p.Rate > float64(maxRate) {
		p.Short = float64(p.Target)/max(budget.Seconds(), 1e-3) > float64(maxRate)
		p.Rate = float64(maxRate)
	}
	return p
}

// Run runs one pass: it plans from the ledger, then checks placements,
// the longest unchecked first, until it has read its target (or found
// nothing more to check). A placement whose backend is not configured
// here, or whose read fails for a reason that is not about its bytes
// (the store unreachable), is skipped and stays first in line for the
// next pass.
func (s *Scrub) Run(ctx context.Context) (rep ScrubReport, err error) {
	defer func() { s.Metrics.scrubbed(s.Datacenter, rep) }()
	load, err := s.Ledger.ScrubLoad(ctx, s.Datacenter, s.Interval-s.Period)
	if err != nil {
		return rep, err
	}
	start := load.Now
	s.Metrics.scrubLag(s.Datacenter, load.OldestAge)
	rep.Pace = PlanPass(load, s.Interval, s.Period, s.Budget, s.MaxRate)
	if rep.Pace.Short {
		s.Logger.WarnContext(ctx, "the scrub cannot cover its period at its rate cap; raise BLOBPLANE_SCRUB_RATE or BLOBPLANE_SCRUB_PERIOD",
			"datacenter", s.Datacenter, "stored_bytes", load.TotalBytes, "period", s.Period, "cap_bytes_per_second", s.MaxRate,
			"needed_bytes_per_second", int64(float64(rep.Pace.Target)/max(s.Budget.Seconds(), 1e-3)))
	}
	lim := rate.NewLimiter(rate.Limit(rep.Pace.Rate), 256<<10)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.Budget)
	}
	for rep.Bytes < rep.Pace.Target {
		// Skipped placements stay in front; checked ones go to the back.
		cands, err := s.Ledger.ScrubCandidates(ctx, s.Datacenter, rep.Skipped, s.batch())
		if err != nil {
			return rep, err
		}
		more, err := s.checkAll(ctx, lim, deadline, cands, start, &rep)
		if err != nil || !more || len(cands) < s.batch() {
			return rep, err
		}
	}
	return rep, nil
}

func (s *Scrub) batch() int {
	if s.Batch <= 0 {
		return 1000
	}
	return s.Batch
}

// checkAll checks cands in order until the target is read. more is
// false once the pass has come round to a placement it checked itself
// (since start): the whole datacenter is done.
//
// Intact checks are recorded together, when the page is done (or the
// pass stops), in one statement: before the next page is listed, which
// must not list them again.
func (s *Scrub) checkAll(ctx context.Context, lim *rate.Limiter, deadline time.Time, cands []store.ScrubCandidate, start time.Time, rep *ScrubReport) (more bool, err error) {
	var intact []placement.Key
	defer func() {
		// Also when the budget ran out mid-page: what was checked counts.
		if rerr := s.Ledger.RecordPlacementChecks(context.WithoutCancel(ctx), intact, store.CheckIntact); rerr != nil {
			err = errors.Join(err, fmt.Errorf("scrub: record %d checks: %w", len(intact), rerr))
		}
	}()
	for _, c := range cands {
		if rep.Bytes >= rep.Pace.Target {
			return false, nil
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if !c.LastChecked.Before(start) {
			return false, nil
		}
		be, ok := s.Backends[c.Key.Backend]
		if !ok {
			rep.Skipped++
			continue
		}
		if !s.fits(ctx, lim, deadline, c, rep) {
			continue
		}
		outcome, n, err := s.check(ctx, lim, be, c)
		rep.Bytes += n
		if err != nil && ctx.Err() != nil {
			return false, ctx.Err() // the pass's budget ran out mid-read
		}
		if err != nil {
			rep.Skipped++
			s.Logger.WarnContext(ctx, "scrub could not read a placement; it is checked next time", "digest", c.Key.Digest, "backend", c.Key.Backend, "err", err)
			continue
		}
		rep.Checked++
		if outcome == store.CheckIntact {
			rep.Intact++
			intact = append(intact, c.Key)
			continue
		}
		if err := s.recordBad(ctx, c, outcome, rep); err != nil {
			return false, err
		}
	}
	return true, nil
}

// fits sets lim's rate for reading c: the pace, or faster when c would
// not otherwise be read whole before the deadline. A placement that
// cannot be read whole in time even at MaxRate is skipped (it stays
// first in line: a later pass, with its whole budget ahead, reads it
// first), so one large blob never holds up the rest. One that cannot be
// read within a whole budget at MaxRate is never checked: that is logged
// and counted (finding too_large) at every pass, and
// blobplane_scrub_oldest_check_age_seconds climbs past the period.
func (s *Scrub) fits(ctx context.Context, lim *rate.Limiter, deadline time.Time, c store.ScrubCandidate, rep *ScrubReport) bool {
	// A tenth of the time left is kept for the ledger writes and slack.
	need := float64(c.Size) / max(0.9*time.Until(deadline).Seconds(), 1e-3)
	if s.MaxRate > 0 && need > float64(s.MaxRate) {
		rep.Skipped++
		if float64(c.Size)/max(s.Budget.Seconds(), 1e-3) > float64(s.MaxRate) {
			rep.TooLarge++
			s.Logger.ErrorContext(ctx, "a placement is too large to be scrubbed within one pass at the rate cap; raise BLOBPLANE_SCRUB_RATE or space the passes further apart (BLOBPLANE_SCRUB_CRON)",
				"digest", c.Key.Digest, "backend", c.Key.Backend, "size", c.Size, "budget", s.Budget, "cap_bytes_per_second", s.MaxRate)
		}
		return false
	}
	lim.SetLimit(rate.Limit(max(rep.Pace.Rate, need)))
	return true
}

// recordBad records a bad copy's check: the placement is failed under a
// new epoch and its repair enqueued.
func (s *Scrub) recordBad(ctx context.Context, c store.ScrubCandidate, outcome string, rep *ScrubReport) error {
	reason := placement.DigestMismatch
	switch outcome {
	case store.CheckMissing:
		rep.Missing++
		reason = placement.SourceUnavailable
	default:
		rep.Mismatched++
	}
	s.Logger.ErrorContext(ctx, "scrub found a bad copy; failing it and enqueueing its repair", "digest", c.Key.Digest, "backend", c.Key.Backend, "datacenter", c.Key.Datacenter, "location", c.Key.Location, "finding", outcome)
	if _, err := s.Ledger.FailPlacement(ctx, c.Key, reason, c.Epoch+1); err != nil && blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		return fmt.Errorf("scrub: fail %s: %w", c.Key.Digest, err)
	}
	if err := s.Ledger.RecordPlacementChecks(ctx, []placement.Key{c.Key}, outcome); err != nil {
		return err
	}
	return s.Repair.EnqueueRepair(ctx, c.Key.Digest, c.Size, s.Datacenter)
}

// check reads c's object whole and hashes it: intact, digest_mismatch
// (other bytes, short or long, or a representation that does not
// decode) or missing. err: the read failed for another reason.
func (s *Scrub) check(ctx context.Context, lim *rate.Limiter, be backend.Backend, c store.ScrubCandidate) (outcome string, n int64, err error) {
	obj, err := be.Read(ctx, c.Key.Digest, backend.ReadOptions{})
	switch {
	case errors.Is(err, backend.ErrNotFound):
		return store.CheckMissing, 0, nil
	case errors.Is(err, backend.ErrCorrupt):
		return store.CheckMismatch, 0, nil
	case err != nil:
		return "", 0, err
	}
	defer obj.Body.Close()
	h := sha256.New()
	n, err = scrubCopy(ctx, lim, h, obj.Body)
	switch {
	case errors.Is(err, backend.ErrCorrupt):
		return store.CheckMismatch, n, nil
	case err != nil:
		return "", n, err
	}
	if n != c.Size || "sha256:"+hex.EncodeToString(h.Sum(nil)) != string(c.Key.Digest) {
		return store.CheckMismatch, n, nil
	}
	return store.CheckIntact, n, nil
}

// scrubCopy hashes r into h at no more than lim's rate: each read asks
// for at most one burst and is paid for once read, so the read that
// meets the end costs nothing.
func scrubCopy(ctx context.Context, lim *rate.Limiter, h hash.Hash, r io.Reader) (int64, error) {
	buf := make([]byte, min(256<<10, lim.Burst()))
	var n int64
	for {
		k, err := r.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if werr := lim.WaitN(ctx, k); werr != nil {
			return n, werr
		}
	}
}
