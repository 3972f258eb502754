//go:build unix

package soak_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Issue 32: the source of truth survives its machine. A pg_auto_failover
// formation (scripts/pg-ha.sh: a monitor, a primary and a synchronous
// standby) under the soak's two apis and two workers, with clients
// uploading, mounting and deleting references while the workers' sweeps
// collect what the deletes leave (bytes at once); the primary is
// failed over twice mid-load, once by `pg_autoctl perform failover` and
// once by a SIGKILL of its postmaster. Afterwards every acknowledged
// upload (201, or 202 whose operation reports it published) is readable
// with its exact bytes at both datacenters, none is published twice, and
// no accepted upload is lost. The errors in each failover window and the
// time from the failover to the first publication after it are reported.

// haFormation is a formation started for one test.
type haFormation struct {
	script string
	env    []string
	url    string
}

func (f *haFormation) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(f.script, args...)
	cmd.Env = append(os.Environ(), f.env...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("pg-ha.sh %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return strings.TrimSpace(string(out))
}

// startFormation brings a formation up on three free ports, in a
// directory the postgres user can reach, and takes it down at cleanup.
func startFormation(t *testing.T) *haFormation {
	t.Helper()
	if _, err := exec.LookPath("pg_autoctl"); err != nil && os.Getuid() != 0 && os.Getenv("CI") == "" {
		t.Skip("pg_autoctl is not installed (scripts/pg-ha.sh installs it as root: apt-get install postgresql-<major>-auto-failover)")
	}
	script, err := filepath.Abs("../scripts/pg-ha.sh")
	if err != nil {
		t.Fatal(err)
	}
	base := freePorts(t, 3)
	dir := fmt.Sprintf("/var/tmp/blobplane-pgha-test-%d-%d", os.Getpid(), base)
	f := &haFormation{script: script, env: []string{"BLOBPLANE_PGHA_DIR=" + dir, "BLOBPLANE_PGHA_PORT=" + strconv.Itoa(base)}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"monitor", "node1", "node2"} {
				b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
				if len(b) > 8<<10 {
					b = b[len(b)-8<<10:]
				}
				t.Logf("--- %s.log (last 8 KiB) ---\n%s", name, b)
			}
		}
		cmd := exec.Command(script, "down", "--purge")
		cmd.Env = append(os.Environ(), f.env...)
		_ = cmd.Run()
	})
	line := f.run(t, "up")
	url, ok := strings.CutPrefix(line[strings.LastIndex(line, "\n")+1:], "export DATABASE_URL=")
	if !ok {
		t.Fatalf("pg-ha.sh up printed %q", line)
	}
	// The export line is shell-quoted (%q): undo the backslashes.
	f.url = strings.NewReplacer(`\,`, ",", `\?`, "?", `\&`, "&", `\=`, "=").Replace(url)
	return f
}

// freePorts finds n consecutive free loopback ports.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 200 {
		base := 20000 + rand.IntN(20000)
		ok := true
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free ports")
	return 0
}

// haWindow is one failover: when it started and what the load saw until
// the first publication after it.
type haWindow struct {
	what        string
	start       time.Time // the command began
	done        time.Time // the command returned (the kill took effect)
	firstFail   time.Time // the first upload refused or failed after start
	firstOK     time.Time // the first publication after both
	errors      int
	refusedSync int
}

func TestHAFailoverLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: a pg_auto_failover formation, two apis, two workers and two failovers (about two minutes); skipped with -short")
	}
	f := startFormation(t)
	c := newClusterOn(t, nil, f.url)
	repos := c.chooseRepos(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.waitHomes(t, ctx, repos, phaseBound)

	l := newLoad(c.token, c.urls, c.dcs, slices.Concat(repos["dc-a"], repos["dc-b"]))
	l.mutate = true // mounts and deletes too; the workers' sweeps collect what the deletes leave
	loadCtx, stopLoad := context.WithCancel(ctx)
	waitClients := l.run(loadCtx, 4)
	t0 := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("%6.1fs "+format, append([]any{time.Since(t0).Seconds()}, args...)...)
	}
	steady := func() {
		// Load against a healthy formation, and a publication seen.
		since := time.Now()
		time.Sleep(6 * time.Second)
		if !l.waitFor(ctx, phaseBound, func() bool { return published(l.snapshot(), since) }) {
			t.Fatalf("soak: no publication within %s of a healthy formation", phaseBound)
		}
	}
	var windows []*haWindow
	failover := func(what string, args ...string) {
		w := &haWindow{what: what, start: time.Now()}
		windows = append(windows, w)
		logf("%s", what)
		out := f.run(t, args...)
		w.done = time.Now()
		if args[0] == "kill-primary" {
			f.run(t, "wait", "60", out) // the monitor fails over away from it
			logf("failed over away from %s; restarting it", out)
			f.run(t, "restart", out) // it rejoins as the standby
			f.run(t, "wait", "180")
		} else {
			f.run(t, "wait", "180")
		}
		logf("the formation is healthy again (%s)", f.run(t, "status"))
		if !l.waitFor(ctx, phaseBound, func() bool { return published(l.snapshot(), w.start) }) {
			t.Fatalf("soak: no publication within %s of the formation's recovery", phaseBound)
		}
	}
	steady()
	failover("failover 1: pg_autoctl perform failover", "failover")
	steady()
	failover("failover 2: SIGKILL of the primary's keeper and postmaster", "kill-primary")
	steady()
	stoppedAt := time.Now()
	stopLoad()
	waitClients()
	logf("load stopped")

	all := l.snapshot()
	for _, w := range windows {
		for _, u := range all {
			if u.at.After(w.start) && !u.acknowledged() && (w.firstFail.IsZero() || u.at.Before(w.firstFail)) {
				w.firstFail = u.at
			}
		}
		if w.firstFail.IsZero() {
			t.Errorf("%s: no upload failed: the failover was not seen", w.what)
			continue
		}
		from := w.firstFail
		if w.done.After(from) {
			from = w.done
		}
		w.firstOK = firstPublished(all, from)
		for _, u := range all {
			if u.at.After(w.start) && u.at.Before(w.firstOK) && !u.acknowledged() {
				w.errors++
				if strings.Contains(u.err, "synchronous standby") {
					w.refusedSync++
				}
			}
		}
		t.Logf("%s: the command took %.1f s; first publication %.1f s after it returned, %.1f s after the first failure; %d uploads refused or failed (%d for want of a synchronous standby)",
			w.what, w.done.Sub(w.start).Seconds(), w.firstOK.Sub(w.done).Seconds(), w.firstOK.Sub(w.firstFail).Seconds(), w.errors, w.refusedSync)
	}
	// Every refusal during a failover is retryable (503): a 500 is a
	// failure the store did not classify.
	for _, dc := range c.dcs {
		for _, line := range c.apis[dc].logLines(`"status":500`, 20) {
			// Requests the load itself cut short when it stopped are not
			// answers anyone read.
			var at struct {
				Time time.Time `json:"time"`
			}
			if json.Unmarshal([]byte(line), &at) == nil && !at.Time.Before(stoppedAt) {
				continue
			}
			t.Errorf("%s answered 500 during the failovers: %s", dc, line)
			// Why: the error logged under the same request id.
			if i := strings.Index(line, `"request_id":"`); i >= 0 {
				id, _, _ := strings.Cut(line[i+len(`"request_id":"`):], `"`)
				for _, why := range c.apis[dc].logLines(`"request_id":"`+id+`"`, 5) {
					t.Logf("  %s", why)
				}
			}
		}
	}
	if took, ok := c.settle(t, ctx, all, settleBound); ok {
		logf("every upload answered 202 published, %s after the load stopped", took.Round(time.Millisecond))
	}
	c.verify(t, ctx, l.kept(all))
	c.checkIntents(t, ctx)
	// The ledger agrees with itself across the failovers: every
	// admitted intent has its outcome, every outcome its reference
	// unless the load deleted it, and every operation published once
	// (the retried closes found their stored outcome).
	var orphans, unreferenced int
	if err := c.db.QueryRow(ctx, `SELECT count(*) FROM intents i WHERE state = 'admitted'
		AND NOT EXISTS (SELECT 1 FROM operation_outcomes o WHERE o.operation_id = i.operation_id)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	rows, err := c.db.Query(ctx, `SELECT o.repository, o.digest FROM operation_outcomes o
		WHERE NOT EXISTS (SELECT 1 FROM blob_references r WHERE r.repository = o.repository AND r.digest = o.digest)`)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Repo, Digest string }])
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gone {
		if !l.wasDeleted(&upload{repo: g.Repo, digest: g.Digest}) {
			unreferenced++
		}
	}
	t.Logf("mutations: %d mounts answered 201, %d references deleted (202)", countMode(all, mounted), l.deletes.Load())
	if orphans+unreferenced > 0 {
		t.Errorf("ledger: %d admitted intents without an outcome, %d outcomes without their reference", orphans, unreferenced)
	}
	summarize(t, all, c, time.Since(t0))
}

// published reports whether an upload answered 201 after since.
func published(all []*upload, since time.Time) bool {
	return !firstPublished(all, since).IsZero()
}

// firstPublished is when the first upload answered 201 after since.
func firstPublished(all []*upload, since time.Time) time.Time {
	var first time.Time
	for _, u := range all {
		if u.status == http.StatusCreated && u.at.After(since) && (first.IsZero() || u.at.Before(first)) {
			first = u.at
		}
	}
	return first
}

// countMode counts the uploads of mode m answered 201.
func countMode(all []*upload, m mode) int {
	n := 0
	for _, u := range all {
		if u.mode == m && u.status == http.StatusCreated {
			n++
		}
	}
	return n
}
