package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Split and merge (A.5, A.6; R3, R16, R89–R96). A Blobplane partition is
// MIXED — its ledger is in Postgres, and a child's quota state is
// bootstrapped from the ledger into its own journal when it first serves —
// so a child restores nothing from its parents:
// the group's parents are sealed together by the node holding them, the
// target claims every child's lease at an epoch above its parents'
// (ClaimChildLease refuses before every parent is sealed: no slot is ever
// served by a parent and a child at once), and the map replacing the
// parents by the children is published when every child serves (R79).

// SplitRequest asks for partition to be split in two.
type SplitRequest struct {
	Partition string
	// At is the first slot of the second child; 0 splits the slots in
	// halves. A partition of a single slot is split after the map's
	// slot_bits are refined (R3: nothing moves).
	At authority.Slot
	// To is the node that serves the children; "" keeps them on the
	// parent's primary (they can be moved afterwards).
	To     string
	By     string
	Reason string
}

// MergeRequest asks for partitions, all served by one node, to be merged
// into one.
type MergeRequest struct {
	Partitions []string
	To         string
	By         string
	Reason     string
}

// Split starts a split: it records the plan and creates its group; the
// service (or Apply) carries it forward. It returns the group id.
func (s *Service) Split(ctx context.Context, r SplitRequest) (int64, error) {
	o, err := s.Observe(ctx)
	if err != nil {
		return 0, err
	}
	p, err := servedPartition(o, r.Partition)
	if err != nil {
		return 0, err
	}
	if slotCount(*p) < 2 {
		if o, err = s.refine(ctx, o); err != nil {
			return 0, err
		}
		p = o.Map.Partition(r.Partition)
	}
	a, b, err := splitSlots(p.Slots, r.At)
	if err != nil {
		return 0, err
	}
	ids, err := authority.NewPartitionIDs(nil, 2, takenIDs(o))
	if err != nil {
		return 0, err
	}
	l := o.Leases[p.ID]
	parents := []authority.ParentRef{{ID: p.ID, Generation: p.Generation}}
	children := []authority.Child{
		{ID: ids[0], Generation: p.Generation + 1, Epoch: authority.ChildEpoch(l.Epoch), Slots: a, Parents: parents},
		{ID: ids[1], Generation: p.Generation + 1, Epoch: authority.ChildEpoch(l.Epoch), Slots: b, Parents: parents},
	}
	return s.startGroup(ctx, o, authority.KindSplit, []*authority.Partition{p}, children, r.To, r.By, r.Reason)
}

// Merge starts a merge of partitions (all served by one node) into one.
func (s *Service) Merge(ctx context.Context, r MergeRequest) (int64, error) {
	o, err := s.Observe(ctx)
	if err != nil {
		return 0, err
	}
	if len(r.Partitions) < 2 {
		return 0, blobplane.Errorf(blobplane.CodeInvalid, "a merge needs at least two partitions")
	}
	var ps []*authority.Partition
	var slots []authority.SlotRange
	var parents []authority.ParentRef
	var gen uint64
	var epochs []uint64
	for _, id := range r.Partitions {
		p, err := servedPartition(o, id)
		if err != nil {
			return 0, err
		}
		if slices.Contains(ps, p) {
			return 0, blobplane.Errorf(blobplane.CodeInvalid, "partition %s named twice", id)
		}
		if len(ps) > 0 && p.Primary.Node != ps[0].Primary.Node {
			return 0, blobplane.Errorf(blobplane.CodeInvalid,
				"%s is served by %s and %s by %s: a merge's parents are sealed together by one node; move them to one node first (controller takeover, or drain)",
				ps[0].ID, ps[0].Primary.Node, p.ID, p.Primary.Node)
		}
		ps = append(ps, p)
		slots = append(slots, p.Slots...)
		parents = append(parents, authority.ParentRef{ID: p.ID, Generation: p.Generation})
		gen = max(gen, p.Generation)
		epochs = append(epochs, o.Leases[id].Epoch)
	}
	// R90: the parents' ranges must be adjacent — each joining another's,
	// so the union has at least len(parents)-1 fewer ranges.
	if merged := coalesce(slots); len(merged) > len(slots)-(len(ps)-1) {
		return 0, blobplane.Errorf(blobplane.CodeInvalid, "partitions %v are not adjacent (their slots %v): a merge combines neighbours (R90)", r.Partitions, merged)
	}
	ids, err := authority.NewPartitionIDs(nil, 1, takenIDs(o))
	if err != nil {
		return 0, err
	}
	slices.SortFunc(parents, func(a, b authority.ParentRef) int { return cmp.Compare(a.ID, b.ID) })
	child := authority.Child{ID: ids[0], Generation: gen + 1, Epoch: authority.ChildEpoch(epochs...), Slots: coalesce(slots), Parents: parents}
	return s.startGroup(ctx, o, authority.KindMerge, ps, []authority.Child{child}, r.To, r.By, r.Reason)
}

