package controller

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Plan kinds: what triggered a move, each with its own apply policy
// (R118: automatic, or held for an operator's `controller apply`).
const (
	// TriggerDrain moves the partitions of a node that received its
	// termination signal (R83), live (A.4).
	TriggerDrain = "drain"
	// TriggerRecover moves a partition whose lease expired on a node that
	// is gone or no longer renews (A.3).
	TriggerRecover = "recover"
	// TriggerBalance moves a partition, live, from the most loaded api
	// node of a datacenter to the least loaded (A.8 step 3, R115: only
	// when no required move is planned or in flight).
	TriggerBalance = "balance"
)

// Kinds are every plan kind, in the order ComputePlan weighs them.
var Kinds = []string{TriggerDrain, TriggerRecover, TriggerBalance}

// Settings tune the controller service (docs/authority.md "Moves"; every
// one is a BLOBPLANE_CONTROLLER_* setting).
type Settings struct {
	// Tick is the longest wait between two rounds; notifications on the
	// handoffs and the map wake it sooner.
	Tick time.Duration
	// HandoffDeadline bounds a handoff before its seal (R82): past it,
	// the handoff aborts and the outgoing primary keeps serving (R75);
	// after the seal it completes by recovery (R76).
	HandoffDeadline time.Duration
	// FailoverGrace is how long a lease must have been expired before
	// its partition is recovered elsewhere when its node is gone (its
	// presence lock went with its connections) or draining.
	FailoverGrace time.Duration
	// LiveNodeGrace is the same wait when the node is still connected:
	// its keeper claims the lease back by itself within a renewal
	// interval, so a blip (Postgres restarting, a slow renewal) moves
	// nothing; a node connected but not renewing for this long is stuck
	// and its partitions move.
	LiveNodeGrace time.Duration
	// NodeDeadAfter: a node whose heartbeat is older is never a target.
	NodeDeadAfter time.Duration
	// MaxConcurrent and MaxPerNode bound the moves in flight, globally
	// and per node as source or target (R81, R116).
	MaxConcurrent int
	MaxPerNode    int
	// MaxMoveFraction caps the slots one plan moves, relative to the map
	// (R119); a plan beyond it needs an override with a reason. The
	// first move of a plan is always allowed, so a map of few partitions
	// can still recover.
	MaxMoveFraction float64
	// Auto lists the plan kinds applied without an operator (R118);
	// the others wait for `controller apply`.
	Auto map[string]bool
	// BalanceCooldown is balance's hysteresis (R116): a partition moved
	// (for any reason) more recently is not moved to balance, so load
	// settles before it is judged again.
	BalanceCooldown time.Duration
}

// DefaultSettings are the controller service's defaults.
var DefaultSettings = Settings{
	Tick:            500 * time.Millisecond,
	HandoffDeadline: 5 * time.Second,
	FailoverGrace:   250 * time.Millisecond,
	LiveNodeGrace:   30 * time.Second,
	NodeDeadAfter:   45 * time.Second,
	MaxConcurrent:   8,
	MaxPerNode:      4,
	MaxMoveFraction: 0.5,
	Auto:            map[string]bool{TriggerDrain: true, TriggerRecover: true},
	BalanceCooldown: time.Minute,
}

// withDefaults fills zero fields from DefaultSettings.
func (s Settings) withDefaults() Settings {
	d := DefaultSettings
	if s.Tick <= 0 {
		s.Tick = d.Tick
	}
	if s.HandoffDeadline <= 0 {
		s.HandoffDeadline = d.HandoffDeadline
	}
	if s.FailoverGrace <= 0 {
		s.FailoverGrace = d.FailoverGrace
	}
	if s.LiveNodeGrace <= 0 {
		s.LiveNodeGrace = d.LiveNodeGrace
	}
	if s.NodeDeadAfter <= 0 {
		s.NodeDeadAfter = d.NodeDeadAfter
	}
	if s.MaxConcurrent <= 0 {
		s.MaxConcurrent = d.MaxConcurrent
	}
	if s.MaxPerNode <= 0 {
		s.MaxPerNode = d.MaxPerNode
	}
	if s.MaxMoveFraction <= 0 {
		s.MaxMoveFraction = d.MaxMoveFraction
	}
	if s.Auto == nil {
		s.Auto = d.Auto
	}
	if s.BalanceCooldown <= 0 {
		s.BalanceCooldown = d.BalanceCooldown
	}
	return s
}

