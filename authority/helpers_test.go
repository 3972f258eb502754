package authority

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// sign signs domain+canonical; tests use it to forge documents that skip
// SignMap's validation or use the wrong domain.
func (s Signer) sign(domain string, canonical []byte) *Signature {
	return s.signMessage(append([]byte(domain), canonical...))
}

var t0 = time.Date(2026, 8, 21, 9, 14, 2, 0, time.UTC)

// seeded is a deterministic io.Reader for partition ids.
type seeded struct{ r *rand.ChaCha8 }

func newSeeded(seed byte) seeded {
	var s [32]byte
	s[0] = seed
	return seeded{rand.NewChaCha8(s)}
}

func (s seeded) Read(p []byte) (int, error) { return s.r.Read(p) }

func nodes(n int) []NodeAddr {
	out := make([]NodeAddr, n)
	for i := range out {
		out[i] = NodeAddr{Node: fmt.Sprintf("n_%02d", i), Endpoint: fmt.Sprintf("10.0.%d.1:7443", i)}
	}
	return out
}

// testMap is a valid, unsigned even-split map at version 1, SERVING.
func testMap(t testing.TB, bits, parts, nNodes int) *Map {
	t.Helper()
	m, err := EvenSplit{
		Version: 1, GeneratedAt: t0, SlotBits: bits, Partitions: parts,
		Nodes: nodes(nNodes), Standbys: min(1, nNodes-1), Class: "std.2x", Mode: ModeJournaled,
		State: PrimaryServing, Epoch: 1, Rand: newSeeded(byte(parts)),
	}.Build()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustIndex(t testing.TB, m *Map) *Index {
	t.Helper()
	ix, err := NewIndex(m)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// specMap is the example map of the spec's Wire formats section, verbatim.
func specMap(t testing.TB) *Map {
	t.Helper()
	data, err := os.ReadFile("testdata/spec-map-1487.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseMap(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func wantErr(t testing.TB, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
}
