package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

const (
	obRoot   = "root"
	obReason = "the blob holds a leaked credential"
	obOther  = "team/other"
)

// obliterable is the factory for a digest an obliteration has work for:
// published in upRepo and obOther, verified in upDC and in us-1, and
// claimed by a pending upload that never published.
func (u *uploads) obliterable(t *testing.T, content string) (blobplane.Digest, upload.FinalizeRequest) {
	t.Helper()
	ctx := context.Background()
	if err := u.s.CreateRepository(ctx, obOther); err != nil {
		t.Fatal(err)
	}
	_, req := u.admitted(t, content)
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	_, other := u.admittedIn(t, obOther, content)
	if _, err := u.s.Finalize(ctx, other); err != nil {
		t.Fatal(err)
	}
	k := placement.Key{Digest: req.Digest, Backend: "fs", Datacenter: "us-1", Location: req.Digest.Hex()}
	if _, err := u.s.StagePlacement(ctx, k, req.Size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.VerifyPlacement(ctx, k, req.Digest, req.Size, 0); err != nil {
		t.Fatal(err)
	}
	_, pending := u.admitted(t, content) // claims the digest, never publishes
	return req.Digest, pending
}

// recordedDCs are the datacenters of the deletions an enqueuer got.
func recordedDCs(ds []store.Deletion) []string {
	var dcs []string
	for _, d := range ds {
		dcs = append(dcs, d.Key.Datacenter)
	}
	slices.Sort(dcs)
	return slices.Compact(dcs)
}

// The whole obliteration at the store: the mark and the removal of every
// reference commit together with the audit row and the job; while the
// mark holds no claim or publication of the digest succeeds; the job's
// steps, one by one, abandon the pending upload, revoke every placement
// and enqueue one deletion per placement in its datacenter; the settle
// step finishes only once nothing is left, a settle period after the
// mark; the bytes' deletion then deletes.
func TestObliterationEndToEnd(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	d, pending := u.obliterable(t, "obliterate me")
	if _, err := u.s.ReferencedBlob(ctx, upRepo, d); err != nil {
		t.Fatalf("before: %v", err)
	}

	st, marked, err := u.s.Obliterate(ctx, d, obRoot, obReason)
	if err != nil || !marked {
		t.Fatalf("obliterate: marked %v, %v", marked, err)
	}
	if st.State != "obliterated" || st.Mark == nil || st.Mark.Principal != obRoot || st.Mark.Reason != obReason ||
		st.Mark.Action != store.ActionObliterate || !st.Mark.FinishedAt.IsZero() || len(st.History) != 1 {
		t.Fatalf("status after the mark: %+v", st)
	}
	if st.Left != (store.ObliterationLeft{References: 0, PendingUploads: 1, Placements: 2}) {
		t.Fatalf("left after the mark: %+v", st.Left)
	}
	mark := st.Mark.ID
	if n := u.count(t, `SELECT count(*) FROM river_job WHERE kind = 'obliterate' AND args->>'digest' = $1 AND (args->>'mark')::bigint = $2 AND state = 'available'`, string(d), mark); n != 1 {
		t.Fatalf("%d obliterate jobs, want 1 inserted with the mark", n)
	}
	for _, repo := range []string{upRepo, obOther} {
		if _, err := u.s.ReferencedBlob(ctx, repo, d); !errors.Is(err, errNotFound) {
			t.Fatalf("existence in %s after the mark: %v", repo, err)
		}
	}

	// While the mark holds: the pending upload cannot publish, and no
	// claim of the digest records anything.
	if _, err := u.s.Finalize(ctx, pending); !errors.Is(err, upload.ErrObliterated) || blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("publication under the mark: %v", err)
	}
	if ob, err := u.s.Obliterated(ctx, d); err != nil || !ob {
		t.Fatalf("obliterated: %v %v", ob, err)
	}
	intents := u.count(t, `SELECT count(*) FROM intents`)
	if _, err := u.s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: pending.Size,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}); err == nil {
		t.Fatal("an intent declaring the obliterated digest was created")
	}
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
	session := u.open(t, upRepo)
	if _, err := u.s.ClaimAndStage(ctx, session.OperationID, k, pending.Size); err == nil {
		t.Fatal("a session claimed the obliterated digest")
	}
	if _, claimed, _, err := u.s.ClaimSessionAndStage(ctx, session.OperationID, upRepo, k, pending.Size); err != nil || claimed {
		t.Fatalf("session claim of the obliterated digest: claimed %v, %v", claimed, err)
	}
	if _, err := u.s.CreateMountIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: pending.Size,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}, obOther); err == nil {
		t.Fatal("a mount intent of the obliterated digest was created")
	}
	if n := u.count(t, `SELECT count(*) FROM intents`); n != intents+1 { // the session only
		t.Fatalf("%d intents, want %d", n, intents+1)
	}

	// Obliterating again records nothing and doubles no job.
	if again, marked, err := u.s.Obliterate(ctx, d, "someone", "again"); err != nil || marked || again.Mark.ID != mark || len(again.History) != 1 {
		t.Fatalf("second obliterate: marked %v %+v %v", marked, again, err)
	}
	if n := u.count(t, `SELECT count(*) FROM river_job WHERE kind = 'obliterate'`); n != 1 {
		t.Fatalf("%d obliterate jobs after a second request", n)
	}

	// The job's steps, one by one.
	args := store.ObliterateArgs{Digest: d, Mark: mark}
	enq := &recordingEnqueuer{}
	want := map[store.ObliterationStep]store.ObliterationPass{
		store.StepReferences: {},
		store.StepUploads:    {Abandoned: 1},
		store.StepPlacements: {Revoked: 2, Recorded: 2},
	}
	for _, step := range store.ObliterationSteps {
		p, err := u.s.ObliterationStep(ctx, args, step, enq, nil)
		w := want[step]
		if err != nil || p.References != w.References || p.Abandoned != w.Abandoned || p.Revoked != w.Revoked || p.Recorded != w.Recorded || p.Busy != 0 {
			t.Fatalf("step %s: %+v %v; want %+v", step, p, err, w)
		}
	}
	if dcs := recordedDCs(enq.got); !slices.Equal(dcs, []string{upDC, "us-1"}) {
		t.Fatalf("deletions enqueued in %v", dcs)
	}
	if n := u.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state = 'revoked' AND revoke_reason = 'reclamation'`, string(d)); n != 2 {
		t.Fatalf("%d placements revoked, want 2", n)
	}
	if n := u.count(t, `SELECT count(*) FROM intents WHERE expected_digest = $1 AND state = 'pending'`, string(d)); n != 0 {
		t.Fatalf("%d pending claims left", n)
	}
	// A re-run of a step changes nothing.
	if p, err := u.s.ObliterationStep(ctx, args, store.StepPlacements, enq, nil); err != nil || p.Changed() || len(p.Deletions) != 2 {
		t.Fatalf("re-run: %+v %v", p, err)
	}

	// Settle: nothing left, but the mark is younger than the period.
	done, wait, p, err := u.s.SettleObliteration(ctx, args, enq, time.Hour)
	if err != nil || done || p.Changed() || wait <= 0 || wait > time.Hour {
		t.Fatalf("settle within the period: done %v wait %s %+v %v", done, wait, p, err)
	}
	if done, _, _, err := u.s.SettleObliteration(ctx, args, enq, time.Nanosecond); err != nil || !done {
		t.Fatalf("settle: done %v %v", done, err)
	}
	st, err = u.s.ObliterationStatus(ctx, d)
	if err != nil || st.Mark == nil || st.Mark.FinishedAt.IsZero() || st.Left != (store.ObliterationLeft{OwedDeletions: 2}) {
		t.Fatalf("status after the job: %+v %v", st, err)
	}

	// The byte deletion the job enqueued deletes (nothing owns the digest).
	calls := 0
	res, _, err := u.s.DeleteCollectedBytes(ctx, k, func(context.Context) error { calls++; return nil })
	if err != nil || res != store.DeletionDeleted || calls != 1 {
		t.Fatalf("byte deletion: %q %v after %d calls", res, err, calls)
	}
	// Still refused, still no reference (S1).
	if _, err := u.s.Finalize(ctx, pending); err == nil {
		t.Fatalf("publication after the job: %v", err)
	}
	if n := u.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(d)); n != 0 {
		t.Fatalf("%d references", n)
	}
}

// Validation: digest, principal and reason; an unknown digest is
// not_found; unmarking a digest that is not obliterated is not_found.
func TestObliterationRefusesMalformedRequests(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	_, req := u.admitted(t, "validated")
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	invalid := &blobplane.Error{Code: blobplane.CodeInvalid}
	for _, c := range []struct {
		what, digest, principal, reason string
		want                            error
	}{
		{"malformed digest", "sha256:abc", obRoot, obReason, invalid},
		{"uppercase digest", strings.ToUpper(string(req.Digest)), obRoot, obReason, invalid},
		{"bad principal", string(req.Digest), "no spaces allowed", obReason, invalid},
		{"no reason", string(req.Digest), obRoot, "", invalid},
		{"blank reason", string(req.Digest), obRoot, " \t ", invalid},
		{"oversized reason", string(req.Digest), obRoot, strings.Repeat("x", store.MaxObliterationReason+1), invalid},
		{"control characters", string(req.Digest), obRoot, "line\nbreak", invalid},
		{"unknown digest", "sha256:" + strings.Repeat("0", 64), obRoot, obReason, errNotFound},
	} {
		if _, _, err := u.s.Obliterate(ctx, blobplane.Digest(c.digest), c.principal, c.reason); !errors.Is(err, c.want) {
			t.Errorf("obliterate, %s: %v", c.what, err)
		}
	}
	if _, err := u.s.Unmark(ctx, req.Digest, obRoot, obReason); !errors.Is(err, errNotFound) {
		t.Errorf("unmark of a live digest: %v", err)
	}
	if n := u.count(t, `SELECT count(*) FROM blob_obliterations`); n != 0 {
		t.Errorf("%d audit rows after refusals", n)
	}
	if _, _, err := u.s.Obliterate(ctx, req.Digest, obRoot, strings.Repeat("é", store.MaxObliterationReason/2)); err != nil {
		t.Errorf("a reason of exactly %d bytes: %v", store.MaxObliterationReason, err)
	}
}

// The race of a publication and an obliteration of the same digest,
// decided on the blob state row, both orders forced with locks: never a
// reference to a digest being deleted (S1, ADR-00018 "obliteration
// ordering is load-bearing").
func TestObliterationRacesPublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// The publication holds the blob row (its BeforeCommit waits) when
	// the obliteration asks for it: the publication commits first, then
	// the mark's transaction deletes the reference it made.
	t.Run("publication first", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		d, _ := u.obliterable(t, "published first")
		if err := u.s.CreateRepository(ctx, "team/racer"); err != nil {
			t.Fatal(err)
		}
		_, req := u.admittedIn(t, "team/racer", "published first")
		holding, release := make(chan struct{}), make(chan struct{})
		req.BeforeCommit = func() error {
			close(holding)
			<-release
			return nil
		}
		published := make(chan error, 1)
		go func() { _, err := u.s.Finalize(ctx, req); published <- err }()
		<-holding
		obliterated := make(chan error, 1)
		go func() { _, _, err := u.s.Obliterate(ctx, d, obRoot, obReason); obliterated <- err }()
		pgtest.WaitForLockWaiters(t, u.pool, 1) // the mark waits for the publication's blob row
		close(release)
		if err := <-published; err != nil {
			t.Fatalf("the publication holding the row first: %v", err)
		}
		if err := <-obliterated; err != nil {
			t.Fatalf("the obliteration after it: %v", err)
		}
		if n := u.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(d)); n != 0 {
			t.Fatalf("%d references survive the mark", n)
		}
	})

	// The publication read its context (a verified placement, its
	// intent) before the mark and reaches the blob row after it: the
	// test holds the intent's row, which Finalize locks first, while
	// the obliteration commits. The publication is then refused.
	t.Run("mark first", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		d, _ := u.obliterable(t, "marked first")
		if err := u.s.CreateRepository(ctx, "team/racer"); err != nil {
			t.Fatal(err)
		}
		_, req := u.admittedIn(t, "team/racer", "marked first")
		tx, err := u.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
		if _, err := tx.Exec(ctx, `SELECT 1 FROM intents WHERE operation_id = $1 FOR UPDATE`, req.OperationID); err != nil {
			t.Fatal(err)
		}
		published := make(chan error, 1)
		go func() { _, err := u.s.Finalize(ctx, req); published <- err }()
		pgtest.WaitForLockWaiters(t, u.pool, 1) // the publication waits at its first statement
		if _, marked, err := u.s.Obliterate(ctx, d, obRoot, obReason); err != nil || !marked {
			t.Fatalf("the obliteration while the publication waits: %v %v", marked, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-published; !errors.Is(err, upload.ErrObliterated) {
			t.Fatalf("the publication after the mark: %v", err)
		}
		if n := u.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(d)); n != 0 {
			t.Fatalf("%d references after the refused publication", n)
		}
	})
}

// A step whose mark no longer holds changes nothing and says so
// (ErrMarkGone): unmarked, or marked again (a newer mark's job works).
// Unmark makes the row collected once every placement is revoked, live
// while one is not, and records who and why.
func TestObliterationUnmark(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	d, _ := u.obliterable(t, "unmarked early")
	st, _, err := u.s.Obliterate(ctx, d, obRoot, obReason)
	if err != nil {
		t.Fatal(err)
	}
	first := store.ObliterateArgs{Digest: d, Mark: st.Mark.ID}
	// Unmarked before the job revoked anything: live, for the collector.
	if st, err := u.s.Unmark(ctx, d, "ops", "false alarm"); err != nil || st.State != "live" || st.Mark != nil ||
		len(st.History) != 2 || st.History[0].Action != store.ActionUnmark || st.History[0].Principal != "ops" || st.History[0].Reason != "false alarm" {
		t.Fatalf("unmark: %+v %v", st, err)
	}
	if _, err := u.s.ObliterationStep(ctx, first, store.StepPlacements, nil, nil); !errors.Is(err, store.ErrMarkGone) || blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("a step after the unmark: %v", err)
	}
	if n := u.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state = 'revoked'`, string(d)); n != 0 {
		t.Fatalf("%d placements revoked by a step of a lifted mark", n)
	}
	// Marked again: the first mark's job stops, the second's works.
	st, marked, err := u.s.Obliterate(ctx, d, obRoot, "really")
	if err != nil || !marked || st.Mark.ID == first.Mark {
		t.Fatalf("second mark: %v %+v %v", marked, st, err)
	}
	if _, _, _, err := u.s.SettleObliteration(ctx, first, nil, 0); !errors.Is(err, store.ErrMarkGone) {
		t.Fatalf("the first mark's settle: %v", err)
	}
	second := store.ObliterateArgs{Digest: d, Mark: st.Mark.ID}
	if done, _, _, err := u.s.SettleObliteration(ctx, second, nil, time.Nanosecond); err != nil || done {
		t.Fatalf("first settle pass of the second mark finds work: done %v %v", done, err)
	}
	if done, _, _, err := u.s.SettleObliteration(ctx, second, nil, time.Nanosecond); err != nil || !done {
		t.Fatalf("second settle pass: done %v %v", done, err)
	}
	// Every placement revoked: collected, exactly what a collection leaves.
	if st, err := u.s.Unmark(ctx, d, "ops", "cleared by legal"); err != nil || st.State != "collected" {
		t.Fatalf("unmark after the job: %+v %v", st, err)
	}
	if n := u.count(t, `SELECT count(*) FROM blob_obliterations WHERE digest = $1`, string(d)); n != 4 {
		t.Fatalf("%d audit rows, want 4", n)
	}
}

