// Package keeper is the lease keeper every api node runs (ZBP-5 R14–R24):
// it follows the latest verified partition map (a jittered refresh plus
// Postgres notifications), acquires the partitions the map gives this node,
// renews them on their interval, and fences itself on the monotonic clock.
// A restarted process that keeps its node id takes its live leases back at
// epoch+1 on its first claim instead of waiting out their TTL (issue 27).
// It answers the routing decision's LeaseView without blocking.
package keeper

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
)

// Store is the part of the metadata store the keeper needs.
type Store interface {
	// LatestMapFor returns the newest published map node adopts (a canary
	// naming node included, R120); a not-found error when none has been
	// published yet.
	LatestMapFor(ctx context.Context, node string) (*authority.Map, error)
	// MapDelta returns the signed delta from base to the latest map; not
	// found when none is stored.
	MapDelta(ctx context.Context, since uint64) (*authority.Delta, error)
	// SigningKeys returns the controller's public keys with their windows.
	SigningKeys(ctx context.Context) ([]authority.TrustedKey, error)
	// AcquireLease claims partition for node at epoch+1 when it is absent
	// or expired (database clock); CodeConflict when another owner holds it.
	AcquireLease(ctx context.Context, partition, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error)
	// TakeBackLease is AcquireLease that also claims, at epoch+1, a live
	// lease whose owner is node: one an earlier process with this node id
	// left (issue 27). CodeConflict when another node holds it live, or
	// the record is sealed or quarantined.
	TakeBackLease(ctx context.Context, partition, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error)
	// RenewLease extends the lease held at epoch; CodeStaleEpoch when the
	// lease moved on.
	RenewLease(ctx context.Context, partition, node string, epoch uint64) (authority.LeaseRecord, error)
	// SetLeaseState records the primary state (RESTORING → SERVING) under
	// the epoch fence; CodeStaleEpoch when the lease moved on.
	SetLeaseState(ctx context.Context, partition, node string, epoch uint64, state authority.PrimaryState) error
	// ReleaseLease gives the lease up at epoch (expires it now); a lease
	// that already moved on is left alone without an error.
	ReleaseLease(ctx context.Context, partition, node string, epoch uint64) error

	// HandoffsFor returns the moves in flight from or to node (issue 30).
	HandoffsFor(ctx context.Context, node string) ([]authority.Handoff, error)
	// MarkHandoffSynced answers a handoff to node in preparing: it will
	// take the partition (A.4 step 3).
	MarkHandoffSynced(ctx context.Context, id int64, node string) (bool, error)
	// SealForHandoff seals node's lease at epoch for a synced handoff
	// (A.4 step 4, R74); CodeConflict when the handoff is no longer
	// synced or its deadline passed (nothing changed, R75).
	SealForHandoff(ctx context.Context, id int64, node string, epoch uint64) (authority.LeaseRecord, error)
	// ClaimSealedLease is the target's ACQUIRE of the sealed lease at
	// epoch + 1 (A.4 step 7).
	ClaimSealedLease(ctx context.Context, id int64, partition, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error)
	// MarkHandoffReady records that node serves the partition at epoch
	// (R79: only then may a map name it).
	MarkHandoffReady(ctx context.Context, id int64, node string, epoch uint64) (bool, error)
	// ForcedLeasesFor returns the live leases an operator forced onto node
	// (R26): adopted at once.
	ForcedLeasesFor(ctx context.Context, node string) ([]authority.LeaseRecord, error)
	// SealGroup seals every parent of a split or merge group, all held by
	// node, in one transaction (A.5 step 4, A.6); nothing otherwise.
	SealGroup(ctx context.Context, group int64, node string) error
	// ClaimChildLease creates a split or merge child's lease for node once
	// every parent of its group is sealed (A.5 step 5, R16).
	ClaimChildLease(ctx context.Context, child, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error)
	// MarkChildReady records that node serves child; true once every
	// child of group does (R79).
	MarkChildReady(ctx context.Context, group int64, child, node string) (bool, error)
}

