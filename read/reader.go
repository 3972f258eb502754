// Package read serves a blob's bytes from wherever a verified copy is
// (issue 29, DESIGN.md flow 4): this datacenter's backends first, then a
// node of another datacenter through the node-authenticated internal
// endpoint. Every whole-blob read is hashed as it streams, and its last
// bytes are handed over only once they prove the digest, so no client
// ever receives a complete wrong body (S2). A copy found corrupt or lost
// is failed under a new epoch, counted, logged and repaired from another
// verified copy (blob-placement.md "Failure and repair").
package read

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
)

// Ledger is what reads need of the ledger (store.Store).
type Ledger interface {
	Placements(ctx context.Context, d blobplane.Digest) ([]placement.Placement, error)
	FailPlacement(ctx context.Context, k placement.Key, reason placement.Reason, epoch int64) (placement.Placement, error)
}

// Remote opens d (rng of it, nil: whole) from a node of datacenter dc
// (jobs.RemoteSource over GET /internal/v1/blobs/<digest>). The object's
// Length is what the node announced.
type Remote interface {
	OpenBlob(ctx context.Context, dc string, d blobplane.Digest, rng *backend.Range) (*backend.Object, error)
}

// Repairer enqueues the copy of d (size bytes) into datacenter from a
// verified copy elsewhere (a replicate job, unique per digest and target:
// asking twice adds nothing).
type Repairer interface {
	EnqueueRepair(ctx context.Context, d blobplane.Digest, size int64, datacenter string) error
}

// Reader opens blobs for GET. Its zero value is not usable: Datacenter,
// Backends, Ledger and Logger are required; Remote and Repair may be nil
// (no remote reads; no repairs, the scrub finds the copy again).
type Reader struct {
	Datacenter string
	Backends   map[string]backend.Backend
	Ledger     Ledger
	Remote     Remote
	Repair     Repairer
	// Unverified names backends whose whole reads are not hashed here
	// (BLOBPLANE_READ_UNVERIFIED_BACKENDS: stores that verify checksums
	// themselves); a short object is still caught.
	Unverified map[string]bool
	// Preference orders other datacenters, nearest first
	// (BLOBPLANE_READ_PREFERENCE); those not named come after, by name.
	Preference []string
	// ReadThrough enqueues a copy into this datacenter when a read is
	// served from another (BLOBPLANE_READ_THROUGH).
	ReadThrough bool
	// PendingWait is how long a read of a blob with only pending copies
	// waits for one to verify before answering 503 (0: not at all).
	PendingWait time.Duration
	Metrics     *Metrics
	Logger      *slog.Logger

	mu     sync.Mutex
	failed map[string]time.Time // datacenter → when a remote open from it last failed
}

// Blob is an opened read. Body must be closed. A whole read's Body
// verifies as it streams: it returns ErrCorrupt (never the last bytes)
// when the content does not prove the digest, and the caller must then
// abort the response. It may still be hashing the last chunk it handed
// over: the caller must not change that chunk before its next Read or
// Close, and must Close before reusing the buffer.
type Blob struct {
	Body   io.ReadCloser
	Length int64
	// From is the placement read; Remote when it is another datacenter's.
	From   placement.Placement
	Remote bool
}

// ErrCorrupt is a read whose bytes do not prove the digest (other
// bytes, short or long): the response must be aborted.
var ErrCorrupt = errors.New("the stored content does not hash to its digest")

// errDamaged marks an open that found its copy lost or corrupt.
var errDamaged = errors.New("copy damaged")

// pollPending is how often a read waiting for a pending copy looks again.
const pollPending = 100 * time.Millisecond

// Open opens d (size bytes; rng of it, nil: whole) from the nearest
// verified copy that opens: this datacenter's first, then other
// datacenters' (by Preference, then the least recently failed). A copy
// that fails before its first byte is left for the next; a lost or
// corrupt one is failed and repaired on the way. Errors: unavailable
// (with only pending copies, or none that opens now), not_found (no copy
// at all).
func (r *Reader) Open(ctx context.Context, d blobplane.Digest, size int64, rng *backend.Range) (*Blob, error) {
	deadline := time.Now().Add(r.PendingWait)
	for {
		b, pending, err := r.open(ctx, d, size, rng)
		if b != nil || err != nil || !pending || !time.Now().Before(deadline) {
			if b == nil && err == nil {
				err = blobplane.Errorf(blobplane.CodeUnavailable, "%s is being copied; no verified copy can be read yet", d)
			}
			return b, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollPending):
		}
	}
}

