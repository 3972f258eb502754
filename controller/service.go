package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/internal/buildinfo"
	"github.com/blobplane/blobplane/store"
)

// Service is the controller as a service (`controller run`, issue 30):
// one instance acts at a time (a Postgres advisory lock; standbys wait),
// and each round (A.8) reads the observed state, carries the moves in
// flight forward — publishing a map naming every target that reported
// ready (R79), aborting what missed its deadline before the seal (R75,
// R82) — then places standbys again (republishStandbys: R60, R61), then
// plans and starts new moves: handoffs off draining nodes, recoveries of
// leases that expired on gone nodes, adoptions of forced takeovers. No
// operator is needed for a node that dies or stops.
type Service struct {
	Store    *store.Store
	Signer   authority.Signer
	Settings Settings
	Logger   *slog.Logger
	Metrics  *Metrics
	// AppliedBy names who applies plans in the record (R118).
	AppliedBy string
}

// Metrics are the controller's Prometheus series.
type Metrics struct {
	Registry      *prometheus.Registry
	unavailable   *prometheus.HistogramVec
	moves         *prometheus.CounterVec
	held          *prometheus.CounterVec
	leader        prometheus.Gauge
	frozen        prometheus.Gauge
	rounds        prometheus.Counter
	roundFailures prometheus.Counter
	published     prometheus.Counter
}

// NewMetrics registers the controller's series on a new registry.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(buildinfo.Collector("controller"))
	m := &Metrics{
		Registry: r,
		unavailable: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "blobplane_partition_unavailability_seconds",
			Help:    "Per published move, how long its partition had no serving primary clients could find: from the seal (handoff) or the old lease's last renewal (recovery, an upper bound) to the map naming the new primary (ZBP-5 R79, R135).",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120},
		}, []string{"kind"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_controller_moves_total",
			Help: "Moves by kind (handoff, recover, adopt) and outcome (started, published, aborted).",
		}, []string{"kind", "outcome"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_controller_moves_held_total",
			Help: "Planned moves held back in a round, by brake (frozen, policy, concurrency, cap, no_target).",
		}, []string{"brake"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_controller_leader",
			Help: "1 while this controller holds the leader lock and acts; 0 while it stands by.",
		}),
		frozen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_controller_frozen",
			Help: "1 while the global freeze holds new movement (R123).",
		}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_controller_rounds_total",
			Help: "Reconciliation rounds run as leader.",
		}),
		roundFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_controller_round_failures_total",
			Help: "Rounds that failed (logged); the next round starts over from observed state.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_controller_maps_published_total",
			Help: "Map versions the service published.",
		}),
	}
	r.MustRegister(m.unavailable, m.moves, m.held, m.leader, m.frozen, m.rounds, m.roundFailures, m.published)
	return m
}

func (s *Service) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func (s *Service) metrics() *Metrics {
	if s.Metrics == nil {
		s.Metrics = NewMetrics()
	}
	return s.Metrics
}

// Observe reads the state a round works from (A.8 step 1).
func (s *Service) Observe(ctx context.Context) (Observed, error) {
	st := s.Store
	o := Observed{Leases: map[string]authority.LeaseRecord{}}
	m, err := st.LatestMap(ctx)
	if err != nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		return o, err
	}
	o.Map = m
	leases, err := st.Leases(ctx)
	if err != nil {
		return o, err
	}
	for _, l := range leases {
		o.Leases[l.Partition] = l
	}
	fleet, err := observeFleet(ctx, st)
	if err != nil {
		return o, err
	}
	o.Nodes, o.Present, o.Now = fleet.Nodes, fleet.Present, fleet.Now
	if o.Active, err = st.ActiveHandoffs(ctx); err != nil {
		return o, err
	}
	if o.Frozen, err = st.Frozen(ctx); err != nil {
		return o, err
	}
	reports, err := st.StandbyReports(ctx)
	if err != nil {
		return o, err
	}
	o.Standbys = map[string][]store.StandbyReport{}
	for _, r := range reports {
		o.Standbys[r.Partition] = append(o.Standbys[r.Partition], r)
	}
	if m != nil {
		// Enough history for every partition's latest move in the usual
		// case; an older one is past any cooldown anyway.
		recent, err := st.RecentHandoffs(ctx, 4*len(m.Partitions)+16)
		if err != nil {
			return o, err
		}
		o.LastMoved = map[string]time.Time{}
		for _, h := range recent {
			if h.CreatedAt.After(o.LastMoved[h.Partition]) {
				o.LastMoved[h.Partition] = h.CreatedAt
			}
		}
	}
	return o, nil
}

