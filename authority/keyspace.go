package authority

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"math/big"
)

// HashName names the one hash function this key space uses, as written in
// the map's "hash" field (R2: fixed for the life of the system, named in the
// map, identical in every process and library version — unlike a seeded
// runtime hash).
const HashName = "md5-128-be"

// DefaultSlotBits is Blobplane's SLOT_BITS: 4096 slots (R1).
const DefaultSlotBits = 12

// MinSlotBits and MaxSlotBits bound SLOT_BITS. The upper bound keeps a slot
// in a uint32 and a slot count in a uint64.
const (
	MinSlotBits = 1
	MaxSlotBits = 32
)

// Slot is the atom of the key space (R4): a number in 0 .. 2^slot_bits − 1.
// A slot is meaningful only together with the slot_bits it was computed at.
type Slot uint32

// Hash128 is the 128-bit MD5 of a key's UTF-8 bytes, big-endian (R1).
type Hash128 [md5.Size]byte

// HashKey returns the 128-bit hash a key's slot is taken from (R1). Go
// strings are byte strings; callers hold keys as UTF-8, which is what the
// spec hashes (A.1 step 1: hash(utf8(key))).
func HashKey(key string) Hash128 { return md5.Sum([]byte(key)) }

// Slot returns the top bits of h as a slot (R1: most significant bits,
// big-endian — a prefix, never a modulus, so that R3 refinement holds).
func (h Hash128) Slot(bits int) Slot {
	return Slot(binary.BigEndian.Uint64(h[:8]) >> (64 - uint(bits)))
}

// SlotOf returns key's slot at slot_bits bits (R1, A.1 step 1). bits must be
// within [MinSlotBits, MaxSlotBits]; Validate guarantees it for any map.
func SlotOf(key string, bits int) Slot {
	return HashKey(key).Slot(bits)
}

// SlotCount is 2^bits (R1).
func SlotCount(bits int) uint64 { return uint64(1) << uint(bits) }

// MaxSlot is the highest slot at bits: 2^bits − 1.
func MaxSlot(bits int) Slot { return Slot(SlotCount(bits) - 1) }

// ValidSlotBits reports whether bits is a usable SLOT_BITS.
func ValidSlotBits(bits int) bool { return bits >= MinSlotBits && bits <= MaxSlotBits }

// SlotRange is an inclusive [Low, High] pair of slots (R7). On the wire it is
// the two-element JSON array [low, high].
type SlotRange struct {
	Low, High Slot
}

// Contains reports whether s lies in r (inclusive bounds, R7).
func (r SlotRange) Contains(s Slot) bool { return r.Low <= s && s <= r.High }

// Len is the number of slots in r.
func (r SlotRange) Len() uint64 { return uint64(r.High) - uint64(r.Low) + 1 }

func (r SlotRange) String() string { return fmt.Sprintf("[%d, %d]", r.Low, r.High) }

// Refine rewrites r from b to b+d bits (R3): slot s becomes
// [s << d, (s << d) | (2^d − 1)], so [lo, hi] becomes
// [lo << d, (hi << d) | (2^d − 1)]. Every key in r at b bits lies in the
// result at b+d bits, and no other key does: refinement moves no key.
func (r SlotRange) Refine(d int) SlotRange {
	return SlotRange{Low: r.Low << uint(d), High: r.High<<uint(d) | Slot(SlotCount(d)-1)}
}

// RefineSlot is the range slot s at fromBits becomes at toBits (R3, V2).
// toBits must not be below fromBits (R3: SLOT_BITS MUST NOT decrease).
func RefineSlot(s Slot, fromBits, toBits int) (SlotRange, error) {
	if toBits < fromBits || !ValidSlotBits(fromBits) || !ValidSlotBits(toBits) {
		return SlotRange{}, invalidf("authority.RefineSlot", ErrSlotBitsShrink, "slot_bits %d -> %d", fromBits, toBits)
	}
	return SlotRange{Low: s, High: s}.Refine(toBits - fromBits), nil
}

// ExplicitHashKey is the explicit hash key for slot s at bits (R52, V7):
// s × 2^(128 − bits), the lowest 128-bit hash in the slot, as a decimal
// string. It is what a producer that cannot key the input stream by the
// service key sets as the record's explicit hash key.
func ExplicitHashKey(s Slot, bits int) string {
	v := new(big.Int).SetUint64(uint64(s))
	return v.Lsh(v, uint(128-bits)).String()
}

// SlotHashRange returns the inclusive 128-bit hash range slot s spans at
// bits, as decimal strings: [s × 2^(128−bits), (s+1) × 2^(128−bits) − 1]
// (V7: slot 4095 at 12 bits ends at 2^128 − 1). It is how a slot lines up
// with input-stream shard hash ranges (R51).
func SlotHashRange(s Slot, bits int) (low, high string) {
	lo := new(big.Int).SetUint64(uint64(s))
	lo.Lsh(lo, uint(128-bits))
	hi := new(big.Int).SetUint64(uint64(s) + 1)
	hi.Lsh(hi, uint(128-bits))
	hi.Sub(hi, big.NewInt(1))
	return lo.String(), hi.String()
}