// Observed is what one round reads (A.8 step 1), all on the database's
// clock (Now).
type Observed struct {
	Map     *authority.Map
	Leases  map[string]authority.LeaseRecord
	Nodes   map[string]store.PlacementNode
	Present map[string]bool
	Active  []authority.Handoff
	Frozen  *store.FreezeState
	Now     time.Time
	// LastMoved is when each partition recently moved (its latest
	// handoff's creation), for balance's cooldown.
	LastMoved map[string]time.Time
	// Standbys are the standbys' last reports, by partition
	// (store.StandbyReports): a move's target is its synced standby
	// when it has one (R73).
	Standbys map[string][]store.StandbyReport
}

// Move is one planned move of a partition.
type Move struct {
	Partition  string                `json:"partition"`
	Trigger    string                `json:"trigger"`
	Kind       authority.HandoffKind `json:"kind"`
	From       string                `json:"from"`
	FromEpoch  uint64                `json:"from_epoch"`
	To         string                `json:"to,omitempty"`
	ToEndpoint string                `json:"to_endpoint,omitempty"`
	Slots      uint64                `json:"slots"`
	Reason     string                `json:"reason"`
	// Since is when the partition stopped being served, for a recovery:
	// the expired lease's last renewal.
	Since time.Time `json:"-"`
	// Stuck: the recovery is from a node still connected to Postgres
	// that stopped renewing (paused, wedged); its sessions are ended
	// before the move starts (store.TerminateNodeSessions).
	Stuck bool `json:"stuck,omitempty"`
	// Held says why the move does not start now ("" when it does).
	Held string `json:"held,omitempty"`
}

// Adoption is a map change that follows a lease already held elsewhere
// than the map says (a force-takeover, R26): nothing moves, the map
// catches up with the lease store.
type Adoption struct {
	Partition string `json:"partition"`
	From      string `json:"from"`
	To        string `json:"to"`
	Endpoint  string `json:"endpoint"`
	Epoch     uint64 `json:"epoch"`
}

// Plan is what a round would do (A.8 steps 2–5, R117): the moves it
// starts, the ones it holds back and why, and the adoptions.
type Plan struct {
	MapVersion uint64             `json:"map_version"`
	Moves      []Move             `json:"moves"` // to start
	Held       []Move             `json:"held"`  // planned but held: freeze, concurrency, cap, policy, no target
	Adoptions  []Adoption         `json:"adoptions"`
	MovedSlots uint64             `json:"moved_slots"`
	TotalSlots uint64             `json:"total_slots"`
	Frozen     *store.FreezeState `json:"frozen"`
}

// Override lets one plan move more than MaxMoveFraction (R119): who
// and why, recorded with the plan.
type Override struct {
	By, Reason string
}

// ComputePlan is A.8 steps 2–4 over what was observed: for every
// partition with no move in flight, a drain handoff when its primary is
// draining, a recovery when its lease expired past the grace, an adoption
// when a live node holds its lease but the map names another; then the
// brakes (freeze R123, concurrency R81 and R116, the movement cap
// R119, the apply policy R118). Deterministic: partitions in id order,
// targets by datacenter, load, then id.
func ComputePlan(o Observed, s Settings, apply map[string]bool, ov Override) Plan {
	s = s.withDefaults()
	p := Plan{Frozen: o.Frozen}
	if o.Map == nil {
		return p
	}
	p.MapVersion = o.Map.Version
	p.TotalSlots = authority.SlotCount(o.Map.SlotBits)
	c := newCounts(o)
	for _, part := range o.Map.Partitions {
		if c.moving[part.ID] {
			continue
		}
		if a, ok := adoption(o, part); ok {
			p.Adoptions = append(p.Adoptions, a)
			continue
		}
		m, ok := needsMove(o, s, part)
		if !ok {
			continue
		}
		m.Held = brake(o, s, c, &m, apply, ov, p.MovedSlots, p.TotalSlots, len(p.Moves))
		if m.Held != "" {
			p.Held = append(p.Held, m)
			continue
		}
		c.start(m)
		p.MovedSlots += m.Slots
		p.Moves = append(p.Moves, m)
	}
	if len(p.Moves)+len(p.Held)+len(p.Adoptions) == 0 && len(o.Active) == 0 {
		balance(o, s, c, &p, apply, ov)
	}
	return p
}

