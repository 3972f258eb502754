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

	"golang.org/x/time/rate"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// ScrubLedger is what a scrub needs of the ledger (store.Store).
type ScrubLedger interface {
	ScrubCandidates(ctx context.Context, datacenter string, limit int) ([]store.ScrubCandidate, error)
	RecordPlacementCheck(ctx context.Context, k placement.Key, outcome string) error
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
type Scrub struct {
	Ledger     ScrubLedger
	Datacenter string
	Backends   map[string]backend.Backend
	Repair     Repairer
	// Limiter bounds the bytes read per second (nil: no bound).
	Limiter *rate.Limiter
	Metrics *Metrics
	Logger  *slog.Logger
}

// ScrubReport is what one pass found.
type ScrubReport struct {
	Checked, Intact, Mismatched, Missing, Skipped int
	Bytes                                         int64
}

// Run checks up to limit placements. A placement whose backend is not
// configured here, or whose read fails for a reason that is not about
// its bytes (the store unreachable), is skipped and stays first in line.
func (s *Scrub) Run(ctx context.Context, limit int) (rep ScrubReport, err error) {
	defer func() { s.Metrics.scrubbed(s.Datacenter, rep) }()
	cands, err := s.Ledger.ScrubCandidates(ctx, s.Datacenter, limit)
	if err != nil {
		return rep, err
	}
	for _, c := range cands {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		be, ok := s.Backends[c.Key.Backend]
		if !ok {
			rep.Skipped++
			continue
		}
		outcome, n, err := s.check(ctx, be, c)
		rep.Bytes += n
		if err != nil {
			rep.Skipped++
			s.Logger.WarnContext(ctx, "scrub could not read a placement; it is checked next time", "digest", c.Key.Digest, "backend", c.Key.Backend, "err", err)
			continue
		}
		rep.Checked++
		if err := s.record(ctx, c, outcome, &rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// record writes a check's outcome; a bad copy is failed under a new epoch
// and its repair enqueued.
func (s *Scrub) record(ctx context.Context, c store.ScrubCandidate, outcome string, rep *ScrubReport) error {
	reason := placement.DigestMismatch
	switch outcome {
	case store.CheckIntact:
		rep.Intact++
		return s.Ledger.RecordPlacementCheck(ctx, c.Key, outcome)
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
	if err := s.Ledger.RecordPlacementCheck(ctx, c.Key, outcome); err != nil {
		return err
	}
	return s.Repair.EnqueueRepair(ctx, c.Key.Digest, c.Size, s.Datacenter)
}

// check reads c's object whole and hashes it: intact, digest_mismatch
// (other bytes, short or long, or a representation that does not
// decode) or missing. err: the read failed for another reason.
func (s *Scrub) check(ctx context.Context, be backend.Backend, c store.ScrubCandidate) (outcome string, n int64, err error) {
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
	n, err = s.copy(ctx, h, obj.Body)
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

// copy hashes r into h at no more than the limiter's rate: each read
// asks for at most one burst, and waits for its tokens first.
func (s *Scrub) copy(ctx context.Context, h hash.Hash, r io.Reader) (int64, error) {
	chunk := 256 << 10
	if s.Limiter != nil {
		chunk = min(chunk, s.Limiter.Burst())
	}
	buf := make([]byte, chunk)
	var n int64
	for {
		if s.Limiter != nil {
			if err := s.Limiter.WaitN(ctx, chunk); err != nil {
				return n, err
			}
		}
		k, err := r.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
