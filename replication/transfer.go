package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
)

// Ledger is what a transfer needs of the placement ledger (store.Store).
type Ledger interface {
	// Placements lists d's placements.
	Placements(ctx context.Context, d blobplane.Digest) ([]placement.Placement, error)
	// StagePlacement, VerifyPlacement and FailPlacement are the
	// epoch-fenced transitions (see store).
	StagePlacement(ctx context.Context, k placement.Key, size, epoch int64) (placement.Placement, error)
	VerifyPlacement(ctx context.Context, k placement.Key, confirmed blobplane.Digest, confirmedSize, epoch int64) (placement.Placement, error)
	FailPlacement(ctx context.Context, k placement.Key, reason placement.Reason, epoch int64) (placement.Placement, error)
}

// Source opens the content of a verified placement p (decoded bytes,
// exactly p.Size of them when all is well). Errors: any; the transfer
// classifies them as source_unavailable.
type Source interface {
	Open(ctx context.Context, p placement.Placement) (io.ReadCloser, error)
}

// Transfer copies blobs into one datacenter: its Datacenter, written
// through Backend (named BackendName in the ledger).
type Transfer struct {
	Ledger      Ledger
	Datacenter  string
	BackendName string
	Backend     backend.Backend
	// Local reads placements of this datacenter; Remote those of others.
	Local, Remote Source
	Metrics       *Metrics
	Logger        *slog.Logger
}

// Request is one copy: Digest (Size bytes) into the transfer's
// datacenter, preferably from SourceDatacenter.
type Request struct {
	Digest           blobplane.Digest
	Size             int64
	SourceDatacenter string
	// TakeOver: a pending target row is taken over under a newer epoch.
	// A first attempt leaves a pending row alone (an upload at the
	// target, or a copy in flight, may be about to verify it) and asks
	// to be retried; a retry (an earlier attempt of this copy was cut
	// short and may still hold the row) takes it over.
	TakeOver bool
}

// ErrInProgress is a first attempt that found the target row pending.
var ErrInProgress = errors.New("replication: the target placement is pending (a copy or an upload in flight)")

// Result says what a Run did.
type Result struct {
	// Done: the target holds a verified copy (now or already).
	Done bool
	// AlreadyVerified: nothing was copied.
	AlreadyVerified bool
	// Placement is the target row after the run.
	Placement placement.Placement
	// Source is the placement the bytes came from.
	Source placement.Placement
	// Bytes copied.
	Bytes int64
}

// ErrNoSource is a transfer with no verified copy to read from (yet).
var ErrNoSource = errors.New("replication: no verified source placement")

// Key is the target placement of d in this transfer's datacenter.
func (t *Transfer) Key(d blobplane.Digest) placement.Key {
	return placement.Key{Digest: d, Backend: t.BackendName, Datacenter: t.Datacenter, Location: placement.ObjectLocation(d)}
}

// Run copies req's blob into the target, or finds it there already. An
// error leaves the target row failed with its classified reason (unless
// another transfer took the row over: then it is that transfer's), and
// the caller retries; a retry re-stages under a newer epoch.
func (t *Transfer) Run(ctx context.Context, req Request) (Result, error) {
	if req.Size < 0 {
		return Result{}, blobplane.Errorf(blobplane.CodeInvalid, "transfer of %s: size %d", req.Digest, req.Size)
	}
	k := t.Key(req.Digest)
	ps, err := t.Ledger.Placements(ctx, req.Digest)
	if err != nil {
		return Result{}, err
	}
	cur, exists := find(ps, k)
	if exists && cur.State == placement.Verified {
		return Result{Done: true, AlreadyVerified: true, Placement: cur}, nil
	}
	if exists && cur.State == placement.Pending && !req.TakeOver {
		return Result{Placement: cur}, fmt.Errorf("transfer of %s into %s: %w", req.Digest, t.Datacenter, ErrInProgress)
	}
	sources := t.sources(ps, req)
	if len(sources) == 0 {
		return Result{}, fmt.Errorf("transfer of %s into %s: %w", req.Digest, t.Datacenter, ErrNoSource)
	}
	// A new epoch above the row's: this transfer takes the row over, and
	// whatever an earlier attempt still does under its epoch is fenced
	// off (S3).
	epoch := int64(1)
	if exists {
		epoch = cur.Epoch + 1
	}
	staged, err := t.Ledger.StagePlacement(ctx, k, req.Size, epoch)
	if err != nil {
		if blobplane.ErrorCode(err) == blobplane.CodeConflict {
			// Verified meanwhile by another transfer or an upload.
			if p, ok := t.verified(ctx, k); ok {
				return Result{Done: true, AlreadyVerified: true, Placement: p}, nil
			}
		}
		return Result{}, err
	}
	res := Result{Placement: staged}
	var lastErr error
	for _, src := range sources {
		res.Source = src
		n, err := t.copyFrom(ctx, src, req)
		res.Bytes = n
		if err == nil {
			return t.verify(ctx, k, req, epoch, res)
		}
		// Another verified copy may be intact where this one (or its
		// path) was not: try each. A mismatch is what the row fails with
		// if no source delivers (S2: never verified).
		if lastErr == nil || !errors.Is(lastErr, backend.ErrMismatch) {
			lastErr = err
		}
		t.Logger.WarnContext(ctx, "transfer source failed; trying the next", "digest", req.Digest, "source_datacenter", src.Datacenter, "source_backend", src.Backend, "err", err)
	}
	return res, t.fail(ctx, k, epoch, lastErr)
}

