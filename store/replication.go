package store

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
)

// Issue 32: Postgres is the source of truth, so an acknowledged write must
// survive the loss of the primary (RPO 0). With a synchronous standby
// (pg_auto_failover's default) every commit waits until the standby has
// it. pg_auto_failover drops to asynchronous replication when the standby
// is unhealthy (synchronous_standby_names = ''); commits then return at
// once, and commits that were waiting are released without the standby.
// The Guard watches for that, and the api refuses writes, and withholds
// the success of a write whose commit may have been such a release, until
// a synchronous standby is back.

// SyncMode says when writes need a synchronous standby
// (BLOBPLANE_SYNC_REPLICATION).
type SyncMode string

const (
	// SyncAuto requires a synchronous standby once the database is
	// replicated: it has had a synchronous standby since start, or it is
	// a pg_auto_failover node (the primary keeps a pgautofailover_standby_*
	// slot per standby, healthy or not). A lone Postgres writes, and so
	// does one whose only slots are a backup tool's. Other HA stacks:
	// SyncRequired.
	SyncAuto SyncMode = "auto"
	// SyncRequired always requires one: a lone Postgres refuses writes.
	SyncRequired SyncMode = "required"
	// SyncDegraded never refuses: without a synchronous standby writes go
	// on, each acknowledged write at risk of loss with the primary, and
	// the Guard says so loudly (an error log at the loss and every 30 s).
	SyncDegraded SyncMode = "degraded"
	// SyncWatch (the worker's) refuses nothing and logs nothing: the
	// Guard only resets pools that landed on a standby.
	SyncWatch SyncMode = ""
)

// ParseSyncMode reads a SyncMode.
func ParseSyncMode(v string) (SyncMode, error) {
	switch m := SyncMode(v); m {
	case SyncAuto, SyncRequired, SyncDegraded:
		return m, nil
	}
	return "", errors.New("must be auto, required or degraded")
}

// Replication is what one check saw of the primary.
type Replication struct {
	// InRecovery: the server is a standby (read-only): the pool's
	// connections landed on the wrong node.
	InRecovery bool `json:"in_recovery"`
	// StandbyNames is synchronous_standby_names ('' : asynchronous).
	StandbyNames string `json:"synchronous_standby_names"`
	// SyncCommit is this session's synchronous_commit.
	SyncCommit string `json:"synchronous_commit"`
	// SyncStandbys counts standbys in pg_stat_replication whose
	// sync_state is sync or quorum.
	SyncStandbys int `json:"sync_standbys"`
	// Slots counts pg_auto_failover's standby slots (a replicated
	// database).
	Slots int `json:"pg_auto_failover_slots"`
}

// Synchronous reports whether a commit on this primary waits for a
// standby: one is named, one streams as sync or quorum, and commits wait
// for it (synchronous_commit on, remote_write or remote_apply).
func (r Replication) Synchronous() bool {
	switch r.SyncCommit {
	case "on", "remote_write", "remote_apply":
	default:
		return false
	}
	return strings.TrimSpace(r.StandbyNames) != "" && r.SyncStandbys > 0
}

// CheckReplication reads r from the primary in one round trip.
func (s *Store) CheckReplication(ctx context.Context) (Replication, error) {
	var r Replication
	err := s.pool.QueryRow(ctx, `SELECT pg_is_in_recovery(),
		current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
		(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))::int,
		(SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'physical' AND slot_name LIKE 'pgautofailover\_standby\_%')::int`).
		Scan(&r.InRecovery, &r.StandbyNames, &r.SyncCommit, &r.SyncStandbys, &r.Slots)
	return r, dbErr("check replication", err)
}

// ErrNotSynchronous refuses a write while no synchronous standby would
// have it: retryable, the formation is healing.
var ErrNotSynchronous = &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "sync replication", Retryable: true,
	Message: "the database has no synchronous standby now: writes are refused until one is back, so that no acknowledged write can be lost with the primary (retry)"}

// ErrOutcomeUnknown withholds the success of a write whose commit may
// have been released without the standby: retryable; the retry finds the
// operation's stored outcome (S4) or does the work again.
var ErrOutcomeUnknown = &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "sync replication", Retryable: true,
	Message: "the database lost its synchronous standby while this write committed: its outcome is not known to be durable; retry it (an upload's retry returns its stored outcome)"}

