package main

import (
	"os"
	"strconv"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command with spaces and a parenthesis, as /proc shows it.
	const stat = "4242 (api (x) 1) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 37 0 0 20 0 9 0 123 456 789"
	got, ok := parseStatCPU(stat)
	if !ok || got != 287*clockTick {
		t.Fatalf("parseStatCPU = %v, %v; want %v", got, ok, 287*clockTick)
	}
	for _, bad := range []string{"", "4242 api S 1", "4242 (api) S 1 2 3", "4242 (api) S 1 4242 4242 0 -1 4194560 1200 0 0 0 x 37 0"} {
		if _, ok := parseStatCPU(bad); ok {
			t.Errorf("parseStatCPU(%q) parsed", bad)
		}
	}
}

func TestCPUUsed(t *testing.T) {
	before := map[int]time.Duration{1: 10 * time.Millisecond, 2: 50 * time.Millisecond, 3: time.Second}
	after := map[int]time.Duration{1: 30 * time.Millisecond, 2: 50 * time.Millisecond, 4: 70 * time.Millisecond}
	// 1 used 20 ms, 2 nothing, 4 started since (all of its 70 ms), 3 ended (lost).
	if got := cpuUsed(before, after); got != 90*time.Millisecond {
		t.Fatalf("cpuUsed = %v, want 90ms", got)
	}
}

// The bench's own process, read through /proc, is counted and grows.
func TestCPUTimesOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	pid := os.Getpid()
	before := cpuTimes([]int{pid, -1})
	if _, ok := before[pid]; !ok || len(before) != 1 {
		t.Fatalf("cpuTimes = %v, want this process only", before)
	}
	deadline := time.Now().Add(5 * time.Second)
	for cpuUsed(before, cpuTimes([]int{pid})) < 2*clockTick && time.Now().Before(deadline) {
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
	}
	if got := cpuUsed(before, cpuTimes([]int{pid})); got < 2*clockTick {
		t.Fatalf("this process used %v of CPU after spinning", got)
	}
	if !isLocalProc(pid, readComm(t, pid)) || isLocalProc(pid, "postgres-not-this") {
		t.Fatal("isLocalProc does not recognise this process by its command")
	}
}

func readComm(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:len(b)-1])
}
