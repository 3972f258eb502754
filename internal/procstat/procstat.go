// Package procstat reads the CPU time of processes from /proc, for the
// benchmarks' "CPU per op" figures (docs/performance.md): the work one op
// costs the machine, which its noise moves far less than throughput.
package procstat

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTick is the unit of /proc/<pid>/stat's times (USER_HZ: 100 on
// every Linux the benchmarks run on).
const ClockTick = 10 * time.Millisecond

// Times reads the CPU time (user + system) of each of pids; one that is
// gone, or that /proc cannot tell (not Linux), is left out.
func Times(pids []int) map[int]time.Duration {
	m := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if t, ok := CPU(pid); ok {
			m[pid] = t
		}
	}
	return m
}

// CPU reads utime + stime (fields 14 and 15) of /proc/<pid>/stat.
func CPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return ParseStat(string(b))
}

// ParseStat reads utime + stime from the text of a /proc/<pid>/stat
// (after the command, which is in parentheses and may hold spaces).
func ParseStat(stat string) (time.Duration, bool) {
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
	return time.Duration(utime+stime) * ClockTick, true
}

// Used is the CPU the processes of after used since before; one that
// started since counts whole. A process that ended in between is lost:
// measure long-lived processes (servers, pooled connections).
func Used(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range after {
		d += t - before[pid]
	}
	return d
}