// Guard checks the primary every Interval and keeps what it saw, so the
// request path reads an atomic, not the database.
type Guard struct {
	Store *Store
	// Others are more pools on the same database, reset with Store's.
	Others   []*Store
	Mode     SyncMode
	Interval time.Duration // default 250 ms
	Logger   *slog.Logger
	// OnReset is called after the pool was reset because its connections
	// were on a standby (tests, metrics).
	OnReset func()

	// check replaces Store.CheckReplication (tests).
	check func(ctx context.Context) (Replication, error)

	state atomic.Pointer[guardState]
	// losses counts the checks that found no synchronous standby after
	// one that did: a request that began before a loss must not be
	// acknowledged as durable.
	losses     atomic.Uint64
	resets     atomic.Uint64
	replicated atomic.Bool // seen a synchronous standby or a pg_auto_failover slot
	mu         sync.Mutex
	fresh      chan struct{} // closed and replaced by each completed check
	lastLoud   time.Time     // degraded mode's last error log (Run's goroutine only)
}

type guardState struct {
	at      time.Time // when the check that produced it started
	ok      bool      // the check answered
	safe    bool      // writes may be acknowledged
	r       Replication
	err     error
	checkNo uint64
}

func (g *Guard) interval() time.Duration {
	if g.Interval <= 0 {
		return 250 * time.Millisecond
	}
	return g.Interval
}

