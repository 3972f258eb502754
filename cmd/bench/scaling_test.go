//go:build linux

package main

// TestScaling is the measurement harness of docs/scaling.md (issue 32,
// "Past one Postgres"), not a test: it is skipped unless
// BLOBPLANE_SCALING=1, and scripts/scaling.sh runs it. It reuses the
// bench's Blobplane (blobplane.go) and two-datacenter cluster
// (repcluster.go) and measures, on one Postgres:
//
//   - per table, the rows each operation writes (pg_stat_user_tables) and
//     the statements it runs (pg_stat_statements, which must be loaded:
//     shared_preload_libraries), per upload, GET, HEAD, reaped intent,
//     collected digest, inventoried object and replicated blob;
//   - uploads/s as client concurrency rises, with the CPU per upload of
//     the api, the Postgres backends and every Postgres process, the WAL
//     bytes, WAL syncs and commits per upload (pg_stat_wal,
//     pg_current_wal_lsn, pg_stat_database) and the api's fsync-family
//     syscalls (perf stat tracepoints, when perf can count them);
//   - worker fleets of N processes: reaper intents/s and collector
//     digests/s of N concurrent `worker sweep --only ...` loops, and
//     cross-datacenter transfers/s of N workers in the target datacenter
//     draining the same kind of backlog.
//
// Figures are printed as Markdown (BLOBPLANE_SCALING_OUT, default
// bench/results/scaling.md), never asserted.

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/internal/procstat"
)

// Seed tags of the scaling harness, far from data.go's.
const (
	seedScaleUpload = 0x40 + iota
	seedScaleCollect
	seedScaleFleet
)

// scaleConfig is the run's settings (environment, see scripts/scaling.sh).
type scaleConfig struct {
	duration     time.Duration
	clients      []int
	fleet        []int
	intents      int // expired intents per reaper fleet run
	collect      int // unreferenced digests per collector fleet run
	transfers    int // 4 KiB blobs per replication fleet run
	settle       time.Duration
	out, bin, db string
}

func scaleConfigFromEnv(t *testing.T) scaleConfig {
	c := scaleConfig{duration: 10 * time.Second, clients: []int{1, 4, 16, 32, 64}, fleet: []int{1, 2, 4},
		intents: 50000, collect: 3000, transfers: 3000, settle: 11 * time.Second,
		out: "bench/results/scaling.md", bin: os.Getenv("BLOBPLANE_SCALING_BIN"), db: os.Getenv("DATABASE_URL")}
	if v := os.Getenv("BLOBPLANE_SCALING_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		c.duration = d
	}
	ints := func(env string, into *[]int) {
		if v := os.Getenv(env); v != "" {
			*into = nil
			for _, f := range strings.Split(v, ",") {
				n, err := strconv.Atoi(f)
				if err != nil || n < 1 {
					t.Fatalf("%s: %q", env, v)
				}
				*into = append(*into, n)
			}
		}
	}
	ints("BLOBPLANE_SCALING_CLIENTS", &c.clients)
	ints("BLOBPLANE_SCALING_FLEET", &c.fleet)
	for env, p := range map[string]*int{"BLOBPLANE_SCALING_INTENTS": &c.intents, "BLOBPLANE_SCALING_COLLECT": &c.collect, "BLOBPLANE_SCALING_TRANSFERS": &c.transfers} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s: %q", env, v)
			}
			*p = n
		}
	}
	if v := os.Getenv("BLOBPLANE_SCALING_SETTLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		c.settle = d
	}
	if v := os.Getenv("BLOBPLANE_SCALING_OUT"); v != "" {
		c.out = v
	}
	return c
}

