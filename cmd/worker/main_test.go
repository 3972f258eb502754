package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// `worker sweep [--dry-run]` through the real binary: the dry run lists the
// expired upload and changes nothing; the pass reaps it and deletes its
// staged bytes.
func TestWorkerSweepCommand(t *testing.T) {
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "worker")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/blobplane/blobplane/cmd/worker").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
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
	defer be.Close()
	in, err := st.CreateIntent(ctx, store.NewIntent{Repository: "team/app", Principal: "alice", ExpectedSize: store.SizeUnknown,
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
		"BLOBPLANE_DATA_DIR=" + dataDir, "BLOBPLANE_DATACENTER=local"}
	sweep := func(args ...string) (report struct {
		DryRun         bool `json:"dry_run"`
		Reaped         []struct{ OperationID string }
		Deleted        []struct{ OperationID string }
		BytesReclaimed int64 `json:"bytes_reclaimed"`
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
	staged := func() bool {
		_, err := be.UploadSize(ctx, id)
		if err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	dry := sweep("--dry-run")
	if !dry.DryRun || len(dry.Reaped) != 1 || dry.Reaped[0].OperationID != in.OperationID || dry.BytesReclaimed != 15 {
		t.Fatalf("dry run: %+v", dry)
	}
	if cur, _ := st.GetIntent(ctx, in.OperationID); cur.State != store.IntentPending || !staged() {
		t.Fatal("the dry run changed something")
	}
	rep := sweep()
	if rep.DryRun || len(rep.Reaped) != 1 || len(rep.Deleted) != 1 || rep.BytesReclaimed != 15 {
		t.Fatalf("sweep: %+v", rep)
	}
	if cur, _ := st.GetIntent(ctx, in.OperationID); cur.State != store.IntentAbandoned || staged() {
		t.Fatal("the sweep left the intent pending or its bytes staged")
	}
	if again := sweep(); len(again.Reaped) != 0 || len(again.Deleted) != 0 {
		t.Fatalf("second sweep: %+v", again)
	}
	cmd := exec.Command(bin, "sweep", "--frobnicate")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "usage: worker sweep") {
		t.Fatalf("bad flag: %v %q", err, out)
	}
}
