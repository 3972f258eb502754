package procstat

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command with spaces and a parenthesis, as /proc shows it.
	const stat = "4242 (api (x) 1) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 37 0 0 20 0 9 0 123 456 789"
	got, ok := ParseStat(stat)
	if !ok || got != 287*ClockTick {
		t.Fatalf("ParseStat = %v, %v; want %v", got, ok, 287*ClockTick)
	}
	for _, bad := range []string{"", "4242 api S 1", "4242 (api) S 1 2 3", "4242 (api) S 1 4242 4242 0 -1 4194560 1200 0 0 0 x 37 0"} {
		if _, ok := ParseStat(bad); ok {
			t.Errorf("ParseStat(%q) parsed", bad)
		}
	}
}

func TestUsed(t *testing.T) {
	before := map[int]time.Duration{1: 10 * time.Millisecond, 2: 50 * time.Millisecond, 3: time.Second}
	after := map[int]time.Duration{1: 30 * time.Millisecond, 2: 50 * time.Millisecond, 4: 70 * time.Millisecond}
	// 1 used 20 ms, 2 nothing, 4 started since (all of its 70 ms), 3 ended (lost).
	if got := Used(before, after); got != 90*time.Millisecond {
		t.Fatalf("Used = %v, want 90ms", got)
	}
}

// This process, read through /proc, is counted and grows.
func TestTimesOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	pid := os.Getpid()
	before := Times([]int{pid, -1})
	if _, ok := before[pid]; !ok || len(before) != 1 {
		t.Fatalf("Times = %v, want this process only", before)
	}
	deadline := time.Now().Add(5 * time.Second)
	for Used(before, Times([]int{pid})) < 2*ClockTick && time.Now().Before(deadline) {
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
	}
	if got := Used(before, Times([]int{pid})); got < 2*ClockTick {
		t.Fatalf("this process used %v of CPU after spinning", got)
	}
}
