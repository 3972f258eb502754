package main

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/procstat"
)

// The bench's own process, read through /proc, is counted and grows.
func TestCPUTimesOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	pid := os.Getpid()
	before := procstat.Times([]int{pid, -1})
	if _, ok := before[pid]; !ok || len(before) != 1 {
		t.Fatalf("cpuTimes = %v, want this process only", before)
	}
	deadline := time.Now().Add(5 * time.Second)
	for procstat.Used(before, procstat.Times([]int{pid})) < 2*procstat.ClockTick && time.Now().Before(deadline) {
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
	}
	if got := procstat.Used(before, procstat.Times([]int{pid})); got < 2*procstat.ClockTick {
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