// open is one attempt of Open. pending: no verified copy opened, but a
// pending one may verify.
func (r *Reader) open(ctx context.Context, d blobplane.Digest, size int64, rng *backend.Range) (*Blob, bool, error) {
	ps, err := r.Ledger.Placements(ctx, d)
	if err != nil {
		return nil, false, err
	}
	local, remote, pending := r.candidates(ps)
	var errs []error
	damaged := 0
	for _, p := range local {
		b, err := r.openLocal(ctx, p, size, rng)
		if err == nil {
			return b, false, nil
		}
		if errors.Is(err, errDamaged) {
			damaged++
		}
		errs = append(errs, err)
	}
	for _, p := range remote {
		b, err := r.openRemote(ctx, p, size, rng)
		if err == nil {
			r.readThrough(ctx, d, size)
			return b, false, nil
		}
		errs = append(errs, err)
	}
	if len(errs) > 0 && damaged == len(errs) && !pending {
		// Every copy there was is lost or corrupt: as if none were
		// stored (HEAD says so too once the ledger is read again).
		return nil, false, blobplane.Errorf(blobplane.CodeNotFound, "no intact copy of %s is left; upload it again", d)
	}
	if len(errs) > 0 {
		r.Logger.WarnContext(ctx, "no verified copy could be opened", "digest", d, "err", errors.Join(errs...))
		return nil, pending, blobplane.Errorf(blobplane.CodeUnavailable, "no verified copy of %s can be read now", d)
	}
	if pending {
		return nil, true, nil
	}
	return nil, false, blobplane.Errorf(blobplane.CodeNotFound, "no copy of %s is stored", d)
}

// OpenLocal opens d (rng of it) from this datacenter's verified copies
// only: the internal endpoint's read for a node of another datacenter.
// Errors: unavailable when none opens here.
func (r *Reader) OpenLocal(ctx context.Context, d blobplane.Digest, rng *backend.Range) (*Blob, error) {
	ps, err := r.Ledger.Placements(ctx, d)
	if err != nil {
		return nil, err
	}
	local, _, _ := r.candidates(ps)
	for _, p := range local {
		if b, err := r.openLocal(ctx, p, p.Size, rng); err == nil {
			return b, nil
		}
	}
	return nil, blobplane.Errorf(blobplane.CodeUnavailable, "%s has no readable verified copy in datacenter %s", d, r.Datacenter)
}

// candidates splits ps into this datacenter's verified copies on a
// backend configured here, other datacenters' verified copies in the
// order they are tried, and whether any copy is pending.
func (r *Reader) candidates(ps []placement.Placement) (local, remote []placement.Placement, pending bool) {
	for _, p := range ps {
		switch {
		case p.State == placement.Pending:
			pending = true
		case p.State != placement.Verified:
		case p.Datacenter == r.Datacenter:
			if _, ok := r.Backends[p.Backend]; ok {
				local = append(local, p)
			}
		case r.Remote != nil:
			remote = append(remote, p)
		}
	}
	r.mu.Lock()
	failed := maps.Clone(r.failed)
	r.mu.Unlock()
	rank := func(dc string) int {
		if i := slices.Index(r.Preference, dc); i >= 0 {
			return i
		}
		return len(r.Preference)
	}
	slices.SortStableFunc(remote, func(a, b placement.Placement) int {
		return cmp.Or(cmp.Compare(rank(a.Datacenter), rank(b.Datacenter)),
			failed[a.Datacenter].Compare(failed[b.Datacenter]),
			cmp.Compare(a.Datacenter, b.Datacenter))
	})
	// One node per datacenter serves a remote read: one try each.
	remote = slices.CompactFunc(remote, func(a, b placement.Placement) bool { return a.Datacenter == b.Datacenter })
	return local, remote, pending
}

