package partstate

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/upload"
)

// Ledger is what a node's homes need of the store: the journal, its
// trimming and restart, the lease pointers, the cluster's format level,
// and whether a repository already references a digest. *store.Store
// implements it.
type Ledger interface {
	Journal
	Trimmer
	Restarter
	Pointers
	Formats
	ReferencedBlob(ctx context.Context, repository string, d blobplane.Digest) (int64, error)
	ReportJournalApplied(ctx context.Context, partition string, generation int64, epoch, lsn uint64) error
}

// Homes holds the quota state of every partition this node is the home
// of (issue 33): restored before the partition serves (Prepare, the
// keeper's hook: ZBP-5-R23), discarded the moment the lease ends
// (R24), caught up after each publication and on a timer, checkpointed
// and sealed on a schedule, and asked for admission (Admit, the upload
// flow's quota port).
type Homes struct {
	Ledger  Ledger
	Archive backend.Archive // where checkpoints and segments go; nil: none
	Node    string
	// Map is the current verified map (the keeper's): a partition's slots.
	Map func() *authority.VerifiedMap
	// Wake asks the keeper to look at its leases again (a restore ended).
	Wake   func()
	Logger *slog.Logger
	// CheckpointEvery is how many records a home applies between
	// checkpoints (0: 100,000); CheckpointInterval the longest it waits
	// with records not checkpointed (0: 10 minutes). Recovery replays at
	// most the records since the last checkpoint (ADR 0009: 206,000
	// records/s measured).
	CheckpointEvery    uint64
	CheckpointInterval time.Duration
	// Tick is how often a home catches up with records other processes
	// wrote (deletes, obliterations, quota changes) (0: 1 s).
	Tick    time.Duration
	Metrics *Metrics
	// Class is the homes' partition class (zero: QuotaClass); the api
	// sets QuotaClass with its chain bound derived from its shutdown
	// budget (ZBP-5-R41).
	Class Class
	// Now is the clock upload-rate windows are read at (nil: time.Now);
	// the windows themselves hold the database's times of the records.
	Now func() time.Time

	// Standbys are this node's standbys: a partition failing over to
	// this node starts from its standby's state (R73); nil: none.
	Standbys *Standbys

	// Hooks are interleaving points for tests; leave them nil.
	Hooks HomesHooks

	mu    sync.Mutex
	homes map[string]*home
}

// HomesHooks let tests stop the homes where an interleaving matters.
// Production code leaves them nil.
type HomesHooks struct {
	// RoundJoined runs once a caller (a Position call, the upkeep loop,
	// a refused admission) joined the catch-up round it will be answered
	// by (one that has not started yet).
	RoundJoined func(partition string)
}

var _ upload.Quotas = (*Homes)(nil)

// releaseEvery is the shortest time between two catch-ups that release
// reservations after publications.
const releaseEvery = 20 * time.Millisecond

// home is one held partition's state and its upkeep.
type home struct {
	p     *Partition
	ready chan struct{} // closed when the restore ended
	err   error         // the restore's, once ready
	ctx   context.Context
	// kick wakes the upkeep loop: a publication's reservation waits for
	// the next catch-up to release.
	kick    chan struct{}
	mu      sync.Mutex
	pending []func()
	// verifying: a replay check of this home is running (one at a time).
	verifying atomic.Bool

	// Catch-up rounds (Homes.round): next gathers the callers waiting
	// for a catch-up that starts after their call (positions, ZBP-5-R107;
	// the upkeep loop; a refused admission); rounding says a goroutine
	// runs the rounds.
	bmu      sync.Mutex
	next     *round
	rounding bool
}

// round is one catch-up its callers wait on: the LSN it applied up to,
// or why it failed.
type round struct {
	done chan struct{}
	lsn  uint64
	err  error
}