func TestScaling(t *testing.T) {
	if os.Getenv("BLOBPLANE_SCALING") == "" {
		t.Skip("measurement harness of docs/scaling.md: run scripts/scaling.sh")
	}
	cfg := scaleConfigFromEnv(t)
	if cfg.db == "" {
		t.Fatal("DATABASE_URL unset")
	}
	ctx := t.Context()
	var cl cleanups
	t.Cleanup(func() {
		if err := cl.run(); err != nil {
			t.Log(err)
		}
	})
	dir := t.TempDir()
	if cfg.bin == "" {
		cfg.bin = filepath.Join(dir, "bin")
		if err := buildBlobplane(ctx, cfg.bin); err != nil {
			t.Fatal(err)
		}
	}
	server, err := pgxpool.New(ctx, cfg.db)
	if err != nil {
		t.Fatal(err)
	}
	cl.add(func() error { server.Close(); return nil })
	var pgss bool
	if err := server.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_extension WHERE extname = 'pg_stat_statements'`).Scan(&pgss); err != nil || !pgss {
		t.Fatalf("pg_stat_statements is not installed in the server's database (CREATE EXTENSION after shared_preload_libraries): %v", err)
	}
	r := &scaleRun{t: t, cfg: cfg, server: server, block: make([]byte, 4<<20)}
	_, _ = rand.Read(r.block)
	r.header(ctx)

	bp, err := startBlobplane(ctx, cfg.bin, mustDB(t, ctx, cfg.db, &cl), filepath.Join(dir, "single"), "", &cl)
	if err != nil {
		t.Fatal(err)
	}
	r.bp = bp
	r.singleDatacenter(ctx)
	if os.Getenv("BLOBPLANE_SCALING_ONLY") == "uploads" {
		r.write()
		return
	}
	r.sweepFleets(ctx)

	c, err := startRepCluster(ctx, cfg.bin, cfg.db, filepath.Join(dir, "replication"), &cl)
	if err != nil {
		t.Fatal(err)
	}
	r.transferFleets(ctx, c, &cl)
	r.write()
}

// mustDB creates a bench database on the server of serverURL.
func mustDB(t *testing.T, ctx context.Context, serverURL string, cl *cleanups) string {
	u, drop, err := createDatabase(ctx, serverURL)
	if err != nil {
		t.Fatal(err)
	}
	cl.add(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return drop(ctx)
	})
	return u
}

// scaleRun is one run of the harness: what it measures on and the
// Markdown it writes.
type scaleRun struct {
	t      *testing.T
	cfg    scaleConfig
	server *pgxpool.Pool // the Postgres server (pg_stat_wal, pg_stat_statements)
	bp     *blobplane
	block  []byte
	md     strings.Builder
	// perOp are the per-table rows-per-op columns of the summary table.
	perOp []phaseResult
	// last is the latest closed loop's outcome, taken by phase.
	last loopResult
	// extra is the CPU of the phase's short-lived processes (one-shot
	// sweeps, fleet workers), taken by phase.
	extra time.Duration
	mu    sync.Mutex
}

func (r *scaleRun) printf(format string, args ...any) {
	fmt.Fprintf(&r.md, format, args...)
}

func (r *scaleRun) logf(format string, args ...any) {
	r.t.Logf(format, args...)
}

func (r *scaleRun) write() {
	if err := os.MkdirAll(filepath.Dir(r.cfg.out), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(r.cfg.out, []byte(r.md.String()), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.t.Logf("wrote %s", r.cfg.out)
}

func (r *scaleRun) header(ctx context.Context) {
	m := describeMachine(ctx, r.cfg.db)
	if c := os.Getenv("BLOBPLANE_SCALING_COMMIT"); c != "" {
		m.Commit = c // the binaries' tree (scripts/scaling.sh builds them from a clean checkout)
	}
	var settings string
	_ = r.server.QueryRow(ctx, `SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings
		WHERE name IN ('commit_delay','synchronous_commit','fsync','wal_sync_method','shared_buffers','max_wal_size','shared_preload_libraries','wal_level','full_page_writes')`).Scan(&settings)
	r.printf("# Scaling measurements\n\nStarted %s UTC; commit %s; %d vCPU %s, %s, %s; Go %s; %s; load average at start %s.\n\nPostgres settings: %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04"), m.Commit, m.CPUs, m.CPUModel, m.Memory, m.Kernel, m.GoVersion, m.Postgres, loadAvg(), settings)
	r.printf("Settings: %s per timed load, clients %v, fleets %v, %d intents, %d collected digests, %d transfers per fleet run.\n\n",
		r.cfg.duration, r.cfg.clients, r.cfg.fleet, r.cfg.intents, r.cfg.collect, r.cfg.transfers)
}

// ---- snapshots of the server's counters ----

// tableWrites are a table's cumulative row writes.
type tableWrites struct{ ins, upd, del, hot int64 }

// snapshot is the counters at one moment.
type snapshot struct {
	tables  map[string]tableWrites
	lsn     string
	wal     struct{ records, fpi, bytes, write, sync int64 }
	commits int64
	cpu     map[int]time.Duration
	pgCPU   time.Duration // every Postgres process, exited ones included (postmasterCPU)
	at      time.Time
}

// snap reads the counters of the database db (a pool on it) and the CPU
// of pids. Per-table counters reach pg_stat_user_tables when a backend
// flushes them (at most once a second while busy, 10 s after it goes
// idle): callers settle first.
func (r *scaleRun) snap(ctx context.Context, db *pgxpool.Pool, pids []int) snapshot {
	s := snapshot{tables: map[string]tableWrites{}, cpu: procstat.Times(pids), at: time.Now()}
	rows, err := db.Query(ctx, `SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd FROM pg_stat_user_tables`)
	if err != nil {
		r.t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var w tableWrites
		if err := rows.Scan(&name, &w.ins, &w.upd, &w.del, &w.hot); err != nil {
			r.t.Fatal(err)
		}
		s.tables[name] = w
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi, w.wal_bytes::bigint, w.wal_write, w.wal_sync,
			(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
		FROM pg_stat_wal w`).Scan(&s.lsn, &s.wal.records, &s.wal.fpi, &s.wal.bytes, &s.wal.write, &s.wal.sync, &s.commits); err != nil {
		r.t.Fatal(err)
	}
	return s
}

