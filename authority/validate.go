package authority

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"unicode/utf8"

	"github.com/blobplane/blobplane"
)

// maxProblems bounds how many problems Validate reports, so a hostile
// document cannot make the error itself large.
const maxProblems = 16

// MaxPartitionIDLen bounds a partition id (R13 ids are opaque, not
// unbounded).
const MaxPartitionIDLen = 64

// Validate checks that m is a well-formed map that may be published or
// applied: total coverage and non-overlap of 0 .. 2^slot_bits − 1 (R5);
// every entry carrying id, generation, epoch, class, mode, sorted inclusive
// slot ranges, primary endpoint and state, standby endpoints and states, all
// states known (R7, R29); the fixed hash named (R2); lineage pointing
// backwards in generation (R89–R91); integers and strings the canonical
// encoding can carry (R10). Partitions must be sorted by id so a map has one
// canonical encoding.
//
// It does not check the signature (Verifier) or the relation to the previous
// version (CheckSuccessor). The error is CodeInvalid and its chain holds
// every problem found (up to 16), each wrapping a sentinel such as
// ErrCoverageGap or ErrOverlap.
func Validate(m *Map) error {
	const op = "authority.Validate"
	if m == nil {
		return invalidf(op, ErrMissingField, "nil map")
	}
	if err := checkEncodable(m); err != nil {
		return err
	}
	v := &problems{}
	if m.Version == 0 {
		v.addf(ErrMissingField, "map_version must be >= 1") // R6: versions start at 1; 0 means "no map"
	}
	if m.GeneratedAt.IsZero() {
		v.addf(ErrMissingField, "generated_at")
	}
	if !ValidSlotBits(m.SlotBits) {
		v.addf(ErrBadSlotBits, "slot_bits %d not in [%d, %d]", m.SlotBits, MinSlotBits, MaxSlotBits)
		return v.err(op) // nothing about ranges can be checked without it
	}
	if m.Hash != HashName { // R2
		v.addf(ErrUnknownHash, "hash %q, want %q", m.Hash, HashName)
	}
	if len(m.Partitions) == 0 {
		v.addf(ErrCoverageGap, "no partitions") // R5
	}
	for i := range m.Partitions {
		p := &m.Partitions[i]
		validatePartition(v, p, m.SlotBits)
		if i > 0 {
			switch prev := m.Partitions[i-1].ID; {
			case prev == p.ID:
				v.addf(ErrDuplicateID, "partition %q appears twice", p.ID)
			case prev > p.ID:
				v.addf(ErrUnsorted, "partitions not sorted by id: %q before %q", prev, p.ID)
			}
		}
	}
	if len(v.errs) == 0 {
		checkCoverage(v, m.Partitions, m.SlotBits)
	}
	return v.err(op)
}

// validatePartition checks one entry (R7, R29, R89–R91, R13).
func validatePartition(v *problems, p *Partition, bits int) {
	checkPartitionFields(v, p)
	checkSlotRanges(v, p, bits)
	checkLineage(v, p)
	checkPrimary(v, p)
	checkStandbys(v, p)
}

// checkPartitionFields checks the entry's id (R13), class, mode and
// generation.
func checkPartitionFields(v *problems, p *Partition) {
	if p.ID == "" {
		v.addf(ErrMissingField, "partition without id")
	} else if len(p.ID) > MaxPartitionIDLen || !printable(p.ID) {
		v.addf(ErrMalformed, "partition id %q: want at most %d printable characters", p.ID, MaxPartitionIDLen)
	}
	if p.Class == "" {
		v.addf(ErrMissingField, "partition %q: class", p.ID) // R7, R112
	}
	if !p.Mode.Known() {
		v.addf(ErrUnknownMode, "partition %q: mode %q", p.ID, p.Mode) // R29
	}
	if p.Generation == 0 {
		v.addf(ErrMissingField, "partition %q: generation must be >= 1", p.ID)
	}
}

