package authority

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/quick"
)

// The spec's copy of the V1/V2/V7 tables lists no rows beyond the worked
// t_whale example, so the other rows here were produced by running the
// spec's reference implementation (Python, "Reference implementation") on
// these keys; t_whale is the spec's own example (md5 55b0c21b…, slot 1371).

func TestV1_KeyToSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key    string
		md5hex string
		slot   Slot
	}{
		{"t_whale", "55b0c21b24e83694bdafcb69a8da3391", 1371}, // the spec's worked example
		{"", "d41d8cd98f00b204e9800998ecf8427e", 3393},
		{"a", "0cc175b9c0f1b6a831c399e269772661", 204},
		{"team/app", "e61301958c4a615ba8ae6962eeb94c29", 3681},
		{"library/ubuntu", "0e0fc7a77da0e1e3f22f35d070c46512", 224},
		{"t_1", "69ac49315fb75559bc7125a373ed5735", 1690},
		{"données/über", "2648debf3af87f2a3c1838883272bda6", 612}, // R1: UTF-8 bytes
		{"日本/リポジトリ", "ccc0bafa63906ff8e30c028a6fc05024", 3276},
	} {
		t.Run(tc.key, func(t *testing.T) {
			h := HashKey(tc.key)
			if got := hex.EncodeToString(h[:]); got != tc.md5hex {
				t.Fatalf("md5(%q) = %s, want %s", tc.key, got, tc.md5hex)
			}
			if got := SlotOf(tc.key, DefaultSlotBits); got != tc.slot {
				t.Fatalf("SlotOf(%q, 12) = %d, want %d", tc.key, got, tc.slot)
			}
			// At 12 bits the slot is the first three hex digits of the MD5.
			if want := fmt.Sprintf("%03x", tc.slot); want != tc.md5hex[:3] {
				t.Fatalf("slot %d is %s, md5 starts %s", tc.slot, want, tc.md5hex[:3])
			}
		})
	}
}

func TestV2_RefinementTwelveToThirteen(t *testing.T) {
	t.Parallel()
	// Each key lands in one of its own slot's two children.
	for _, tc := range []struct {
		key string
		s12 Slot
		s13 Slot
		s16 Slot
	}{
		{"t_whale", 1371, 2742, 21936},
		{"", 3393, 6787, 54301},
		{"a", 204, 408, 3265},
		{"team/app", 3681, 7362, 58899},
		{"données/über", 612, 1225, 9800},
	} {
		if got := SlotOf(tc.key, 13); got != tc.s13 {
			t.Errorf("SlotOf(%q, 13) = %d, want %d", tc.key, got, tc.s13)
		}
		if got := SlotOf(tc.key, 16); got != tc.s16 {
			t.Errorf("SlotOf(%q, 16) = %d, want %d", tc.key, got, tc.s16)
		}
		r, err := RefineSlot(tc.s12, 12, 13)
		if err != nil || !r.Contains(tc.s13) || r.Len() != 2 {
			t.Errorf("RefineSlot(%d) = %v, %v; want 2 slots containing %d", tc.s12, r, err, tc.s13)
		}
	}
	// Ranges rewrite mechanically (the spec's two examples).
	for _, tc := range []struct{ in, want SlotRange }{
		{SlotRange{1371, 1371}, SlotRange{2742, 2743}},
		{SlotRange{0, 1370}, SlotRange{0, 2741}},
		{SlotRange{0, 4095}, SlotRange{0, 8191}},
	} {
		if got := tc.in.Refine(1); got != tc.want {
			t.Errorf("%v.Refine(1) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestR3_RefineSlotRefusesDecrease(t *testing.T) {
	t.Parallel()
	if _, err := RefineSlot(5, 13, 12); err == nil {
		t.Fatal("RefineSlot 13 -> 12 accepted; SLOT_BITS must never decrease")
	}
}

// TestR3_RefinementMovesNoKey is the property behind R3: for any key, any
// range, any b and d, the key is in the range at b bits iff it is in the
// refined range at b+d bits.
func TestR3_RefinementMovesNoKey(t *testing.T) {
	t.Parallel()
	prop := func(key string, a, c uint32, bRaw, dRaw uint8) bool {
		b := int(bRaw)%20 + 1 // 1..20
		d := int(dRaw) % (MaxSlotBits - b + 1)
		lo, hi := Slot(a)&MaxSlot(b), Slot(c)&MaxSlot(b)
		if lo > hi {
			lo, hi = hi, lo
		}
		r := SlotRange{lo, hi}
		before := r.Contains(SlotOf(key, b))
		after := r.Refine(d).Contains(SlotOf(key, b+d))
		// and the key's own slot refines to a range holding its finer slot
		own, err := RefineSlot(SlotOf(key, b), b, b+d)
		return err == nil && before == after && own.Contains(SlotOf(key, b+d))
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 20000, Rand: nil}); err != nil {
		t.Fatal(err)
	}
}

// TestR3_RefineMapMovesNoKey refines a whole map and checks every sampled key
// resolves to the same partition before and after.
func TestR3_RefineMapMovesNoKey(t *testing.T) {
	t.Parallel()
	m := testMap(t, 12, 37, 5)
	fine, err := Refine(m, 15, m.Version+1, m.GeneratedAt)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(fine); err != nil {
		t.Fatalf("refined map invalid: %v", err)
	}
	if err := CheckSuccessor(m, fine); err != nil {
		t.Fatal(err)
	}
	if n, err := MovedSlots(m, fine); err != nil || n != 0 {
		t.Fatalf("MovedSlots after refinement = %d, %v; want 0", n, err)
	}
	a, b := mustIndex(t, m), mustIndex(t, fine)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		key := fmt.Sprintf("repo/%x", rng.Uint64())
		ra, _ := a.ResolveKey(key)
		rb, _ := b.ResolveKey(key)
		if ra.Partition.ID != rb.Partition.ID {
			t.Fatalf("key %q moved from %s to %s", key, ra.Partition.ID, rb.Partition.ID)
		}
	}
	if _, err := Refine(m, 11, m.Version+1, m.GeneratedAt); err == nil {
		t.Fatal("Refine to fewer bits accepted (R3)")
	}
}

func TestV7_SlotToExplicitHashKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		slot Slot
		want string
	}{
		{0, "0"},
		{1, "83076749736557242056487941267521536"}, // 2^116
		{1371, "113898223888819978859444967477772025856"},
		{2048, "170141183460469231731687303715884105728"}, // 2^127
		{4095, "340199290171201906221318119490500689920"},
	} {
		if got := ExplicitHashKey(tc.slot, 12); got != tc.want {
			t.Errorf("ExplicitHashKey(%d) = %s, want %s", tc.slot, got, tc.want)
		}
	}
	// Slot 4095 spans from its low hash key to the top of the space.
	lo, hi := SlotHashRange(4095, 12)
	if lo != "340199290171201906221318119490500689920" || hi != "340282366920938463463374607431768211455" {
		t.Fatalf("SlotHashRange(4095) = %s..%s", lo, hi)
	}
}

func BenchmarkSlotOf(b *testing.B) {
	keys := []string{"t_whale", "library/ubuntu", "acme/platform/backend-service", "données/über"}
	b.ReportAllocs()
	var sink Slot
	for i := 0; b.Loop(); i++ {
		sink ^= SlotOf(keys[i&3], DefaultSlotBits)
	}
	_ = sink
}