// Run checks until ctx ends. The first check runs at once.
func (g *Guard) Run(ctx context.Context) {
	t := time.NewTicker(g.interval())
	defer t.Stop()
	for {
		g.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check runs one check now and records it.
func (g *Guard) Check(ctx context.Context) {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	check := g.Store.CheckReplication
	if g.check != nil {
		check = g.check
	}
	r, err := check(cctx)
	cancel()
	if err == nil && r.InRecovery && g.Store != nil {
		// Every connection may be on a standby (a proxy or a DNS name
		// that moved, river#1225): drop them all; new ones go where
		// target_session_attrs or the name now lead.
		g.Store.pool.Reset()
		g.resets.Add(1)
		for _, o := range g.Others {
			o.pool.Reset()
		}
		g.logger().Error("database: the pool's connections were on a read-only standby; reset the pool")
		if g.OnReset != nil {
			g.OnReset()
		}
	}
	if err == nil && (r.Synchronous() || r.Slots > 0) {
		g.replicated.Store(true)
	}
	prev := g.state.Load()
	st := &guardState{at: start, ok: err == nil, r: r, err: err}
	st.safe = err == nil && !r.InRecovery && (r.Synchronous() || !g.requires())
	if prev != nil {
		st.checkNo = prev.checkNo + 1
		if prev.ok && prev.r.Synchronous() && !(err == nil && r.Synchronous()) {
			g.losses.Add(1)
		}
	}
	g.state.Store(st)
	g.report(prev, st)
	g.mu.Lock()
	if g.fresh != nil {
		close(g.fresh)
	}
	g.fresh = make(chan struct{})
	g.mu.Unlock()
}

// requires reports whether writes need a synchronous standby now.
func (g *Guard) requires() bool {
	switch g.Mode {
	case SyncRequired:
		return true
	case SyncDegraded:
		return false
	}
	return g.replicated.Load()
}

func (g *Guard) logger() *slog.Logger {
	if g.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return g.Logger
}

// report logs changes: losing or regaining the synchronous standby, and
// in degraded mode, every check without one.
func (g *Guard) report(prev, st *guardState) {
	if !st.ok || g.Mode == "" {
		return
	}
	sync := st.r.Synchronous()
	was := prev != nil && prev.ok && prev.r.Synchronous()
	if prev == nil && !sync {
		// At start: a deployment without a synchronous standby is warned
		// about, not refused (unless BLOBPLANE_SYNC_REPLICATION=required).
		g.logger().Warn("database: no synchronous standby; the loss of this Postgres loses acknowledged writes (docs/database.md, \"High availability\")",
			"synchronous_standby_names", st.r.StandbyNames, "synchronous_commit", st.r.SyncCommit, "pg_auto_failover_slots", st.r.Slots, "mode", g.Mode)
	}
	switch {
	case !sync && g.Mode == SyncDegraded && g.replicated.Load() && (was || time.Since(g.lastLoud) >= 30*time.Second):
		g.lastLoud = time.Now()
		g.logger().Error("database: NO synchronous standby; writes are acknowledged anyway (BLOBPLANE_SYNC_REPLICATION=degraded): each is lost if the primary is",
			"synchronous_standby_names", st.r.StandbyNames, "sync_standbys", st.r.SyncStandbys)
	case was && !sync:
		g.logger().Error("database: the synchronous standby is gone; refusing writes until it is back",
			"synchronous_standby_names", st.r.StandbyNames, "sync_standbys", st.r.SyncStandbys, "mode", g.Mode)
	case !was && sync && prev != nil:
		g.logger().Info("database: a synchronous standby is back; writes accepted", "synchronous_standby_names", st.r.StandbyNames)
	}
}

// Losses counts losses of the synchronous standby seen so far.
func (g *Guard) Losses() uint64 { return g.losses.Load() }

// Admit says whether a write may start now: nil, or ErrNotSynchronous
// (also while no check has answered yet, or the last one failed: the
// write would fail on the database anyway).
func (g *Guard) Admit() error {
	st := g.state.Load()
	if st == nil || !st.ok {
		if g.Mode == SyncDegraded || (g.Mode == SyncAuto && !g.replicated.Load()) {
			return nil // nothing known to protect; the database answers for itself
		}
		return ErrNotSynchronous
	}
	if !st.safe {
		return ErrNotSynchronous
	}
	return nil
}

// Ticket is taken when a write starts; Acknowledge checks it before the
// write's success is answered.
type Ticket struct {
	losses  uint64
	cancels uint64
	start   time.Time
}

// Ticket marks the start of a write.
func (g *Guard) Ticket() Ticket {
	return Ticket{losses: g.losses.Load(), cancels: g.cancels(), start: time.Now()}
}

// cancels counts the cancelled synchronous-replication waits of the
// guarded pools.
func (g *Guard) cancels() uint64 {
	if g.Store == nil {
		return 0
	}
	return g.Store.syncCancels.Load()
}

// lost reports whether, since t, the standby was lost or a commit's wait
// for it was cancelled: a commit in between may be on the primary only.
func (g *Guard) lost(t Ticket) bool {
	return g.losses.Load() != t.losses || g.cancels() != t.cancels
}

// Acknowledge says whether a write that began at t and has committed may
// be answered as a success. While writes need a synchronous standby: not
// if the standby was lost since t (its commit may have been released
// without it); and a write that took longer than a check interval (a
// commit that waited, perhaps for a standby that never answered) first
// waits for a check that began after now, and is answered only if that
// check finds the synchronous standby there and no loss since t.
func (g *Guard) Acknowledge(ctx context.Context, t Ticket) error {
	if !g.requires() {
		return nil
	}
	if g.lost(t) {
		return ErrOutcomeUnknown
	}
	if time.Since(t.start) <= g.interval() {
		return nil
	}
	now := time.Now()
	for {
		st := g.state.Load()
		if st != nil && st.at.After(now) {
			if !st.safe || g.lost(t) {
				return ErrOutcomeUnknown
			}
			return nil
		}
		g.mu.Lock()
		fresh := g.fresh
		g.mu.Unlock()
		if fresh == nil {
			return ErrOutcomeUnknown // no checks run
		}
		wait := time.NewTimer(4 * g.interval())
		select {
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		case <-wait.C:
			return ErrOutcomeUnknown // the checks stalled: the database is in trouble
		case <-fresh:
			wait.Stop()
		}
	}
}

// Status is the last check, for /readyz and the status page.
func (g *Guard) Status() (Replication, bool, error) {
	st := g.state.Load()
	if st == nil {
		return Replication{}, false, nil
	}
	return st.r, st.safe, st.err
}

// Collectors are the guard's metrics: whether writes may be acknowledged
// now, the losses of the synchronous standby, the cancelled waits and
// the pool resets.
func (g *Guard) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "blobplane_database_synchronous",
			Help: "1 while the primary has a synchronous standby that commits wait for; 0 without (writes refused unless BLOBPLANE_SYNC_REPLICATION allows them, issue 32)."},
			func() float64 {
				if r, _, err := g.Status(); err == nil && r.Synchronous() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "blobplane_database_writes_admitted",
			Help: "1 while the api admits the blob API's writes; 0 while it refuses them for want of a synchronous standby."},
			func() float64 {
				if g.Admit() == nil {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "blobplane_database_sync_losses_total",
			Help: "Checks that found the synchronous standby gone (or the primary unreachable) after one that had it."},
			func() float64 { return float64(g.Losses()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "blobplane_database_sync_waits_cancelled_total",
			Help: "Commits whose wait for the synchronous standby was cancelled: committed on the primary, perhaps not on the standby."},
			func() float64 { return float64(g.cancels()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "blobplane_database_pool_resets_total",
			Help: "Pool resets because its connections were on a read-only standby (a failover)."},
			func() float64 { return float64(g.resets.Load()) }),
	}
}
