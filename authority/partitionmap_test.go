package authority

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
)

func TestV3_MapResolution(t *testing.T) {
	t.Parallel()
	// Against the spec's map at map_version 1487: p_whale holds slot 1371
	// alone; p_0002 holds [1372, 2047]; that example covers nothing else, so
	// other slots resolve to NO_MAP (A.1 step 2).
	ix := mustIndex(t, specMap(t))
	for _, tc := range []struct {
		key       string
		slot      Slot
		partition string // "" means no partition (NO_MAP)
		node      string
		endpoint  string
	}{
		{"t_whale", 1371, "p_whale", "n_c41d", "10.0.6.4:7443"},
		{"repo-1504", 1371, "p_whale", "n_c41d", "10.0.6.4:7443"},
		{"repo-2939", 1372, "p_0002", "n_7a2c", "10.0.4.11:7443"},
		{"repo-521", 1789, "p_0002", "n_7a2c", "10.0.4.11:7443"},
		{"repo-804", 2047, "p_0002", "n_7a2c", "10.0.4.11:7443"},
		{"repo-0", 201, "", "", ""},
		{"repo-2", 2310, "", "", ""},
	} {
		t.Run(tc.key, func(t *testing.T) {
			r, err := ix.ResolveKey(tc.key)
			if r.Slot != tc.slot {
				t.Fatalf("slot = %d, want %d", r.Slot, tc.slot)
			}
			if tc.partition == "" {
				wantErr(t, err, ErrNoMap)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Partition.ID != tc.partition || r.Primary().Node != tc.node || r.Primary().Endpoint != tc.endpoint || r.MapVersion != 1487 {
				t.Fatalf("resolved %+v / %+v", r.Partition.ID, r.Primary())
			}
		})
	}
}

func TestR7_SpecExampleParsesFieldForField(t *testing.T) {
	t.Parallel()
	m := specMap(t)
	if m.Version != 1487 || m.SlotBits != 12 || m.Hash != HashName || !m.GeneratedAt.Equal(t0) {
		t.Fatalf("header = %d %d %q %v", m.Version, m.SlotBits, m.Hash, m.GeneratedAt)
	}
	p := m.Partition("p_0002")
	if p == nil || p.Generation != 5 || p.Epoch != 73 || p.Class != "std.2x" || p.Mode != ModeJournaled ||
		len(p.Slots) != 1 || p.Slots[0] != (SlotRange{1372, 2047}) ||
		len(p.Parents) != 1 || p.Parents[0] != (ParentRef{"p_0001", 4}) ||
		p.Primary != (Primary{"n_7a2c", "10.0.4.11:7443", PrimaryServing}) ||
		len(p.Standbys) != 1 || p.Standbys[0] != (Standby{"n_1f90", "10.0.5.23:7443", StandbySynced, 0}) {
		t.Fatalf("p_0002 = %+v", p)
	}
	if m.Signature == nil || m.Signature.KeyID != "map-2026-08" || m.Signature.Alg != "ed25519" {
		t.Fatalf("signature = %+v", m.Signature)
	}
	// The example covers only slots 1371..2047, so it is not publishable.
	wantErr(t, Validate(m), ErrCoverageGap)
}

func TestR5_ValidMapPasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ bits, parts, nodes int }{{12, 1, 1}, {12, 256, 7}, {12, 4096, 3}, {1, 2, 2}, {16, 5, 3}} {
		m := testMap(t, tc.bits, tc.parts, tc.nodes)
		if err := Validate(m); err != nil {
			t.Errorf("%+v: %v", tc, err)
		}
	}
}

// mutate returns a valid 4-partition map changed by f.
func mutate(t *testing.T, f func(m *Map)) *Map {
	t.Helper()
	m := testMap(t, 12, 4, 3)
	f(m)
	return m
}

