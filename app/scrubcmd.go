package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"golang.org/x/time/rate"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/replication"
)

// ScrubOptions say what RunScrub does.
type ScrubOptions struct {
	// Rate caps the bytes per second the pass reads (`--rate`); 0 reads
	// as fast as the backends answer.
	Rate int64
}

// ScrubSummary is what `worker scrub` prints, as one line of JSON.
type ScrubSummary struct {
	Datacenter string `json:"datacenter"`
	Checked    int    `json:"checked"`
	Intact     int    `json:"intact"`
	Mismatched int    `json:"mismatched"`
	Missing    int    `json:"missing"`
	// Skipped placements could not be read for a reason that is not
	// about their bytes (their backend is not configured here, the store
	// did not answer): they stay first in line for the next pass.
	Skipped int `json:"skipped"`
	// Repairs is how many replicate jobs the pass enqueued, one per bad
	// copy (mismatched or missing).
	Repairs int     `json:"repairs"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	GBPerS  float64 `json:"gb_per_s"`
}

// RunScrub runs one scrub pass over this worker's datacenter now
// (`worker scrub [--rate N]`): every verified placement on its backends
// is re-read and re-hashed once, the longest unchecked first, unpaced
// unless opts.Rate is set. A bad copy is failed and its repair (a
// replicate job from another verified copy) enqueued, as the scheduled
// scrub does. It writes a ScrubSummary as one line of JSON to out, also
// after an error (what was checked until then).
//
// Bad copies are findings, not failures: the pass returns nil after
// failing them and enqueueing their repairs, so the exit status says
// only whether the pass ran. Errors: invalid for a negative rate or a
// worker without backends; the database's and River's otherwise.
func RunScrub(ctx context.Context, cfg *config.Config, logger *slog.Logger, opts ScrubOptions, out io.Writer) error {
	if opts.Rate < 0 {
		return blobplane.Errorf(blobplane.CodeInvalid, "scrub rate %d: must not be negative", opts.Rate)
	}
	st, backends, err := openOneShot(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	defer backends.Close()
	if len(backends.Order) == 0 {
		return blobplane.Errorf(blobplane.CodeInvalid, "BLOBPLANE_BACKENDS names no backend: %s's placements cannot be read here", cfg.Datacenter)
	}
	// Insert-only (no queues, no workers): the repairs run on the
	// datacenter's workers.
	client, err := river.NewClient(riverpgxv5.New(st.Pool()), &river.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	repairs := &repairInserter{client: client}
	scrub := oneShotScrub(cfg.Datacenter, st, pacedBackends(backends.ByName, opts.Rate), repairs, logger)

	start := time.Now()
	rep, err := scrub.Run(ctx)
	sum := summarizeScrub(cfg.Datacenter, rep, repairs.enqueued, time.Since(start))
	line, jerr := json.Marshal(sum)
	if jerr == nil {
		_, jerr = fmt.Fprintf(out, "%s\n", line)
	}
	return errors.Join(err, jerr)
}

// oneShotScrub is a scrub for which every verified placement is due (a
// period and an interval of a nanosecond: the whole datacenter is this
// pass's share) and that reads unpaced (a budget of a nanosecond: its
// pace is the datacenter's bytes per millisecond). With no MaxRate it
// never skips a placement for want of time; `--rate` paces the reads
// themselves instead (pacedBackends), because Scrub's own cap plans
// against a budget and skips what would not fit in it, where a one-shot
// pass must check everything.
func oneShotScrub(datacenter string, ledger replication.ScrubLedger, backends map[string]backend.Backend, repair replication.Repairer, logger *slog.Logger) *replication.Scrub {
	return &replication.Scrub{
		Ledger: ledger, Datacenter: datacenter, Backends: backends, Repair: repair,
		Period: time.Nanosecond, Interval: time.Nanosecond, Budget: time.Nanosecond,
		Batch: jobs.DefaultScrubBatch, Logger: logger.With("service", "scrub"),
	}
}

func summarizeScrub(datacenter string, rep replication.ScrubReport, repairs int, elapsed time.Duration) ScrubSummary {
	s := ScrubSummary{
		Datacenter: datacenter, Checked: rep.Checked, Intact: rep.Intact, Mismatched: rep.Mismatched, Missing: rep.Missing,
		Skipped: rep.Skipped, Repairs: repairs, Bytes: rep.Bytes, Seconds: elapsed.Seconds(),
	}
	if s.Seconds > 0 {
		s.GBPerS = float64(s.Bytes) / 1e9 / s.Seconds
	}
	return s
}

// repairInserter enqueues each repair as a replicate job into the
// datacenter's own queue through an insert-only River client
// (replication.Repairer; jobs.RepairQueue does the same with the running
// job's client).
type repairInserter struct {
	client   *river.Client[pgx.Tx]
	enqueued int
}

var _ replication.Repairer = (*repairInserter)(nil)

func (r *repairInserter) EnqueueRepair(ctx context.Context, d blobplane.Digest, size int64, datacenter string) error {
	if _, err := r.client.Insert(ctx, jobs.ReplicateArgs{Digest: d, Size: size, TargetDatacenter: datacenter}, nil); err != nil {
		return fmt.Errorf("enqueue the repair of %s in %s: %w", d, datacenter, err)
	}
	r.enqueued++
	return nil
}

// pacedBackends wraps every backend so that, together, their reads yield
// at most bytesPerSecond (0: byName as is).
func pacedBackends(byName map[string]backend.Backend, bytesPerSecond int64) map[string]backend.Backend {
	if bytesPerSecond == 0 {
		return byName
	}
	lim := rate.NewLimiter(rate.Limit(bytesPerSecond), int(min(bytesPerSecond, 256<<10)))
	out := make(map[string]backend.Backend, len(byName))
	for name, be := range byName {
		out[name] = pacedBackend{Backend: be, lim: lim}
	}
	return out
}

// pacedBackend is a backend whose object bodies are read no faster than
// lim allows.
type pacedBackend struct {
	backend.Backend
	lim *rate.Limiter
}

func (b pacedBackend) Read(ctx context.Context, d blobplane.Digest, opts backend.ReadOptions) (*backend.Object, error) {
	obj, err := b.Backend.Read(ctx, d, opts)
	if err != nil {
		return nil, err
	}
	obj.Body = &pacedBody{ReadCloser: obj.Body, ctx: ctx, lim: b.lim}
	return obj, nil
}

// pacedBody waits for lim's tokens before each read, asking for at most
// one burst at a time. It keeps the context of the Read that opened it,
// as the body it wraps does.
type pacedBody struct {
	io.ReadCloser
	ctx context.Context
	lim *rate.Limiter
}

func (p *pacedBody) Read(b []byte) (int, error) {
	if len(b) > p.lim.Burst() {
		b = b[:p.lim.Burst()]
	}
	if err := p.lim.WaitN(p.ctx, len(b)); err != nil {
		return 0, err
	}
	return p.ReadCloser.Read(b)
}

// ParseScrubRate parses `worker scrub --rate`: bytes per second, as a
// number with an optional KiB, MiB, GiB or TiB suffix (as
// BLOBPLANE_SCRUB_RATE); "" and 0 mean no cap.
func ParseScrubRate(s string) (int64, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	n, err := config.ParseBytes(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0, blobplane.Errorf(blobplane.CodeInvalid, "scrub rate %q: want bytes per second, optionally with KiB, MiB, GiB or TiB (0: no cap)", s)
	}
	return n, nil
}