// balance is A.8 step 3 once the constraints hold (no required move, no
// move in flight): within each datacenter, while its most loaded
// eligible api node homes at least two partitions more than its least
// loaded, one partition goes from the first to the second — the fewest
// moves that bring the spread to one (R115: movement before balance).
// Hysteresis (R116): a spread of one moves nothing, a partition moved
// within BalanceCooldown stays, and a node that is not eligible (gone,
// stale, draining: a heartbeat blip) is neither a source nor a target,
// so a blip moves nothing.
func balance(o Observed, s Settings, c *counts, p *Plan, apply map[string]bool, ov Override) {
	// Within a datacenter and a class (R112): partitions go only to nodes
	// of their class.
	byDC := map[string][]string{}
	for _, n := range o.Nodes {
		if eligible(o, s, n) {
			g := n.Datacenter + "/" + cmp.Or(n.Class, "standard")
			byDC[g] = append(byDC[g], n.ID)
		}
	}
	homed := map[string][]authority.Partition{}
	for _, part := range o.Map.Partitions {
		homed[part.Primary.Node] = append(homed[part.Primary.Node], part)
	}
	for _, dc := range slices.Sorted(maps.Keys(byDC)) {
		ids := byDC[dc]
		for len(ids) > 1 {
			slices.SortFunc(ids, func(a, b string) int { return cmp.Or(cmp.Compare(c.load[a], c.load[b]), cmp.Compare(a, b)) })
			lo, hi := ids[0], ids[len(ids)-1]
			if c.load[hi]-c.load[lo] < 2 {
				break
			}
			part, ok := balanceCandidate(o, s, c, homed[hi], o.Nodes[lo])
			if !ok {
				// Nothing on hi may move now: judge the others without it.
				ids = ids[:len(ids)-1]
				continue
			}
			l := o.Leases[part.ID]
			m := Move{Partition: part.ID, From: hi, FromEpoch: l.Epoch, Slots: slotCount(part),
				Trigger: TriggerBalance, Kind: authority.KindHandoff, To: lo, ToEndpoint: Endpoint(o.Nodes[lo].Endpoint),
				Reason: fmt.Sprintf("balance %s: %s homes %d partitions, %s %d", dc, hi, c.load[hi], lo, c.load[lo])}
			if m.Held = brake(o, s, c, &m, apply, ov, p.MovedSlots, p.TotalSlots, len(p.Moves)); m.Held != "" {
				p.Held = append(p.Held, m)
				if o.Frozen != nil || apply[TriggerBalance] {
					return // a brake: the rest would wait for the same
				}
				// Awaiting an operator: list what `controller apply`
				// would start, as if it had.
				c.start(m)
				continue
			}
			c.start(m)
			p.MovedSlots += m.Slots
			p.Moves = append(p.Moves, m)
		}
	}
}

// balanceCandidate is the first partition (by id) of from's that may
// move to to to balance: its lease live and serving on from, not moving,
// not moved within the cooldown, of to's class with room in its budget.
func balanceCandidate(o Observed, s Settings, c *counts, homed []authority.Partition, to store.PlacementNode) (authority.Partition, bool) {
	for _, part := range homed {
		l, ok := o.Leases[part.ID]
		if c.moving[part.ID] || !ok || l.OwnerNode != part.Primary.Node || l.State != authority.PrimaryServing || !l.ExpiresAt.After(o.Now) || !fits(c, to, part.Class) {
			continue
		}
		if at, moved := o.LastMoved[part.ID]; moved && o.Now.Sub(at) < s.BalanceCooldown {
			continue
		}
		return part, true
	}
	return authority.Partition{}, false
}

// eligible: n may home partitions now — an api node that is up,
// connected, fresh, not draining, with an endpoint (target's test, load
// aside).
func eligible(o Observed, s Settings, n store.PlacementNode) bool {
	return n.Up && !n.Draining && o.Present[n.ID] && n.HeartbeatAge <= s.NodeDeadAfter && Endpoint(n.Endpoint) != ""
}

