package authority

import (
	"cmp"
	"io"
	"slices"
	"time"
)

// NodeAddr names a node and the endpoint it serves on.
type NodeAddr struct {
	Node     string
	Endpoint string
}

// EvenSplit describes a map that divides the 2^SlotBits slots into
// Partitions contiguous, near-equal ranges and places them round-robin over
// Nodes. It is what the controller's first publish (and tests) start from;
// later maps are derived from earlier ones, never rebuilt, so that ids and
// epochs carry over (R13, R16).
type EvenSplit struct {
	Version     uint64    // R6: >= 1
	GeneratedAt time.Time // the controller's record time
	SlotBits    int       // 0 means DefaultSlotBits
	Partitions  int       // 1 .. 2^SlotBits (R96: one slot is the floor)
	Nodes       []NodeAddr
	Standbys    int          // standbys per partition, < len(Nodes)
	Class       string       // R112
	Mode        Mode         // R29
	State       PrimaryState // primary state to publish; "" means RESTORING
	Epoch       uint64       // initial epoch recorded in the map
	Rand        io.Reader    // id randomness; nil means crypto/rand (R13)
}

// Build returns the map the spec describes, validated (R5, R7) but unsigned,
// with partitions sorted by id.
func (e EvenSplit) Build() (*Map, error) {
	const op = "authority.EvenSplit"
	bits := e.SlotBits
	if bits == 0 {
		bits = DefaultSlotBits
	}
	if !ValidSlotBits(bits) {
		return nil, invalidf(op, ErrBadSlotBits, "slot_bits %d", bits)
	}
	total := SlotCount(bits)
	if e.Partitions < 1 || uint64(e.Partitions) > total {
		return nil, invalidf(op, ErrBadRange, "%d partitions for %d slots", e.Partitions, total)
	}
	if len(e.Nodes) == 0 || e.Standbys < 0 || e.Standbys >= len(e.Nodes) {
		return nil, invalidf(op, ErrMissingField, "%d nodes for %d standbys per partition", len(e.Nodes), e.Standbys)
	}
	state := e.State
	if state == "" {
		state = PrimaryRestoring
	}
	ids, err := NewPartitionIDs(e.Rand, e.Partitions, nil)
	if err != nil {
		return nil, err
	}
	m := &Map{Version: e.Version, GeneratedAt: e.GeneratedAt, SlotBits: bits, Hash: HashName, Partitions: make([]Partition, e.Partitions)}
	n := uint64(e.Partitions)
	for i := range m.Partitions {
		// [i·S/N, (i+1)·S/N − 1]: sizes differ by at most one slot.
		lo, hi := uint64(i)*total/n, (uint64(i)+1)*total/n-1
		primary := e.Nodes[i%len(e.Nodes)]
		p := Partition{
			ID: ids[i], Generation: 1, Epoch: e.Epoch, Class: e.Class, Mode: e.Mode,
			Slots:    []SlotRange{{Low: Slot(lo), High: Slot(hi)}},
			Parents:  []ParentRef{},
			Primary:  Primary{Node: primary.Node, Endpoint: primary.Endpoint, State: state},
			Standbys: make([]Standby, 0, e.Standbys),
		}
		for k := 1; k <= e.Standbys; k++ {
			s := e.Nodes[(i+k)%len(e.Nodes)]
			p.Standbys = append(p.Standbys, Standby{Node: s.Node, Endpoint: s.Endpoint, State: StandbyRestoring})
		}
		m.Partitions[i] = p
	}
	slices.SortFunc(m.Partitions, func(a, b Partition) int { return cmp.Compare(a.ID, b.ID) })
	if err := Validate(m); err != nil {
		return nil, err
	}
	return m, nil
}
