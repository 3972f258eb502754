package partstate

import (
	"fmt"
	"strconv"
	"strings"
)

// PositionHeader carries the position a mutating response was applied
// at (ZBP-5-R107); MinPositionHeader is a read's demand for one.
const (
	PositionHeader    = "X-Partition-Position"
	MinPositionHeader = "X-Min-Position"
)

// Position is where a partition's state stands: (epoch, LSN) within one
// partition id (ZBP-5-R107, R108). Its text is "partition:epoch:lsn".
type Position struct {
	Partition string
	Epoch     uint64
	LSN       uint64
}

func (p Position) String() string {
	return p.Partition + ":" + strconv.FormatUint(p.Epoch, 10) + ":" + strconv.FormatUint(p.LSN, 10)
}

// Covers reports whether state at p includes what was applied at q:
// (epoch, LSN) ordered lexicographically, and only within one partition
// id. A split or merge restarts LSNs under a new id, so positions of two
// ids are never compared (R108): Covers is false.
func (p Position) Covers(q Position) bool {
	if p.Partition != q.Partition {
		return false
	}
	if p.Epoch != q.Epoch {
		return p.Epoch > q.Epoch
	}
	return p.LSN >= q.LSN
}

// ParsePosition reads a position token. Errors name what is wrong with
// it; the caller answers them as invalid input.
func ParsePosition(s string) (Position, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Position{}, fmt.Errorf("position %q: want partition:epoch:lsn", s)
	}
	j := strings.LastIndexByte(s[:i], ':')
	if j <= 0 {
		return Position{}, fmt.Errorf("position %q: want partition:epoch:lsn", s)
	}
	id := s[:j]
	if len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return Position{}, fmt.Errorf("position %q: the partition id is not printable ASCII of at most 128 bytes", s)
	}
	epoch, err := strconv.ParseUint(s[j+1:i], 10, 64)
	if err != nil {
		return Position{}, fmt.Errorf("position %q: the epoch is not a decimal number", s)
	}
	lsn, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		return Position{}, fmt.Errorf("position %q: the LSN is not a decimal number", s)
	}
	return Position{Partition: id, Epoch: epoch, LSN: lsn}, nil
}
