package authority

import (
	"bytes"
	"cmp"
	"slices"
	"time"
)

// Delta carries only what changed between two map versions and names the
// base it applies to (R9). It is signed like a full map (R10) and verified
// before it is applied, whoever relayed it (R11, R103).
//
// The spec's delta shows map_version, base_version, changed and signature.
// Blobplane adds three members a delta cannot be applied without:
// removed (ids present in the base and absent from the result — a split or
// merge removes its parents), slot_bits (the result's, so an R3 refinement
// travels as a delta) and generated_at (the result's).
type Delta struct {
	Version     uint64      `json:"map_version"`
	BaseVersion uint64      `json:"base_version"`
	GeneratedAt time.Time   `json:"generated_at"`
	SlotBits    int         `json:"slot_bits"`
	Changed     []Partition `json:"changed"` // full entries, sorted by id
	Removed     []string    `json:"removed"` // sorted
	Signature   *Signature  `json:"signature,omitempty"`
}

// MarshalJSON writes the canonical encoding of d with its signature member.
func (d Delta) MarshalJSON() ([]byte, error) {
	if err := checkDeltaEncodable(&d); err != nil {
		return nil, err
	}
	return appendDelta(nil, &d, true), nil
}

// ParseDelta decodes a delta document, rejecting unknown members and
// trailing data, as ParseMap does. It does not verify the signature.
func ParseDelta(data []byte) (*Delta, error) {
	var d Delta
	if err := strictDecode(data, &d); err != nil {
		return nil, invalidf("authority.ParseDelta", ErrMalformed, "%v", err)
	}
	return &d, nil
}

// Diff computes the delta that turns base into next (R9): every partition of
// next that is new or whose entry differs, and every id of base that next
// no longer holds. The result is unsigned; the controller signs it.
func Diff(base, next *Map) (*Delta, error) {
	if next.Version <= base.Version {
		return nil, invalidf("authority.Diff", ErrVersionOrder, "map_version %d does not advance past %d", next.Version, base.Version)
	}
	d := &Delta{Version: next.Version, BaseVersion: base.Version, GeneratedAt: next.GeneratedAt, SlotBits: next.SlotBits, Changed: []Partition{}, Removed: []string{}}
	old := make(map[string]*Partition, len(base.Partitions))
	for i := range base.Partitions {
		old[base.Partitions[i].ID] = &base.Partitions[i]
	}
	for i := range next.Partitions {
		np := &next.Partitions[i]
		if op, ok := old[np.ID]; !ok || !samePartition(op, np) {
			d.Changed = append(d.Changed, np.Clone())
		}
		delete(old, np.ID)
	}
	for id := range old {
		d.Removed = append(d.Removed, id)
	}
	slices.SortFunc(d.Changed, func(a, b Partition) int { return cmp.Compare(a.ID, b.ID) })
	slices.Sort(d.Removed)
	return d, nil
}

func samePartition(a, b *Partition) bool {
	return bytes.Equal(appendPartition(nil, a), appendPartition(nil, b))
}

// ApplyDelta returns the map d describes when applied to base (R9). It
// refuses a delta whose base_version is not base's version (ErrWrongBase),
// and validates the result (R5, R7): a delta must not produce a map that
// could not have been published. Partitions of the result are sorted by id.
// It does not check signatures: Verifier.ApplyDelta does both.
func ApplyDelta(base *Map, d *Delta) (*Map, error) {
	const op = "authority.ApplyDelta"
	if d.BaseVersion != base.Version {
		return nil, invalidf(op, ErrWrongBase, "delta %d is based on %d, cached map is %d", d.Version, d.BaseVersion, base.Version)
	}
	if d.Version <= base.Version {
		return nil, invalidf(op, ErrVersionOrder, "delta map_version %d does not advance past %d", d.Version, base.Version)
	}
	removed := make(map[string]bool, len(d.Removed)+len(d.Changed))
	for _, id := range d.Removed {
		removed[id] = true
	}
	for i := range d.Changed {
		removed[d.Changed[i].ID] = true // replaced below
	}
	out := &Map{Version: d.Version, GeneratedAt: d.GeneratedAt, SlotBits: d.SlotBits, Hash: base.Hash}
	for i := range base.Partitions {
		if !removed[base.Partitions[i].ID] {
			out.Partitions = append(out.Partitions, base.Partitions[i].Clone())
		}
	}
	for i := range d.Changed {
		out.Partitions = append(out.Partitions, d.Changed[i].Clone())
	}
	slices.SortFunc(out.Partitions, func(a, b Partition) int { return cmp.Compare(a.ID, b.ID) })
	if err := Validate(out); err != nil {
		return nil, err
	}
	if err := CheckSuccessor(base, out); err != nil {
		return nil, err
	}
	return out, nil
}