// openLocal opens p from its backend here. A not-found is a detected
// loss, a representation that does not decode a detected corruption:
// each fails p and asks for its repair.
func (r *Reader) openLocal(ctx context.Context, p placement.Placement, size int64, rng *backend.Range) (*Blob, error) {
	be := r.Backends[p.Backend]
	obj, err := be.Read(ctx, p.Digest, backend.ReadOptions{Range: rng})
	switch {
	case errors.Is(err, backend.ErrNotFound):
		r.damaged(ctx, p, placement.SourceUnavailable, "lost")
		return nil, fmt.Errorf("%s on %s: %w: %w", p.Digest, p.Backend, errDamaged, err)
	case errors.Is(err, backend.ErrCorrupt):
		r.damaged(ctx, p, placement.DigestMismatch, "corrupt")
		return nil, fmt.Errorf("%s on %s: %w: %w", p.Digest, p.Backend, errDamaged, err)
	case err != nil:
		return nil, fmt.Errorf("%s on %s: %w", p.Digest, p.Backend, err)
	}
	b := &Blob{Body: obj.Body, Length: obj.Length, From: p}
	if rng != nil {
		// A range is checked where the backend can (zstd frames); the
		// scrub covers the rest (docs/reads.md).
		b.Body = &rangeBody{ReadCloser: obj.Body, onCorrupt: r.onCorrupt(ctx, p)}
		return b, nil
	}
	b.Length = size
	b.Body = newVerifier(obj.Body, p.Digest, size, !r.Unverified[p.Backend], r.onCorrupt(ctx, p))
	return b, nil
}

// openRemote opens p through a node of its datacenter. The node verifies
// its own read; this one verifies what arrives (a whole read), and fails
// p only for bytes that arrived complete and wrong (a stream cut short
// is the network's, or the node's own abort).
func (r *Reader) openRemote(ctx context.Context, p placement.Placement, size int64, rng *backend.Range) (*Blob, error) {
	obj, err := r.Remote.OpenBlob(ctx, p.Datacenter, p.Digest, rng)
	if err != nil {
		r.mu.Lock()
		if r.failed == nil {
			r.failed = map[string]time.Time{}
		}
		r.failed[p.Datacenter] = time.Now()
		r.mu.Unlock()
		return nil, fmt.Errorf("%s from %s: %w", p.Digest, p.Datacenter, err)
	}
	r.Metrics.remote(p.Datacenter)
	b := &Blob{Body: obj.Body, Length: obj.Length, From: p, Remote: true}
	if rng == nil {
		b.Length = size
		b.Body = newVerifier(obj.Body, p.Digest, size, true, r.onCorrupt(ctx, p))
	}
	return b, nil
}

// readThrough asks for a copy here after a remote read, when set.
func (r *Reader) readThrough(ctx context.Context, d blobplane.Digest, size int64) {
	if !r.ReadThrough || r.Repair == nil {
		return
	}
	if err := r.Repair.EnqueueRepair(context.WithoutCancel(ctx), d, size, r.Datacenter); err != nil {
		r.Logger.WarnContext(ctx, "cannot enqueue a read-through copy", "digest", d, "err", err)
	}
}

// onCorrupt is what a read of p calls, once, on finding its bytes wrong.
func (r *Reader) onCorrupt(ctx context.Context, p placement.Placement) func() {
	return sync.OnceFunc(func() { r.damaged(ctx, p, placement.DigestMismatch, "corrupt") })
}

// damaged records a detected loss or corruption of p: counted, logged,
// failed under a new epoch (a newer stage or failure wins: stale epoch is
// not an error here) and its repair enqueued into its datacenter.
func (r *Reader) damaged(ctx context.Context, p placement.Placement, reason placement.Reason, what string) {
	ctx = context.WithoutCancel(ctx)
	r.Metrics.damaged(what, p)
	r.Logger.ErrorContext(ctx, "a read found a verified copy "+what+"; failing it and enqueueing its repair",
		"digest", p.Digest, "datacenter", p.Datacenter, "backend", p.Backend, "location", p.Location, "reason", reason)
	if _, err := r.Ledger.FailPlacement(ctx, p.Key, reason, p.Epoch+1); err != nil && blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		r.Logger.WarnContext(ctx, "cannot record a damaged copy", "digest", p.Digest, "err", err)
	}
	if r.Repair == nil {
		return
	}
	if err := r.Repair.EnqueueRepair(ctx, p.Digest, p.Size, p.Datacenter); err != nil {
		r.Logger.WarnContext(ctx, "cannot enqueue a repair", "digest", p.Digest, "err", err)
	}
}