// Config tunes a Keeper.
type Config struct {
	NodeID   string
	Endpoint string // host:port as published in the map
	Timing   authority.LeaseTiming
	// Refresh is the mean map refresh interval; each wait is jittered
	// ±25% (R106).
	Refresh time.Duration
	Clock   authority.MonoClock
	Logger  *slog.Logger
	// OnReject is told about every map or delta that fails verification
	// (a correctness fault: count it).
	OnReject func(authority.Rejection)
	// Prepare, when set, restores a partition's state before it serves
	// (R23): called at each keep of a held partition not yet serving, with
	// the lease's context (cancelled when the lease ends), it must not
	// block; it reports whether the state is ready. Until it is, the
	// lease is held and renewed but the partition does not serve. It
	// calls Notify when a restore ends, so serving does not wait for the
	// next renewal.
	// slotBits and slots are the partition's: from the map, or for a
	// split or merge child not yet in it, from its handoff (none: the
	// partition is in neither).
	Prepare func(ctx context.Context, partition string, epoch uint64, slotBits int, slots []authority.SlotRange) bool
}

// DefaultTiming is the lease timing used unless configured otherwise:
// TimingFor(8 s). 8 s puts a new home within 10 s of a crash (issue 30:
// kill -9 → first 201 p50 8.7 s, max 9.1 s over 10 kills, where 10 s gave
// p50 11.0 s) and still rides out about 5.6 s of Postgres trouble before
// a home fences itself (docs/authority.md "Moves").
var DefaultTiming = authority.LeaseTiming{TTL: 8 * time.Second, RenewInterval: 1600 * time.Millisecond, MaxRenewRTT: 800 * time.Millisecond, MaxClockError: 400 * time.Millisecond}

// TimingFor scales DefaultTiming to ttl (BLOBPLANE_LEASE_TTL): renewal
// every fifth of it, a renewal slower than a tenth extends nothing, half
// a second of clock error. The lease TTL bounds how long a dead home's
// partitions wait for recovery (docs/authority.md "Moves").
func TimingFor(ttl time.Duration) authority.LeaseTiming {
	if ttl <= 0 {
		return DefaultTiming
	}
	return authority.LeaseTiming{TTL: ttl, RenewInterval: ttl / 5, MaxRenewRTT: ttl / 10, MaxClockError: min(500*time.Millisecond, ttl/20)}
}

type held struct {
	fence   *authority.SelfFence
	serving bool
	// sealing is set while this node seals the lease for a handoff (A.4
	// step 4): nothing new is admitted; writes already admitted commit
	// before the seal or are refused by it (R77, retryable).
	sealing bool
	// ctx is cancelled the moment the lease is lost or its deadline
	// passes: in-flight work fails retryably (R24).
	ctx    context.Context
	cancel context.CancelFunc
}

// Keeper owns this node's leases. Lease and Map are safe to call from any
// goroutine; Run drives the rest.
type Keeper struct {
	cfg   Config
	store Store

	mu       sync.Mutex
	current  *authority.VerifiedMap
	verifier *authority.Verifier
	leases   map[string]*held
	// claimed holds every partition this process has acquired since it
	// started: only the first claim of a partition may take back a live
	// lease of this node id (issue 27, docs/authority.md "Taking a lease
	// back"); a lease lost or self-fenced afterwards is claimed again
	// only once expired, like any other node's.
	claimed map[string]bool
	deltas  map[uint64]*authority.Delta // signed deltas to the current map, by base
	wake    chan struct{}

	// handoffs are the moves in flight from or to this node, as last read
	// (kept when a read fails, so a target does not drop a partition it
	// took over because of one failed query).
	handoffs []authority.Handoff
	// sealed holds the partitions this node sealed for a handoff, by the
	// sealed epoch: never kept again while the map still names this node
	// (R74, R76: the outgoing primary does not resume).
	sealed map[string]uint64
	// successor is, for a partition this node is sealing or sealed for a
	// handoff, where it goes (its target at epoch + 1): the new
	// assignment refusals carry until the map names it (R77).
	successor map[string]authority.Assignment
	// forced holds the live leases an operator forced onto this node
	// (R26), as last read: adopted at once and kept like the map's until
	// a newer map than the one current at adoption gives the partition
	// to another node (then done[partition] = that epoch: never again).
	forced map[string]forcedLease
	done   map[string]uint64
}

type forcedLease struct {
	epoch      uint64
	mapVersion uint64 // the map current when this node adopted it
}

