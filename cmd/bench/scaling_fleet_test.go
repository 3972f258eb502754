//go:build linux

package main

// The worker fleets and the report of TestScaling (scaling_test.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/blobplane/blobplane/internal/childproc"
	"github.com/blobplane/blobplane/internal/procstat"
)

// oneShot runs a Blobplane one-shot command (`worker sweep ...`) and
// returns its stdout; its CPU (rusage) is added to the phase's.
func (r *scaleRun) oneShot(ctx context.Context, bin string, args, env []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = childproc.SysProcAttr()
	err := cmd.Run()
	if cmd.ProcessState == nil {
		return nil, fmt.Errorf("%s %s: %w", bin, strings.Join(args, " "), err)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.mu.Lock()
		r.extra += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		r.mu.Unlock()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = "…" + msg[len(msg)-2000:]
		}
		return nil, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// fleetLoop runs n goroutines, each running passes (pass returns how many
// items it handled) until one handles none; it returns the total.
func fleetLoop(ctx context.Context, n int, pass func(ctx context.Context) (int, error)) (int, error) {
	var mu sync.Mutex
	total := 0
	err := forEach(ctx, n, n, func(ctx context.Context, _ int) error {
		for {
			k, err := pass(ctx)
			if err != nil {
				return err
			}
			if k == 0 {
				return nil
			}
			mu.Lock()
			total += k
			mu.Unlock()
		}
	})
	return total, err
}

// fleetRow is one fleet size's figures.
type fleetRow struct {
	n       int
	items   int
	elapsed time.Duration
	span    time.Duration // ledger's first → last (transfers only)
	cpu     time.Duration // Blobplane processes + Postgres
	pgCPU   time.Duration
	load    string
}

func (r *scaleRun) sweepFleets(ctx context.Context) {
	worker := filepath.Join(r.bp.bin, "worker")
	db := r.bp.pool
	var reaper, collector []fleetRow
	for i, n := range r.cfg.fleet {
		r.insertIntents(ctx, i)
		p := r.phase(ctx, db, fmt.Sprintf("reaper, %d processes", n), "intents", nil, func() (int, error) {
			return fleetLoop(ctx, n, func(ctx context.Context) (int, error) {
				out, err := r.oneShot(ctx, worker, []string{"sweep", "--only", "reaper"}, r.bp.env)
				if err != nil {
					return 0, err
				}
				var rep struct {
					Reaper struct {
						Reaped []json.RawMessage `json:"reaped"`
						Failed int               `json:"failed"`
					} `json:"reaper"`
				}
				if err := json.Unmarshal(out, &rep); err != nil {
					return 0, err
				}
				if rep.Reaper.Failed > 0 {
					return 0, fmt.Errorf("reaper: %d deletes failed", rep.Reaper.Failed)
				}
				return len(rep.Reaper.Reaped), nil
			})
		})
		reaper = append(reaper, r.fleetRowOf(p, n))
		if i == 0 {
			r.perOp = append(r.perOp, *p)
		}
	}
	for i, n := range r.cfg.fleet {
		r.unreferencedBlobs(ctx, i)
		p := r.phase(ctx, db, fmt.Sprintf("collector, %d processes", n), "digests", nil, func() (int, error) {
			return fleetLoop(ctx, n, func(ctx context.Context) (int, error) {
				out, err := r.oneShot(ctx, worker, []string{"sweep", "--only", "collector"}, r.bp.env)
				if err != nil {
					return 0, err
				}
				var rep struct {
					Collector struct {
						Collected []json.RawMessage `json:"collected"`
					} `json:"collector"`
				}
				if err := json.Unmarshal(out, &rep); err != nil {
					return 0, err
				}
				return len(rep.Collector.Collected), nil
			})
		})
		collector = append(collector, r.fleetRowOf(p, n))
		if i == 0 {
			r.perOp = append(r.perOp, *p)
		}
	}
	p := r.phase(ctx, db, "inventory, 1 process", "objects", nil, func() (int, error) {
		out, err := r.oneShot(ctx, worker, []string{"sweep", "--only", "inventory"}, r.bp.env)
		if err != nil {
			return 0, err
		}
		var rep struct {
			Inventory struct {
				Objects int `json:"objects"`
			} `json:"inventory"`
		}
		err = json.Unmarshal(out, &rep)
		return rep.Inventory.Objects, err
	})
	r.perOp = append(r.perOp, *p)
	inventory := []fleetRow{r.fleetRowOf(p, 1)}

	r.fleetTable("Reaper fleet: N concurrent `worker sweep --only reaper` loops (passes of BLOBPLANE_SWEEP_BATCH = 1000) over the same expired intents", "intents/s", reaper)
	r.fleetTable("Collector fleet: N concurrent `worker sweep --only collector` loops over the same unreferenced digests (each pass decides their collection; the bytes follow by delete_bytes jobs after BLOBPLANE_COLLECT_DELETE_DELAY)", "digests/s", collector)
	r.fleetTable("Inventory: one `worker sweep --only inventory` pass over the backend (every object the run stored)", "objects/s", inventory)
}

// insertIntents inserts the run's count of expired pending intents (as
// the bench's sweep workload does), untimed.
func (r *scaleRun) insertIntents(ctx context.Context, round int) {
	if _, err := r.bp.pool.Exec(ctx, `
		INSERT INTO intents (repository, principal, ingress_datacenter, backend, staged_location, received_bytes, created_at, expires_at)
		SELECT $1, $2, $3, $4, lpad(to_hex($5::bigint * 100000000 + g), 32, '0'), 4096, now() - interval '2 hours', now() - interval '1 hour' - g * interval '1 ms'
		FROM generate_series(1, $6::int) g`, bpRepo, bpPrincipal, bpDatacenter, bpBackend, round, r.cfg.intents); err != nil {
		r.t.Fatal(err)
	}
}

// unreferencedBlobs uploads the run's count of new 4 KiB blobs into a
// repository of their own (16 clients) and then deletes that repository's
// references with SQL, as a blob DELETE would, so that every one is a
// collector candidate: a live blob row, a verified placement, real bytes.
func (r *scaleRun) unreferencedBlobs(ctx context.Context, round int) {
	repo := fmt.Sprintf("bench/collect%d", round)
	if _, err := runTool(ctx, filepath.Join(r.bp.bin, "api"), []string{"repo", "create", repo}, r.bp.env); err != nil {
		r.t.Fatal(err)
	}
	oc := &ociClient{base: r.bp.base, repo: repo, user: bpPrincipal, pass: r.bp.pass, hc: r.bp.hc}
	err := forEach(ctx, r.cfg.collect, 16, func(ctx context.Context, i int) error {
		b, d := smallBlob(r.block, smallSize, seedOf(seedScaleCollect, round, i))
		return oc.PutOne(ctx, d, b)
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.bp.pool.Exec(ctx, `DELETE FROM blob_references WHERE repository = $1`, repo); err != nil {
		r.t.Fatal(err)
	}
}

func (r *scaleRun) fleetRowOf(p *phaseResult, n int) fleetRow {
	pg := p.pgCPU()
	return fleetRow{n: n, items: p.ops, elapsed: p.elapsed, cpu: p.cpu(p.apiPID) + pg + p.extraCPU, pgCPU: pg, load: p.load}
}

func (r *scaleRun) fleetTable(title, unit string, rows []fleetRow) {
	r.printf("## %s\n\n| N | items | seconds | %s | ÷ N=1 | CPU ms/item (Blobplane processes + Postgres) | of it Postgres | load average after |\n|--:|--:|--:|--:|--:|--:|--:|---|\n", title, unit)
	for _, x := range rows {
		secs := x.elapsed.Seconds()
		if x.span > 0 {
			secs = x.span.Seconds()
		}
		rate := float64(x.items) / secs
		base := float64(rows[0].items) / pick(rows[0].span, rows[0].elapsed).Seconds()
		r.printf("| %d | %d | %.2f | %.0f | %.2f | %.3f | %.3f | %s |\n", x.n, x.items, secs, rate, rate/base,
			ms(x.cpu)/float64(max(x.items, 1)), ms(x.pgCPU)/float64(max(x.items, 1)), x.load)
	}
	r.printf("\n")
}

func pick(a, b time.Duration) time.Duration {
	if a > 0 {
		return a
	}
	return b
}

// ---- replication fleet ----

// transferFleets stops the cluster's us-1 worker, and for each fleet size
// publishes a backlog of 4 KiB blobs in eu-1 (no copy can start: no us-1
// worker runs), then starts N us-1 workers and times the backlog's copies.
func (r *scaleRun) transferFleets(ctx context.Context, c *repCluster, cl *cleanups) {
	c.dcs[repTarget].worker.stop()
	standing := []int{c.dcs[repSource].api.cmd.Process.Pid, c.dcs[repTarget].api.cmd.Process.Pid, c.dcs[repSource].worker.cmd.Process.Pid}
	var rows []fleetRow
	for i, n := range r.cfg.fleet {
		ds := r.backlog(ctx, c, i)
		var span time.Duration
		p := r.phase(ctx, c.pool, fmt.Sprintf("replication, %d us-1 workers", n), "transfers", standing, func() (int, error) {
			ws, err := r.startFleet(ctx, c, i, n, cl)
			if err != nil {
				return 0, err
			}
			err = c.waitCopied(ctx, ds)
			r.stopFleet(ws)
			if err != nil {
				return 0, err
			}
			span, err = r.verifiedSpan(ctx, c, ds)
			return len(ds), err
		})
		row := r.fleetRowOf(p, n)
		row.span = span
		rows = append(rows, row)
		r.logf("replication %d workers: %d copies, ledger span %s, wall %s", n, len(ds), span, p.elapsed)
		if i == 0 {
			r.perOp = append(r.perOp, *p)
		}
	}
	r.fleetTable(fmt.Sprintf("Replication fleet: N worker processes in %s (each River's replicate queue, 16 at once) draining a backlog of 4 KiB copies from %s; rate over the ledger's first → last verification, CPU of both apis, the eu-1 worker, the N workers and Postgres", repTarget, repSource), "transfers/s", rows)
	r.perTableReport()
}

// backlog publishes the run's count of new 4 KiB blobs in eu-1 (16
// clients) and returns their digests.
func (r *scaleRun) backlog(ctx context.Context, c *repCluster, round int) []string {
	ds := make([]string, r.cfg.transfers)
	err := forEach(ctx, len(ds), repClients, func(ctx context.Context, i int) error {
		b, d := smallBlob(r.block, smallSize, seedOf(seedScaleFleet, round, i))
		ds[i] = d
		_, err := c.upload(ctx, d, bytes.NewReader(b), smallSize, true)
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	// Kept uploads (202) are published by a finalize job on eu-1's
	// worker: wait until every one is published, so the backlog is whole.
	deadline := time.Now().Add(repBound)
	for {
		var k int
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM operation_outcomes WHERE digest = ANY($1)`, ds).Scan(&k); err != nil {
			r.t.Fatal(err)
		}
		if k >= len(ds) {
			return ds
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("backlog: %d of %d published", k, len(ds))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startFleet starts n workers in us-1 with ids of round.
func (r *scaleRun) startFleet(ctx context.Context, c *repCluster, round, n int, cl *cleanups) ([]*proc, error) {
	d := c.dcs[repTarget]
	var ws []*proc
	for k := range n {
		p, err := retryPort(func(port int) (*proc, error) {
			metrics := "127.0.0.1:" + strconv.Itoa(port)
			p, err := startProc(fmt.Sprintf("worker-%s-%d-%d", d.name, round, k), filepath.Join(c.bin, "worker"), nil, append(d.env[:len(d.env):len(d.env)],
				fmt.Sprintf("BLOBPLANE_NODE_ID=worker-%s-%d-%d", d.name, round, k), "BLOBPLANE_WORKER_METRICS="+metrics, "BLOBPLANE_SCRUB_CRON=off"))
			if err != nil {
				return nil, err
			}
			if err := p.waitReady(ctx, "http://"+metrics+"/metrics", 60*time.Second); err != nil {
				p.stop()
				return nil, err
			}
			return p, nil
		})
		if err != nil {
			r.stopFleet(ws)
			return nil, err
		}
		cl.add(func() error { p.stop(); return nil })
		ws = append(ws, p)
	}
	return ws, nil
}

// stopFleet stops the workers, their CPU added to the phase's first.
func (r *scaleRun) stopFleet(ws []*proc) {
	var pids []int
	for _, w := range ws {
		pids = append(pids, w.cmd.Process.Pid)
	}
	used := procstat.Used(nil, procstat.Times(pids))
	r.mu.Lock()
	r.extra += used
	r.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
}

// verifiedSpan is the ledger's first → last verification of the copies.
func (r *scaleRun) verifiedSpan(ctx context.Context, c *repCluster, ds []string) (time.Duration, error) {
	var s float64
	err := c.pool.QueryRow(ctx, `SELECT extract(epoch FROM max(verified_at) - min(verified_at))::float8 FROM placements
		WHERE datacenter = $1 AND state = 'verified' AND digest = ANY($2)`, repTarget, ds).Scan(&s)
	return time.Duration(s * float64(time.Second)), err
}

// ---- report ----

func (r *scaleRun) saturationTable(idle *phaseResult, ps []*phaseResult) {
	r.printf("## Uploads at rising concurrency (4 KiB, `POST ?digest=`, one api, closed loops of %s)\n\n", r.cfg.duration)
	r.printf("CPU per upload from /proc/<pid>/stat: the api; the Postgres backends of the bench database; every Postgres process (the postmaster's children, live or exited within the load: backends of all databases, WAL writer, checkpointer, autovacuum); the harness's clients. WAL from pg_current_wal_lsn and pg_stat_wal; commits from pg_stat_database.xact_commit; fsync-family syscalls of the api from `perf stat` tracepoints.\n\n")
	r.printf("| clients | uploads/s | errors | p50 ms | p99 ms | api CPU ms | Postgres backends ms | all Postgres ms | clients ms | WAL bytes | WAL records | WAL syncs | commits | api fsync+fdatasync+syncfs | load average after |\n")
	r.printf("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, p := range ps {
		f := func(d time.Duration) float64 { return ms(d) / float64(p.ops) }
		fs := "—"
		if p.fsyncs != nil {
			var n int64
			for _, v := range p.fsyncs {
				n += v
			}
			fs = fmt.Sprintf("%.2f", p.perOp(float64(n)))
		}
		r.printf("| %d | %.0f | %d | %.1f | %.1f | %.3f | %.3f | %.3f | %.3f | %.0f | %.1f | %.3f | %.2f | %s | %s |\n",
			len(p.loop.lats)*0+clientsOf(p.name), float64(p.ops)/p.elapsed.Seconds(), p.loop.errs,
			ms(percentile(p.loop.lats, 50)), ms(percentile(p.loop.lats, 99)),
			f(p.cpu(p.apiPID)), f(p.cpu(p.dbPIDs)), f(p.pgCPU()), f(p.self),
			p.perOp(float64(p.walBytes())), p.perOp(float64(p.after.wal.records-p.before.wal.records)),
			p.perOp(float64(p.after.wal.sync-p.before.wal.sync)), p.perOp(float64(p.after.commits-p.before.commits)), fs, p.load)
	}
	secs := idle.elapsed.Seconds()
	r.printf("\nIdle (the api up, no requests, %.0f s): api CPU %.1f ms/s, Postgres %.1f ms/s, WAL %.0f bytes/s, %.1f commits/s.\n\n",
		secs, ms(idle.cpu(idle.apiPID))/secs, ms(idle.pgCPU())/secs, float64(idle.walBytes())/secs, float64(idle.after.commits-idle.before.commits)/secs)
	for _, p := range ps {
		if p.fsyncs != nil {
			r.printf("api syscalls per upload at %d clients: %s.  \n", clientsOf(p.name), formatCounts(p.fsyncs, p.ops))
		}
	}
	r.printf("\n")
}

var clientsRE = regexp.MustCompile(`(\d+) clients`)

func clientsOf(name string) int {
	m := clientsRE.FindStringSubmatch(name)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func formatCounts(m map[string]int64, ops int) string {
	var parts []string
	for _, e := range perfEvents {
		parts = append(parts, fmt.Sprintf("%s %.3f", e, float64(m[e])/float64(max(ops, 1))))
	}
	return strings.Join(parts, ", ")
}

// perTableReport prints rows written per op by table and phase, then
// each phase's statements.
func (r *scaleRun) perTableReport() {
	tables := map[string]bool{}
	for _, p := range r.perOp {
		for name := range p.after.tables {
			if i, u, d := p.rowsPerOp(name); i+u+d > 0 {
				tables[name] = true
			}
		}
	}
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)
	r.printf("## Rows written per operation, by table (pg_stat_user_tables: inserted / updated / deleted)\n\n")
	r.printf("Each column is one phase; a cell is rows per op (idle: per second) as ins/upd/del; empty: none. Counters settle %s before and after each phase (backends flush them when idle), so background writes of that time (lease renewals, heartbeats; see the idle column) are included.\n\n", r.cfg.settle)
	r.printf("| table |")
	for _, p := range r.perOp {
		r.printf(" %s (per %s) |", p.name, strings.TrimSuffix(p.unit, "s"))
	}
	r.printf("\n|---|%s\n", strings.Repeat("--:|", len(r.perOp)))
	for _, n := range names {
		r.printf("| `%s` |", n)
		for _, p := range r.perOp {
			i, u, d := p.rowsPerOp(n)
			if i+u+d == 0 {
				r.printf(" |")
				continue
			}
			r.printf(" %s/%s/%s |", num(i), num(u), num(d))
		}
		r.printf("\n")
	}
	r.printf("| *ops* |")
	for _, p := range r.perOp {
		r.printf(" %d |", p.ops)
	}
	r.printf("\n| *WAL bytes per op* |")
	for _, p := range r.perOp {
		r.printf(" %.0f |", p.perOp(float64(p.walBytes())))
	}
	r.printf("\n| *commits per op* |")
	for _, p := range r.perOp {
		r.printf(" %.2f |", p.perOp(float64(p.after.commits-p.before.commits)))
	}
	r.printf("\n\n")
	for _, p := range r.perOp {
		r.statementTable(p)
	}
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	case v >= 0.01:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	default:
		return fmt.Sprintf("%.4f", v)
	}
}

var spaceRE = regexp.MustCompile(`\s+`)

// writeRE finds the table a statement writes (top level or in a CTE).
var writeRE = regexp.MustCompile(`(?i)\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+("?[a-z_][a-z0-9_.]*"?)`)

// statementTable lists a phase's statements (pg_stat_statements): every
// one that writes a table, then the rest by execution time, with calls,
// rows and execution time per op and the tables each writes.
func (r *scaleRun) statementTable(p phaseResult) {
	r.printf("### Statements: %s (%d %s)\n\n| calls/op | rows/op | exec ms/op | writes | statement |\n|--:|--:|--:|---|---|\n", p.name, p.ops, p.unit)
	type row struct {
		s      statement
		q      string
		writes []string
	}
	var rows []row
	for _, s := range p.stmts {
		q := spaceRE.ReplaceAllString(s.query, " ")
		if strings.Contains(q, "pg_stat_") || strings.Contains(q, "pg_current_wal_lsn") || strings.Contains(q, "pg_backend_pid") {
			continue // the harness's own
		}
		rows = append(rows, row{s: s, q: q, writes: writtenTables(q)})
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if (len(a.writes) > 0) != (len(b.writes) > 0) {
			if len(a.writes) > 0 {
				return -1
			}
			return 1
		}
		if len(a.writes) > 0 && a.s.calls != b.s.calls {
			return int(b.s.calls - a.s.calls)
		}
		switch {
		case a.s.ms > b.s.ms:
			return -1
		case a.s.ms < b.s.ms:
			return 1
		}
		return 0
	})
	for i, x := range rows {
		if i == 18 {
			r.printf("| | | | | (%d more statements) |\n", len(rows)-i)
			break
		}
		q := x.q
		if len(q) > 110 {
			q = q[:110] + "…"
		}
		r.printf("| %s | %s | %.3f | %s | `%s` |\n", num(p.perOp(float64(x.s.calls))), num(p.perOp(float64(x.s.rows))), x.s.ms/float64(max(p.ops, 1)),
			strings.Join(x.writes, ", "), strings.ReplaceAll(q, "|", `\|`))
	}
	r.printf("\n")
}

// writtenTables are the tables a statement's text inserts into, updates
// or deletes from (top level or in a CTE; not FOR UPDATE locks).
func writtenTables(q string) []string {
	var out []string
	for _, m := range writeRE.FindAllStringSubmatch(q, -1) {
		t := strings.Trim(m[2], `"`)
		switch strings.ToUpper(t) {
		case "OF", "SKIP", "NOWAIT", "SET":
			continue
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}
