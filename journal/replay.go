package journal

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// ErrGap is a hole in the LSN sequence during replay (A.3 step 7,
// JOURNAL_GAP): recovery stops and the partition is quarantined; a gap is
// never skipped.
var ErrGap = errors.New("journal: gap in the LSN sequence")

// Replay is the recovery walk over the journal after a checkpoint (A.3
// step 7): it decides which records to apply, refuses a gap, and keeps
// the resume positions, which come from the last record that carries
// them, never from the checkpoint once the journal is past it (the trap
// V5 exists for: the checkpoint's positions would re-apply every input
// record between the two).
type Replay struct {
	next  uint64 // the LSN the next record must have
	marks Marks
}

// NewReplay starts a replay after a checkpoint at lsn (0: none, replay
// from LSN 1) with the positions it records.
func NewReplay(lsn uint64, positions Marks) *Replay {
	return &Replay{next: lsn + 1, marks: maps.Clone(positions)}
}

// Feed takes the next record read. apply reports whether the applier must
// apply it: an APPLY record past the checkpoint. Records at or before the
// checkpoint (a segment that straddles it) are skipped. Errors: ErrGap.
func (r *Replay) Feed(rec Record) (apply bool, err error) {
	switch {
	case rec.LSN < r.next:
		return false, nil // in the checkpoint already
	case rec.LSN > r.next:
		return false, fmt.Errorf("%w: want LSN %d, found %d", ErrGap, r.next, rec.LSN)
	}
	r.next++
	if len(rec.Marks) > 0 {
		r.marks = maps.Clone(rec.Marks)
	}
	return rec.Type == Apply, nil
}

// LSN is the last LSN fed (the checkpoint's before any).
func (r *Replay) LSN() uint64 { return r.next - 1 }

// Resume is where input consumption resumes: the positions of the last
// record fed that carries any, else the checkpoint's.
func (r *Replay) Resume() Marks { return maps.Clone(r.marks) }

// Segment names a journal segment by the LSNs of its first and last
// records (the object layout's seg-{first}-{last}).
type Segment struct {
	First, Last uint64
}

// Plan lists the segments a restore from a checkpoint at lsn must read, in
// order: those holding a record after lsn, which must follow one another
// without a hole from lsn+1. segs is every retained segment of the
// generation, in any order. Errors: ErrGap (a hole, or a segment that
// overlaps another: one LSN, one record).
func Plan(lsn uint64, segs []Segment) ([]Segment, error) {
	sorted := make([]Segment, 0, len(segs))
	for _, s := range segs {
		if s.First > s.Last || s.First == 0 {
			return nil, fmt.Errorf("journal: segment %d-%d: want 1 <= first <= last", s.First, s.Last)
		}
		if s.Last > lsn {
			sorted = append(sorted, s)
		}
	}
	slices.SortFunc(sorted, func(a, b Segment) int { return cmp.Compare(a.First, b.First) })
	next := lsn + 1
	for i, s := range sorted {
		// The first may straddle the checkpoint; every later one starts
		// where the one before ended.
		if s.First > next || (i > 0 && s.First != next) {
			return nil, fmt.Errorf("%w: want a segment holding LSN %d, found %d-%d", ErrGap, next, s.First, s.Last)
		}
		next = s.Last + 1
	}
	return sorted, nil
}