// New validates cfg and returns a Keeper that holds nothing yet.
func New(store Store, cfg Config) (*Keeper, error) {
	if cfg.Timing == (authority.LeaseTiming{}) {
		cfg.Timing = DefaultTiming
	}
	if err := cfg.Timing.Validate(); err != nil {
		return nil, err
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = authority.SystemClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Keeper{cfg: cfg, store: store, leases: map[string]*held{}, claimed: map[string]bool{}, deltas: map[uint64]*authority.Delta{}, wake: make(chan struct{}, 1),
		sealed: map[string]uint64{}, successor: map[string]authority.Assignment{}, forced: map[string]forcedLease{}, done: map[string]uint64{}}, nil
}

// Map returns the current verified map, or nil before the first one.
func (k *Keeper) Map() *authority.VerifiedMap {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.current
}

// Lease answers the routing decision (A.2 step 2) from local state only:
// held while the self-fence deadline has not passed on the monotonic clock
// (R17, R18), serving once the partition is ready (R23).
func (k *Keeper) Lease(partition string) authority.LeaseState {
	k.mu.Lock()
	defer k.mu.Unlock()
	h := k.leases[partition]
	if h == nil {
		return authority.LeaseState{}
	}
	return h.fence.State(k.cfg.Clock.Now(), h.serving)
}

// Admit is checked before admitting work for partition at the epoch the
// routing decision saw: it returns a context that is cancelled when the
// lease is lost or self-fenced, or a retryable error when it already is.
func (k *Keeper) Admit(partition string, epoch uint64) (context.Context, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h := k.leases[partition]
	if h == nil {
		return nil, blobplane.Errorf(blobplane.CodeUnavailable, "partition %s is not held by this node", partition)
	}
	if err := h.fence.Check(k.cfg.Clock.Now()); err != nil {
		return nil, err
	}
	if h.sealing {
		return nil, blobplane.Errorf(blobplane.CodeUnavailable, "partition %s is being handed off", partition)
	}
	if _, e, _ := h.fence.Deadline(); e != epoch {
		return nil, blobplane.Errorf(blobplane.CodeUnavailable, "partition %s moved to epoch %d", partition, e)
	}
	return h.ctx, nil
}

// Successor is where partition goes while this node seals it for a
// handoff or has sealed it and the map does not name the target yet: the
// new assignment a refusal carries (R77). A hint for clients and logs,
// unsigned: routing follows signed maps only (R103).
func (k *Keeper) Successor(partition string) *authority.Assignment {
	k.mu.Lock()
	defer k.mu.Unlock()
	a, ok := k.successor[partition]
	if !ok {
		return nil
	}
	return &a
}

// sealingLocked: this node is sealing partition now. Called with k.mu
// held.
func (k *Keeper) sealingLocked(partition string) bool {
	l := k.leases[partition]
	return l != nil && l.sealing
}

// Delta returns the controller-signed delta from base to the current map,
// for MOVED answers (R103). It may query the store once per base version.
func (k *Keeper) Delta(base uint64) *authority.Delta {
	k.mu.Lock()
	d, ok := k.deltas[base]
	k.mu.Unlock()
	if ok {
		return d
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := k.store.MapDelta(ctx, base)
	if err != nil {
		d = nil
	}
	k.mu.Lock()
	if cur := k.current; cur != nil && d != nil && d.Version != cur.Version() {
		d = nil // a delta to some other version would not route this retry
	}
	if len(k.deltas) < 1024 {
		k.deltas[base] = d
	}
	k.mu.Unlock()
	return d
}

// Notify asks the keeper to refresh the map now (a Postgres notification
// arrived).
func (k *Keeper) Notify() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Run refreshes the map and keeps leases until ctx ends, then gives every
// lease up so a successor need not wait out the TTL.
func (k *Keeper) Run(ctx context.Context) {
	renew := time.NewTicker(k.cfg.Timing.RenewInterval)
	defer renew.Stop()
	refresh := time.NewTimer(0)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			k.releaseAll(context.WithoutCancel(ctx))
			return
		case <-k.wake:
			k.RefreshMap(ctx)
			k.Tick(ctx)
		case <-refresh.C:
			k.RefreshMap(ctx)
			k.Tick(ctx)
			refresh.Reset(authority.JitteredInterval(k.cfg.Refresh, 0.25, rand.Float64()))
		case <-renew.C:
			k.Tick(ctx)
		}
	}
}

