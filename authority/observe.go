package authority

import (
	"cmp"
	"slices"
)

// Pure helpers behind the authority's alarms; the metrics package exports
// what they compute.

// PrimaryReport is one node's claim to be primary for a partition at an
// epoch (from its heartbeat or the nodes table).
type PrimaryReport struct {
	Node      string
	Partition string
	Epoch     uint64
}

// DuplicatePrimary is a correctness fault: several nodes claim the primary
// role for one partition at the same epoch (R134).
type DuplicatePrimary struct {
	Partition string
	Epoch     uint64
	Nodes     []string // sorted
}

// DuplicatePrimaries returns every (partition, epoch) claimed by more than
// one node (R134: alarm as a correctness fault, never as a transient
// inconsistency). Result sorted by partition, then epoch.
func DuplicatePrimaries(reports []PrimaryReport) []DuplicatePrimary {
	type key struct {
		p string
		e uint64
	}
	claims := map[key][]string{}
	for _, r := range reports {
		k := key{r.Partition, r.Epoch}
		if !slices.Contains(claims[k], r.Node) {
			claims[k] = append(claims[k], r.Node)
		}
	}
	var out []DuplicatePrimary
	for k, nodes := range claims {
		if len(nodes) > 1 {
			slices.Sort(nodes)
			out = append(out, DuplicatePrimary{Partition: k.p, Epoch: k.e, Nodes: nodes})
		}
	}
	slices.SortFunc(out, func(a, b DuplicatePrimary) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Epoch, b.Epoch))
	})
	return out
}

// Unowned is a partition whose slots have no ready owner (R133).
type Unowned struct {
	Partition string
	State     PrimaryState
	Slots     uint64 // how many slots are affected
}

// UnownedPartitions lists the partitions of m with no ready owner, and the
// number of slots they leave unowned (R133: alarm within a bounded
// interval; unowned is its own condition, neither healthy nor a node
// failure). ready decides readiness per partition — typically "a lease
// record at the map's epoch, not expired, state SERVING"; nil means the
// map's own view: a SERVING primary with a node.
func UnownedPartitions(m *Map, ready func(p *Partition) bool) (parts []Unowned, slots uint64) {
	if ready == nil {
		ready = func(p *Partition) bool { return p.Primary.State == PrimaryServing && p.Primary.Node != "" }
	}
	for i := range m.Partitions {
		p := &m.Partitions[i]
		if ready(p) {
			continue
		}
		var n uint64
		for _, r := range p.Slots {
			n += r.Len()
		}
		parts = append(parts, Unowned{Partition: p.ID, State: p.Primary.State, Slots: n})
		slots += n
	}
	return parts, slots
}

// OldestMapVersion returns the lowest map version in use among reporters
// (client or node id → cached map version) and who holds it, so
// convergence after a map change is measured rather than assumed (R139).
// ok is false when there are no reports.
func OldestMapVersion(inUse map[string]uint64) (version uint64, holder string, ok bool) {
	for who, v := range inUse {
		if !ok || v < version || v == version && who < holder {
			version, holder, ok = v, who, true
		}
	}
	return version, holder, ok
}