func TestR5_R7_ValidateRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    func(m *Map)
		want error
	}{
		{"R5_CoverageGapAtTop", func(m *Map) { last(m).Slots[0].High-- }, ErrCoverageGap},
		{"R5_CoverageGapAtBottom", func(m *Map) { first(m).Slots[0].Low++ }, ErrCoverageGap},
		{"R5_NoPartitions", func(m *Map) { m.Partitions = nil }, ErrCoverageGap},
		{"R5_OverlapAcrossPartitions", func(m *Map) { first(m).Slots[0].High++ }, ErrOverlap},
		{"R7_OverlapWithinPartition", func(m *Map) {
			p := byLow(m, 0)
			h := p.Slots[0].High
			p.Slots = []SlotRange{{0, h}, {h, h}}
		}, ErrOverlap},
		{"R7_UnsortedRanges", func(m *Map) {
			p := byLow(m, 0)
			h := p.Slots[0].High
			p.Slots = []SlotRange{{10, h}, {0, 9}}
		}, ErrUnsorted},
		{"R7_InvertedRange", func(m *Map) { s := &byLow(m, 0).Slots[0]; s.Low, s.High = s.High, s.Low }, ErrBadRange},
		{"R7_RangeBeyondSlotBits", func(m *Map) { byLowLast(m).Slots[0].High = 4096 }, ErrBadRange},
		{"R89_NoSlots", func(m *Map) { m.Partitions[0].Slots = nil }, ErrBadRange},
		{"R7_UnknownPrimaryState", func(m *Map) { m.Partitions[1].Primary.State = "ALIVE" }, ErrUnknownState},
		{"R7_UnknownStandbyState", func(m *Map) { m.Partitions[1].Standbys[0].State = "HOT" }, ErrUnknownState},
		{"R7_MissingClass", func(m *Map) { m.Partitions[2].Class = "" }, ErrMissingField},
		{"R7_MissingID", func(m *Map) { m.Partitions[0].ID = "" }, ErrMissingField},
		{"R7_MissingPrimaryEndpoint", func(m *Map) { m.Partitions[0].Primary.Endpoint = "" }, ErrMissingField},
		{"R7_BadStandbyEndpoint", func(m *Map) { m.Partitions[0].Standbys[0].Endpoint = "nope" }, ErrMissingField},
		{"R7_DuplicateID", func(m *Map) { m.Partitions[1].ID = m.Partitions[0].ID }, ErrDuplicateID},
		{"R7_PartitionsNotSortedByID", func(m *Map) { m.Partitions[0], m.Partitions[1] = m.Partitions[1], m.Partitions[0] }, ErrUnsorted},
		{"R29_UnknownMode", func(m *Map) { m.Partitions[0].Mode = "EPHEMERAL" }, ErrUnknownMode},
		{"R2_UnknownHash", func(m *Map) { m.Hash = "xxhash64" }, ErrUnknownHash},
		{"R1_SlotBitsZero", func(m *Map) { m.SlotBits = 0 }, ErrBadSlotBits},
		{"R6_VersionZero", func(m *Map) { m.Version = 0 }, ErrMissingField},
		{"R91_ParentAtHigherGeneration", func(m *Map) { m.Partitions[0].Parents = []ParentRef{{"p_old", 3}} }, ErrBadLineage},
		{"R10_IntegerBeyondCanonicalRange", func(m *Map) { m.Partitions[0].Epoch = 1 << 60 }, ErrOutOfRange},
		{"R10_InvalidUTF8", func(m *Map) { m.Partitions[0].Class = "\xff" }, ErrMalformed},
		{"R7_PrimaryAlsoStandby", func(m *Map) { m.Partitions[0].Standbys[0].Node = m.Partitions[0].Primary.Node }, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(mutate(t, tc.f))
			wantErr(t, err, tc.want)
			if blobplane.ErrorCode(err) != blobplane.CodeInvalid {
				t.Fatalf("code = %s, want invalid", blobplane.ErrorCode(err))
			}
		})
	}
}

func first(m *Map) *Partition { return byLow(m, 0) }
func last(m *Map) *Partition  { return byLowLast(m) }

func byLow(m *Map, low Slot) *Partition {
	for i := range m.Partitions {
		if m.Partitions[i].Slots[0].Low == low {
			return &m.Partitions[i]
		}
	}
	panic("no partition")
}

func byLowLast(m *Map) *Partition {
	for i := range m.Partitions {
		if m.Partitions[i].Slots[len(m.Partitions[i].Slots)-1].High == MaxSlot(m.SlotBits) {
			return &m.Partitions[i]
		}
	}
	panic("no partition")
}