// pgPIDs lists every process of the Postgres server (backends of every
// database and the background processes) and, separately, the backends
// connected to db's database.
func pgPIDs(ctx context.Context, server, db *pgxpool.Pool) (all, ofDB []int, err error) {
	all, err = pidsOf(ctx, server, `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()`)
	if err != nil {
		return nil, nil, err
	}
	ofDB, err = pidsOf(ctx, db, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	return all, ofDB, err
}

func pidsOf(ctx context.Context, p *pgxpool.Pool, q string) ([]int, error) {
	rows, err := p.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	out := make([]int, 0, len(ps))
	for _, pid := range ps {
		if isLocalProc(int(pid), "postgres") {
			out = append(out, int(pid))
		}
	}
	return out, err
}

// statement is one pg_stat_statements row of a phase.
type statement struct {
	calls, rows int64
	ms          float64
	query       string
}

// resetStatements empties pg_stat_statements for the database of db.
func (r *scaleRun) resetStatements(ctx context.Context, db *pgxpool.Pool) {
	if _, err := r.server.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = $1), 0)`, dbName(db)); err != nil {
		r.t.Fatal(err)
	}
}

func dbName(db *pgxpool.Pool) string { return db.Config().ConnConfig.Database }

// statements reads pg_stat_statements of db's database, most calls first.
func (r *scaleRun) statements(ctx context.Context, db *pgxpool.Pool) []statement {
	rows, err := r.server.Query(ctx, `SELECT calls, rows, total_exec_time, query FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) ORDER BY calls DESC, query`, dbName(db))
	if err != nil {
		r.t.Fatal(err)
	}
	var out []statement
	for rows.Next() {
		var s statement
		if err := rows.Scan(&s.calls, &s.rows, &s.ms, &s.query); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// ---- phases ----

// phaseResult is what one measured phase found.
type phaseResult struct {
	name     string
	ops      int
	unit     string
	elapsed  time.Duration
	before   snapshot
	after    snapshot
	stmts    []statement
	apiPID   []int // the long-lived Blobplane processes measured (apis, a standing worker)
	dbPIDs   []int // backends of the database
	allPG    []int
	self     time.Duration // the harness's own CPU (its clients)
	fsyncs   map[string]int64
	load     string
	loop     loopResult    // the closed loop's outcome, when the phase ran one
	extraCPU time.Duration // CPU of processes that exit within the phase (rusage)
}

// phase measures run on the database of db: it settles the counters,
// snapshots them and the CPU of api (and Postgres), resets
// pg_stat_statements, runs run (which returns the op count), settles
// again and snapshots. Settling (cfg.settle) waits for backends to flush
// their per-table counters; background writes in that time (leases,
// heartbeats) are measured by the idle phase and reported beside.
func (r *scaleRun) phase(ctx context.Context, db *pgxpool.Pool, name, unit string, api []int, run func() (int, error)) *phaseResult {
	time.Sleep(r.cfg.settle)
	all, ofDB, err := pgPIDs(ctx, r.server, db)
	if err != nil {
		r.t.Fatal(err)
	}
	pids := slices.Concat(api, all)
	p := &phaseResult{name: name, unit: unit, apiPID: api, dbPIDs: ofDB, allPG: all}
	perf := startPerf(api)
	r.resetStatements(ctx, db)
	p.before = r.snap(ctx, db, pids)
	p.before.pgCPU = r.postmasterCPU(ctx)
	selfBefore, _ := procstat.CPU(os.Getpid())
	start := time.Now()
	r.last, r.extra = loopResult{}, 0
	p.ops, err = run()
	p.elapsed = time.Since(start)
	p.loop, p.extraCPU = r.last, r.extra
	selfAfter, _ := procstat.CPU(os.Getpid())
	p.self = selfAfter - selfBefore
	p.load = loadAvg()
	if err != nil {
		perf.stop()
		r.t.Fatalf("%s: %v", name, err)
	}
	p.fsyncs = perf.stop()
	p.stmts = r.statements(ctx, db)
	// CPU right after the run (the settle's idle is not the op's), the
	// tables' counters after the settle.
	cpuAfter := procstat.Times(pids)
	pgAfter := r.postmasterCPU(ctx)
	time.Sleep(r.cfg.settle)
	p.after = r.snap(ctx, db, nil)
	p.after.cpu, p.after.pgCPU = cpuAfter, pgAfter
	p.after.at = start.Add(p.elapsed)
	r.logf("%s: %d %s in %s (load %s)", name, p.ops, unit, p.elapsed.Round(time.Millisecond), p.load)
	return p
}

// pgCPU is the CPU every process of the Postgres server used during the
// phase, backends that started or exited within it included.
func (p *phaseResult) pgCPU() time.Duration { return p.after.pgCPU - p.before.pgCPU }

// postmasterCPU is the CPU time of the whole Postgres server so far: the
// postmaster's own and its reaped children's (cutime, cstime: every
// backend that exited, e.g. a one-shot sweep's) plus its live children's.
// Its delta over a phase counts backends that came and went within it.
func (r *scaleRun) postmasterCPU(ctx context.Context) time.Duration {
	var backend int32
	if err := r.server.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		r.t.Fatal(err)
	}
	pm, _, ok := statFields(int(backend))
	if !ok {
		r.t.Fatalf("cannot read /proc/%d/stat: is Postgres on this machine?", backend)
	}
	_, total, _ := statFields(pm)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pm {
			continue
		}
		if ppid, _, ok := statFields(pid); ok && ppid == pm {
			t, _ := procstat.CPU(pid)
			total += t
		}
	}
	return total
}

// statFields reads a process's parent and its CPU time including its
// reaped children's (utime + stime + cutime + cstime).
func statFields(pid int) (ppid int, cpu time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	var ticks int64
	for _, k := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		ticks += v
	}
	return ppid, time.Duration(ticks) * procstat.ClockTick, true
}

// cpu is the CPU the processes in pids used during the phase.
func (p *phaseResult) cpu(pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		if a, ok := p.after.cpu[pid]; ok {
			d += a - p.before.cpu[pid]
		}
	}
	return d
}

func (p *phaseResult) perOp(v float64) float64 { return v / float64(max(p.ops, 1)) }

// rowsPerOp is a table's rows written per op: inserted, updated, deleted.
func (p *phaseResult) rowsPerOp(table string) (ins, upd, del float64) {
	a, b := p.after.tables[table], p.before.tables[table]
	return p.perOp(float64(a.ins - b.ins)), p.perOp(float64(a.upd - b.upd)), p.perOp(float64(a.del - b.del))
}

func (p *phaseResult) walBytes() int64 { return lsnDiff(p.after.lsn, p.before.lsn) }

// lsnDiff is a - b of two LSNs ("X/Y").
func lsnDiff(a, b string) int64 {
	return lsnInt(a) - lsnInt(b)
}

func lsnInt(s string) int64 {
	hi, lo, _ := strings.Cut(s, "/")
	h, _ := strconv.ParseInt(hi, 16, 64)
	l, _ := strconv.ParseInt(lo, 16, 64)
	return h<<32 | l
}

// ---- perf: fsync-family syscalls of the api ----

type perfCounter struct {
	cmd *exec.Cmd
	out string
}

var perfEvents = []string{"fsync", "fdatasync", "syncfs", "sync_file_range"}

// startPerf counts the fsync-family syscalls of pids with perf stat;
// without perf (or its permission) it counts nothing.
func startPerf(pids []int) *perfCounter {
	pc := &perfCounter{}
	if len(pids) == 0 {
		return pc
	}
	if _, err := exec.LookPath("perf"); err != nil {
		return pc
	}
	f, err := os.CreateTemp("", "scaling-perf-*.csv")
	if err != nil {
		return pc
	}
	f.Close()
	pc.out = f.Name()
	var ev []string
	for _, e := range perfEvents {
		ev = append(ev, "syscalls:sys_enter_"+e)
	}
	var ps []string
	for _, p := range pids {
		ps = append(ps, strconv.Itoa(p))
	}
	pc.cmd = exec.Command("perf", "stat", "-x,", "-o", pc.out, "-e", strings.Join(ev, ","), "-p", strings.Join(ps, ","))
	if err := pc.cmd.Start(); err != nil {
		pc.cmd = nil
		return pc
	}
	time.Sleep(300 * time.Millisecond) // attach before the load starts
	return pc
}

// stop ends perf and returns its counts by syscall (nil: not counted).
func (pc *perfCounter) stop() map[string]int64 {
	if pc.cmd == nil {
		return nil
	}
	defer os.Remove(pc.out)
	_ = pc.cmd.Process.Signal(syscall.SIGINT)
	_ = pc.cmd.Wait()
	b, err := os.ReadFile(pc.out)
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || !strings.HasPrefix(f[2], "syscalls:sys_enter_") {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return nil // "<not counted>"/"<not supported>"
		}
		out[strings.TrimPrefix(f[2], "syscalls:sys_enter_")] = n
	}
	return out
}

// ---- the single-datacenter phases ----

// closedLoop runs op from clients goroutines for d and counts ops and
// errors (an error does not stop the load: at saturation the api may
// refuse with 503, which is a figure): runLoad, tolerating errors.
func closedLoop(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, i int) error) (ok int, errs int64, lats []time.Duration, elapsed time.Duration) {
	r, errs, _ := runLoadCounting(ctx, clients, d, op, true)
	return r.Ops, errs, r.Latencies, r.Elapsed
}

func (r *scaleRun) apiPIDs() []int { return []int{r.bp.api.cmd.Process.Pid} }

func (r *scaleRun) singleDatacenter(ctx context.Context) {
	db := r.bp.pool
	idle := r.phase(ctx, db, "idle (api running, no requests)", "seconds", r.apiPIDs(), func() (int, error) {
		time.Sleep(r.cfg.duration)
		return int(r.cfg.duration.Seconds()), nil
	})
	r.perOp = append(r.perOp, *idle)

	var uploads []*phaseResult
	for _, n := range r.cfg.clients {
		p := r.phase(ctx, db, fmt.Sprintf("4 KiB single-request uploads, %d clients", n), "uploads", r.apiPIDs(), func() (int, error) {
			return r.uploadLoad(ctx, n, seedScaleUpload, n)
		})
		uploads = append(uploads, p)
		if n == 16 || (n == r.cfg.clients[len(r.cfg.clients)-1] && !slices.Contains(r.cfg.clients, 16)) {
			r.perOp = append(r.perOp, *p)
		}
	}
	r.saturationTable(idle, uploads)
	if os.Getenv("BLOBPLANE_SCALING_ONLY") == "uploads" {
		return
	}

	r.preload(ctx)
	for _, get := range []bool{true, false} {
		name, unit := "4 KiB GET, 16 clients", "GETs"
		if !get {
			name, unit = "HEAD, 16 clients", "HEADs"
		}
		p := r.phase(ctx, db, name, unit, r.apiPIDs(), func() (int, error) { return r.readLoad(ctx, get) })
		r.perOp = append(r.perOp, *p)
	}
}

// uploadLoad is the closed loop of new 4 KiB single-request uploads.
func (r *scaleRun) uploadLoad(ctx context.Context, clients, tag, rep int) (int, error) {
	ok, errs, lats, elapsed := closedLoop(ctx, clients, r.cfg.duration, func(ctx context.Context, i int) error {
		b, d := smallBlob(r.block, smallSize, seedOf(tag, rep, i))
		return r.bp.PutOne(ctx, d, b)
	})
	r.last = loopResult{ok, errs, lats, elapsed}
	if ok == 0 {
		return 0, fmt.Errorf("no upload succeeded (%d errors)", errs)
	}
	return ok, nil
}

// loopResult is the latest closed loop's outcome (for the tables).
type loopResult struct {
	ok      int
	errs    int64
	lats    []time.Duration
	elapsed time.Duration
}

var preloaded []blobRef

// preload stores 256 blobs for the reads, untimed.
func (r *scaleRun) preload(ctx context.Context) {
	preloaded = make([]blobRef, 256)
	err := forEach(ctx, len(preloaded), 8, func(ctx context.Context, i int) error {
		b, d := smallBlob(r.block, smallSize, seedOf(seedPreload, 0, i))
		preloaded[i] = blobRef{digest: d, content: b}
		return r.bp.PutOne(ctx, d, b)
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

func (r *scaleRun) readLoad(ctx context.Context, get bool) (int, error) {
	ok, errs, lats, elapsed := closedLoop(ctx, 16, r.cfg.duration, func(ctx context.Context, i int) error {
		b := preloaded[i%len(preloaded)]
		if !get {
			return r.bp.Head(ctx, b.digest, smallSize)
		}
		var buf bytes.Buffer
		_, err := r.bp.Get(ctx, b.digest, &buf)
		return err
	})
	r.last = loopResult{ok, errs, lats, elapsed}
	if errs > 0 {
		return ok, fmt.Errorf("%d reads failed", errs)
	}
	return ok, nil
}