// RefreshMap adopts the latest published map if it verifies and is newer.
// A map that fails verification is rejected and counted even when newer
// (R11); serving continues on the last verified map (R110).
func (k *Keeper) RefreshMap(ctx context.Context) {
	m, err := k.store.LatestMapFor(ctx, k.cfg.NodeID)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			k.cfg.Logger.Warn("map refresh failed; serving on the last verified map", "err", err)
		}
		return
	}
	k.mu.Lock()
	cur := k.current
	k.mu.Unlock()
	if cur != nil && m.Version <= cur.Version() {
		return
	}
	keys, err := k.store.SigningKeys(ctx)
	if err != nil {
		k.cfg.Logger.Warn("read signing keys", "err", err)
		return
	}
	ring, err := authority.NewKeyring(keys...)
	if err != nil {
		k.cfg.Logger.Error("signing keys unusable", "err", err)
		return
	}
	v := authority.NewVerifier(ring, k.onReject)
	vm, err := v.Adopt(cur, m, time.Now())
	if err != nil {
		return // counted and logged by onReject, or not newer
	}
	k.mu.Lock()
	k.current, k.verifier = vm, v
	k.deltas = map[uint64]*authority.Delta{}
	k.mu.Unlock()
	k.cfg.Logger.Info("adopted partition map", "version", vm.Version())
}

func (k *Keeper) onReject(r authority.Rejection) {
	k.cfg.Logger.Error("partition map rejected: correctness fault", "rejection", r)
	if k.cfg.OnReject != nil {
		k.cfg.OnReject(r)
	}
}

// Tick does one round of lease work: self-fence expired leases, give up
// partitions the map moved away, take part in the handoffs from and to
// this node, acquire or renew the rest.
func (k *Keeper) Tick(ctx context.Context) {
	k.readMoves(ctx)
	k.mu.Lock()
	mine, targets := k.wanted()
	now := k.cfg.Clock.Now()
	var release []string
	for id, h := range k.leases {
		if h.fence.Check(now) != nil && h.ctx.Err() == nil {
			k.cfg.Logger.Warn("self-fenced: lease deadline passed before a renewal was acknowledged", "partition", id)
			h.cancel()
			h.serving = false
		}
		if !mine[id] {
			release = append(release, id)
		}
	}
	hs := k.handoffs
	k.mu.Unlock()
	for _, id := range release {
		k.release(ctx, id)
	}
	k.handOff(ctx, hs)
	for id := range mine {
		if ctx.Err() != nil {
			return
		}
		k.keep(ctx, id, targets[id])
	}
	k.reportReady(ctx, targets)
}

