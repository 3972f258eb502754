package main_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// `worker sweep [--dry-run]` through the real binary: the dry run lists the
// expired upload and changes nothing; the pass reaps it and deletes its
// staged bytes.
func TestWorkerSweep(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "worker")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/blobplane/blobplane/cmd/worker").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Run("command", func(t *testing.T) { testSweepCommand(t, bin) })
	t.Run("scheduled", func(t *testing.T) { testScheduledSweep(t, bin) })
}

// fixture is a database with one expired upload whose bytes are staged on
// the worker's default filesystem backend, and the worker's environment.
type fixture struct {
	d   *pgtest.DB
	st  *store.Store
	be  *fs.Backend
	in  upload.Intent
	id  string
	env []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	if err := st.CreateRepository(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	be, err := fs.Open(filepath.Join(dataDir, "local", "blobs"), "") // the worker's default backend "fs"
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	in, err := st.CreateIntent(ctx, upload.NewIntent{Repository: "team/app", Principal: "alice", ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: "local", Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id, err := be.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.AppendUpload(ctx, id, 0, strings.NewReader("never published")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ExtendIntent(ctx, in.OperationID, id, 15, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `UPDATE intents SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE operation_id = $1`, in.OperationID); err != nil {
		t.Fatal(err)
	}

	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DATABASE_URL=" + d.URL,
		"BLOBPLANE_DATA_DIR=" + dataDir, "BLOBPLANE_DATACENTER=local",
		// Collected bytes go at once here; the delete delay (24h by
		// default) is sweep.TestCollectDeleteDelayKeepsBytesUntilDue's.
		"BLOBPLANE_COLLECT_DELETE_DELAY=0"}
	return &fixture{d: d, st: st, be: be, in: in, id: id, env: env}
}

func (f *fixture) staged(t *testing.T) bool {
	t.Helper()
	_, err := f.be.UploadSize(context.Background(), f.id)
	if err != nil && !errors.Is(err, backend.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func testSweepCommand(t *testing.T, bin string) {
	ctx := context.Background()
	f := newFixture(t)
	st, in, env := f.st, f.in, f.env
	type reaperReport struct {
		DryRun         bool `json:"dry_run"`
		Reaped         []struct{ OperationID string }
		Deleted        []struct{ OperationID string }
		BytesReclaimed int64 `json:"bytes_reclaimed"`
	}
	sweepAll := func(args ...string) (report struct {
		DryRun     bool         `json:"dry_run"`
		Reaper     reaperReport `json:"reaper"`
		Collector  *struct{ Collected []struct{ Digest string } }
		Candidates []string `json:"collect_candidates"`
		Deleted    int      `json:"bytes_deleted"`
		Inventory  struct {
			Orphans        int `json:"orphans"`
			OrphansDeleted int `json:"orphans_deleted"`
		} `json:"inventory"`
	}) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"sweep"}, args...)...)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("worker sweep %v: %v\n%s", args, err, stderr.String())
		}
		if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
			t.Fatalf("worker sweep %v printed %q: %v", args, stdout.String(), err)
		}
		return report
	}
	sweep := func(args ...string) reaperReport {
		t.Helper()
		r := sweepAll(args...)
		r.Reaper.DryRun = r.DryRun
		return r.Reaper
	}
	staged := func() bool { return f.staged(t) }

	// Besides the expired upload: an unreferenced digest with verified
	// bytes (for the collector) and an object no ledger row names (for the
	// inventory).
	collectable, orphan := f.collectable(t), f.orphan(t)
	dryAll := sweepAll("--dry-run")
	if !slices.Contains(dryAll.Candidates, string(collectable)) || dryAll.Collector != nil || dryAll.Inventory.Orphans != 1 || dryAll.Inventory.OrphansDeleted != 0 {
		t.Fatalf("dry run of the collector and inventory: %+v", dryAll)
	}
	if !f.stored(t, collectable) || !f.stored(t, orphan) {
		t.Fatal("the dry run deleted bytes")
	}

	// --only runs the steps it names; the others are absent from the report.
	dryLater := sweepAll("--dry-run", "--only", "collector,inventory")
	if len(dryLater.Reaper.Reaped) != 0 || !slices.Contains(dryLater.Candidates, string(collectable)) || dryLater.Inventory.Orphans != 1 {
		t.Fatalf("dry run of --only collector,inventory: %+v", dryLater)
	}
	if inv := sweepAll("--dry-run", "--only", "inventory"); len(inv.Reaper.Reaped) != 0 || len(inv.Candidates) != 0 || inv.Inventory.Orphans != 1 {
		t.Fatalf("dry run of --only inventory: %+v", inv)
	}

	dry := sweep("--dry-run")
	if !dry.DryRun || len(dry.Reaped) != 1 || dry.Reaped[0].OperationID != in.OperationID || dry.BytesReclaimed != 15 {
		t.Fatalf("dry run: %+v", dry)
	}
	if cur, _ := st.GetIntent(ctx, in.OperationID); cur.State != upload.IntentPending || !staged() {
		t.Fatal("the dry run changed something")
	}
	all := sweepAll()
	rep := all.Reaper
	if all.DryRun || len(rep.Reaped) != 1 || len(rep.Deleted) != 1 || rep.BytesReclaimed != 15 {
		t.Fatalf("sweep: %+v", rep)
	}
	if all.Collector == nil || len(all.Collector.Collected) != 1 || all.Collector.Collected[0].Digest != string(collectable) ||
		all.Deleted != 1 || all.Inventory.OrphansDeleted != 1 {
		t.Fatalf("sweep of the collector and inventory: %+v", all)
	}
	if f.stored(t, collectable) || f.stored(t, orphan) {
		t.Fatal("the sweep left collectable or orphaned bytes")
	}
	if cur, _ := st.GetIntent(ctx, in.OperationID); cur.State != upload.IntentAbandoned || staged() {
		t.Fatal("the sweep left the intent pending or its bytes staged")
	}
	if again := sweep(); len(again.Reaped) != 0 || len(again.Deleted) != 0 {
		t.Fatalf("second sweep: %+v", again)
	}
	// Retention (issue 31): the reaped intent, once past
	// BLOBPLANE_RETAIN_OPERATIONS, is pruned by the retention step; a dry
	// run counts it and keeps it.
	if _, err := st.Pool().Exec(ctx, `UPDATE intents SET updated_at = now() - interval '40 days' WHERE operation_id = $1`, in.OperationID); err != nil {
		t.Fatal(err)
	}
	retention := func(args ...string) int64 {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"sweep", "--only", "retention"}, args...)...)
		cmd.Env = env
		out, err := cmd.Output()
		var r struct {
			Retention *store.Pruned `json:"retention"`
		}
		if err != nil || json.Unmarshal(out, &r) != nil || r.Retention == nil {
			t.Fatalf("sweep --only retention %v: %v %q", args, err, out)
		}
		return r.Retention.Intents
	}
	if n := retention("--dry-run"); n != 1 {
		t.Fatalf("dry run of the retention: %d intents", n)
	}
	if _, err := st.GetIntent(ctx, in.OperationID); err != nil {
		t.Fatalf("the dry run pruned: %v", err)
	}
	if n := retention(); n != 1 {
		t.Fatalf("retention: %d intents", n)
	}
	if _, err := st.GetIntent(ctx, in.OperationID); err == nil {
		t.Fatal("the retention kept a finished intent past its retention")
	}
	// A backend whose marker is gone: the inventory refuses to delete
	// there until an operator re-adopts it (docs/sweeps.md).
	if err := os.Remove(filepath.Join(f.be.Dir(), "marker.json")); err != nil {
		t.Fatal(err)
	}
	orphan = f.orphan(t)
	if r := sweepAll("--only", "inventory"); r.Inventory.OrphansDeleted != 0 || !f.stored(t, orphan) {
		t.Fatalf("inventory over a backend whose marker is gone: %+v", r)
	}
	adopt := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"sweep"}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := adopt("--adopt", "fs"); err != nil || !strings.Contains(out, `"backend":"fs"`) || !strings.Contains(out, `"pass":`) {
		t.Fatalf("worker sweep --adopt fs: %v %q", err, out)
	}
	if r := sweepAll("--only", "inventory"); r.Inventory.OrphansDeleted != 1 || f.stored(t, orphan) {
		t.Fatalf("inventory after the re-adoption: %+v", r)
	}
	if out, err := adopt("--adopt", "nope"); err == nil || !strings.Contains(out, `backend "nope" is not configured`) {
		t.Fatalf("adopting an unknown backend: %v %q", err, out)
	}
	if out, err := adopt("--adopt", "fs", "--dry-run"); err == nil || !strings.Contains(out, "usage: worker sweep") {
		t.Fatalf("--adopt with --dry-run: %v %q", err, out)
	}

	cmd := exec.Command(bin, "sweep", "--frobnicate")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "usage: worker sweep") {
		t.Fatalf("bad flag: %v %q", err, out)
	}
	cmd = exec.Command(bin, "sweep", "--only", "reaper,compactor")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), `unknown sweep step "compactor"`) {
		t.Fatalf("unknown step: %v %q", err, out)
	}
}

