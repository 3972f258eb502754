//go:build unix

package soak_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	bpfs "github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/testbin"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
)

// TestAPIKilledBetweenWriteAndVerifyLeaksNothing is issue 29's "kill -9 of
// the api between write and verify → bytes reclaimed with no operator",
// with the real api binary on a filesystem backend:
//
//  1. A single-request upload (POST ?digest=, a body too large to chain)
//     commits its intent and its placement's stage, writes the bytes to
//     the content-addressed key, and sends its publication, whose
//     verification statement runs first; the test holds an uncommitted
//     blob state row for the digest in its own connection, so the
//     publication waits on it, the verification uncommitted. The api is
//     SIGKILLed there, then the test lets go: the publication (and the
//     verification) roll back. Left: a pending intent, a pending
//     placement, the bytes.
//  2. A second upload is SIGKILLed while its body streams into its temp
//     file: left, a .tmp- file no ledger row names.
//
// Then the worker's sweeps, as the worker runs them (in process here, with
// a minimum age of a nanosecond): the reaper abandons the expired intents,
// the collector fails the pending placements nothing can verify any more,
// and the inventory adopts the backend, deletes the unverified bytes and
// the temp file. Nobody edits a row.
func TestAPIKilledBetweenWriteAndVerifyLeaksNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: builds and kills the api; skipped with -short")
	}
	ctx := context.Background()
	bins := testbin.Build(t)
	db := pgtest.New(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "eu-1", "blobs")
	const dc, repo = "eu-1", "leaks/app"
	api := filepath.Join(bins, "api")
	common := []string{"DATABASE_URL=" + db.URL, "BLOBPLANE_LOG_FORMAT=json", "BLOBPLANE_DATA_DIR=" + filepath.Join(dir, "tools")}
	tok, err := runTool(api, common, "token", "bootstrap", "--principal", "soak")
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(tok)
	if _, err := runTool(api, common, "repo", "create", repo); err != nil {
		t.Fatal(err)
	}
	port, err := stablePort()
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	p := newProc(t, "api-"+dc, api, []string{
		"DATABASE_URL=" + db.URL,
		"BLOBPLANE_DATACENTER=" + dc,
		"BLOBPLANE_DATA_DIR=" + filepath.Join(dir, dc),
		"BLOBPLANE_BACKENDS=fs=filesystem:" + root,
		"BLOBPLANE_CLUSTER_SECRET=" + hex.EncodeToString(secret),
		// The killed uploads' intents expire within seconds, so the reaper
		// may abandon them (it decides on the row: expiry only permits).
		"BLOBPLANE_UPLOAD_TTL=2s",
		"BLOBPLANE_SHUTDOWN_TIMEOUT=5s",
		"BLOBPLANE_LOG_FORMAT=json",
		"BLOBPLANE_NODE_ID=api-" + dc,
		"BLOBPLANE_LISTEN=127.0.0.1:" + strconv.Itoa(port),
		"BLOBPLANE_RIVERUI=false",
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("api log:\n%s", p.tail(16<<10))
		}
	})
	hc := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	start := func() {
		t.Helper()
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		if err := waitHTTP(ctx, p, hc, base+"/readyz", "", phaseBound); err != nil {
			t.Fatal(err)
		}
	}
	start()
	ctl := filepath.Join(bins, "controller")
	ctlEnv := append(common, "BLOBPLANE_SIGNING_KEY_FILE="+filepath.Join(dir, "controller", "signing-key.json"), "BLOBPLANE_PARTITIONS=4")
	for _, cmd := range []string{"keygen", "publish"} {
		if _, err := runTool(ctl, ctlEnv, cmd); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitHTTP(ctx, p, hc, base+"/v1/home/"+repo, token, phaseBound); err != nil {
		t.Fatal(err)
	}

	// 1. Killed between the write and the verification.
	body := make([]byte, 256<<10)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	d := blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: dc, Location: placement.ObjectLocation(d)}
	hold, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2)`, string(d), len(body)); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		sent <- post(ctx, base+"/v2/"+repo+"/blobs/uploads/?digest="+string(d), token, bytes.NewReader(body), int64(len(body)))
	}()
	pgtest.WaitForLockWaiters(t, db.Pool, 1) // the publication waits on the blob row, its verification sent
	if st := placementState(t, db.Pool, k); st != "pending" {
		t.Fatalf("before the kill the placement is %q, want pending (staged, verification uncommitted)", st)
	}
	if _, err := os.Stat(filepath.Join(root, bpfs.ObjectPath(d))); err != nil {
		t.Fatalf("before the kill the bytes are not at the key: %v", err)
	}
	if err := p.kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err == nil {
		t.Fatal("the killed upload was answered")
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// 2. Killed mid-body: a temp file of the killed writer is left.
	start()
	if err := waitHTTP(ctx, p, hc, base+"/v1/home/"+repo, token, phaseBound); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 4<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	bigSum := sha256.Sum256(big)
	d2 := blobplane.Digest("sha256:" + hex.EncodeToString(bigSum[:]))
	pr, pw := io.Pipe()
	defer pw.Close()
	sent = make(chan error, 1)
	go func() {
		sent <- post(ctx, base+"/v2/"+repo+"/blobs/uploads/?digest="+string(d2), token, pr, int64(len(big)))
	}()
	if _, err := pw.Write(big[:1<<20]); err != nil {
		t.Fatal(err)
	}
	tmpDir := filepath.Join(root, filepath.Dir(bpfs.ObjectPath(d2)))
	deadline := time.Now().Add(phaseBound)
	for len(tempFiles(t, tmpDir)) == 0 { // poll: the first bytes reach the temp file
		if time.Now().After(deadline) {
			t.Fatal("no temp file appeared for the streaming upload")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.kill(); err != nil {
		t.Fatal(err)
	}
	pw.CloseWithError(errors.New("the api was killed"))
	<-sent

	// The worker's sweeps, until everything is reclaimed.
	st := store.New(db.Pool, nil)
	be, err := bpfs.Open(root, "")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	reaper := &sweep.Reaper{Store: st, Backends: map[string]sweep.StagedDeleter{"fs": be}, Datacenter: dc}
	collector := &sweep.Collector{Store: st, Enqueuer: noJobs{}}
	inv := &sweep.Inventory{Store: st, Backends: map[string]sweep.Lister{"fs": be}, Datacenter: dc, MinAge: time.Nanosecond}
	var (
		reaped, orphansDeleted, tmpsDeleted int
		failed                              []placement.Key
	)
	deadline = time.Now().Add(phaseBound)
	for {
		rrep, err := reaper.RunOnce(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		reaped += len(rrep.Reaped)
		crep, err := collector.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		failed = append(failed, crep.StalePlacements...)
		irep, err := inv.Run(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		orphansDeleted += irep.OrphansDeleted
		tmpsDeleted += irep.ResidueDeleted[backend.ResidueTemp]
		_, statErr := os.Stat(filepath.Join(root, bpfs.ObjectPath(d)))
		if errors.Is(statErr, fs.ErrNotExist) && len(tempFiles(t, tmpDir)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("L1: after %s: reaped %d, stale placements failed %v, inventory %+v; object %v, temp files %v",
				phaseBound, reaped, failed, irep, statErr, tempFiles(t, tmpDir))
		}
		time.Sleep(100 * time.Millisecond) // poll: the intents expire (2 s), the sweeps run again
	}
	if reaped < 1 || !slices.Contains(failed, k) || orphansDeleted != 1 || tmpsDeleted != 1 {
		t.Fatalf("reclaimed by: reaped %d, failed %v, orphans deleted %d, temp files deleted %d; want the cut upload's intent reaped, its stage failed, its bytes deleted, and the killed writer's temp file",
			reaped, failed, orphansDeleted, tmpsDeleted)
	}
	if got := placementState(t, db.Pool, k); got != "failed" {
		t.Fatalf("the cut upload's placement is %q, want failed", got)
	}
	page, err := be.List(ctx, backend.ListOptions{})
	if err != nil || len(page.Entries) != 0 {
		t.Fatalf("objects left: %+v, %v", page.Entries, err)
	}
}

// noJobs stands in for River: the byte deletions a collection decides
// (none here: nothing was ever published) would be its jobs.
type noJobs struct{}

func (noJobs) EnqueueDeletionsTx(context.Context, pgx.Tx, []store.Deletion) error { return nil }

// post sends a single-request upload of length bytes.
func post(ctx context.Context, url, token string, body io.Reader, length int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return err
	}
	req.ContentLength = length
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return fmt.Errorf("answered %d %s", resp.StatusCode, b)
}

func placementState(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, k placement.Key) string {
	t.Helper()
	var st string
	err := db.QueryRow(context.Background(), `SELECT state FROM placements WHERE digest = $1 AND backend = $2 AND datacenter = $3 AND location = $4`,
		string(k.Digest), k.Backend, k.Datacenter, k.Location).Scan(&st)
	if err != nil {
		t.Fatalf("placement %v: %v", k, err)
	}
	return st
}

func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	got, err := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	if err != nil {
		t.Fatal(err)
	}
	return got
}