// Prepare is the keeper's readiness hook (keeper.Config.Prepare): it
// starts restoring partition's state at epoch over slots (once) under
// ctx, the lease's context, and reports whether it is restored. A
// partition without slots carries no quota state and is ready at once.
func (hs *Homes) Prepare(ctx context.Context, partition string, epoch uint64, bits int, slots []authority.SlotRange) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.homes == nil {
		hs.homes = map[string]*home{}
	}
	if h := hs.homes[partition]; h != nil && h.p.Epoch == epoch && h.ctx.Err() == nil {
		select {
		case <-h.ready:
			if h.err == nil {
				return true
			}
		default:
			return false
		}
	}
	if len(slots) == 0 {
		return true
	}
	p := New(hs.Ledger, partition, epoch, bits, slots, hs.Logger)
	p.Archive, p.Pointers, p.Formats = hs.Archive, hs.Ledger, hs.Ledger
	if hs.Class.Checkpoint != "" {
		p.Class = hs.Class
	}
	h := &home{p: p, ready: make(chan struct{}), ctx: ctx, kick: make(chan struct{}, 1)}
	hs.homes[partition] = h
	context.AfterFunc(ctx, func() { hs.drop(partition, h) })
	go hs.run(h)
	return false
}

func (hs *Homes) now() time.Time {
	if hs.Now != nil {
		return hs.Now()
	}
	return time.Now()
}

// Holds reports whether this node holds partition as its home (restoring
// or serving) under a lease that has not ended.
func (hs *Homes) Holds(partition string) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.homes[partition]
	return h != nil && h.ctx.Err() == nil
}

// Restored says how partition's restore here went, once it ended: the
// records it applied after its starting point, and whether it started
// from this node's standby (R73). ok is false while it restores or when
// this node is not its home.
func (hs *Homes) Restored(partition string) (fed int, promoted, ok bool) {
	hs.mu.Lock()
	h := hs.homes[partition]
	hs.mu.Unlock()
	if h == nil {
		return 0, false, false
	}
	select {
	case <-h.ready:
	default:
		return 0, false, false
	}
	if h.err != nil {
		return 0, false, false
	}
	fed, _ = h.p.Restored()
	return fed, h.p.Promoted(), true
}

// slotsOf is partition's slot bits and ranges in the current map.
func (hs *Homes) slotsOf(partition string) (int, []authority.SlotRange, bool) {
	if hs.Map == nil {
		return 0, nil, false
	}
	vm := hs.Map()
	if vm == nil {
		return 0, nil, false
	}
	p := vm.Map().Partition(partition)
	if p == nil {
		return 0, nil, false
	}
	return vm.Map().SlotBits, p.Slots, len(p.Slots) > 0
}

// drop discards h once its lease ended (R24: never flushed); its
// reservations go with it, their publications refused by the fence.
func (hs *Homes) drop(partition string, h *home) {
	hs.mu.Lock()
	if hs.homes[partition] == h {
		delete(hs.homes, partition)
	}
	hs.mu.Unlock()
	hs.Metrics.forget(partition)
}

// run restores h, then keeps it: catch-ups (releasing the reservations
// of publications that committed before each), checkpoints and seals,
// until the lease ends.
func (hs *Homes) run(h *home) {
	start := time.Now()
	if sp := hs.Standbys.Promote(h.ctx, h.p.ID); sp != nil {
		h.p.Adopt(sp) // R73: the keeper claimed the new epoch before Prepare
	}
	h.err = h.p.Restore(h.ctx)
	close(h.ready)
	if h.err != nil {
		if h.ctx.Err() == nil {
			hs.logger().Error("partition state cannot be restored; the partition does not serve", "partition", h.p.ID, "epoch", h.p.Epoch, "err", h.err)
		}
		hs.wake()
		return
	}
	hs.Metrics.restored(h.p, time.Since(start))
	hs.reportQuotas(h)
	hs.wake()
	tick := time.NewTicker(cmp.Or(hs.Tick, time.Second))
	defer tick.Stop()
	checkpointed, last := h.p.LSN(), time.Now()
	for {
		select {
		case <-h.ctx.Done():
			h.releaseAll()
			return
		case <-h.kick:
			// Coalesce: the reservations waiting wait a few milliseconds
			// more, and the sequencing's commit (a WAL flush) runs at
			// most every releaseEvery instead of once per publication
			// (BenchmarkUpload4KiBQuota, one client: -20 % uploads/s
			// without it). A refusal never waits for this: Admit catches
			// up itself first.
			select {
			case <-h.ctx.Done():
			case <-time.After(releaseEvery):
			}
		case <-tick.C:
		}
		_, _ = hs.catchUp(h)
		lsn := h.p.LSN()
		if hs.Archive != nil && lsn > checkpointed &&
			(lsn-checkpointed >= cmp.Or(hs.CheckpointEvery, 100_000) || time.Since(last) >= cmp.Or(hs.CheckpointInterval, 10*time.Minute)) {
			if hs.checkpoint(h) {
				checkpointed, last = lsn, time.Now()
			}
		}
	}
}