// The scheduled sweep job (BLOBPLANE_SWEEP_CRON) reaps the expired upload
// in a running worker and counts it on the worker's /metrics.
func testScheduledSweep(t *testing.T, bin string) {
	ctx := context.Background()
	f := newFixture(t)
	cmd := exec.Command(bin)
	cmd.Env = append(f.env, "BLOBPLANE_SWEEP_CRON=@every 1s", "BLOBPLANE_COLLECT_CRON=@every 1s", "BLOBPLANE_INVENTORY_CRON=@every 1s", "BLOBPLANE_WORKER_METRICS=127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	metricsURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "worker metrics listening" {
				u, _ := m["url"].(string)
				metricsURL <- u
			}
		}
	}()
	var url string
	select {
	case url = <-metricsURL:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker never logged its metrics address")
	}
	// Liveness for the platform (issue 31).
	if resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("worker /healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		cur, err := f.st.GetIntent(ctx, f.in.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		if cur.State == upload.IntentAbandoned && !f.staged(t) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduled sweep did not reclaim the upload: intent %s, staged %v", cur.State, f.staged(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The pass that deleted may still be recording; poll the counter.
	for {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "blobplane_sweep_intents_reaped_total 1") &&
			strings.Contains(string(body), `blobplane_sweep_reclaimed_bytes_total{kind="staged"} 15`) &&
			// Issue 31 point 6: the build, the pool, River's job latency by kind.
			strings.Contains(string(body), `blobplane_build_info{binary="worker"`) &&
			strings.Contains(string(body), `blobplane_db_pool_connections{pool="main"`) &&
			strings.Contains(string(body), `blobplane_river_job_run_duration_seconds_count{kind="sweep",outcome="completed"}`) &&
			strings.Contains(string(body), `blobplane_river_job_queue_wait_seconds_count{kind="sweep"}`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The collector and the inventory are scheduled in the same worker.
	for {
		var kinds int
		if err := f.st.Pool().QueryRow(ctx, `SELECT count(DISTINCT kind) FROM river_job WHERE kind IN ('collect', 'inventory') AND state = 'completed'`).Scan(&kinds); err != nil {
			t.Fatal(err)
		}
		if kinds == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("collect and inventory jobs completed: %d kinds, want 2", kinds)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// collectable stores bytes with a verified placement and a live blob row
// no reference names: what a collection pass decides and deletes.
func (f *fixture) collectable(t *testing.T) blobplane.Digest {
	t.Helper()
	ctx := context.Background()
	const content = "published once, dereferenced since"
	sum := sha256.Sum256([]byte(content))
	d := blobplane.Digest(blobplane.DigestPrefix + hex.EncodeToString(sum[:]))
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: "local", Location: "sha256/" + d.Hex()}
	if _, err := f.st.StagePlacement(ctx, k, int64(len(content)), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.be.Write(ctx, backend.WriteRequest{Digest: d, Size: int64(len(content)), Body: strings.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.VerifyPlacement(ctx, k, d, int64(len(content)), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.Pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2)`, string(d), len(content)); err != nil {
		t.Fatal(err)
	}
	return d
}

// orphan stores bytes no ledger row names (a crash between byte write and
// ledger write).
func (f *fixture) orphan(t *testing.T) blobplane.Digest {
	t.Helper()
	const content = "written outside the protocol"
	sum := sha256.Sum256([]byte(content))
	d := blobplane.Digest(blobplane.DigestPrefix + hex.EncodeToString(sum[:]))
	if _, err := f.be.Write(context.Background(), backend.WriteRequest{Digest: d, Size: int64(len(content)), Body: strings.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	// Two days old: past the inventory's minimum age (a day by default,
	// BLOBPLANE_INVENTORY_MIN_AGE), which keeps anything younger.
	at := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(f.be.Dir(), fs.ObjectPath(d)), at, at); err != nil {
		t.Fatal(err)
	}
	return d
}

func (f *fixture) stored(t *testing.T, d blobplane.Digest) bool {
	t.Helper()
	_, err := f.be.Stat(context.Background(), d)
	if err != nil && !errors.Is(err, backend.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}
