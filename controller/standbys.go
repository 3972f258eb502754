package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/store"
)

// Standby placement (issue 33; ZBP-5 R7, R60, R61, R114). Every map the
// controller publishes names, for each partition, up to its class's
// standbys (partstate.Class.Standbys), each on an eligible api node (as a
// move target: present, fresh, up, not draining, with an endpoint, of the
// partition's class; capacity is not counted, a standby homes nothing)
// outside its primary's failure domain (partstate.Class.Diversity). The
// diversity is a hard constraint (R114): with no candidate outside the
// primary's domain the partition has fewer standbys, and the health
// report, which counts synced standbys (R60, R62), says so. Placement is
// stable: a standby still eligible and still valid stays, so a map
// changes only where one has to.

// classTable maps the class names a map gives partitions to the classes
// the controller places standbys for ("" is the standard class, as
// fits() reads it). A class not listed is not the controller's to place:
// its standbys are left as published.
type classTable map[string]partstate.Class

// standbyClasses are Blobplane's; it has one, partstate.QuotaClass.
var standbyClasses = classTable{
	"":                        partstate.QuotaClass,
	partstate.QuotaClass.Name: partstate.QuotaClass,
}

// placeStandbys sets the standbys of every partition of m but those in
// skip (a move in flight: changing them would race it): first it keeps,
// in order, every listed standby that is still eligible and valid, up to
// the class's count; then it fills what is missing, one at a time, with
// the candidate whose failure domain no standby of the partition has yet
// (spread, where possible), in the primary's datacenter (a failover to
// the standby keeps the home near its writers: partstate.QuotaClass),
// holding the fewest standby assignments, then the fewest primaries,
// then by id from the primary's on, wrapping around (a ring, as
// authority.EvenSplit places standbys: equal nodes share the standbys
// evenly, a,b,c homing one each get b,c,a rather than b,a,a). Pure and
// deterministic: partitions kept in map order, filled in fillOrder.
//
// A standby placed here is published SYNCING with lag 0: the map says
// where a standby is, not how far it is; its live lag is in
// partition_standbys (store.StandbyReports) and the standby's metrics
// (R64: lag is a metric, not an inference).
func placeStandbys(m *authority.Map, classes classTable, o Observed, s Settings, skip map[string]bool) {
	cands := standbyCandidates(o, s)
	load := standbyLoad{standbys: map[string]int{}, primaries: map[string]int{}}
	managed := make([]bool, len(m.Partitions))
	for i := range m.Partitions {
		p := &m.Partitions[i]
		load.primaries[p.Primary.Node]++
		if cl, ok := classes[p.Class]; ok && !skip[p.ID] {
			managed[i] = true
			p.Standbys = keepStandbys(*p, cl, o, cands)
		}
		for _, sb := range p.Standbys {
			load.standbys[sb.Node]++
		}
	}
	for _, i := range fillOrder(m, managed) {
		fillStandbys(&m.Partitions[i], classes[m.Partitions[i].Class], o, cands, &load)
	}
}

// fillOrder is the order placeStandbys fills the managed partitions of m
// in: round-robin over their primaries — each primary's first partition
// (in map order), by primary id, then each one's second — so the
// greedy choice spreads standbys evenly rather than piling them on
// whichever node the map's order happens to leave for last.
func fillOrder(m *authority.Map, managed []bool) []int {
	rank := map[string]int{}
	type slot struct{ i, rank int }
	var order []slot
	for i, p := range m.Partitions {
		if managed[i] {
			order = append(order, slot{i, rank[p.Primary.Node]})
			rank[p.Primary.Node]++
		}
	}
	slices.SortStableFunc(order, func(a, b slot) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(m.Partitions[a.i].Primary.Node, m.Partitions[b.i].Primary.Node))
	})
	out := make([]int, len(order))
	for k, s := range order {
		out[k] = s.i
	}
	return out
}

// standbyLoad is what placeStandbys balances: each node's standby
// assignments and primaries in the map being built.
type standbyLoad struct {
	standbys, primaries map[string]int
}

// standbyCandidates are the api nodes a standby may be placed on now, by
// id: eligible() as for a move target.
func standbyCandidates(o Observed, s Settings) map[string]store.PlacementNode {
	out := map[string]store.PlacementNode{}
	for id, n := range o.Nodes {
		if eligible(o, s, n) {
			out[id] = n
		}
	}
	return out
}

// keepStandbys is p's standbys that stay: on a candidate node, valid for
// cl (standbyFits), listed once, at most cl.Standbys of them; their
// endpoint follows the node's registration.
func keepStandbys(p authority.Partition, cl partstate.Class, o Observed, cands map[string]store.PlacementNode) []authority.Standby {
	var kept []authority.Standby
	home := primaryDomain(p, cl, o)
	for _, sb := range p.Standbys {
		n, ok := cands[sb.Node]
		if !ok || len(kept) >= cl.Standbys || !standbyFits(p, cl, n, home) || slices.ContainsFunc(kept, sameNode(sb.Node)) {
			continue
		}
		sb.Endpoint = Endpoint(n.Endpoint)
		kept = append(kept, sb)
	}
	return kept
}

