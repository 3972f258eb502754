package authority

import (
	"cmp"
	"slices"

	"github.com/blobplane/blobplane"
)

// Index answers "which partition owns slot s" for one map by binary search
// over its ranges. It is built once per map and shared read-only.
type Index struct {
	m      *Map
	bits   int
	lows   []Slot // sorted range lows
	highs  []Slot
	owners []int32 // index into m.Partitions
}

// NewIndex indexes m's slot ranges. It needs ranges that are well formed
// and non-overlapping (R5, R7) but tolerates gaps, so a partial map (like the
// spec's two-partition example used by V3) can be resolved; a slot in a gap
// resolves to nothing (A.1 step 2: NO_MAP). Validate before NewIndex for a
// map that is to be published or applied.
func NewIndex(m *Map) (*Index, error) {
	const op = "authority.NewIndex"
	if !ValidSlotBits(m.SlotBits) {
		return nil, invalidf(op, ErrBadSlotBits, "slot_bits %d", m.SlotBits)
	}
	type entry struct {
		r     SlotRange
		owner int32
	}
	var es []entry
	for i := range m.Partitions {
		for _, r := range m.Partitions[i].Slots {
			if r.Low > r.High || r.High > MaxSlot(m.SlotBits) {
				return nil, invalidf(op, ErrBadRange, "partition %q: range %v", m.Partitions[i].ID, r)
			}
			es = append(es, entry{r, int32(i)})
		}
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.r.Low, b.r.Low) })
	ix := &Index{m: m, bits: m.SlotBits, lows: make([]Slot, len(es)), highs: make([]Slot, len(es)), owners: make([]int32, len(es))}
	for i, e := range es {
		if i > 0 && e.r.Low <= es[i-1].r.High {
			return nil, invalidf(op, ErrOverlap, "ranges %v and %v", es[i-1].r, e.r) // R5
		}
		ix.lows[i], ix.highs[i], ix.owners[i] = e.r.Low, e.r.High, e.owner
	}
	return ix, nil
}

// Map returns the indexed map. Callers must not modify it.
func (ix *Index) Map() *Map { return ix.m }

// SlotBits is the indexed map's slot_bits.
func (ix *Index) SlotBits() int { return ix.bits }

// Lookup returns the partition owning slot s, or nil when no range covers it
// (only possible for a map that failed Validate).
func (ix *Index) Lookup(s Slot) *Partition {
	// The first range whose low is above s; the candidate is the one before.
	i, _ := slices.BinarySearch(ix.lows, s+1)
	if s == MaxSlot(MaxSlotBits) { // s+1 wrapped
		i = len(ix.lows)
	}
	if i == 0 || s > ix.highs[i-1] {
		return nil
	}
	return &ix.m.Partitions[ix.owners[i-1]]
}

// Resolution is where a slot lives in one map version (A.1 steps 1–3).
type Resolution struct {
	Key        string
	Slot       Slot
	MapVersion uint64
	Partition  *Partition // never nil in a Resolution returned without error
}

// Primary is the resolved partition's primary (node, endpoint, state).
func (r Resolution) Primary() Primary { return r.Partition.Primary }

// Resolve returns the partition owning slot s (V3). The error chains to
// ErrNoMap when no partition covers it.
func (ix *Index) Resolve(s Slot) (Resolution, error) {
	p := ix.Lookup(s)
	if p == nil {
		return Resolution{Slot: s, MapVersion: ix.m.Version}, coded(blobplane.CodeUnavailable, "authority.Resolve", ErrNoMap)
	}
	return Resolution{Slot: s, MapVersion: ix.m.Version, Partition: p}, nil
}

// ResolveKey computes key's slot at the map's slot_bits (R1, R97) and
// resolves it (V3).
func (ix *Index) ResolveKey(key string) (Resolution, error) {
	r, err := ix.Resolve(SlotOf(key, ix.bits))
	r.Key = key
	return r, err
}