// adoption: the lease is live on a present node other than the map's
// primary (a force-takeover, R26): publish what already is.
func adoption(o Observed, part authority.Partition) (Adoption, bool) {
	l, ok := o.Leases[part.ID]
	if !ok || !l.ExpiresAt.After(o.Now) || l.OwnerNode == part.Primary.Node || l.State == authority.PrimarySealed {
		return Adoption{}, false
	}
	n, known := o.Nodes[l.OwnerNode]
	if !known || !o.Present[l.OwnerNode] || Endpoint(n.Endpoint) == "" {
		return Adoption{}, false
	}
	return Adoption{Partition: part.ID, From: part.Primary.Node, To: l.OwnerNode, Endpoint: Endpoint(n.Endpoint), Epoch: l.Epoch}, true
}

// needsMove says whether part must move and how: a drain handoff from a
// draining primary that holds its lease, or a recovery of an expired (or
// never claimed) lease past its grace.
func needsMove(o Observed, s Settings, part authority.Partition) (Move, bool) {
	primary := part.Primary.Node
	node, known := o.Nodes[primary]
	draining := known && node.Draining
	present := o.Present[primary]
	l, hasLease := o.Leases[part.ID]
	m := Move{Partition: part.ID, From: primary, Slots: slotCount(part)}
	live := hasLease && l.ExpiresAt.After(o.Now)
	switch {
	case live && draining && l.OwnerNode == primary && l.State != authority.PrimarySealed:
		m.Trigger, m.Kind, m.FromEpoch = TriggerDrain, authority.KindHandoff, l.Epoch
		m.Reason = "drain of " + primary
		return m, true
	case live:
		return Move{}, false
	}
	grace := s.LiveNodeGrace
	why := "connected but not renewing"
	if !present || draining {
		grace, why = s.FailoverGrace, "gone"
		if draining && present {
			why = "draining"
		}
	}
	if hasLease {
		if o.Now.Sub(l.ExpiresAt) < grace {
			return Move{}, false
		}
		m.FromEpoch = l.Epoch
		m.Since = l.ExpiresAt.Add(-l.TTL) // the last renewal: its holder proved it could write
	} else if present && !draining {
		return Move{}, false // never claimed, its node is up: its keeper claims it
	}
	m.Trigger, m.Kind = TriggerRecover, authority.KindRecover
	m.Stuck = present && !draining
	m.Reason = fmt.Sprintf("lease expired on %s (%s)", primary, why)
	return m, true
}

// counts are the per-node numbers the brakes and the target choice use.
type counts struct {
	moving   map[string]bool // partitions with a move in flight
	busy     map[string]int  // moves in flight per node (source or target)
	load     map[string]int  // partitions per node, moves in flight applied
	inflight int
}

func newCounts(o Observed) *counts {
	c := &counts{moving: map[string]bool{}, busy: map[string]int{}, load: map[string]int{}}
	for _, part := range o.Map.Partitions {
		c.load[part.Primary.Node]++
	}
	for _, h := range o.Active {
		c.moving[h.Partition] = true
		c.busy[h.From]++
		c.busy[h.To]++
		c.load[h.From]--
		c.load[h.To]++
		c.inflight++
	}
	return c
}

func (c *counts) start(m Move) {
	c.moving[m.Partition] = true
	c.busy[m.From]++
	c.busy[m.To]++
	c.load[m.From]--
	c.load[m.To]++
	c.inflight++
}

// brake returns why m must wait, "" when it may start now; it picks m's
// target.
func brake(o Observed, s Settings, c *counts, m *Move, apply map[string]bool, ov Override, moved, total uint64, started int) string {
	switch {
	case o.Frozen != nil:
		return fmt.Sprintf("frozen by %s: %s", o.Frozen.By, o.Frozen.Reason)
	case !apply[m.Trigger]:
		return "awaiting an operator (controller apply): " + m.Trigger + " is not applied automatically"
	case c.inflight >= s.MaxConcurrent:
		return fmt.Sprintf("concurrency: %d moves in flight (max %d)", c.inflight, s.MaxConcurrent)
	case m.Kind == authority.KindHandoff && c.busy[m.From] >= s.MaxPerNode:
		return fmt.Sprintf("concurrency: %s is in %d moves (max %d per node)", m.From, c.busy[m.From], s.MaxPerNode)
	case started > 0 && ov.Reason == "" && float64(moved+m.Slots) > s.MaxMoveFraction*float64(total):
		return fmt.Sprintf("movement cap: %d + %d of %d slots exceeds %.0f%% (controller apply --override-reason)", moved, m.Slots, total, 100*s.MaxMoveFraction)
	}
	if m.To != "" { // chosen by balance
		if c.busy[m.To] >= s.MaxPerNode {
			return fmt.Sprintf("concurrency: %s is in %d moves (max %d per node)", m.To, c.busy[m.To], s.MaxPerNode)
		}
		return ""
	}
	part := o.Map.Partition(m.Partition)
	to, ok := target(o, s, c, m.From, *part)
	if !ok {
		return fmt.Sprintf("no target: no other api node of class %s is connected, fresh, not draining, below its capacity budget and its move limit", part.Class)
	}
	m.To, m.ToEndpoint = to.ID, Endpoint(to.Endpoint)
	if syncedStandby(o, *part, to.ID) {
		m.Reason += "; to its synced standby " + to.ID
	}
	return ""
}

