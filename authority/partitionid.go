package authority

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"io"
	"strings"
)

// PartitionIDPrefix starts every generated partition id.
const PartitionIDPrefix = "p_"

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewPartitionID returns a fresh opaque partition id (R13): "p_" followed by
// 80 random bits in lowercase base32 (16 characters). It encodes nothing
// about the slot range the partition holds, which changes while the id does
// not. r is the randomness source; nil means crypto/rand. Tests pass a
// seeded reader for reproducible maps.
func NewPartitionID(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	var b [10]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", fmt.Errorf("partition id: %w", err)
	}
	return PartitionIDPrefix + idEncoding.EncodeToString(b[:]), nil
}

// NewPartitionIDs returns n distinct fresh ids that collide with none in
// taken (R13; ids are never reused, so a split child never inherits a
// parent's id).
func NewPartitionIDs(r io.Reader, n int, taken map[string]bool) ([]string, error) {
	seen := make(map[string]bool, n)
	ids := make([]string, 0, n)
	for len(ids) < n {
		id, err := NewPartitionID(r)
		if err != nil {
			return nil, err
		}
		if taken[id] || seen[id] || !strings.HasPrefix(id, PartitionIDPrefix) {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, nil
}