func (s *Service) startGroup(ctx context.Context, o Observed, kind authority.HandoffKind, ps []*authority.Partition, children []authority.Child, to, by, reason string) (int64, error) {
	if by == "" || reason == "" {
		return 0, blobplane.Errorf(blobplane.CodeInvalid, "a %s needs an operator and a reason (R118: every plan records what triggered it)", kind)
	}
	if o.Frozen != nil {
		return 0, blobplane.Errorf(blobplane.CodeConflict, "frozen by %s (%s): no new movement (R123)", o.Frozen.By, o.Frozen.Reason)
	}
	from := ps[0].Primary.Node
	if to == "" {
		to = from
	}
	n, ok := o.Nodes[to]
	if !ok || !n.Up || n.Draining || !o.Present[to] || Endpoint(n.Endpoint) == "" {
		return 0, blobplane.Errorf(blobplane.CodeInvalid, "node %s cannot take the children: not an api node that is up, connected and not draining", to)
	}
	// R112: the children keep their parents' class; the node must be of
	// it and have room for them in its budget.
	c := newCounts(o)
	for _, p := range ps {
		if p.Primary.Node == to {
			c.load[to]--
		}
	}
	c.load[to] += len(children) - 1
	if !fits(c, n, ps[0].Class) {
		return 0, blobplane.Errorf(blobplane.CodeConflict, "node %s cannot take the children: class %s, capacity budget %d partitions (homes %d)", to, cmp.Or(n.Class, "standard"), n.Capacity, newCounts(o).load[to])
	}
	var moved uint64
	for _, p := range ps {
		moved += slotCount(*p)
	}
	s.Settings = s.Settings.withDefaults()
	plan, err := s.Store.RecordPlan(ctx, planRecord(kind, ps, children, to, by, reason, moved, authority.SlotCount(o.Map.SlotBits)))
	if err != nil {
		return 0, err
	}
	var hs []authority.Handoff
	for _, p := range ps {
		hs = append(hs, authority.Handoff{PlanID: plan, Partition: p.ID, Kind: kind, From: from, FromEpoch: o.Leases[p.ID].Epoch,
			To: to, ToEndpoint: Endpoint(n.Endpoint), Reason: fmt.Sprintf("%s by %s: %s", kind, by, reason)})
	}
	g, err := s.Store.CreateGroup(ctx, hs, children, s.Settings.HandoffDeadline)
	if err == nil {
		s.logger().Info("move started", "kind", kind, "group", g, "plan", plan, "parents", len(ps), "children", len(children), "from", from, "to", to)
	}
	return g, err
}

// servedPartition is id in the map, held live and SERVING by the primary
// the map names, with no move in flight.
func servedPartition(o Observed, id string) (*authority.Partition, error) {
	if o.Map == nil {
		return nil, blobplane.Errorf(blobplane.CodeNotFound, "no partition map published yet")
	}
	p := o.Map.Partition(id)
	if p == nil {
		return nil, blobplane.Errorf(blobplane.CodeNotFound, "no partition %s in map version %d", id, o.Map.Version)
	}
	l, ok := o.Leases[id]
	if !ok || l.OwnerNode != p.Primary.Node || l.State != authority.PrimaryServing || !l.ExpiresAt.After(o.Now) {
		return nil, blobplane.Errorf(blobplane.CodeConflict, "partition %s is not served by its primary %s (lease %+v): recover it first", id, p.Primary.Node, l)
	}
	for _, h := range o.Active {
		if h.Partition == id {
			return nil, blobplane.Errorf(blobplane.CodeConflict, "partition %s has a move in flight (%s %d)", id, h.Kind, h.ID)
		}
	}
	return p, nil
}

