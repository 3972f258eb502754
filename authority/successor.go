package authority

import (
	"bytes"
	"time"
)

// CheckSuccessor checks that next may be published (or adopted) after prev:
// its version is strictly greater — versions are monotonic and never reused
// (R6); slot_bits never decreases (R3); the hash never changes (R2); no
// partition's epoch decreases, and a split or merge child's epoch does not
// reset below its parents' (R16). Both maps should already be valid.
//
// prev may be nil (the first map). Returned errors are CodeInvalid.
func CheckSuccessor(prev, next *Map) error {
	const op = "authority.CheckSuccessor"
	if prev == nil {
		return nil
	}
	v := &problems{}
	if next.Version <= prev.Version { // R6
		v.addf(ErrVersionOrder, "map_version %d does not advance past %d", next.Version, prev.Version)
	}
	if next.SlotBits < prev.SlotBits { // R3
		v.addf(ErrSlotBitsShrink, "slot_bits %d -> %d", prev.SlotBits, next.SlotBits)
	}
	if next.Hash != prev.Hash { // R2
		v.addf(ErrUnknownHash, "hash changed from %q to %q", prev.Hash, next.Hash)
	}
	for i := range next.Partitions {
		np := &next.Partitions[i]
		if pp := prev.Partition(np.ID); pp != nil {
			if np.Epoch < pp.Epoch { // R16
				v.addf(ErrEpochRegress, "partition %q epoch %d -> %d", np.ID, pp.Epoch, np.Epoch)
			}
			if np.Generation != pp.Generation { // R89, R90: a new shape gets a new id
				v.addf(ErrBadLineage, "partition %q generation %d -> %d under the same id", np.ID, pp.Generation, np.Generation)
			}
			continue
		}
		for _, pr := range np.Parents { // R16: no reset across split or merge
			if pp := prev.Partition(pr.ID); pp != nil && np.Epoch <= pp.Epoch {
				v.addf(ErrEpochRegress, "child %q epoch %d does not exceed parent %q epoch %d", np.ID, np.Epoch, pr.ID, pp.Epoch)
			}
		}
	}
	return v.err(op)
}

// SameContent reports whether a and b have identical canonical encodings,
// i.e. are the same document apart from the signature. Two maps with the
// same version and different content mean a version was reused (R6).
func SameContent(a, b *Map) bool {
	ca, errA := CanonicalMap(a)
	cb, errB := CanonicalMap(b)
	return errA == nil && errB == nil && bytes.Equal(ca, cb)
}

// MovedSlots counts the slots whose owning partition or primary node differs
// between prev and next, at next's slot_bits (prev's ranges refined first, so
// a pure R3 refinement moves nothing). It is the measure the controller's
// movement cap (R119) compares against a configured fraction. Both maps must
// be valid.
func MovedSlots(prev, next *Map) (uint64, error) {
	if next.SlotBits < prev.SlotBits {
		return 0, invalidf("authority.MovedSlots", ErrSlotBitsShrink, "slot_bits %d -> %d", prev.SlotBits, next.SlotBits)
	}
	rp, err := Refine(prev, next.SlotBits, prev.Version, prev.GeneratedAt)
	if err != nil {
		return 0, err
	}
	pi, err := NewIndex(rp)
	if err != nil {
		return 0, err
	}
	var moved uint64
	// Walk next's ranges; within each, walk prev's ranges that intersect.
	for i := range next.Partitions {
		np := &next.Partitions[i]
		for _, r := range np.Slots {
			for s := uint64(r.Low); s <= uint64(r.High); {
				pp := pi.Lookup(Slot(s))
				end := uint64(r.High)
				if pp != nil {
					// the end of prev's range containing s
					for _, pr := range pp.Slots {
						if pr.Contains(Slot(s)) {
							end = min(end, uint64(pr.High))
							break
						}
					}
				}
				if pp == nil || pp.ID != np.ID || pp.Primary.Node != np.Primary.Node {
					moved += end - s + 1
				}
				s = end + 1
			}
		}
	}
	return moved, nil
}

// Refine returns a copy of m rewritten from its slot_bits to toBits (R3):
// every range [lo, hi] becomes [lo << d, (hi << d) | (2^d − 1)], and nothing
// else changes except the version and generated_at the caller gives (R6: a
// changed document is a new version). No key changes partition, so no state
// moves. toBits below m's slot_bits is refused.
func Refine(m *Map, toBits int, version uint64, at time.Time) (*Map, error) {
	if toBits < m.SlotBits || !ValidSlotBits(toBits) {
		return nil, invalidf("authority.Refine", ErrSlotBitsShrink, "slot_bits %d -> %d", m.SlotBits, toBits)
	}
	d := toBits - m.SlotBits
	out := m.Clone()
	out.Signature = nil
	out.SlotBits, out.Version, out.GeneratedAt = toBits, version, at
	for i := range out.Partitions {
		for j, r := range out.Partitions[i].Slots {
			out.Partitions[i].Slots[j] = r.Refine(d)
		}
	}
	return out, nil
}