// readMoves refreshes the handoffs and forced leases involving this node;
// on a failed read the last ones stand.
func (k *Keeper) readMoves(ctx context.Context) {
	hs, err := k.store.HandoffsFor(ctx, k.cfg.NodeID)
	if err != nil {
		if ctx.Err() == nil {
			k.cfg.Logger.Warn("read handoffs", "err", err)
		}
	} else {
		k.mu.Lock()
		k.handoffs = hs
		k.mu.Unlock()
	}
	forced, err := k.store.ForcedLeasesFor(ctx, k.cfg.NodeID)
	if err != nil {
		if ctx.Err() == nil {
			k.cfg.Logger.Warn("read forced leases", "err", err)
		}
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var version uint64
	if k.current != nil {
		version = k.current.Version()
	}
	m := make(map[string]forcedLease, len(forced))
	for _, r := range forced {
		switch f, ok := k.forced[r.Partition]; {
		case k.done[r.Partition] == r.Epoch:
		case ok && f.epoch == r.Epoch:
			m[r.Partition] = f
		default:
			m[r.Partition] = forcedLease{epoch: r.Epoch, mapVersion: version}
			k.cfg.Logger.Info("adopting a forced takeover", "partition", r.Partition, "epoch", r.Epoch, "operator", r.TakenBy, "reason", r.TakenReason)
		}
	}
	k.forced = m
}

// wanted is the set of partitions this node should hold: those the map
// gives it (less those it sealed away), those a handoff moves to it, and
// those an operator forced onto it (R26). targets maps a partition to the
// handoff moving it here. Called with k.mu held.
func (k *Keeper) wanted() (mine map[string]bool, targets map[string]authority.Handoff) {
	mine, targets = map[string]bool{}, map[string]authority.Handoff{}
	named := map[string]bool{}
	if k.current != nil {
		for _, p := range k.current.Map().Partitions {
			if p.Primary.Node == k.cfg.NodeID {
				named[p.ID] = true
			}
		}
	}
	for id := range k.sealed {
		if !named[id] {
			delete(k.sealed, id) // the map moved on: nothing left to hold back
		}
	}
	for id := range k.successor {
		if _, sealed := k.sealed[id]; !sealed && !k.sealingLocked(id) {
			delete(k.successor, id) // the map names the successor now
		}
	}
	for id := range named {
		if _, sealed := k.sealed[id]; !sealed {
			mine[id] = true
		}
	}
	for _, h := range k.handoffs {
		for _, id := range k.incoming(h) {
			mine[id] = true
			targets[id] = h
		}
	}
	for id, f := range k.forced {
		if k.current != nil && k.current.Version() > f.mapVersion && !named[id] {
			// A map newer than the force gives the partition elsewhere:
			// the operator's override is over.
			k.done[id] = f.epoch
			delete(k.forced, id)
			continue
		}
		mine[id] = true
		delete(k.sealed, id)
	}
	return mine, targets
}

// incoming is what h brings this node to hold now: the partition of a
// handoff past its seal or of a recovery, the children of a split or
// merge past its seal (the parents stay sealed). Called with k.mu held.
func (k *Keeper) incoming(h authority.Handoff) []string {
	if h.To != k.cfg.NodeID {
		return nil
	}
	pastSeal := h.State == authority.HandoffSealed || h.State == authority.HandoffReady
	switch {
	case h.Kind.Grouped() && pastSeal:
		ids := make([]string, len(h.Children))
		for i, c := range h.Children {
			ids[i] = c.ID
		}
		return ids
	case h.Kind.Grouped():
		return nil
	case pastSeal || (h.Kind == authority.KindRecover && h.State == authority.HandoffPreparing):
		delete(k.sealed, h.Partition)
		return []string{h.Partition}
	}
	return nil
}

// handOff does this node's steps of the handoffs in flight: as a target it
// answers synced (A.4 step 3: a DERIVED partition has nothing to restore,
// R78); as the outgoing primary of a synced handoff it seals (step 4).
func (k *Keeper) handOff(ctx context.Context, hs []authority.Handoff) {
	groups := map[int64][]authority.Handoff{}
	for _, h := range hs {
		if ctx.Err() != nil {
			return
		}
		switch {
		case h.Kind != authority.KindRecover && h.To == k.cfg.NodeID && h.State == authority.HandoffPreparing:
			if _, err := k.store.MarkHandoffSynced(ctx, h.ID, k.cfg.NodeID); err != nil && ctx.Err() == nil {
				k.cfg.Logger.Warn("handoff: report synced", "handoff", h.ID, "partition", h.Partition, "err", err)
			}
		case h.Kind == authority.KindHandoff && h.From == k.cfg.NodeID && h.State == authority.HandoffSynced:
			k.seal(ctx, h)
		}
		if h.Kind.Grouped() && h.From == k.cfg.NodeID {
			groups[h.GroupID] = append(groups[h.GroupID], h)
		}
	}
	for g, parents := range groups {
		synced := true
		for _, h := range parents {
			synced = synced && h.State == authority.HandoffSynced
		}
		if synced && ctx.Err() == nil {
			k.sealGroup(ctx, g, parents)
		}
	}
}

// sealGroup is the seal of a split or merge (A.5 step 4, A.6): every
// parent stops admitting, then all are sealed in one transaction, then
// forgotten; a refused seal changes nothing and they keep serving (R75).
func (k *Keeper) sealGroup(ctx context.Context, group int64, parents []authority.Handoff) {
	k.mu.Lock()
	var locked []*held
	for _, h := range parents {
		l := k.leases[h.Partition]
		if l == nil || l.fence.Check(k.cfg.Clock.Now()) != nil {
			for _, x := range locked {
				x.sealing = false
			}
			k.mu.Unlock()
			return
		}
		if _, e, _ := l.fence.Deadline(); e != h.FromEpoch {
			for _, x := range locked {
				x.sealing = false
			}
			k.mu.Unlock()
			return
		}
		l.sealing = true
		locked = append(locked, l)
	}
	k.mu.Unlock()
	err := k.store.SealGroup(ctx, group, k.cfg.NodeID)
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, h := range parents {
		l := locked[i]
		if err != nil {
			l.sealing = false
			continue
		}
		l.fence.Lost()
		l.cancel()
		if k.leases[h.Partition] == l {
			delete(k.leases, h.Partition)
		}
		k.sealed[h.Partition] = h.FromEpoch
	}
	if err != nil {
		if ctx.Err() == nil {
			k.cfg.Logger.Warn("split/merge: seal refused; the parents still serve", "group", group, "err", err)
		}
		return
	}
	k.cfg.Logger.Info("split/merge: parents sealed; the children take over", "group", group, "parents", len(parents), "kind", parents[0].Kind)
}

// seal is A.4 step 4 at the outgoing primary: stop admitting, seal the
// lease under its epoch (waiting for the writes already fenced under it),
// then forget the partition without flushing anything (R24, R74). When the
// seal is refused before it happened — the handoff aborted or late — the
// partition keeps serving as if nothing had been asked (R75).
func (k *Keeper) seal(ctx context.Context, h authority.Handoff) {
	k.mu.Lock()
	l := k.leases[h.Partition]
	ok := l != nil && l.fence.Check(k.cfg.Clock.Now()) == nil
	if ok {
		_, e, _ := l.fence.Deadline()
		ok = e == h.FromEpoch
	}
	if ok {
		l.sealing = true
		k.successor[h.Partition] = authority.Assignment{Partition: h.Partition, Epoch: h.FromEpoch + 1,
			Primary: authority.AssignedNode{Node: h.To, Endpoint: h.ToEndpoint}}
	}
	k.mu.Unlock()
	if !ok {
		return // not held at the handoff's epoch: the controller's deadline settles it
	}
	_, err := k.store.SealForHandoff(ctx, h.ID, k.cfg.NodeID, h.FromEpoch)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		l.sealing = false
		delete(k.successor, h.Partition)
		if errors.Is(err, &blobplane.Error{Code: blobplane.CodeStaleEpoch}) {
			l.fence.Lost()
			l.cancel()
			if k.leases[h.Partition] == l {
				delete(k.leases, h.Partition)
			}
		}
		if ctx.Err() == nil {
			k.cfg.Logger.Warn("handoff: seal refused; still serving", "handoff", h.ID, "partition", h.Partition, "err", err)
		}
		return
	}
	l.fence.Lost()
	l.cancel()
	if k.leases[h.Partition] == l {
		delete(k.leases, h.Partition)
	}
	k.sealed[h.Partition] = h.FromEpoch
	k.cfg.Logger.Info("handoff: lease sealed; the partition moves on", "handoff", h.ID, "partition", h.Partition, "epoch", h.FromEpoch, "to", h.To)
}

