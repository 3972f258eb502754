package main

import (
	"context"
	"os"
	"strconv"
	"strings"
)

// Server CPU per op: around every timed load the bench reads the CPU time
// (user + system, /proc/<pid>/stat) of the processes that serve the
// system: the api and the Postgres backends connected to its database
// for Blobplane, the server process for MinIO and Distribution. The raw
// pipeline serves in the bench's own process and has none. Divided by the
// load's ops it is the work one op costs the machine, a figure the
// machine's noise moves far less than throughput (docs/performance.md).

// cpuMeter lists the processes serving a system now.
type cpuMeter func(ctx context.Context) ([]int, error)

// pidMeter is the cpuMeter of a system served by one process.
func pidMeter(pid int) cpuMeter {
	return func(context.Context) ([]int, error) { return []int{pid}, nil }
}

// isLocalProc reports whether pid is a process of this machine named
// comm (its /proc/<pid>/comm).
func isLocalProc(pid int, comm string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && strings.TrimSpace(string(b)) == comm
}
