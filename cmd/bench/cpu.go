package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"
)

// Server CPU per op: around every timed load the bench reads the CPU time
// (user + system, /proc/<pid>/stat) of the processes that serve the
// system: the api and the Postgres backends connected to its database
// for Blobplane, the server process for MinIO and Distribution. The raw
// pipeline serves in the bench's own process and has none. Divided by the
// load's ops it is the work one op costs the machine, a figure the
// machine's noise moves far less than throughput (docs/performance.md).

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ: 100 on
// every Linux the bench runs on).
const clockTick = 10 * time.Millisecond

// cpuMeter lists the processes serving a system now.
type cpuMeter func(ctx context.Context) ([]int, error)

// pidMeter is the cpuMeter of a system served by one process.
func pidMeter(pid int) cpuMeter {
	return func(context.Context) ([]int, error) { return []int{pid}, nil }
}

// cpuTimes reads the CPU time of each of pids; one that is gone, or that
// /proc cannot tell (not Linux), is left out.
func cpuTimes(pids []int) map[int]time.Duration {
	m := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if t, ok := procCPU(pid); ok {
			m[pid] = t
		}
	}
	return m
}

// procCPU parses utime + stime (fields 14 and 15) of /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime + stime from the text of a /proc/<pid>/stat
// (after the command, which is in parentheses and may hold spaces).
func parseStatCPU(stat string) (time.Duration, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * clockTick, true
}

// cpuUsed is the CPU the processes of after used since before; one that
// started since counts whole. A process that ended in between is lost:
// the servers keep theirs (pooled connections) through a load.
func cpuUsed(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range after {
		d += t - before[pid]
	}
	return d
}

// isLocalProc reports whether pid is a process of this machine named
// comm (its /proc/<pid>/comm).
func isLocalProc(pid int, comm string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && strings.TrimSpace(string(b)) == comm
}