// DryRun is the plan an automatic round would compute now, against live
// state: the automatic policy (Settings.Auto, DefaultSettings' when nil,
// as Round takes it) and no override. What `controller plan` shows; it
// changes nothing.
func (s *Service) DryRun(ctx context.Context) (Plan, error) {
	o, err := s.Observe(ctx)
	if err != nil {
		return Plan{}, err
	}
	settings := s.Settings.withDefaults()
	return ComputePlan(o, settings, settings.Auto, Override{}), nil
}

// Round is one reconciliation (A.8): carry the moves in flight forward,
// then plan against fresh state and start what the policy applies
// automatically (apply nil: Settings.Auto). It returns the plan.
func (s *Service) Round(ctx context.Context, apply map[string]bool, ov Override) (Plan, error) {
	s.Settings = s.Settings.withDefaults()
	if apply == nil {
		apply = s.Settings.Auto
	}
	o, err := s.Observe(ctx)
	if err != nil {
		return Plan{}, err
	}
	if o.Map == nil {
		return Plan{}, nil
	}
	// Scheduled plans due now start first (R127); what they start is
	// carried forward below and in the next rounds.
	if err := s.runSchedules(ctx); err != nil {
		return Plan{}, err
	}
	if o, err = s.Observe(ctx); err != nil {
		return Plan{}, err
	}
	changed, err := s.progress(ctx, o)
	if err != nil {
		return Plan{}, err
	}
	if changed {
		if o, err = s.Observe(ctx); err != nil {
			return Plan{}, err
		}
	}
	// Standbys follow the fleet (R60, R61): a map whose only change is
	// them, when a standby's node left or a partition short of standbys
	// can have one.
	if changed, err = s.republishStandbys(ctx, o); err != nil {
		return Plan{}, err
	}
	if changed {
		if o, err = s.Observe(ctx); err != nil {
			return Plan{}, err
		}
	}
	reqs, err := s.Store.TakeApplyRequests(ctx)
	if err != nil {
		return Plan{}, err
	}
	settings, apply, ov, by := s.withRequests(reqs, apply, ov)
	p := ComputePlan(o, settings, apply, ov)
	if o.Frozen != nil {
		s.metrics().frozen.Set(1)
	} else {
		s.metrics().frozen.Set(0)
	}
	for _, m := range p.Held {
		s.metrics().held.WithLabelValues(brakeLabel(m.Held)).Inc()
	}
	id, err := s.start(ctx, p, ov, by)
	if err != nil {
		return p, err
	}
	if len(reqs) > 0 {
		ids := make([]int64, len(reqs))
		for i, r := range reqs {
			ids[i] = r.ID
		}
		if err := s.Store.SetApplyRequestsPlan(ctx, ids, id); err != nil {
			return p, err
		}
	}
	return p, nil
}

// withRequests is this round's settings, policy, override and author
// once operators' requests (`controller apply` beside this service) are
// folded in: their kinds widen the policy, an override reason may lift
// the cap (R118, R119), and an operator's apply ignores balance's
// cooldown.
func (s *Service) withRequests(reqs []store.ApplyRequest, apply map[string]bool, ov Override) (Settings, map[string]bool, Override, string) {
	if len(reqs) == 0 {
		return s.Settings, apply, ov, s.AppliedBy
	}
	apply = maps.Clone(apply)
	var who []string
	for _, r := range reqs {
		for _, k := range r.Kinds {
			apply[k] = true
		}
		who = append(who, fmt.Sprintf("%s (request %d)", r.By, r.ID))
		if r.OverrideReason != "" && ov.Reason == "" {
			ov = Override{By: r.By, Reason: r.OverrideReason}
		}
	}
	return deliberate(s).Settings, apply, ov, "controller apply by " + strings.Join(who, ", ")
}

func brakeLabel(held string) string {
	for _, b := range []string{"frozen", "awaiting", "concurrency", "movement cap", "no target"} {
		if len(held) >= len(b) && held[:len(b)] == b {
			switch b {
			case "awaiting":
				return "policy"
			case "movement cap":
				return "cap"
			case "no target":
				return "no_target"
			}
			return b
		}
	}
	return "other"
}