// refine publishes the map at slot_bits + 1 (R3: every range doubled,
// nothing moves) and returns the state observed after.
func (s *Service) refine(ctx context.Context, o Observed) (Observed, error) {
	next, err := authority.Refine(o.Map, o.Map.SlotBits+1, o.Map.Version+1, time.Now().UTC().Truncate(time.Millisecond))
	if err != nil {
		return o, err
	}
	if err := publishNext(ctx, s.Store, s.Signer, o.Map, next); err != nil {
		return o, err
	}
	s.logger().Info("slot bits refined for a split (R3)", "slot_bits", next.SlotBits, "map_version", next.Version)
	return s.Observe(ctx)
}

// splitSlots divides ranges at slot at (0: halves by count) into two
// non-empty sets (R89).
func splitSlots(ranges []authority.SlotRange, at authority.Slot) (a, b []authority.SlotRange, err error) {
	var total uint64
	for _, r := range ranges {
		total += uint64(r.High-r.Low) + 1
	}
	if at == 0 {
		// the first slot of the second half
		skip := total / 2
		for _, r := range ranges {
			n := uint64(r.High-r.Low) + 1
			if skip < n {
				at = r.Low + authority.Slot(skip)
				break
			}
			skip -= n
		}
	}
	for _, r := range ranges {
		switch {
		case r.High < at:
			a = append(a, r)
		case r.Low >= at:
			b = append(b, r)
		default:
			a = append(a, authority.SlotRange{Low: r.Low, High: at - 1})
			b = append(b, authority.SlotRange{Low: at, High: r.High})
		}
	}
	if len(a) == 0 || len(b) == 0 {
		return nil, nil, blobplane.Errorf(blobplane.CodeInvalid, "slot %d does not split the partition's slots %v in two non-empty parts (R89)", at, ranges)
	}
	return a, b, nil
}

// coalesce sorts ranges and joins adjacent ones.
func coalesce(ranges []authority.SlotRange) []authority.SlotRange {
	rs := slices.Clone(ranges)
	slices.SortFunc(rs, func(a, b authority.SlotRange) int { return cmp.Compare(a.Low, b.Low) })
	var out []authority.SlotRange
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].High+1 == r.Low {
			out[n-1].High = r.High
			continue
		}
		out = append(out, r)
	}
	return out
}

func takenIDs(o Observed) map[string]bool {
	taken := map[string]bool{}
	for _, p := range o.Map.Partitions {
		taken[p.ID] = true
	}
	for id := range o.Leases { // parents of earlier splits keep their sealed rows
		taken[id] = true
	}
	return taken
}

// applyGroup replaces a group's parents by its children in m.
func applyGroup(m *authority.Map, h authority.Handoff) error {
	if len(h.Children) == 0 {
		return errors.New("a split or merge without children")
	}
	parents := map[string]bool{}
	for _, c := range h.Children {
		for _, p := range c.Parents {
			parents[p.ID] = true
		}
	}
	var class string
	var mode authority.Mode
	kept := m.Partitions[:0]
	for _, p := range m.Partitions {
		if parents[p.ID] {
			class, mode = p.Class, p.Mode
			continue
		}
		kept = append(kept, p)
	}
	m.Partitions = kept
	for _, c := range h.Children {
		m.Partitions = append(m.Partitions, authority.Partition{
			ID: c.ID, Generation: c.Generation, Epoch: c.Epoch, Class: class, Mode: mode,
			Slots: slices.Clone(c.Slots), Parents: append([]authority.ParentRef{}, c.Parents...), Standbys: []authority.Standby{},
			Primary: authority.Primary{Node: h.To, Endpoint: h.ToEndpoint, State: PublishedState},
		})
	}
	slices.SortFunc(m.Partitions, func(a, b authority.Partition) int { return cmp.Compare(a.ID, b.ID) })
	return nil
}

// planRecord is the controller_plans row of a split or merge (R117, R118).
func planRecord(kind authority.HandoffKind, ps []*authority.Partition, children []authority.Child, to, by, reason string, moved, total uint64) store.PlanRecord {
	type move struct {
		Kind     authority.HandoffKind `json:"kind"`
		Parents  []string              `json:"parents"`
		Children []authority.Child     `json:"children"`
		To       string                `json:"to"`
		Reason   string                `json:"reason"`
	}
	m := move{Kind: kind, Children: children, To: to, Reason: reason}
	for _, p := range ps {
		m.Parents = append(m.Parents, p.ID)
	}
	return store.PlanRecord{Trigger: string(kind), Moves: []move{m}, MovedSlots: moved, TotalSlots: total, AppliedBy: string(kind) + " by " + by}
}