// checkSlotRanges checks the entry's own slot ranges; coverage across
// entries is checkCoverage's.
func checkSlotRanges(v *problems, p *Partition, bits int) {
	// R7: inclusive [low, high] pairs, sorted, non-overlapping; R89: never
	// zero slots.
	if len(p.Slots) == 0 {
		v.addf(ErrBadRange, "partition %q: no slot ranges", p.ID)
	}
	limit := MaxSlot(bits)
	for j, r := range p.Slots {
		if r.Low > r.High || r.High > limit {
			v.addf(ErrBadRange, "partition %q: range %v at slot_bits %d", p.ID, r, bits)
			continue
		}
		if j > 0 {
			prev := p.Slots[j-1]
			if r.Low <= prev.High && r.High >= prev.Low {
				v.addf(ErrOverlap, "partition %q: ranges %v and %v overlap", p.ID, prev, r)
			} else if r.Low < prev.Low {
				v.addf(ErrUnsorted, "partition %q: range %v after %v", p.ID, r, prev)
			}
		}
	}
}

func checkLineage(v *problems, p *Partition) {
	// R91 lineage: parents name other partitions at a lower generation
	// (R89, R90: a child's generation exceeds every parent's).
	for _, pr := range p.Parents {
		if pr.ID == "" || pr.ID == p.ID || pr.Generation >= p.Generation {
			v.addf(ErrBadLineage, "partition %q (generation %d): parent %q generation %d", p.ID, p.Generation, pr.ID, pr.Generation)
		}
	}
}

func checkPrimary(v *problems, p *Partition) {
	// R7: primary endpoint and state.
	if !p.Primary.State.Known() {
		v.addf(ErrUnknownState, "partition %q: primary state %q", p.ID, p.Primary.State)
	} else if p.Primary.State.placed() {
		if p.Primary.Node == "" {
			v.addf(ErrMissingField, "partition %q: primary node (state %s)", p.ID, p.Primary.State)
		}
		if !validEndpoint(p.Primary.Endpoint) {
			v.addf(ErrMissingField, "partition %q: primary endpoint %q must be host:port", p.ID, p.Primary.Endpoint)
		}
	}
}

func checkStandbys(v *problems, p *Partition) {
	// R7: each standby's endpoint and state; a standby is never the primary.
	for k, s := range p.Standbys {
		if !s.State.Known() {
			v.addf(ErrUnknownState, "partition %q: standby %q state %q", p.ID, s.Node, s.State)
		}
		if s.Node == "" || !validEndpoint(s.Endpoint) {
			v.addf(ErrMissingField, "partition %q: standby %d needs node and host:port endpoint", p.ID, k)
		}
		if s.Node != "" && s.Node == p.Primary.Node {
			v.addf(ErrMalformed, "partition %q: node %q is both primary and standby", p.ID, s.Node)
		}
		for _, o := range p.Standbys[:k] {
			if o.Node == s.Node {
				v.addf(ErrMalformed, "partition %q: standby node %q listed twice", p.ID, s.Node)
			}
		}
	}
}

// checkCoverage proves every slot in 0 .. 2^bits − 1 belongs to exactly one
// partition (R5). Ranges are already individually sane.
func checkCoverage(v *problems, ps []Partition, bits int) {
	type owned struct {
		r  SlotRange
		id string
	}
	var all []owned
	for i := range ps {
		for _, r := range ps[i].Slots {
			all = append(all, owned{r, ps[i].ID})
		}
	}
	slices.SortFunc(all, func(a, b owned) int { return cmp.Compare(a.r.Low, b.r.Low) })
	next := uint64(0) // the lowest slot not yet covered
	for _, o := range all {
		switch lo := uint64(o.r.Low); {
		case lo > next:
			v.addf(ErrCoverageGap, "slots [%d, %d] belong to no partition", next, lo-1)
		case lo < next:
			v.addf(ErrOverlap, "slot %d of partition %q is also covered by another partition", lo, o.id)
		}
		next = max(next, uint64(o.r.High)+1)
	}
	if next < SlotCount(bits) {
		v.addf(ErrCoverageGap, "slots [%d, %d] belong to no partition", next, SlotCount(bits)-1)
	}
}

func validEndpoint(ep string) bool {
	host, port, err := net.SplitHostPort(ep)
	return err == nil && host != "" && port != ""
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// problems collects validation failures.
type problems struct {
	errs []error
	more int
}

func (v *problems) addf(sentinel error, format string, args ...any) {
	if len(v.errs) >= maxProblems {
		v.more++
		return
	}
	v.errs = append(v.errs, fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sentinel))
}

func (v *problems) err(op string) error {
	if len(v.errs) == 0 {
		return nil
	}
	msg := v.errs[0].Error()
	if n := len(v.errs) - 1 + v.more; n > 0 {
		msg = fmt.Sprintf("%s (and %d more)", msg, n)
	}
	return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: msg, Err: errors.Join(v.errs...)}
}