// start records the plan (R118) and creates its handoffs (A.4 step 1).
func (s *Service) start(ctx context.Context, p Plan, ov Override, by string) (int64, error) {
	if len(p.Moves) == 0 {
		return 0, nil
	}
	triggers := map[string]bool{}
	for _, m := range p.Moves {
		triggers[m.Trigger] = true
	}
	trig := make([]string, 0, len(triggers))
	for t := range triggers {
		trig = append(trig, t)
	}
	slices.Sort(trig)
	if by == "" {
		by = "controller run"
	}
	id, err := s.Store.RecordPlan(ctx, store.PlanRecord{
		Trigger: fmt.Sprint(trig), Moves: p.Moves, MovedSlots: p.MovedSlots, TotalSlots: p.TotalSlots,
		OverrideBy: ov.By, OverrideReason: ov.Reason, AppliedBy: by,
	})
	if err != nil {
		return 0, err
	}
	ended := map[string]bool{}
	for _, m := range p.Moves {
		if m.Stuck && !ended[m.From] {
			// A paused node's open transactions hold its lease rows:
			// end them, or the recovery waits for Postgres's idle
			// timeout (and the target's claims for their lock timeout).
			ended[m.From] = true
			n, err := s.Store.TerminateNodeSessions(ctx, m.From)
			if err != nil {
				return id, err
			}
			s.logger().Warn("ended the sessions of a node that stopped renewing", "node", m.From, "sessions", n)
		}
		h, err := s.Store.CreateHandoff(ctx, authority.Handoff{
			PlanID: id, Partition: m.Partition, Kind: m.Kind, From: m.From, FromEpoch: m.FromEpoch,
			To: m.To, ToEndpoint: m.ToEndpoint, Reason: m.Reason, UnavailableSince: m.Since,
		}, s.Settings.HandoffDeadline)
		if blobplane.ErrorCode(err) == blobplane.CodeConflict {
			continue // a move of it started meanwhile (another controller's last act)
		}
		if err != nil {
			return id, err
		}
		s.metrics().moves.WithLabelValues(string(m.Kind), "started").Inc()
		s.logger().Info("move started", "handoff", h.ID, "plan", id, "partition", m.Partition, "kind", m.Kind,
			"from", m.From, "epoch", m.FromEpoch, "to", m.To, "reason", m.Reason)
	}
	return id, nil
}

// progress carries the moves in flight forward: publish one map naming
// the target of every ready move (R79) and of every sealed move past its
// deadline (R76, R82: it only goes forward), with the adoptions of forced
// takeovers; abort what cannot finish before its seal (R75, R82). These
// are not brakes' business: a freeze or the cap never holds back the
// completion of a move already past its seal (R122, R123).
func (s *Service) progress(ctx context.Context, o Observed) (changed bool, err error) {
	var publish []authority.Handoff
	for _, h := range o.Active {
		switch why := abortReason(o, h); {
		case h.State == authority.HandoffReady,
			h.State == authority.HandoffSealed && !o.Now.Before(h.Deadline):
			publish = append(publish, h)
		case why != "" && h.Kind.Grouped():
			// A group is abandoned whole: its parents are sealed together.
			for _, x := range o.Active {
				if x.GroupID == h.GroupID && !x.PastSeal() {
					if _, err := s.Store.AbortHandoff(ctx, x.ID, why); err != nil {
						return changed, err
					}
					changed = true
				}
			}
			s.logger().Warn("split/merge aborted before its seal; nothing changed", "group", h.GroupID, "reason", why)
		case why != "":
			ok, err := s.Store.AbortHandoff(ctx, h.ID, why)
			if err != nil {
				return changed, err
			}
			if ok {
				changed = true
				s.metrics().moves.WithLabelValues(string(h.Kind), "aborted").Inc()
				s.logger().Warn("move aborted before its seal; nothing changed", "handoff", h.ID, "partition", h.Partition, "reason", why)
			}
		}
	}
	adopt := ComputePlan(o, s.Settings, nil, Override{}).Adoptions
	if len(publish) == 0 && len(adopt) == 0 {
		return changed, nil
	}
	if err := s.publishMoves(ctx, o, publish, adopt); err != nil {
		return changed, err
	}
	return true, nil
}

// abortReason says why a move in flight before its seal cannot finish,
// "" when it may.
func abortReason(o Observed, h authority.Handoff) string {
	if h.PastSeal() {
		return ""
	}
	if !o.Now.Before(h.Deadline) {
		return fmt.Sprintf("deadline passed in %s before the seal", h.State)
	}
	if !o.Present[h.To] || o.Nodes[h.To].Draining {
		return "target " + h.To + " is gone or draining"
	}
	l, ok := o.Leases[h.Partition]
	switch h.Kind {
	case authority.KindHandoff, authority.KindSplit, authority.KindMerge:
		if !ok || l.Epoch != h.FromEpoch || l.OwnerNode != h.From {
			return "the lease moved before the seal"
		}
	case authority.KindRecover:
		if ok && l.ExpiresAt.After(o.Now) && l.OwnerNode != h.To {
			return "the lease was claimed by " + l.OwnerNode
		}
	}
	return ""
}