// catchUp waits for a catch-up round that starts after the call (round)
// and sets the gauges.
func (hs *Homes) catchUp(h *home) (uint64, error) {
	lsn, err := hs.round(h.ctx, h)
	if err == nil {
		hs.Metrics.caughtUp(h.p)
	}
	return lsn, err
}

// apply applies what committed, then releases the reservations taken
// before it began: their publications' records, if any, are applied. It
// returns the LSN applied up to. Only the rounds goroutine calls it, so a
// home never runs two sequencings at once; it sets no gauges, which walk
// every repository with a quota: a round per publication (with one
// client) does not pay for them.
func (hs *Homes) apply(h *home) (uint64, error) {
	h.mu.Lock()
	done := h.pending
	h.pending = nil
	h.mu.Unlock()
	lsn, err := h.p.CatchUp(h.ctx)
	if err != nil {
		if h.ctx.Err() == nil {
			hs.logger().Warn("partition state catch-up", "partition", h.p.ID, "epoch", h.p.Epoch, "err", err)
		}
		// Keep them held until a catch-up succeeds.
		h.mu.Lock()
		h.pending = append(done, h.pending...)
		h.mu.Unlock()
		return lsn, err
	}
	for _, release := range done {
		release()
	}
	hs.reportQuotas(h)
	return lsn, nil
}

// Position implements upload.Quotas: the position at which everything
// that committed in at's partition before the call is applied, as its
// token (ZBP-5-R107: a mutating response carries it). The LSN of a
// record exists only once the home sequenced it after its commit, so
// Position waits for a catch-up that starts after the call; every
// caller that arrives while one runs shares the next (one sequencing
// commit for them all). "" when the partition carries no state here (no
// slots in the map). Errors: unavailable (the state is restoring, or the
// lease moved), the catch-up's, ctx's.
func (hs *Homes) Position(ctx context.Context, at upload.Home) (string, error) {
	hs.mu.Lock()
	h := hs.homes[at.Partition]
	hs.mu.Unlock()
	if h == nil {
		if _, _, ok := hs.slotsOf(at.Partition); !ok {
			return "", nil
		}
		return "", notReady(at.Partition)
	}
	if h.p.Epoch != at.Epoch || h.p.Status() != Serving {
		return "", notReady(at.Partition)
	}
	lsn, err := hs.round(ctx, h)
	if err != nil {
		return "", err
	}
	return Position{Partition: at.Partition, Epoch: at.Epoch, LSN: lsn}.String(), nil
}

// View reads repo's state at its home at, once a catch-up that started
// after the call applied everything committed before it (a read sees the
// caller's own writes), and the position it was read at. Errors:
// unavailable (restoring, or the lease moved; not the home), the
// catch-up's, ctx's.
func (hs *Homes) View(ctx context.Context, at upload.Home, repo string) (View, Position, error) {
	hs.mu.Lock()
	h := hs.homes[at.Partition]
	hs.mu.Unlock()
	if h == nil || h.p.Epoch != at.Epoch || h.p.Status() != Serving {
		return View{}, Position{}, notReady(at.Partition)
	}
	if _, err := hs.round(ctx, h); err != nil {
		return View{}, Position{}, err
	}
	v := h.p.View(repo, hs.now())
	return v, Position{Partition: at.Partition, Epoch: at.Epoch, LSN: v.LSN}, nil
}