// target chooses where part, homed on from, goes: a present, fresh, up,
// non-draining api node other than from, of its class with room in its
// capacity budget (R112: constraints first), below its move limit; its
// synced standby first (syncedStandby: it takes over by catching up its
// lag, R73), then the same datacenter as from, then the least loaded,
// then by id.
func target(o Observed, s Settings, c *counts, from string, part authority.Partition) (store.PlacementNode, bool) {
	dc := o.Nodes[from].Datacenter
	var cands []store.PlacementNode
	synced := map[string]bool{}
	for _, n := range o.Nodes {
		if n.ID == from || !eligible(o, s, n) || !fits(c, n, part.Class) || c.busy[n.ID] >= s.MaxPerNode {
			continue
		}
		cands = append(cands, n)
		synced[n.ID] = syncedStandby(o, part, n.ID)
	}
	if len(cands) == 0 {
		return store.PlacementNode{}, false
	}
	return slices.MinFunc(cands, func(a, b store.PlacementNode) int {
		return cmp.Or(preferTrue(synced[a.ID], synced[b.ID]), preferTrue(a.Datacenter == dc, b.Datacenter == dc),
			cmp.Compare(c.load[a.ID], c.load[b.ID]), cmp.Compare(a.ID, b.ID))
	}), true
}

// PartitionEstimate is each partition's capacity estimate in a node's
// budget (R112): Blobplane's partitions are DERIVED — no state to hold,
// no measured traffic per partition — so each costs one unit, and a
// node's budget (BLOBPLANE_NODE_CAPACITY) is the most partitions it
// homes.
const PartitionEstimate = 1

// fits: n may take one more partition of class (R112): the class its api
// declared (an undeclared one is "standard") and room in its budget (0:
// undeclared, unbounded).
func fits(c *counts, n store.PlacementNode, class string) bool {
	if cmp.Or(n.Class, "standard") != cmp.Or(class, "standard") {
		return false
	}
	return n.Capacity <= 0 || (c.load[n.ID]+1)*PartitionEstimate <= n.Capacity
}

func slotCount(p authority.Partition) uint64 {
	var n uint64
	for _, r := range p.Slots {
		n += uint64(r.High-r.Low) + 1
	}
	return n
}

// Print renders the plan for an operator (`controller plan --dry-run`).
func (p Plan) Print(w io.Writer) {
	if p.MapVersion == 0 {
		fmt.Fprintln(w, "no partition map published yet (run: controller publish)")
		return
	}
	fmt.Fprintf(w, "plan against map version %d: %d move(s), %d held, %d adoption(s); %d of %d slots move\n",
		p.MapVersion, len(p.Moves), len(p.Held), len(p.Adoptions), p.MovedSlots, p.TotalSlots)
	if p.Frozen != nil {
		fmt.Fprintf(w, "FROZEN by %s since %s: %s\n", p.Frozen.By, p.Frozen.At.UTC().Format(time.RFC3339), p.Frozen.Reason)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(p.Moves)+len(p.Held) > 0 {
		fmt.Fprintln(tw, "PARTITION\tKIND\tFROM\tEPOCH\tTO\tSLOTS\tREASON\tHELD")
	}
	for _, m := range append(slices.Clone(p.Moves), p.Held...) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", m.Partition, m.Kind, m.From, m.FromEpoch, dash(m.To), m.Slots, m.Reason, dash(m.Held))
	}
	for _, a := range p.Adoptions {
		fmt.Fprintf(tw, "%s\tadopt\t%s\t%d\t%s\t-\tlease held by %s (force-takeover)\t-\n", a.Partition, a.From, a.Epoch, a.To, a.To)
	}
	tw.Flush()
}

func dash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
