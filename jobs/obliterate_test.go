package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// obliterationFixture is a digest published in team/app, its bytes in an
// eu-1 filesystem backend, verified in eu-1 and in us-1, and claimed by
// a pending upload: work for every step of an obliteration.
type obliterationFixture struct {
	d    *pgtest.DB
	st   *store.Store
	be   *fs.Backend
	dg   blobplane.Digest
	size int64
}

func newObliterationFixture(t *testing.T, content string) *obliterationFixture {
	t.Helper()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	be, err := fs.Open(t.TempDir(), backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	h := sha256.Sum256([]byte(content))
	dg := blobplane.Digest("sha256:" + hex.EncodeToString(h[:]))
	size := int64(len(content))
	if _, err := be.Write(ctx, backend.WriteRequest{Digest: dg, Size: size, Body: strings.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	for _, dc := range []string{"eu-1", "us-1"} {
		k := placement.Key{Digest: dg, Backend: "fs", Datacenter: dc, Location: placement.ObjectLocation(dg)}
		if _, err := st.StagePlacement(ctx, k, size, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := st.VerifyPlacement(ctx, k, dg, size, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateRepository(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2)`,
		`INSERT INTO blob_references (repository, digest, operation_id) VALUES ('team/app', $1, gen_random_uuid())`,
	} {
		args := []any{string(dg)}
		if strings.Contains(q, "$2") {
			args = append(args, size)
		}
		if _, err := d.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CreateIntent(ctx, upload.NewIntent{Repository: "team/app", Principal: "alice", ExpectedDigest: dg, ExpectedSize: size,
		IngressDatacenter: "eu-1", Backend: "fs", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return &obliterationFixture{d: d, st: st, be: be, dg: dg, size: size}
}

func (f *obliterationFixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.d.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// client is a River client working obliterations (and eu-1's byte
// deletions) on f's database.
func (f *obliterationFixture) client(t *testing.T) *river.Client[pgx.Tx] {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	w := river.NewWorkers()
	river.AddWorker(w, &ObliterateWorker{Store: f.st, Settle: time.Millisecond, Logger: logger})
	AddCollectWorkers(w, CollectDeps{Store: f.st, Logger: logger, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": f.be}})
	rc, err := river.NewClient(riverpgxv5.New(f.d.Pool), &river.Config{
		Logger: logger, Workers: w, FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}, DeletionQueue("eu-1"): {MaxWorkers: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// waitJob polls until job id is in one of the states want, or fails at
// a deadline.
func (f *obliterationFixture) waitJob(t *testing.T, id int64, want ...rivertype.JobState) *rivertype.JobRow {
	t.Helper()
	ctx := context.Background()
	rc, err := river.NewClient(riverpgxv5.New(f.d.Pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, err := rc.JobGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(want, j.State) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d is %s (errors %v), want %v", id, j.State, j.Errors, want)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

func stopClient(t *testing.T, rc *river.Client[pgx.Tx], cancel bool) {
	t.Helper()
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	stop := rc.Stop
	if cancel {
		stop = rc.StopAndCancel
	}
	if err := stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// Issue 29: "crash in the middle of obliteration then resume". The job's
// placements step blocks on a deletion row the test inserted and has not
// committed; the worker is stopped with its job cancelled there: the
// references and uploads steps committed (and were recorded done with
// them), the placements step rolled back whole. A new worker resumes at
// the placements step and ends with the mark set, no reference, no
// pending upload, every placement revoked, a delete_bytes job in each
// datacenter holding a copy, and eu-1's bytes deleted.
func TestObliterateJobResumesAfterACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newObliterationFixture(t, "obliterated across a crash")
	st, marked, err := f.st.Obliterate(ctx, f.dg, "root", "crash drill")
	if err != nil || !marked {
		t.Fatalf("obliterate: %v %v", marked, err)
	}
	blocker, err := f.d.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx) //nolint:errcheck // a no-op once rolled back
	if _, err := blocker.Exec(ctx, `INSERT INTO deletions (digest, backend, datacenter, location, size_bytes) VALUES ($1, 'fs', 'us-1', $2, $3)`,
		string(f.dg), placement.ObjectLocation(f.dg), f.size); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := f.d.Pool.QueryRow(ctx, `SELECT id FROM river_job WHERE kind = 'obliterate'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	rc := f.client(t)
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitForLockWaiters(t, f.d.Pool, 1) // the placements step waits on the test's deletion row
	if n := f.count(t, `SELECT count(*) FROM intents WHERE expected_digest = $1 AND state = 'pending'`, string(f.dg)); n != 0 {
		t.Fatalf("the uploads step did not commit: %d pending claims", n)
	}
	stopClient(t, rc, true) // the crash: the attempt is cancelled mid-step

	// River hands an attempt cancelled by its shutdown back (available,
	// the attempt not counted); the steps it committed are recorded.
	j := f.waitJob(t, id, rivertype.JobStateAvailable, rivertype.JobStateRetryable)
	if step := stepOf(t, j); step != string(store.StepUploads) {
		t.Fatalf("recorded step %q after the crash, want %q", step, store.StepUploads)
	}
	if n := f.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state = 'revoked'`, string(f.dg)); n != 0 {
		t.Fatalf("%d placements revoked by the cancelled step", n)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	rc = f.client(t)
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopClient(t, rc, false)
	if j.State == rivertype.JobStateRetryable {
		if _, err := rc.JobRetry(ctx, id); err != nil { // now, not after the backoff
			t.Fatal(err)
		}
	}
	f.waitJob(t, id, rivertype.JobStateCompleted)

	after, err := f.st.ObliterationStatus(ctx, f.dg)
	if err != nil {
		t.Fatal(err)
	}
	if after.State != "obliterated" || after.Mark == nil || after.Mark.ID != st.Mark.ID || after.Mark.FinishedAt.IsZero() ||
		after.Left.References != 0 || after.Left.PendingUploads != 0 || after.Left.Placements != 0 {
		t.Fatalf("after the resumed job: %+v", after)
	}
	for _, dc := range []string{"eu-1", "us-1"} {
		if n := f.count(t, `SELECT count(*) FROM river_job WHERE kind = 'delete_bytes' AND queue = $1 AND args->>'digest' = $2`, DeletionQueue(dc), string(f.dg)); n != 1 {
			t.Fatalf("%d delete_bytes jobs in %s, want 1", n, dc)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := f.be.Stat(ctx, f.dg)
		if errors.Is(err, backend.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu-1's bytes remain: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// stepOf is the resumable step River recorded on j.
func stepOf(t *testing.T, j *rivertype.JobRow) string {
	t.Helper()
	var m struct {
		Step string `json:"river:resumable_step"`
	}
	if err := json.Unmarshal(j.Metadata, &m); err != nil {
		t.Fatal(err)
	}
	return m.Step
}

// An unmarked digest's job ends cancelled, having changed nothing.
func TestObliterateJobEndsWhenUnmarked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newObliterationFixture(t, "unmarked before the job ran")
	if _, _, err := f.st.Obliterate(ctx, f.dg, "root", "mistake"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Unmark(ctx, f.dg, "root", "it was the wrong digest"); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := f.d.Pool.QueryRow(ctx, `SELECT id FROM river_job WHERE kind = 'obliterate'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	rc := f.client(t)
	if err := rc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer stopClient(t, rc, false)
	f.waitJob(t, id, rivertype.JobStateCancelled)
	if n := f.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state = 'verified'`, string(f.dg)); n != 2 {
		t.Fatalf("%d verified placements left, want both", n)
	}
	if _, err := f.be.Stat(ctx, f.dg); err != nil {
		t.Fatalf("the bytes of an unmarked digest: %v", err)
	}
}