// copyFrom streams src's bytes through the target backend's verifying
// write.
func (t *Transfer) copyFrom(ctx context.Context, src placement.Placement, req Request) (int64, error) {
	from := t.Remote
	if src.Datacenter == t.Datacenter {
		from = t.Local
	}
	if from == nil {
		return 0, sourceErr(fmt.Errorf("no reader for datacenter %s", src.Datacenter))
	}
	body, err := from.Open(ctx, src)
	if err != nil {
		return 0, sourceErr(err)
	}
	defer body.Close()
	cb := &countingReader{r: body}
	info, err := t.Backend.Write(ctx, backend.WriteRequest{Digest: req.Digest, Size: req.Size, Body: cb})
	if err != nil {
		if cb.err != nil && !errors.Is(err, backend.ErrMismatch) {
			return cb.n, sourceErr(cb.err) // the source broke off mid-stream
		}
		return cb.n, err
	}
	if info.Digest != req.Digest || info.Repr.ContentSize != req.Size {
		return cb.n, fmt.Errorf("target confirmed %s with %d bytes: %w", info.Digest, info.Repr.ContentSize, backend.ErrMismatch)
	}
	return cb.n, nil
}

// verify records the verified copy under the epoch this transfer holds.
// A newer epoch (another transfer took over) rejects it: this run
// changed nothing in the ledger, and its bytes are the same content
// under the same key (S3).
func (t *Transfer) verify(ctx context.Context, k placement.Key, req Request, epoch int64, res Result) (Result, error) {
	p, err := t.Ledger.VerifyPlacement(ctx, k, req.Digest, req.Size, epoch)
	if err != nil {
		return res, err
	}
	res.Placement, res.Done = p, true
	t.Metrics.copied(res.Source.Datacenter, t.Datacenter, res.Bytes)
	return res, nil
}

// fail records cause on the target row under epoch, classified, and
// returns cause.
func (t *Transfer) fail(ctx context.Context, k placement.Key, epoch int64, cause error) error {
	reason := Classify(cause)
	t.Metrics.failed(t.Datacenter, reason)
	if _, err := t.Ledger.FailPlacement(context.WithoutCancel(ctx), k, reason, epoch); err != nil {
		t.Logger.WarnContext(ctx, "cannot record a failed transfer", "digest", k.Digest, "reason", reason, "err", err)
	}
	return &Failure{Reason: reason, Err: cause}
}

// Failure is a failed transfer and its classification.
type Failure struct {
	Reason placement.Reason
	Err    error
}

func (f *Failure) Error() string { return fmt.Sprintf("%s: %v", f.Reason, f.Err) }
func (f *Failure) Unwrap() error { return f.Err }

// errSource marks a failure of the source side.
type errSource struct{ err error }

func (e errSource) Error() string { return "source: " + e.err.Error() }
func (e errSource) Unwrap() error { return e.err }

func sourceErr(err error) error { return errSource{err} }

// Classify is the ledger's failure reason of a transfer error: the
// bytes hashed to something else (digest_mismatch), the source could not
// be read (source_unavailable), or the target backend did not take the
// write (backend_refused).
func Classify(err error) placement.Reason {
	var se errSource
	switch {
	case errors.Is(err, backend.ErrMismatch):
		return placement.DigestMismatch
	case errors.As(err, &se), errors.Is(err, ErrNoSource):
		return placement.SourceUnavailable
	default:
		return placement.BackendRefused
	}
}

// verified is k's row when it is verified.
func (t *Transfer) verified(ctx context.Context, k placement.Key) (placement.Placement, bool) {
	ps, err := t.Ledger.Placements(ctx, k.Digest)
	if err != nil {
		return placement.Placement{}, false
	}
	p, ok := find(ps, k)
	return p, ok && p.State == placement.Verified
}

// sources are the verified placements to read from, best first: this
// datacenter's (no network between datacenters), then the requested
// source datacenter's, then the others, each group in a stable order.
func (t *Transfer) sources(ps []placement.Placement, req Request) []placement.Placement {
	var out []placement.Placement
	for _, p := range ps {
		if p.State == placement.Verified && p.Key != t.Key(req.Digest) && p.Size == req.Size {
			out = append(out, p)
		}
	}
	rank := func(p placement.Placement) int {
		switch p.Datacenter {
		case t.Datacenter:
			return 0
		case req.SourceDatacenter:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(out, func(a, b placement.Placement) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return cmpKey(a.Key, b.Key)
	})
	return out
}

func cmpKey(a, b placement.Key) int {
	for _, c := range [][2]string{{a.Datacenter, b.Datacenter}, {a.Backend, b.Backend}, {a.Location, b.Location}} {
		if c[0] != c[1] {
			if c[0] < c[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func find(ps []placement.Placement, k placement.Key) (placement.Placement, bool) {
	for _, p := range ps {
		if p.Key == k {
			return p, true
		}
	}
	return placement.Placement{}, false
}

// countingReader counts the bytes read and remembers the first read
// error (the source's, as opposed to the target's).
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}