// round waits for a catch-up of h that starts after the call: the next
// round, which every caller arriving meanwhile (positions, the upkeep
// loop, a refused admission) shares. It returns the LSN the round applied
// up to.
func (hs *Homes) round(ctx context.Context, h *home) (uint64, error) {
	h.bmu.Lock()
	if h.next == nil {
		h.next = &round{done: make(chan struct{})}
	}
	r := h.next
	if !h.rounding {
		h.rounding = true
		go hs.rounds(h)
	}
	h.bmu.Unlock()
	if hs.Hooks.RoundJoined != nil {
		hs.Hooks.RoundJoined(h.p.ID)
	}
	select {
	case <-r.done:
		return r.lsn, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// rounds runs the rounds gathered in h.next, one after another, until
// none waits.
func (hs *Homes) rounds(h *home) {
	for {
		h.bmu.Lock()
		r := h.next
		h.next = nil
		if r == nil {
			h.rounding = false
			h.bmu.Unlock()
			return
		}
		h.bmu.Unlock()
		r.lsn, r.err = hs.apply(h)
		close(r.done)
	}
}

// reportQuotas tells the admins waiting on a quota change that h applied
// it (store.SetRepositoryQuota waits for the report).
func (hs *Homes) reportQuotas(h *home) {
	gen, lsn, ok := h.p.QuotaApplied()
	if !ok {
		return
	}
	if err := hs.Ledger.ReportJournalApplied(h.ctx, h.p.ID, gen, h.p.Epoch, lsn); err != nil && h.ctx.Err() == nil {
		hs.logger().Warn("partition state: report a quota applied", "partition", h.p.ID, "err", err)
	}
}

// checkpoint writes h's checkpoint and seals what it covers.
func (hs *Homes) checkpoint(h *home) bool {
	name, err := h.p.Checkpoint(h.ctx, hs.Archive, hs.Ledger, hs.Node)
	if err != nil {
		if h.ctx.Err() == nil {
			hs.logger().Warn("partition checkpoint", "partition", h.p.ID, "err", err)
		}
		return false
	}
	if lsn, ok := checkpointLSN(name); ok {
		_, err = h.p.Seal(h.ctx, hs.Archive, hs.Ledger, lsn)
	}
	if err == nil {
		_, err = h.p.Prune(h.ctx, hs.Archive)
		hs.Metrics.pruned(h.p)
	}
	if err != nil && h.ctx.Err() == nil {
		hs.logger().Warn("partition journal seal", "partition", h.p.ID, "err", err)
	}
	hs.Metrics.checkpointed(h.p)
	if h.verifying.CompareAndSwap(false, true) {
		// Off the upkeep loop: the check restores two checkpoints, and
		// the loop releases the reservations publications wait on.
		go func() {
			defer h.verifying.Store(false)
			hs.verifyReplay(h, name)
		}()
	}
	return true
}

// verifyReplay checks the checkpoint just written against the one before
// it replayed forward (ZBP-5-R137, R48), counts the outcome and, when they
// differ, says so loudly: the partition keeps serving (its live state is
// the journal's, applied once), but a restore would not reproduce it.
func (hs *Homes) verifyReplay(h *home, name string) {
	from, to, err := h.p.VerifyReplay(h.ctx, hs.Archive, hs.Ledger, name)
	var differs *ReplayDiffersError
	switch {
	case err == nil:
		hs.Metrics.replayChecked("equal")
		hs.logger().Info("partition replay check: equal", "partition", h.p.ID, "from_lsn", from, "to_lsn", to, "checkpoint", name)
	case errors.As(err, &differs):
		hs.Metrics.replayChecked("differs")
		hs.logger().Error("partition replay check: the replayed state differs from the checkpoint", "partition", h.p.ID, "from_lsn", from, "to_lsn", to,
			"checkpoint", name, "replayed_bytes", len(differs.Replayed), "restored_bytes", len(differs.Restored), "err", err)
	case errors.Is(err, ErrNoEarlierCheckpoint) || h.ctx.Err() != nil:
		// The generation's first checkpoint, or the lease ended.
	default:
		hs.Metrics.replayChecked("failed")
		hs.logger().Warn("partition replay check could not run", "partition", h.p.ID, "checkpoint", name, "err", err)
	}
}

// releaseAll releases every reservation of a home whose lease ended.
func (h *home) releaseAll() {
	h.mu.Lock()
	done := h.pending
	h.pending = nil
	h.mu.Unlock()
	for _, release := range done {
		release()
	}
}

// Admit implements upload.Quotas: one blob of size bytes, d, into repo at
// home, against repo's quota, counting the publications in flight (ADR
// 0009 item 5). done releases the reservation: at once when the
// publication failed, else after the next catch-up, which applies its
// record. A blob repo references already changes no usage and is
// admitted over a full quota (a re-push). Errors: unavailable (the state
// is restoring, or the lease moved), forbidden naming the quota,
// too_many_requests naming the upload rate (with when to retry).
func (hs *Homes) Admit(ctx context.Context, at upload.Home, repo string, d blobplane.Digest, size int64) (func(published bool), error) {
	hs.mu.Lock()
	h := hs.homes[at.Partition]
	hs.mu.Unlock()
	if h == nil {
		if _, _, ok := hs.slotsOf(at.Partition); !ok {
			return func(bool) {}, nil // a partition outside the map holds no quota state
		}
		return nil, notReady(at.Partition)
	}
	if h.p.Epoch != at.Epoch {
		return nil, notReady(at.Partition)
	}
	now := hs.now
	release, err := h.p.Reserve(repo, size, now())
	var exceeded *quota.ExceededError
	if errors.As(err, &exceeded) {
		// A refusal is final only against everything committed: a
		// delete a moment ago (here, at another node, an obliteration)
		// may have made room that no catch-up has applied yet.
		_, _ = hs.catchUp(h)
		release, err = h.p.Reserve(repo, size, now())
	}
	var rated *quota.RateError
	switch {
	case errors.As(err, &exceeded) || errors.As(err, &rated):
		if _, rerr := hs.Ledger.ReferencedBlob(ctx, repo, d); rerr == nil {
			return func(bool) {}, nil // a re-push: no new reference, no usage
		}
		return nil, hs.refusal(exceeded, rated)
	case errors.Is(err, ErrNotReady):
		return nil, notReady(at.Partition)
	case err != nil:
		return nil, err
	}
	if release == nil { // no quota: nothing reserved, nothing to wait for
		return func(bool) {}, nil
	}
	return func(published bool) {
		if !published {
			release()
			return
		}
		h.mu.Lock()
		h.pending = append(h.pending, release)
		h.mu.Unlock()
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}, nil
}

// refusal is the answer to an admission refused by a quota (forbidden)
// or by an upload rate (too many requests, with when to retry), counted.
func (hs *Homes) refusal(exceeded *quota.ExceededError, rated *quota.RateError) error {
	if rated != nil {
		hs.Metrics.denied(rated.Measure + "_per_minute")
		return &blobplane.Error{Code: blobplane.CodeTooManyRequests, Op: "admit", Err: rated, Message: rated.Error(), RetryAfter: rated.RetryAfter}
	}
	hs.Metrics.denied(exceeded.Measure)
	return &blobplane.Error{Code: blobplane.CodeForbidden, Op: "admit", Err: exceeded, Message: exceeded.Error()}
}

// Check implements upload.Quotas: Admit without the reservation.
func (hs *Homes) Check(ctx context.Context, at upload.Home, repo string, d blobplane.Digest, size int64) error {
	done, err := hs.Admit(ctx, at, repo, d, size)
	if err == nil {
		done(false)
	}
	return err
}

func notReady(partition string) error {
	return &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "admit", Retryable: true,
		Message: "the quota state of partition " + partition + " is restoring at its home: retry"}
}

// Usage is repo's usage and quota as its home holds them, when this node
// is its home (ok false otherwise).
func (hs *Homes) Usage(partition, repo string) (quota.Usage, quota.Limit, bool) {
	hs.mu.Lock()
	h := hs.homes[partition]
	hs.mu.Unlock()
	if h == nil || h.p.Status() != Serving {
		return quota.Usage{}, quota.Limit{}, false
	}
	u, l := h.p.Usage(repo)
	return u, l, true
}

func (hs *Homes) wake() {
	if hs.Wake != nil {
		hs.Wake()
	}
}

func (hs *Homes) logger() *slog.Logger {
	if hs.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return hs.Logger
}

// Metrics are the homes' Prometheus metrics; a nil *Metrics records
// nothing.
type Metrics struct {
	lsn         *prometheus.GaugeVec
	quarantined *prometheus.GaugeVec
	restore     prometheus.Histogram
	restarts    prometheus.Counter
	checkpoints prometheus.Counter
	replays     *prometheus.CounterVec
	stray       *prometheus.GaugeVec
	denials     *prometheus.CounterVec
	// used and limit are per repository with a quota, exported by its
	// home; shown holds the repositories each partition exported.
	used, limit *prometheus.GaugeVec
	mu          sync.Mutex
	shown       map[string]map[string]bool
	// Standbys' (R64, R72) and promotions (R73).
	standbyLSN, standbyLag, standbyStop *prometheus.GaugeVec
	promotions                          prometheus.Counter
}

// NewMetrics registers the homes' metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lsn: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_partition_state_applied_lsn",
			Help: "The last journal LSN a home's quota state applied, by partition this node is the home of."}, []string{"partition"}),
		quarantined: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_partition_state_quarantined_records",
			Help: "Journal records a home's quota state skipped because the applier refused them (ZBP-5 R59), since it restored, by partition."}, []string{"partition"}),
		restore: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "blobplane_partition_state_restore_seconds",
			Help: "How long restoring a partition's quota state took before it served.", Buckets: prometheus.ExponentialBuckets(0.005, 4, 9)}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "blobplane_partition_state_journal_restarts_total",
			Help: "Restores that restarted a journal from the ledger because its history was not readable here."}),
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{Name: "blobplane_partition_state_checkpoints_total",
			Help: "Quota state checkpoints written by this node's homes."}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "blobplane_partition_state_replay_checks_total",
			Help: "Replay-equivalence checks after checkpoints (ZBP-5 R137): the checkpoint before, replayed to the new one, compared with it; by result (equal, differs: a non-deterministic applier or a wrong checkpoint, failed: a restore could not run)."}, []string{"result"}),
		stray: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_partition_state_unreachable_objects",
			Help: "Checkpoint objects of a partition's archive that no live restore path reaches and its last prune left (ZBP-5 R46): a checkpoint whose pointer did not move, or a failed deletion; by partition this node is the home of."}, []string{"partition"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "blobplane_quota_denials_total",
			Help: "Publications refused because they would exceed a repository's quota, by measure (bytes, blobs, bytes_per_minute, blobs_per_minute: its upload rate)."}, []string{"measure"}),
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_repository_quota_used",
			Help: "What a repository with a quota holds, by measure (bytes, blobs), as its home's state has it: exported by the home only."}, []string{"repository", "measure"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_repository_quota_limit",
			Help: "A repository's quota by measure (bytes, blobs, and its upload rate bytes_per_minute, blobs_per_minute; 0: no limit on it), exported by its home only."}, []string{"repository", "measure"}),
		shown: map[string]map[string]bool{},
		standbyLSN: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_partition_standby_applied_lsn",
			Help: "The last journal LSN this node's standby of a partition applied (ZBP-5 R64), by partition."}, []string{"partition"}),
		standbyLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_partition_standby_lag_records",
			Help: "Records of a partition's journal sequenced and not yet applied by this node's standby of it (ZBP-5 R64): what a failover to it would replay."}, []string{"partition"}),
		standbyStop: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blobplane_partition_standby_stopped",
			Help: "1 while this node's standby of a partition stopped consuming because its journal is sequenced under another epoch than the map's primary holds (ZBP-5 R72), until the map agrees."}, []string{"partition"}),
		promotions: prometheus.NewCounter(prometheus.CounterOpts{Name: "blobplane_partition_state_promotions_total",
			Help: "Restores that started from this node's standby of the partition (ZBP-5 R73) instead of its last checkpoint."}),
	}
	reg.MustRegister(m.lsn, m.quarantined, m.restore, m.restarts, m.checkpoints, m.replays, m.stray, m.denials, m.used, m.limit,
		m.standbyLSN, m.standbyLag, m.standbyStop, m.promotions)
	return m
}