// publishMoves publishes the map that names the targets of moves and the
// owners of adoptions, then records the moves published with their
// outage (R135).
func (s *Service) publishMoves(ctx context.Context, o Observed, moves []authority.Handoff, adopt []Adoption) error {
	next := o.Map.Clone()
	next.Signature = nil
	groups := map[int64]bool{}
	for _, h := range moves {
		if !h.Kind.Grouped() {
			setPrimary(next, h.Partition, h.To, h.ToEndpoint)
			continue
		}
		if !groups[h.GroupID] { // once per split or merge: its parents give way to its children
			groups[h.GroupID] = true
			if err := applyGroup(next, h); err != nil {
				return err
			}
		}
	}
	for _, a := range adopt {
		setPrimary(next, a.Partition, a.To, a.Endpoint)
	}
	// Standbys follow the new primaries (R60, R61): a standby promoted
	// stops being one, a gone old primary is never one, the children of
	// a split or merge get theirs; partitions whose moves are still in
	// flight keep theirs.
	skip := movingPartitions(o.Active)
	for _, h := range moves {
		delete(skip, h.Partition)
	}
	placeStandbys(next, standbyClasses, o, s.Settings, skip)
	next.Version = o.Map.Version + 1
	next.GeneratedAt = time.Now().UTC().Truncate(time.Millisecond)
	leases := make([]authority.LeaseRecord, 0, len(o.Leases))
	for _, l := range o.Leases {
		leases = append(leases, l)
	}
	raiseEpochs(next, leases)
	if err := publishNext(ctx, s.Store, s.Signer, o.Map, next); err != nil {
		if errors.Is(err, ErrNothingChanged) {
			err = nil
		} else {
			return err
		}
	} else {
		s.metrics().published.Inc()
		// R122: a map completing moves is never held back by a canary;
		// the canaries it supersedes are withdrawn.
		if n, err := s.Store.SupersedeCanaries(ctx, next.Version, fmt.Sprintf("superseded by version %d, which completes moves (R122)", next.Version)); err != nil {
			return err
		} else if n > 0 {
			s.logger().Warn("pending canary superseded by a map completing moves (R122)", "map_version", next.Version, "canaries", n)
		}
	}
	ids := make([]int64, len(moves))
	for i, h := range moves {
		ids[i] = h.ID
	}
	done, err := s.Store.PublishHandoffs(ctx, ids, next.Version)
	if err != nil {
		return err
	}
	for _, h := range done {
		s.metrics().moves.WithLabelValues(string(h.Kind), "published").Inc()
		s.metrics().unavailable.WithLabelValues(string(h.Kind)).Observe(h.Unavailable().Seconds())
		s.logger().Info("move published", "handoff", h.ID, "partition", h.Partition, "kind", h.Kind, "to", h.To,
			"epoch", h.ToEpoch, "map_version", next.Version, "unavailable", h.Unavailable())
	}
	for _, a := range adopt {
		s.metrics().moves.WithLabelValues("adopt", "published").Inc()
		s.logger().Info("map follows a forced takeover", "partition", a.Partition, "to", a.To, "epoch", a.Epoch, "map_version", next.Version)
	}
	return nil
}

func setPrimary(m *authority.Map, partition, node, endpoint string) {
	p := m.Partition(partition)
	if p == nil {
		return
	}
	p.Primary = authority.Primary{Node: node, Endpoint: endpoint, State: PublishedState}
	p.Standbys = slices.DeleteFunc(p.Standbys, func(s authority.Standby) bool { return s.Node == node })
}

// Run acts as the controller while it holds the leader lock, and stands
// by otherwise, until ctx ends. wake (may be nil) starts a round at once
// (a handoff changed, a map was published).
func (s *Service) Run(ctx context.Context, wake <-chan struct{}) error {
	s.Settings = s.Settings.withDefaults()
	t := time.NewTicker(s.Settings.Tick)
	defer t.Stop()
	var lock *store.ControllerLock
	defer func() {
		if lock != nil {
			lock.Release()
		}
	}()
	standby := false
	for {
		if lock == nil {
			l, err := s.Store.TryControllerLock(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				s.logger().Warn("controller lock", "err", err)
			case l != nil:
				lock, standby = l, false
				s.metrics().leader.Set(1)
				s.logger().Info("controller: leader; acting on the fleet")
			case !standby:
				standby = true
				s.logger().Info("controller: another controller is active; standing by")
			}
		}
		if lock != nil {
			if err := lock.Check(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.logger().Error("controller: leader lock lost; standing by", "err", err)
				lock.Release()
				lock = nil
				s.metrics().leader.Set(0)
				continue
			}
			s.metrics().rounds.Inc()
			if _, err := s.Round(ctx, nil, Override{}); err != nil && ctx.Err() == nil {
				s.metrics().roundFailures.Inc()
				s.logger().Warn("controller round failed; the next one starts over", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-wake:
		}
	}
}