func TestR6_CheckSuccessor(t *testing.T) {
	t.Parallel()
	prev := testMap(t, 12, 4, 3)
	next := prev.Clone()
	next.Version = 2
	if err := CheckSuccessor(prev, next); err != nil {
		t.Fatal(err)
	}
	same := prev.Clone()
	wantErr(t, CheckSuccessor(prev, same), ErrVersionOrder) // R6: never reused
	older := prev.Clone()
	older.Version = 0
	wantErr(t, CheckSuccessor(prev, older), ErrVersionOrder)
	shrunk := next.Clone()
	shrunk.SlotBits = 11
	wantErr(t, CheckSuccessor(prev, shrunk), ErrSlotBitsShrink) // R3
	regress := next.Clone()
	regress.Partitions[0].Epoch = 0
	wantErr(t, CheckSuccessor(prev, regress), ErrEpochRegress) // R16
	// R16: a split child's epoch must not reset below its parent's.
	child := next.Clone()
	parent := child.Partitions[0]
	child.Partitions[0].ID = "p_child"
	child.Partitions[0].Generation = parent.Generation + 1
	child.Partitions[0].Parents = []ParentRef{{parent.ID, parent.Generation}}
	child.Partitions[0].Epoch = parent.Epoch // not above the parent
	wantErr(t, CheckSuccessor(prev, child), ErrEpochRegress)
	child.Partitions[0].Epoch = parent.Epoch + 1
	if err := CheckSuccessor(prev, child); err != nil {
		t.Fatal(err)
	}
	if SameContent(prev, next) || !SameContent(prev, prev.Clone()) {
		t.Fatal("SameContent wrong")
	}
}

func TestR5_EvenSplitBuilder(t *testing.T) {
	t.Parallel()
	m := testMap(t, 12, 256, 7)
	sizes := map[uint64]int{}
	for _, p := range m.Partitions {
		sizes[p.Slots[0].Len()]++
		if p.Primary.Node == p.Standbys[0].Node {
			t.Fatalf("%s: standby on its primary", p.ID)
		}
	}
	if len(sizes) != 1 || sizes[16] != 256 {
		t.Fatalf("partition sizes = %v, want 256 x 16", sizes)
	}
	uneven := testMap(t, 12, 7, 2)
	total := uint64(0)
	for _, p := range uneven.Partitions {
		if n := p.Slots[0].Len(); n != 585 && n != 586 {
			t.Fatalf("size %d", n)
		}
		total += p.Slots[0].Len()
	}
	if total != 4096 {
		t.Fatalf("total %d", total)
	}
	if _, err := (EvenSplit{Version: 1, GeneratedAt: t0, Partitions: 4097, Nodes: nodes(1), Class: "c", Mode: ModeDerived}).Build(); err == nil {
		t.Fatal("more partitions than slots accepted (R96)")
	}
}

func TestR13_PartitionIDsAreOpaqueAndUnique(t *testing.T) {
	t.Parallel()
	ids, err := NewPartitionIDs(nil, 1000, map[string]bool{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] || !strings.HasPrefix(id, "p_") || len(id) != 18 {
			t.Fatalf("bad id %q", id)
		}
		seen[id] = true
	}
	// Reproducible from a seeded reader; the id says nothing about slots.
	a, _ := NewPartitionID(newSeeded(1))
	b, _ := NewPartitionID(newSeeded(1))
	if a != b {
		t.Fatal("seeded ids differ")
	}
}

func TestR7_WireRoundTrip(t *testing.T) {
	t.Parallel()
	m := testMap(t, 12, 8, 3)
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseMap(data)
	if err != nil {
		t.Fatal(err)
	}
	if !SameContent(m, back) {
		t.Fatalf("round trip changed the map:\n%s", data)
	}
	again, _ := json.Marshal(back)
	if string(again) != string(data) {
		t.Fatal("encoding not stable")
	}
}

func TestR10_ParseMapRejectsUnknownAndTrailing(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"unknown_field": `{"map_version":1,"extra":true}`,
		"trailing":      `{"map_version":1} {}`,
		"bad_range":     `{"map_version":1,"partitions":[{"slots":[[1,2,3]]}]}`,
		"negative":      `{"map_version":-1}`,
		"not_json":      `{`,
	} {
		if _, err := ParseMap([]byte(doc)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func BenchmarkResolveKey(b *testing.B) {
	ix := mustIndex(b, testMap(b, 12, 256, 16))
	b.ReportAllocs()
	for b.Loop() {
		_, _ = ix.ResolveKey("acme/platform/backend-service")
	}
}

// R4: the slot is the atom of placement: a map cannot pin a key (or
// override a slot) anywhere — a partition carrying a key list, or a map
// carrying overrides, is not a map.
func TestR4_NoKeyLevelPins(t *testing.T) {
	t.Parallel()
	m := testMap(t, 4, 2, 1)
	doc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(string) string{
		"keys on a partition": func(s string) string {
			return strings.Replace(s, `"id":`, `"keys":["team/app"],"id":`, 1)
		},
		"overrides on the map": func(s string) string {
			return strings.Replace(s, `"map_version":`, `"overrides":{"team/app":"p_x"},"map_version":`, 1)
		},
	} {
		if _, err := ParseMap([]byte(edit(string(doc)))); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}