// A step's transaction rolls back whole: its beforeCommit failing (the
// job's checkpoint, say) leaves nothing done, and the step runs again.
func TestObliterationStepIsOneTransaction(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	d, _ := u.obliterable(t, "rolled back")
	st, _, err := u.s.Obliterate(ctx, d, obRoot, obReason)
	if err != nil {
		t.Fatal(err)
	}
	args := store.ObliterateArgs{Digest: d, Mark: st.Mark.ID}
	crash := errors.New("crash before the commit")
	if _, err := u.s.ObliterationStep(ctx, args, store.StepPlacements, &recordingEnqueuer{}, func(context.Context, pgx.Tx) error { return crash }); !errors.Is(err, crash) {
		t.Fatalf("step: %v", err)
	}
	if n := u.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state = 'revoked'`, string(d)); n != 0 {
		t.Fatalf("%d placements revoked by a rolled-back step", n)
	}
	if n := u.count(t, `SELECT count(*) FROM deletions WHERE digest = $1`, string(d)); n != 0 {
		t.Fatalf("%d deletions recorded by a rolled-back step", n)
	}
	if p, err := u.s.ObliterationStep(ctx, args, store.StepPlacements, &recordingEnqueuer{}, nil); err != nil || p.Revoked != 2 {
		t.Fatalf("step again: %+v %v", p, err)
	}
}

// Issue 29: "obliteration racing an upload of the same digest". An
// upload whose claim committed before the mark (its intent claims the
// digest, its placement is staged, its bytes are being written) when
// the job runs: the uploads step skips its intent while the upload holds
// it (busy), the settle step abandons it once released, the placements
// step revokes its stage; the close's publication, and the verification
// it records after the refusal, then fail: no reference, no verified
// placement of the obliterated digest.
func TestObliterationRacesAnUploadInFlight(t *testing.T) {
	t.Parallel()
	u := setupUploads(t)
	ctx := context.Background()
	content := "uploaded while obliterated"
	if err := u.s.CreateRepository(ctx, obOther); err != nil {
		t.Fatal(err)
	}
	// Published in obOther from a us-1 copy; not stored in upDC yet.
	in := u.open(t, obOther)
	d, size := contentOf([]byte(content))
	us := placement.Key{Digest: d, Backend: "fs", Datacenter: "us-1", Location: d.Hex()}
	if _, err := u.s.StagePlacement(ctx, us, size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.VerifyPlacement(ctx, us, d, size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.RecordIntentContent(ctx, in.OperationID, d, size); err != nil {
		t.Fatal(err)
	}
	pub := upload.FinalizeRequest{OperationID: in.OperationID, Digest: d, Size: size, Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch, Proven: true}
	if _, err := u.s.Finalize(ctx, pub); err != nil {
		t.Fatal(err)
	}
	// The upload in flight: claimed and staged in upDC before the mark.
	straggler, req := u.closing(t, content)
	st, _, err := u.s.Obliterate(ctx, d, obRoot, obReason)
	if err != nil {
		t.Fatal(err)
	}
	args := store.ObliterateArgs{Digest: d, Mark: st.Mark.ID}

	tx, err := u.pool.Begin(ctx) // the upload holds its intent (a Finalize in flight)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(ctx, `SELECT 1 FROM intents WHERE operation_id = $1 FOR UPDATE`, straggler.OperationID); err != nil {
		t.Fatal(err)
	}
	for _, step := range store.ObliterationSteps {
		p, err := u.s.ObliterationStep(ctx, args, step, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if step == store.StepUploads && (p.Busy != 1 || p.Abandoned != 0) {
			t.Fatalf("uploads step while the upload holds its intent: %+v", p)
		}
		if step == store.StepPlacements && p.Revoked != 2 {
			t.Fatalf("placements step: %+v", p)
		}
	}
	if done, _, _, err := u.s.SettleObliteration(ctx, args, nil, time.Nanosecond); err != nil || done {
		t.Fatalf("settle while the upload holds its intent: done %v %v", done, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	done, _, p, err := u.s.SettleObliteration(ctx, args, nil, time.Nanosecond)
	if err != nil || done || p.Abandoned != 1 {
		t.Fatalf("settle once released: done %v %+v %v", done, p, err)
	}
	if done, _, _, err := u.s.SettleObliteration(ctx, args, nil, time.Nanosecond); err != nil || !done {
		t.Fatalf("last settle: done %v %v", done, err)
	}

	// The close goes on: its publication and its verification fail.
	if _, err := u.s.Finalize(ctx, req); err == nil {
		t.Fatal("the upload in flight published an obliterated digest")
	}
	if p, err := u.s.Placement(ctx, req.Verify.Key); err != nil || p.State != placement.Revoked {
		t.Fatalf("the upload's placement: %+v %v", p, err)
	}
	if n := u.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(d)); n != 0 {
		t.Fatalf("%d references", n)
	}
	if n := u.count(t, `SELECT count(*) FROM placements WHERE digest = $1 AND state <> 'revoked'`, string(d)); n != 0 {
		t.Fatalf("%d placements not revoked", n)
	}
}
