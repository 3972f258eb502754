//go:build unix

package soak_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Issue 32, "Backup and restore": a database restored from a dump taken
// mid-soak is behind its backends. The soak's clients upload, mount and
// delete references in two datacenters while the workers sweep (the
// collector decides the deletes' collections, with the default-style
// delete delay of an hour) and replicate; pg_dump runs in the middle.
// Then every process stops, the database is replaced by the dump
// (DROP, CREATE, pg_restore), and:
//
//   - the inventory of each datacenter, run at once, deletes nothing
//     (its marker names a pass the restored database never made:
//     database_behind), and re-discovers, re-hashed, every copy a
//     reference in the dump needs that the dump does not know of (a
//     replication made after the dump);
//   - the scrub of each datacenter finds every verified placement of the
//     dump intact (nothing it records was deleted);
//   - with the processes running again on the restored database, every
//     reference in the dump reads back, with exactly its bytes, from both
//     datacenters.
func TestRestoreFromDumpResolvesEveryReference(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: starts Postgres, two apis and two workers, dumps and restores the database (about a minute); skipped with -short")
	}
	pg := startPostgres(t)
	pgDump, pgRestore := filepath.Join(pg.bindir, "pg_dump"), filepath.Join(pg.bindir, "pg_restore")
	for _, b := range []string{pgDump, pgRestore} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("soak: %s not installed beside the server: %v", b, err)
		}
	}
	c := newClusterOn(t, pg, pg.URL(), "BLOBPLANE_COLLECT_DELETE_DELAY=1h")
	repos := c.chooseRepos(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.waitHomes(t, ctx, repos, phaseBound)
	t0 := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("%6.1fs "+format, append([]any{time.Since(t0).Seconds()}, args...)...)
	}

	l := newLoad(c.token, c.urls, c.dcs, slices.Concat(repos["dc-a"], repos["dc-b"]))
	l.mutate = true
	loadCtx, stopLoad := context.WithCancel(ctx)
	waitClients := l.run(loadCtx, clients)
	defer stopLoad()
	if !l.waitFor(ctx, phaseBound, func() bool { return l.acks.Load() >= 60 && l.deletes.Load() >= 3 }) {
		t.Fatalf("soak: 60 uploads and 3 deletes not acknowledged within %s", phaseBound)
	}

	// An inventory pass adopts each backend before the dump (a restore
	// from before a backend's adoption finds its marker foreign, and the
	// inventory does nothing there until an operator re-adopts it).
	for _, dc := range c.dcs {
		c.inventory(t, dc)
	}
	dump := filepath.Join(t.TempDir(), "blobplane.dump")
	var dumpedAt time.Time
	if err := c.db.QueryRow(ctx, `SELECT now()`).Scan(&dumpedAt); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(pgDump, "-Fc", "-f", dump, c.dbURL).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}
	logf("pg_dump taken mid-soak (%d uploads acknowledged, %d references deleted so far)", l.acks.Load(), l.deletes.Load())

	// The load goes on past the dump: more uploads, mounts and deletes
	// whose collections the dump will not know, and an inventory pass in
	// each datacenter, so each marker names a pass the dump never made.
	acked, deletes := l.acks.Load(), l.deletes.Load()
	if !l.waitFor(ctx, phaseBound, func() bool { return l.acks.Load() >= acked+60 && l.deletes.Load() >= deletes+3 }) {
		t.Fatalf("soak: 60 more uploads and 3 more deletes not acknowledged within %s", phaseBound)
	}
	// ... and collections the dump does not know (the collector runs
	// every 3 s): their bytes are what the delete delay must keep.
	collectedAfter := func() int {
		var n int
		if err := c.db.QueryRow(ctx, `SELECT count(*) FROM deletions WHERE decided_at > $1`, dumpedAt).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(phaseBound); collectedAfter() == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("soak: nothing collected within %s of the dump: the restore would prove nothing about the delete delay", phaseBound)
		}
		time.Sleep(200 * time.Millisecond) // polling the ledger; the collector's cron decides when
	}
	for _, dc := range c.dcs {
		c.inventory(t, dc)
	}
	stopLoad()
	waitClients()
	all := l.snapshot()
	if _, ok := c.settle(t, ctx, all, settleBound); !ok {
		t.Fatal("soak: accepted uploads did not publish")
	}
	logf("load stopped: %d uploads acknowledged, %d mounts, %d references deleted; the collector decided %d deletions after the dump",
		l.acks.Load(), countMode(all, mounted), l.deletes.Load(), collectedAfter())

	// Restore: every process down, the database replaced by the dump.
	for _, dc := range c.dcs {
		c.apis[dc].stop()
		c.workers[dc].stop()
	}
	admin, err := pgx.Connect(ctx, pg.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`DROP DATABASE blobplane WITH (FORCE)`, `CREATE DATABASE blobplane`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	admin.Close(ctx)
	if out, err := exec.Command(pgRestore, "--exit-on-error", "-d", c.dbURL, dump).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
	c.db.Reset()
	if out, err := runTool(filepath.Join(c.bins, "api"), c.env["dc-a"], "migrate"); err != nil {
		t.Fatalf("api migrate on the restored database: %v\n%s", err, out)
	}
	type ref struct {
		Repo, Digest string
		Size         int64
	}
	rows, err := c.db.Query(ctx, `SELECT r.repository, r.digest, b.size_bytes FROM blob_references r JOIN blobs b USING (digest) ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ref])
	if err != nil {
		t.Fatal(err)
	}
	logf("restored: the dump holds %d references", len(refs))

	// The inventory deletes nothing and re-discovers; the scrub finds
	// every recorded copy intact.
	for _, dc := range c.dcs {
		rep := c.inventory(t, dc)
		fs := rep.Backends["fs"]
		if fs == nil || fs.Refusal != "database_behind" || rep.OrphansDeleted != 0 || sum(rep.ResidueDeleted) != 0 ||
			rep.Rediscovered != rep.Unrecorded || rep.RediscoverMismatched != 0 {
			t.Errorf("%s: the inventory of the restored database: %+v (backend %+v); want database_behind and nothing deleted", dc, rep, fs)
		}
		logf("%s inventory: %d objects, %d unknown to the dump (kept: %s), %d unrecorded copies re-discovered of %d, nothing deleted",
			dc, rep.Objects, rep.Orphans, fs.Refusal, rep.Rediscovered, rep.Unrecorded)
		out, err := runTool(filepath.Join(c.bins, "worker"), append(c.env[dc], "BLOBPLANE_NODE_ID=scrub-"+dc), "scrub")
		if err != nil {
			t.Fatalf("%s: worker scrub: %v", dc, err)
		}
		var sc struct{ Checked, Intact, Mismatched, Missing, Skipped int }
		if err := json.Unmarshal([]byte(lastLine(out)), &sc); err != nil {
			t.Fatalf("%s: worker scrub printed %q: %v", dc, out, err)
		}
		if sc.Checked == 0 || sc.Missing+sc.Mismatched+sc.Skipped > 0 {
			t.Errorf("%s: the scrub of the restored database: %+v; want every copy intact", dc, sc)
		}
		logf("%s scrub: %d verified copies checked, %d intact", dc, sc.Checked, sc.Intact)
	}

	// Back in service on the restored database: every reference of the
	// dump reads back with its exact bytes from both datacenters.
	for _, dc := range c.dcs {
		if err := c.startAPI(ctx, dc); err != nil {
			t.Fatal(err)
		}
		if err := c.workers[dc].start(); err != nil {
			t.Fatal(err)
		}
	}
	c.waitHomes(t, ctx, repos, phaseBound)
	var bad []string
	for _, r := range refs {
		for _, dc := range c.dcs {
			if msg := c.read(ctx, dc, r.Repo, r.Digest, r.Size); msg != "" {
				bad = append(bad, fmt.Sprintf("%s@%s at %s: %s", r.Repo, r.Digest, dc, msg))
			}
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of %d references of the dump do not resolve:\n  %s", len(bad), len(refs), strings.Join(bad[:min(len(bad), 30)], "\n  "))
	}
	logf("every one of the dump's %d references reads back with its exact bytes from both datacenters", len(refs))
}

// inventoryReport is the part of `worker sweep --only inventory`'s report
// the restore test reads.
type inventoryReport struct {
	Objects        int `json:"objects"`
	Orphans        int `json:"orphans"`
	OrphansDeleted int `json:"orphans_deleted"`
	Unrecorded     int `json:"unrecorded"`
	Rediscovered   int `json:"rediscovered"`
	// RediscoverMismatched: unrecorded copies whose bytes were not their
	// digest's.
	RediscoverMismatched int            `json:"rediscover_mismatched"`
	ResidueDeleted       map[string]int `json:"residue_deleted"`
	Backends             map[string]*struct {
		Refusal string `json:"refusal"`
	} `json:"backends"`
}

// inventory runs one inventory pass of dc's backends (`worker sweep
// --only inventory`) and returns its report.
func (c *cluster) inventory(t *testing.T, dc string) inventoryReport {
	t.Helper()
	out, err := runTool(filepath.Join(c.bins, "worker"), append(c.env[dc], "BLOBPLANE_NODE_ID=sweep-"+dc), "sweep", "--only", "inventory")
	if err != nil {
		t.Fatalf("%s: worker sweep: %v", dc, err)
	}
	var rep struct {
		Inventory inventoryReport `json:"inventory"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%s: worker sweep printed %q: %v", dc, out, err)
	}
	return rep.Inventory
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