func (m *Metrics) followed(partition string, applied, last uint64) {
	if m != nil {
		m.standbyLSN.WithLabelValues(partition).Set(float64(applied))
		m.standbyLag.WithLabelValues(partition).Set(float64(last - min(applied, last)))
	}
}

func (m *Metrics) standbyStopped(partition string, stopped bool) {
	if m != nil {
		v := 0.0
		if stopped {
			v = 1
		}
		m.standbyStop.WithLabelValues(partition).Set(v)
	}
}

func (m *Metrics) unfollowed(partition string) {
	if m != nil {
		m.standbyLSN.DeleteLabelValues(partition)
		m.standbyLag.DeleteLabelValues(partition)
		m.standbyStop.DeleteLabelValues(partition)
	}
}

func (m *Metrics) restored(p *Partition, took time.Duration) {
	if m == nil {
		return
	}
	m.restore.Observe(took.Seconds())
	if p.Restarted() {
		m.restarts.Inc()
	}
	if p.Promoted() {
		m.promotions.Inc()
	}
	m.caughtUp(p)
}

func (m *Metrics) caughtUp(p *Partition) {
	if m == nil {
		return
	}
	m.lsn.WithLabelValues(p.ID).Set(float64(p.LSN()))
	m.quarantined.WithLabelValues(p.ID).Set(float64(p.Quarantined()))
	now := map[string]bool{}
	p.Limited(func(repo string, u quota.Usage, l quota.Limit) {
		now[repo] = true
		m.used.WithLabelValues(repo, "bytes").Set(float64(u.Bytes))
		m.used.WithLabelValues(repo, "blobs").Set(float64(u.Blobs))
		m.limit.WithLabelValues(repo, "bytes").Set(float64(l.Bytes))
		m.limit.WithLabelValues(repo, "blobs").Set(float64(l.Blobs))
		m.limit.WithLabelValues(repo, "bytes_per_minute").Set(float64(l.BytesPerMinute))
		m.limit.WithLabelValues(repo, "blobs_per_minute").Set(float64(l.BlobsPerMinute))
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	for repo := range m.shown[p.ID] {
		if !now[repo] {
			m.unshow(repo)
		}
	}
	m.shown[p.ID] = now
}

// unshow drops repo's gauges. Called with m.mu held.
func (m *Metrics) unshow(repo string) {
	for _, measure := range []string{"bytes", "blobs", "bytes_per_minute", "blobs_per_minute"} {
		m.used.DeleteLabelValues(repo, measure)
		m.limit.DeleteLabelValues(repo, measure)
	}
}

func (m *Metrics) checkpointed(*Partition) {
	if m != nil {
		m.checkpoints.Inc()
	}
}

func (m *Metrics) pruned(p *Partition) {
	if m != nil {
		m.stray.WithLabelValues(p.ID).Set(float64(p.Unreachable()))
	}
}

func (m *Metrics) replayChecked(result string) {
	if m != nil {
		m.replays.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) denied(measure string) {
	if m != nil {
		m.denials.WithLabelValues(measure).Inc()
	}
}

func (m *Metrics) forget(partition string) {
	if m == nil {
		return
	}
	m.lsn.DeleteLabelValues(partition)
	m.quarantined.DeleteLabelValues(partition)
	m.stray.DeleteLabelValues(partition)
	m.mu.Lock()
	defer m.mu.Unlock()
	for repo := range m.shown[partition] {
		m.unshow(repo)
	}
	delete(m.shown, partition)
}