// fillStandbys adds standbys to p until it has cl.Standbys or no
// candidate is left (R114: fewer, reported, rather than a standby in its
// primary's failure domain).
func fillStandbys(p *authority.Partition, cl partstate.Class, o Observed, cands map[string]store.PlacementNode, load *standbyLoad) {
	home := primaryDomain(*p, cl, o)
	homeDC := o.Nodes[p.Primary.Node].Datacenter
	for len(p.Standbys) < cl.Standbys {
		used := map[string]bool{}
		for _, sb := range p.Standbys {
			used[cl.Diversity.Domain(sb.Node, o.Nodes[sb.Node].Datacenter)] = true
		}
		var pick []store.PlacementNode
		for _, n := range cands {
			if standbyFits(*p, cl, n, home) && !slices.ContainsFunc(p.Standbys, sameNode(n.ID)) {
				pick = append(pick, n)
			}
		}
		if len(pick) == 0 {
			return
		}
		best := slices.MinFunc(pick, func(a, b store.PlacementNode) int {
			return cmp.Or(
				preferTrue(!used[cl.Diversity.Domain(a.ID, a.Datacenter)], !used[cl.Diversity.Domain(b.ID, b.Datacenter)]),
				preferTrue(a.Datacenter == homeDC, b.Datacenter == homeDC),
				cmp.Compare(load.standbys[a.ID], load.standbys[b.ID]),
				cmp.Compare(load.primaries[a.ID], load.primaries[b.ID]),
				preferTrue(a.ID > p.Primary.Node, b.ID > p.Primary.Node),
				cmp.Compare(a.ID, b.ID))
		})
		p.Standbys = append(p.Standbys, authority.Standby{Node: best.ID, Endpoint: Endpoint(best.Endpoint), State: authority.StandbySyncing})
		load.standbys[best.ID]++
	}
}

// standbyFits: n may be a standby of p under cl — not its primary
// (authority.Validate refuses that), of its class (R112), and outside
// the primary's failure domain home (R61). Under a diversity other than
// none, a node whose domain is unknown (no datacenter) proves nothing
// and does not fit, nor does any node when the primary's is unknown.
func standbyFits(p authority.Partition, cl partstate.Class, n store.PlacementNode, home string) bool {
	if n.ID == p.Primary.Node || cmp.Or(n.Class, DefaultClass) != cmp.Or(p.Class, DefaultClass) {
		return false
	}
	if cl.Diversity == partstate.DiversityNone {
		return true
	}
	d := cl.Diversity.Domain(n.ID, n.Datacenter)
	return home != "" && d != "" && d != home
}

// primaryDomain is the failure domain of p's primary under cl.
func primaryDomain(p authority.Partition, cl partstate.Class, o Observed) string {
	return cl.Diversity.Domain(p.Primary.Node, o.Nodes[p.Primary.Node].Datacenter)
}

func sameNode(node string) func(authority.Standby) bool {
	return func(s authority.Standby) bool { return s.Node == node }
}

// preferTrue orders a before b when only a holds, after when only b does.
func preferTrue(a, b bool) int {
	switch {
	case a && !b:
		return -1
	case b && !a:
		return 1
	}
	return 0
}

// sameStandbys reports whether a and b name the same standbys, in the
// same order, for every partition (both of the same partitions).
func sameStandbys(a, b *authority.Map) bool {
	return slices.EqualFunc(a.Partitions, b.Partitions, func(x, y authority.Partition) bool {
		return x.ID == y.ID && slices.Equal(x.Standbys, y.Standbys)
	})
}

// syncedStandby: node is one of part's standbys in the map and its last
// report says it is synced (store.StandbyReport.Synced) at the epoch the
// partition's journal is sequenced under (R72): the map's, raised to the
// lease store's as the next map will be (raiseEpochs, R16) — a first
// map says 0 while its primaries write under the epoch they claimed. A
// failover or drain to it catches up by its lag rather than restoring
// from the last checkpoint (R73).
func syncedStandby(o Observed, part authority.Partition, node string) bool {
	if !slices.ContainsFunc(part.Standbys, sameNode(node)) {
		return false
	}
	epoch := max(part.Epoch, o.Leases[part.ID].Epoch)
	return slices.ContainsFunc(o.Standbys[part.ID], func(r store.StandbyReport) bool {
		return r.Node == node && r.Synced(epoch)
	})
}

// republishStandbys publishes a map whose only change is the standbys
// when the latest map's placement is invalid or incomplete and a better
// one exists (a standby's node went down, drains or left; a node
// appeared for a partition short of standbys), and reports whether it
// did. Partitions with a move in flight keep theirs (publishMoves places
// them with the move). Nothing is published while the freeze holds
// (R123) or a canary is pending (R120: a map above it without its
// content would withdraw it undecided); epochs are left as they are.
func (s *Service) republishStandbys(ctx context.Context, o Observed) (bool, error) {
	if o.Map == nil || o.Frozen != nil {
		return false, nil
	}
	next := o.Map.Clone()
	next.Signature = nil
	placeStandbys(next, standbyClasses, o, s.Settings, movingPartitions(o.Active))
	if sameStandbys(o.Map, next) {
		return false, nil
	}
	pending, err := s.Store.PendingCanaries(ctx)
	if err != nil || len(pending) > 0 {
		return false, err
	}
	next.Version = o.Map.Version + 1
	next.GeneratedAt = time.Now().UTC().Truncate(time.Millisecond)
	if err := publishNext(ctx, s.Store, s.Signer, o.Map, next); err != nil {
		return false, fmt.Errorf("publish standby placement: %w", err)
	}
	s.metrics().published.Inc()
	for _, p := range next.Partitions {
		if prev := o.Map.Partition(p.ID); prev != nil && !slices.Equal(prev.Standbys, p.Standbys) {
			s.logger().Info("standbys placed", "partition", p.ID, "primary", p.Primary.Node,
				"standbys", standbyNodes(p.Standbys), "was", standbyNodes(prev.Standbys), "map_version", next.Version)
		}
	}
	return true, nil
}

// movingPartitions are the partitions of moves in flight.
func movingPartitions(active []authority.Handoff) map[string]bool {
	out := map[string]bool{}
	for _, h := range active {
		out[h.Partition] = true
	}
	return out
}

func standbyNodes(ss []authority.Standby) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Node
	}
	return out
}
