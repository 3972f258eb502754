package journal

import (
	"errors"
	"reflect"
	"testing"
)

// V5 — Recovery positions. A checkpoint at journal_lsn 918233 with
// positions {shard-0004: …012, shard-0005: …031}, and two journal segments
// after it, 918234–940100 and 940101–961887, the latter marking
// {shard-0004: …901, shard-0005: …877}: the restore reads both segments,
// applies 918234 through 961887, and resumes input at the latter's marks,
// not the checkpoint's (which would re-apply every input record between
// them).
func TestV5RecoveryPositions(t *testing.T) {
	ckpt := Marks{"shard-0004": "49590000000000000000000012", "shard-0005": "49590000000000000000000031"}
	first := Marks{"shard-0004": "49590000000000000000000455", "shard-0005": "49590000000000000000000460"}
	last := Marks{"shard-0004": "49590000000000000000000901", "shard-0005": "49590000000000000000000877"}
	segs := []Segment{{940101, 961887}, {918234, 940100}, {900001, 918233}}
	plan, err := Plan(918233, segs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Segment{{918234, 940100}, {940101, 961887}}; !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan %v, want %v", plan, want)
	}
	r := NewReplay(918233, ckpt)
	applied := 0
	for _, s := range plan {
		for lsn := s.First; lsn <= s.Last; lsn++ {
			rec := Record{Type: Apply, LSN: lsn, Epoch: 73}
			if lsn == s.Last { // each segment's last record marks its positions
				rec.Marks = first
				if s.Last == 961887 {
					rec.Marks = last
				}
			}
			ok, err := r.Feed(rec)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				applied++
			}
		}
	}
	if applied != 961887-918233 || r.LSN() != 961887 {
		t.Fatalf("applied %d records up to %d; want %d up to 961887", applied, r.LSN(), 961887-918233)
	}
	if got := r.Resume(); !reflect.DeepEqual(got, last) {
		t.Fatalf("resume at %v; want the tail's marks %v (the checkpoint's %v re-applies the window)", got, last, ckpt)
	}
}

func TestReplaySkipsTheCheckpointAndRefusesGaps(t *testing.T) {
	r := NewReplay(10, nil)
	for lsn := uint64(8); lsn <= 10; lsn++ { // a segment straddling the checkpoint
		if ok, err := r.Feed(Record{Type: Apply, LSN: lsn}); ok || err != nil {
			t.Fatalf("LSN %d (in the checkpoint): apply=%v, %v", lsn, ok, err)
		}
	}
	if ok, err := r.Feed(Record{Type: Apply, LSN: 11}); !ok || err != nil {
		t.Fatalf("LSN 11: %v, %v", ok, err)
	}
	if ok, err := r.Feed(Record{Type: Mark, LSN: 12, Marks: Marks{"s": "1"}}); ok || err != nil {
		t.Fatalf("a MARK is not applied: %v, %v", ok, err)
	}
	if _, err := r.Feed(Record{Type: Apply, LSN: 14}); !errors.Is(err, ErrGap) {
		t.Fatalf("LSN 14 after 12: %v, want ErrGap", err)
	}
	if r.LSN() != 12 || r.Resume()["s"] != "1" {
		t.Fatalf("after the gap: LSN %d, resume %v", r.LSN(), r.Resume())
	}
}

func TestPlanRefusesHolesAndOverlaps(t *testing.T) {
	for _, tc := range []struct {
		lsn  uint64
		segs []Segment
	}{
		{0, []Segment{{2, 5}}},           // LSN 1 missing
		{5, []Segment{{1, 5}, {7, 9}}},   // 6 missing
		{0, []Segment{{1, 10}, {5, 20}}}, // overlap
		{0, []Segment{{3, 2}}},           // malformed
	} {
		if _, err := Plan(tc.lsn, tc.segs); err == nil {
			t.Errorf("Plan(%d, %v) accepted", tc.lsn, tc.segs)
		}
	}
	if plan, err := Plan(20, []Segment{{1, 10}, {11, 20}}); err != nil || len(plan) != 0 {
		t.Fatalf("a checkpoint at the tail: %v, %v", plan, err)
	}
}