// reportReady tells the controller a partition moved here is served under
// its new epoch (A.4 step 7, A.3 step 10): only then may a map name this
// node (R79).
func (k *Keeper) reportReady(ctx context.Context, targets map[string]authority.Handoff) {
	for id, h := range targets {
		if h.State == authority.HandoffReady {
			continue
		}
		if h.Kind.Grouped() {
			k.reportChildReady(ctx, id, h)
			continue
		}
		ls := k.Lease(id)
		if !ls.Held || !ls.Serving || ls.Epoch <= h.FromEpoch {
			continue
		}
		ok, err := k.store.MarkHandoffReady(ctx, h.ID, k.cfg.NodeID, ls.Epoch)
		if err != nil && ctx.Err() == nil {
			k.cfg.Logger.Warn("handoff: report ready", "handoff", h.ID, "partition", id, "err", err)
		}
		if ok {
			k.cfg.Logger.Info("handoff: serving the partition", "handoff", h.ID, "partition", id, "epoch", ls.Epoch, "kind", h.Kind)
		}
	}
}

// claim is keep's lease write: a renewal while holding; the sealed lease
// of a handoff to this node; the adoption of a lease an operator forced
// onto it (R26: served at once, not after a TTL); else a claim.
func (k *Keeper) claim(ctx context.Context, id string, epoch uint64, holding, first bool, to authority.Handoff) (authority.LeaseRecord, error) {
	k.mu.Lock()
	f, isForced := k.forced[id]
	k.mu.Unlock()
	switch {
	case holding:
		return k.store.RenewLease(ctx, id, k.cfg.NodeID, epoch)
	case to.Kind == authority.KindHandoff && to.State == authority.HandoffSealed:
		return k.store.ClaimSealedLease(ctx, to.ID, id, k.cfg.NodeID, k.cfg.Endpoint, k.cfg.Timing.TTL, k.cfg.Timing.RenewInterval)
	case to.Kind.Grouped():
		rec, err := k.store.ClaimChildLease(ctx, id, k.cfg.NodeID, k.cfg.Endpoint, k.cfg.Timing.TTL, k.cfg.Timing.RenewInterval)
		if err != nil && first && errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
			// Its lease exists: an earlier process of this node made it.
			return k.store.TakeBackLease(ctx, id, k.cfg.NodeID, k.cfg.Endpoint, k.cfg.Timing.TTL, k.cfg.Timing.RenewInterval)
		}
		return rec, err
	case isForced:
		// The record names this node at that epoch: a renewal under it is
		// the fenced proof, and its acknowledgement starts the self-fence.
		return k.store.RenewLease(ctx, id, k.cfg.NodeID, f.epoch)
	case first:
		// Issue 27: the first claim since this process started takes
		// back a live lease an earlier process with this node id left
		// (killed, or paused and about to be fenced by the new epoch),
		// instead of waiting out its TTL. Never again in this process:
		// a lease lost here may be another incarnation's now.
		return k.store.TakeBackLease(ctx, id, k.cfg.NodeID, k.cfg.Endpoint, k.cfg.Timing.TTL, k.cfg.Timing.RenewInterval)
	default:
		return k.store.AcquireLease(ctx, id, k.cfg.NodeID, k.cfg.Endpoint, k.cfg.Timing.TTL, k.cfg.Timing.RenewInterval)
	}
}

