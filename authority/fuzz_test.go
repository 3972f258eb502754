package authority

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/blobplane/blobplane"
)

// FuzzParseMap fuzzes the map document parser and validator: whatever the
// input, parsing and validation return a CodeInvalid error or a map that
// encodes canonically, round-trips unchanged, and resolves every slot to
// exactly one partition (R5, R7, R10). Seed corpus: testdata/fuzz/FuzzParseMap.
func FuzzParseMap(f *testing.F) {
	if spec, err := os.ReadFile("testdata/spec-map-1487.json"); err == nil {
		f.Add(spec)
	}
	small := testMap(f, 2, 3, 2)
	data, _ := json.Marshal(small)
	f.Add(data)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMap(data)
		if err != nil {
			if blobplane.ErrorCode(err) != blobplane.CodeInvalid || !errors.Is(err, ErrMalformed) {
				t.Fatalf("parse error without the malformed code: %v", err)
			}
			return
		}
		if err := Validate(m); err != nil {
			if blobplane.ErrorCode(err) != blobplane.CodeInvalid {
				t.Fatalf("validation error code %s: %v", blobplane.ErrorCode(err), err)
			}
			return
		}
		wire, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("valid map does not encode: %v", err)
		}
		back, err := ParseMap(wire)
		if err != nil {
			t.Fatalf("canonical output does not parse: %v\n%s", err, wire)
		}
		if !SameContent(m, back) {
			t.Fatalf("round trip changed the map:\n%s", wire)
		}
		again, _ := json.Marshal(back)
		if string(again) != string(wire) {
			t.Fatal("canonical encoding not stable")
		}
		ix, err := NewIndex(m)
		if err != nil {
			t.Fatalf("valid map does not index: %v", err)
		}
		// R5: every slot resolves. Sample the edges and range boundaries.
		top := MaxSlot(m.SlotBits)
		probe := []Slot{0, top, top / 2}
		for _, p := range m.Partitions {
			for _, r := range p.Slots {
				probe = append(probe, r.Low, r.High)
			}
		}
		for _, s := range probe {
			p := ix.Lookup(s)
			if p == nil {
				t.Fatalf("slot %d unowned in a valid map", s)
			}
			owned := false
			for _, r := range p.Slots {
				owned = owned || r.Contains(s)
			}
			if !owned {
				t.Fatalf("slot %d resolved to %s, which does not hold it", s, p.ID)
			}
		}
	})
}

// FuzzApplyDelta fuzzes the delta parser and ApplyDelta against a fixed
// base: a delta either fails with CodeInvalid or yields a valid successor
// (R5, R6, R9).
func FuzzApplyDelta(f *testing.F) {
	base := testMap(f, 3, 3, 3)
	next := base.Clone()
	next.Version = 2
	next.Partitions[1].Epoch++
	next.Partitions[1].Primary.State = PrimarySealed
	d, err := Diff(base, next)
	if err != nil {
		f.Fatal(err)
	}
	data, _ := json.Marshal(d)
	f.Add(data)
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseDelta(data)
		if err != nil {
			return
		}
		out, err := ApplyDelta(base, d)
		if err != nil {
			if blobplane.ErrorCode(err) != blobplane.CodeInvalid {
				t.Fatalf("code %s: %v", blobplane.ErrorCode(err), err)
			}
			return
		}
		if err := Validate(out); err != nil {
			t.Fatalf("applied delta yields an invalid map: %v", err)
		}
		if err := CheckSuccessor(base, out); err != nil {
			t.Fatalf("applied delta yields a non-successor: %v", err)
		}
		if out.Version != d.Version || base.Version != 1 {
			t.Fatal("versions")
		}
	})
}
