package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Machine is what the figures were measured on.
type Machine struct {
	CPUs      int    `json:"nproc"`
	CPUModel  string `json:"cpu_model"`
	Memory    string `json:"memory"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
	Postgres  string `json:"postgres"`
	Commit    string `json:"commit"` // with "-dirty" when tracked files differ from it
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
	PageCache string `json:"page_cache"` // what dropPageCache did before the systems started
}

// dropCachesPath is where Linux takes the order to drop the page cache.
const dropCachesPath = "/proc/sys/vm/drop_caches"

// dropPageCache syncs every filesystem and asks Linux (at path) to drop
// the page cache and the cached dentries and inodes, and describes the
// outcome for the report. Why: on ext4 without a journal, creating files
// right after many were deleted is up to ten times slower while the
// inode-table blocks of the deleted inodes stay cached (the allocator
// checks each for a recent deletion; docs/performance.md), and every run
// deletes its data at the end, so without this a run inherits the last
// one's deletions and the first system of each workload pays for them.
// It needs root; without it the run goes on and the report says so.
func dropPageCache(path string, enabled bool) string {
	if !enabled {
		return "not dropped (--drop-caches=false)"
	}
	syncAll()
	if err := os.WriteFile(path, []byte("3\n"), 0); err != nil {
		return "not dropped (" + err.Error() + ")"
	}
	return "dropped before the systems started"
}

// describeMachine gathers Machine; what cannot be read is "unknown".
// databaseURL may be empty (no Postgres version then).
func describeMachine(ctx context.Context, databaseURL string) Machine {
	m := Machine{
		CPUs:      runtime.NumCPU(),
		CPUModel:  cpuModel(),
		Memory:    memTotal(),
		Kernel:    firstLine("/proc/sys/kernel/osrelease"),
		GoVersion: runtime.Version(),
		Postgres:  "no Postgres",
		Commit:    gitCommit(ctx),
		LoadStart: loadAvg(),
	}
	if databaseURL != "" {
		if conn, err := pgx.Connect(ctx, databaseURL); err == nil {
			var v string
			if conn.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&v) == nil {
				m.Postgres = "PostgreSQL " + v
			}
			conn.Close(ctx)
		}
	}
	return m
}

func firstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	f := strings.Fields(firstLine("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
				return fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
			}
		}
	}
	return "unknown"
}

// gitCommit is HEAD's short hash, "-dirty" when tracked files changed.
func gitCommit(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "-dirty"
	}
	return c
}