func (k *Keeper) keep(ctx context.Context, id string, to authority.Handoff) {
	k.mu.Lock()
	h := k.leases[id]
	var epoch uint64
	holding := false
	if h != nil {
		_, epoch, holding = h.fence.Deadline()
		holding = holding && h.fence.Check(k.cfg.Clock.Now()) == nil
	}
	first := !k.claimed[id]
	k.mu.Unlock()

	sent := k.cfg.Clock.Now()
	rec, err := k.claim(ctx, id, epoch, holding, first, to)
	ack := k.cfg.Clock.Now()
	if err != nil {
		if holding && errors.Is(err, &blobplane.Error{Code: blobplane.CodeStaleEpoch}) {
			k.lost(id, err)
		} else if ctx.Err() == nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) &&
			!errors.Is(err, &blobplane.Error{Code: blobplane.CodeStaleEpoch}) {
			k.cfg.Logger.Warn("lease store", "partition", id, "renew", holding, "err", err)
		}
		return
	}
	k.mu.Lock()
	h = k.leases[id]
	if h == nil || !holding {
		if h != nil {
			h.cancel()
		}
		f, _ := authority.NewSelfFence(k.cfg.Timing)
		c, cancel := context.WithCancel(context.Background())
		h = &held{fence: f, ctx: c, cancel: cancel}
		k.leases[id] = h
		k.claimed[id] = true
	}
	ackErr := h.fence.Acknowledged(rec.Epoch, sent, ack)
	needServing := !h.serving && ackErr == nil
	leaseCtx := h.ctx
	k.mu.Unlock()
	if ackErr != nil {
		k.cfg.Logger.Warn("lease renewal too slow to extend the deadline", "partition", id, "err", ackErr)
		return
	}
	if !holding {
		k.cfg.Logger.Info("acquired partition lease", "partition", id, "epoch", rec.Epoch, "first_since_start", first)
	}
	if needServing {
		k.serve(ctx, id, rec.Epoch, leaseCtx, to)
	}
}

// slotsOf is partition id's slot bits and ranges: a split or merge
// child's from its handoff to (the map names it only once every child is
// ready, R79), anyone else's from the current map.
func (k *Keeper) slotsOf(id string, to authority.Handoff) (int, []authority.SlotRange) {
	vm := k.Map()
	if vm == nil {
		return 0, nil
	}
	bits := vm.Map().SlotBits
	for _, c := range to.Children {
		if c.ID == id {
			return bits, c.Slots
		}
	}
	for _, p := range vm.Map().Partitions {
		if p.ID == id {
			return bits, p.Slots
		}
	}
	return bits, nil
}

// serve moves a held partition to SERVING at epoch once its state is
// ready. The repository metadata lives in Postgres; the partition's
// quota state is restored from its journal (Config.Prepare) before the
// partition serves. Holding and serving are separate steps (R23),
// recorded on the lease row.
func (k *Keeper) serve(ctx context.Context, id string, epoch uint64, leaseCtx context.Context, to authority.Handoff) {
	if k.cfg.Prepare != nil {
		if bits, slots := k.slotsOf(id, to); !k.cfg.Prepare(leaseCtx, id, epoch, bits, slots) {
			return
		}
	}
	if err := k.store.SetLeaseState(ctx, id, k.cfg.NodeID, epoch, authority.PrimaryServing); err != nil {
		if errors.Is(err, &blobplane.Error{Code: blobplane.CodeStaleEpoch}) {
			k.lost(id, err)
		}
		return
	}
	k.mu.Lock()
	if h := k.leases[id]; h != nil {
		if _, e, _ := h.fence.Deadline(); e == epoch {
			h.serving = true
		}
	}
	k.mu.Unlock()
}

// lost handles LEASE_LOST (A.7): stop admitting at once, fail in-flight
// work, discard state without flushing (R24).
func (k *Keeper) lost(id string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if h := k.leases[id]; h != nil {
		h.fence.Lost()
		h.cancel()
		delete(k.leases, id)
	}
	k.cfg.Logger.Warn("lease lost", "partition", id, "err", err)
}

func (k *Keeper) release(ctx context.Context, id string) {
	k.mu.Lock()
	h := k.leases[id]
	delete(k.leases, id)
	k.mu.Unlock()
	if h == nil {
		return
	}
	h.cancel()
	if _, epoch, ok := h.fence.Deadline(); ok {
		if err := k.store.ReleaseLease(ctx, id, k.cfg.NodeID, epoch); err != nil && ctx.Err() == nil {
			k.cfg.Logger.Warn("release lease", "partition", id, "err", err)
		}
	}
}

func (k *Keeper) releaseAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	k.mu.Lock()
	ids := make([]string, 0, len(k.leases))
	for id := range k.leases {
		ids = append(ids, id)
	}
	k.mu.Unlock()
	for _, id := range ids {
		k.release(ctx, id)
	}
}

// reportChildReady tells the controller a split or merge child serves
// under its planned epoch (R79: the map replacing the parents waits for
// every child).
func (k *Keeper) reportChildReady(ctx context.Context, id string, h authority.Handoff) {
	ls := k.Lease(id)
	for _, c := range h.Children {
		if c.ID != id || c.Ready || !ls.Held || !ls.Serving || ls.Epoch != c.Epoch {
			continue
		}
		all, err := k.store.MarkChildReady(ctx, h.GroupID, id, k.cfg.NodeID)
		if err != nil && ctx.Err() == nil {
			k.cfg.Logger.Warn("split/merge: report a child ready", "group", h.GroupID, "child", id, "err", err)
		}
		if all {
			k.cfg.Logger.Info("split/merge: every child serves", "group", h.GroupID, "kind", h.Kind)
		}
	}
}

// NodeID is the node this keeper holds leases for.
func (k *Keeper) NodeID() string { return k.cfg.NodeID }

// Report is what this node believes, for its heartbeat: the map version it
// serves from and the partitions it holds as primary (R134, R139).
func (k *Keeper) Report() (mapVersion uint64, primaries []authority.PrimaryReport) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.current != nil {
		mapVersion = k.current.Version()
	}
	now := k.cfg.Clock.Now()
	for id, h := range k.leases {
		if ls := h.fence.State(now, h.serving); ls.Held {
			primaries = append(primaries, authority.PrimaryReport{Node: k.cfg.NodeID, Partition: id, Epoch: ls.Epoch})
		}
	}
	return mapVersion, primaries
}

// Holding returns how many leases this node holds and how many partitions
// the current map names it primary of: a draining node is done when both
// are zero (R83, R84).
func (k *Keeper) Holding() (leases, named int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.current != nil {
		for _, p := range k.current.Map().Partitions {
			if p.Primary.Node == k.cfg.NodeID {
				named++
			}
		}
	}
	return len(k.leases), named
}
