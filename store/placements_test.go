package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

var (
	errInvalid  = &blobplane.Error{Code: blobplane.CodeInvalid}
	errNotFound = &blobplane.Error{Code: blobplane.CodeNotFound}
	errConflict = &blobplane.Error{Code: blobplane.CodeConflict}
	errStale    = &blobplane.Error{Code: blobplane.CodeStaleEpoch}
	errMismatch = &blobplane.Error{Code: blobplane.CodeMismatch}
)

// placementSetup returns a store over a fresh database (no ledger yet) and
// the database's handles.
func placementSetup(t *testing.T) (*store.Store, *pgtest.DB) {
	t.Helper()
	d := pgtest.New(t)
	return store.New(d.Pool, slog.New(slog.DiscardHandler)), d
}

func digestOf(s string) blobplane.Digest {
	sum := sha256.Sum256([]byte(s))
	return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
}

func pkey(d blobplane.Digest, dc, loc string) placement.Key {
	return placement.Key{Digest: d, Backend: "filesystem", Datacenter: dc, Location: loc}
}

// must unwraps a (value, error) pair that the test's setup requires to
// succeed. Go cannot pass a multi-value call next to t, so a failure panics
// (failing the test binary with the error and a stack) instead of t.Fatal.
func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

// Spec: "Opening a metadata store does not create them. The first placement
// write creates the required table; reads before that write return no
// placements."
func TestPlacementLedgerCreatedOnFirstWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, d := placementSetup(t)
	var reg *string
	if err := d.Pool.QueryRow(ctx, `SELECT to_regclass('placements')::text`).Scan(&reg); err != nil || reg != nil {
		t.Fatalf("a migrated database already has the ledger: %v (%v)", reg, err)
	}
	dg := digestOf("before")
	rows, err := s.Placements(ctx, dg)
	if err != nil || rows == nil || len(rows) != 0 {
		t.Fatalf("read before first write: %v, %v; want no placements and no error", rows, err)
	}
	r, err := s.PlacementRouting(ctx, dg, "eu-1")
	if err != nil || r.Known || r.Serveable {
		t.Fatalf("routing before first write: %+v, %v", r, err)
	}
	if _, err := s.Placement(ctx, pkey(dg, "eu-1", "a")); !errors.Is(err, errNotFound) {
		t.Fatalf("get before first write: %v, want not_found", err)
	}
	if _, _, err := s.PlacementIfChanged(ctx, pkey(dg, "eu-1", "a"), 0); !errors.Is(err, errNotFound) {
		t.Fatalf("get-if-changed before first write: %v, want not_found", err)
	}

	// Several stores (processes) race to write first: the advisory lock
	// makes creation happen once and nobody fails.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			other := store.New(d.Pool, nil)
			_, errs[i] = other.StagePlacement(ctx, pkey(dg, "eu-1", fmt.Sprintf("loc-%d", i)), 10, 1)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent first write %d: %v", i, err)
		}
	}
	if rows := must(s.Placements(ctx, dg)); len(rows) != len(errs) {
		t.Fatalf("%d rows after %d first writes", len(rows), len(errs))
	}
	// The store that only read before now writes through its own path too.
	must(s.StagePlacement(ctx, pkey(dg, "eu-1", "mine"), 10, 1))
}

// DBAs query the ledger directly (issue 4 "For DBAs"): once it exists, the
// table, the view and every column carry a COMMENT, and the constraints the
// issue names are in place.
func TestPlacementLedgerCommented(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, d := placementSetup(t)
	must(s.StagePlacement(ctx, pkey(digestOf("c"), "eu-1", "a"), 1, 1))
	rows, err := d.Pool.Query(ctx, `
		SELECT c.relname || '.' FROM pg_class c
		WHERE c.relname IN ('placements', 'placement_summary') AND obj_description(c.oid, 'pg_class') IS NULL
		UNION ALL
		SELECT c.relname || '.' || a.attname
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE c.relname IN ('placements', 'placement_summary') AND col_description(c.oid, a.attnum) IS NULL
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	missing := must(pgx.CollectRows(rows, pgx.RowTo[string]))
	if len(missing) > 0 {
		t.Fatalf("objects without COMMENT ON: %v", missing)
	}
	var nCols, nViewCols int
	if err := d.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pg_attribute WHERE attrelid = 'placements'::regclass AND attnum > 0),
		(SELECT count(*) FROM pg_attribute WHERE attrelid = 'placement_summary'::regclass AND attnum > 0)`).Scan(&nCols, &nViewCols); err != nil {
		t.Fatal(err)
	}
	if nCols != 13 || nViewCols != 8 {
		t.Fatalf("placements has %d columns, placement_summary %d: update this test and the comments", nCols, nViewCols)
	}
	for _, c := range []string{"sha256_digest_canonical", "placements_reason_iff_failed", "placements_revoke_reason_iff_revoked", "placements_pkey"} {
		var ok bool
		if err := d.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = $1)`, c).Scan(&ok); err != nil || !ok {
			t.Fatalf("constraint %s missing (%v)", c, err)
		}
	}
}

// The table itself refuses what Go refuses: a non-canonical digest, and a
// reason on anything but a failed row (or a failed row without one).
func TestPlacementTableConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, d := placementSetup(t)
	must(s.StagePlacement(ctx, pkey(digestOf("x"), "eu-1", "a"), 1, 1))
	good := string(digestOf("y"))
	for name, stmt := range map[string]string{
		"uppercase digest":       `INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch) VALUES ('` + strings.ToUpper(good) + `', 'fs', 'eu-1', 'a', 'pending', 1, 1)`,
		"other algorithm":        `INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch) VALUES ('md5:abc', 'fs', 'eu-1', 'a', 'pending', 1, 1)`,
		"reason without failed":  `INSERT INTO placements (digest, backend, datacenter, location, state, reason, size_bytes, epoch) VALUES ('` + good + `', 'fs', 'eu-1', 'a', 'pending', 'backend_refused', 1, 1)`,
		"failed without reason":  `INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch) VALUES ('` + good + `', 'fs', 'eu-1', 'a', 'failed', 1, 1)`,
		"unknown reason":         `INSERT INTO placements (digest, backend, datacenter, location, state, reason, size_bytes, epoch) VALUES ('` + good + `', 'fs', 'eu-1', 'a', 'failed', 'gremlins', 1, 1)`,
		"verified without time":  `INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch) VALUES ('` + good + `', 'fs', 'eu-1', 'a', 'verified', 1, 1)`,
		"revoked without reason": `INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch) VALUES ('` + good + `', 'fs', 'eu-1', 'a', 'revoked', 1, 1)`,
	} {
		if _, err := d.Pool.Exec(ctx, stmt); err == nil || !strings.Contains(err.Error(), "23514") {
			t.Errorf("%s: %v, want a check violation", name, err)
		}
	}
}

// bringTo puts k into state from (absent: nothing) at epoch 1.
func bringTo(t *testing.T, s *store.Store, k placement.Key, from placement.State) {
	t.Helper()
	ctx := context.Background()
	if from == placement.Absent {
		return
	}
	must(s.StagePlacement(ctx, k, 10, 1))
	switch from {
	case placement.Verified:
		must(s.VerifyPlacement(ctx, k, k.Digest, 10, 1))
	case placement.Failed:
		must(s.FailPlacement(ctx, k, placement.BackendRefused, 1))
	case placement.Revoked:
		must(s.RevokePlacement(ctx, k, placement.Administrative, 1))
	}
}

func apply(ctx context.Context, s *store.Store, k placement.Key, ev placement.Event, epoch int64) (placement.Placement, error) {
	switch ev {
	case placement.Stage:
		return s.StagePlacement(ctx, k, 10, epoch)
	case placement.VerifyMatch:
		return s.VerifyPlacement(ctx, k, k.Digest, 10, epoch)
	case placement.VerifyMismatch:
		return s.VerifyPlacement(ctx, k, digestOf("something else"), 10, epoch)
	case placement.Fail:
		return s.FailPlacement(ctx, k, placement.SourceUnavailable, epoch)
	case placement.Revoke:
		return s.RevokePlacement(ctx, k, placement.Reclamation, epoch)
	}
	panic(ev)
}

// Every cell of the transition table through the store: the persisted row
// follows placement.Transition exactly, an accepted transition advances the
// generation by one (S3), and a refused one changes nothing.
func TestPlacementTransitionCellsInStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	d := digestOf("cells")
	for _, from := range append([]placement.State{placement.Absent}, placement.States...) {
		for _, ev := range placement.Events {
			name := fmt.Sprintf("%s-%s", from, ev)
			if from == placement.Absent {
				name = "absent-" + string(ev)
			}
			k := pkey(d, "eu-1", name)
			bringTo(t, s, k, from)
			before, _ := s.Placement(ctx, k)
			want, wantErr := placement.Transition(from, ev)
			got, err := apply(ctx, s, k, ev, 1)
			if wantErr != nil {
				if blobplane.ErrorCode(err) != blobplane.ErrorCode(wantErr) {
					t.Errorf("%s: error %v, want code %s", name, err, blobplane.ErrorCode(wantErr))
				}
				after, _ := s.Placement(ctx, k)
				if after != before {
					t.Errorf("%s: refused transition changed the row: %+v -> %+v", name, before, after)
				}
				continue
			}
			if ev == placement.VerifyMismatch {
				// S2: recorded as failed, and reported as a mismatch.
				if !errors.Is(err, errMismatch) {
					t.Errorf("%s: error %v, want digest_mismatch", name, err)
				}
			} else if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			stored := must(s.Placement(ctx, k))
			if stored != got || stored.State != want || stored.Generation != before.Generation+1 {
				t.Errorf("%s: stored %+v (returned %+v), want state %s generation %d", name, stored, got, want, before.Generation+1)
			}
			switch want {
			case placement.Failed:
				wantReason := placement.SourceUnavailable
				if ev == placement.VerifyMismatch {
					wantReason = placement.DigestMismatch
				}
				if stored.Reason != wantReason || stored.RevokeReason != "" {
					t.Errorf("%s: reasons %q/%q", name, stored.Reason, stored.RevokeReason)
				}
			case placement.Revoked:
				if stored.Reason != "" || stored.RevokeReason != placement.Reclamation {
					t.Errorf("%s: reasons %q/%q", name, stored.Reason, stored.RevokeReason)
				}
			case placement.Verified:
				if stored.VerifiedAt.IsZero() || stored.Reason != "" {
					t.Errorf("%s: verified row %+v", name, stored)
				}
			default:
				if stored.Reason != "" || stored.RevokeReason != "" {
					t.Errorf("%s: reasons %q/%q", name, stored.Reason, stored.RevokeReason)
				}
			}
		}
	}
}

// S3: "A write under a lower epoch is rejected and changes nothing" — not
// the state, not the generation, not updated_at — whatever it asked for,
// including a transition the table would also refuse.
func TestPlacementStaleEpochChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	k := pkey(digestOf("stale"), "eu-1", "a")
	must(s.StagePlacement(ctx, k, 10, 5))
	before := must(s.Placement(ctx, k))
	for _, ev := range placement.Events {
		if _, err := apply(ctx, s, k, ev, 4); !errors.Is(err, errStale) {
			t.Fatalf("%s at epoch 4 on a row at epoch 5: %v, want stale_epoch", ev, err)
		}
		if after := must(s.Placement(ctx, k)); after != before {
			t.Fatalf("%s at a stale epoch changed the row: %+v -> %+v", ev, before, after)
		}
	}
	// The table refuses verify on a failed row; a stale worker still hears
	// "stale" (it lost ownership), and nothing changes.
	must(s.FailPlacement(ctx, k, placement.SourceUnavailable, 5))
	before = must(s.Placement(ctx, k))
	if _, err := s.VerifyPlacement(ctx, k, k.Digest, 10, 3); !errors.Is(err, errStale) {
		t.Fatalf("stale verify of a failed row: %v", err)
	}
	if after := must(s.Placement(ctx, k)); after != before {
		t.Fatalf("changed: %+v -> %+v", before, after)
	}
}

// Spec: "A higher epoch takes over. This keeps a preempted worker from
// overwriting the decision of the worker that replaced it."
func TestPlacementHigherEpochTakesOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	k := pkey(digestOf("takeover"), "eu-1", "a")
	must(s.StagePlacement(ctx, k, 10, 1)) // worker A holds it at epoch 1
	// Equal epoch applies (A's own progress).
	if p := must(s.StagePlacement(ctx, k, 10, 1)); p.Epoch != 1 || p.Generation != 2 {
		t.Fatalf("equal epoch: %+v", p)
	}
	// Worker B, at epoch 2, takes the pending row over and verifies it.
	p := must(s.VerifyPlacement(ctx, k, k.Digest, 10, 2))
	if p.State != placement.Verified || p.Epoch != 2 || p.Generation != 3 {
		t.Fatalf("takeover: %+v", p)
	}
	// A, preempted, tries to fail it: stale, and B's decision stands.
	if _, err := s.FailPlacement(ctx, k, placement.SourceUnavailable, 1); !errors.Is(err, errStale) {
		t.Fatalf("preempted worker: %v", err)
	}
	if got := must(s.Placement(ctx, k)); got != p {
		t.Fatalf("preempted worker changed the row: %+v", got)
	}
}

type result struct {
	p   placement.Placement
	err error
}

// Two workers race transitions on one row with different epochs (S3),
// driven deterministically: a third connection holds the row lock, the
// takeover worker (epoch 2) queues on it first and the preempted worker
// (epoch 1) second; releasing the lock lets them through in that order. One
// winner: epoch 2's verify; epoch 1's fail is stale and changes nothing.
func TestPlacementRaceDifferentEpochs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, d := placementSetup(t)
	k := pkey(digestOf("race"), "eu-1", "a")
	staged := must(s.StagePlacement(ctx, k, 10, 1))

	holder := must(d.Pool.Begin(ctx))
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT 1 FROM placements WHERE digest = $1 AND location = $2 FOR UPDATE`, string(k.Digest), k.Location); err != nil {
		t.Fatal(err)
	}

	newer, older := make(chan result, 1), make(chan result, 1)
	go func() {
		p, err := s.VerifyPlacement(ctx, k, k.Digest, 10, 2)
		newer <- result{p, err}
	}()
	pgtest.WaitForLockWaiters(t, d.Pool, 1)
	go func() {
		p, err := s.FailPlacement(ctx, k, placement.SourceUnavailable, 1)
		older <- result{p, err}
	}()
	pgtest.WaitForLockWaiters(t, d.Pool, 2)
	select {
	case r := <-newer:
		t.Fatalf("epoch 2 went through a held row lock: %+v", r)
	case r := <-older:
		t.Fatalf("epoch 1 went through a held row lock: %+v", r)
	default:
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	rn, ro := <-newer, <-older
	if rn.err != nil || rn.p.State != placement.Verified || rn.p.Epoch != 2 || rn.p.Generation != staged.Generation+1 {
		t.Fatalf("epoch 2 worker: %+v, %v", rn.p, rn.err)
	}
	if !errors.Is(ro.err, errStale) {
		t.Fatalf("epoch 1 worker: %+v, %v; want stale_epoch", ro.p, ro.err)
	}
	if got := must(s.Placement(ctx, k)); got != rn.p {
		t.Fatalf("final row %+v, want the epoch 2 worker's %+v", got, rn.p)
	}
}

// Spec: "The same digest can hold up to 64 placements ... A stage that would
// exceed the bound is refused". 100 concurrent stages of distinct locations
// yield exactly 64 rows and 36 clear refusals.
func TestPlacementBoundUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	dg := digestOf("bound")
	must(s.StagePlacement(ctx, pkey(digestOf("other"), "eu-1", "warm"), 1, 1)) // ledger exists: race the bound, not the DDL
	errs := make([]error, 100)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = s.StagePlacement(ctx, pkey(dg, "eu-1", fmt.Sprintf("loc-%03d", i)), 1, 1)
		})
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, store.ErrPlacementLimit) && errors.Is(err, errConflict):
			refused++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	rows := must(s.Placements(ctx, dg))
	if ok != placement.MaxPerDigest || refused != 100-placement.MaxPerDigest || len(rows) != placement.MaxPerDigest {
		t.Fatalf("%d staged, %d refused, %d rows; want 64/36/64", ok, refused, len(rows))
	}
	if msg := blobplane.ErrorMessage(errorsFirst(errs)); !strings.Contains(msg, "64 placements") {
		t.Fatalf("refusal message %q does not say why", msg)
	}
	// Re-staging an existing location does not grow the history: allowed.
	if _, err := s.StagePlacement(ctx, rows[0].Key, 1, 1); err != nil {
		t.Fatalf("re-stage at the bound: %v", err)
	}
}

func errorsFirst(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// S2: "a digest mismatch can never become verified" — neither a different
// digest nor a different size verifies, and the failed row cannot be
// verified afterwards without a re-stage.
func TestPlacementDigestMismatchNeverVerifies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	dg := digestOf("mismatch")
	for name, confirm := range map[string]struct {
		d    blobplane.Digest
		size int64
	}{
		"other digest":    {digestOf("not it"), 10},
		"other size":      {dg, 11},
		"uppercase alias": {blobplane.Digest(strings.ToUpper(string(dg))), 10},
	} {
		k := pkey(dg, "eu-1", name)
		must(s.StagePlacement(ctx, k, 10, 1))
		p, err := s.VerifyPlacement(ctx, k, confirm.d, confirm.size, 1)
		if !errors.Is(err, errMismatch) || p.State != placement.Failed || p.Reason != placement.DigestMismatch {
			t.Fatalf("%s: %+v, %v; want failed/digest_mismatch", name, p, err)
		}
		if _, err := s.VerifyPlacement(ctx, k, dg, 10, 1); !errors.Is(err, errConflict) {
			t.Fatalf("%s: verifying a mismatched row afterwards: %v, want conflict", name, err)
		}
		if r := must(s.PlacementRouting(ctx, dg, "eu-1")); r.Serveable {
			t.Fatalf("%s: a mismatch made the digest serveable: %+v", name, r)
		}
	}
}

// Spec: "A failure on one placement never erases a verified placement in
// another location, because each (digest, backend, datacenter, location) is
// its own row." A detected loss fails only its own row.
func TestPlacementFailureIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	dg := digestOf("isolated")
	a, b, c := pkey(dg, "eu-1", "a"), pkey(dg, "us-1", "a"), placement.Key{Digest: dg, Backend: "s3", Datacenter: "eu-1", Location: "a"}
	for _, k := range []placement.Key{a, b, c} {
		bringTo(t, s, k, placement.Verified)
	}
	bBefore, cBefore := must(s.Placement(ctx, b)), must(s.Placement(ctx, c))
	lost := must(s.FailPlacement(ctx, a, placement.SourceUnavailable, 1))
	if lost.State != placement.Failed || lost.Reason != placement.SourceUnavailable || lost.VerifiedAt.IsZero() {
		t.Fatalf("lost row %+v", lost)
	}
	if got := must(s.Placement(ctx, b)); got != bBefore {
		t.Fatalf("other datacenter's row changed: %+v", got)
	}
	if got := must(s.Placement(ctx, c)); got != cBefore {
		t.Fatalf("other backend's row changed: %+v", got)
	}
	r := must(s.PlacementRouting(ctx, dg, "eu-1"))
	if !r.Serveable || len(r.Local) != 1 || r.Local[0].Backend != "s3" || len(r.VerifiedRemote) != 1 || len(r.Failed) != 1 {
		t.Fatalf("routing after a loss: %+v", r)
	}
}

// S3: "each accepted transition advances the generation, so a reader can
// detect a concurrent change."
func TestPlacementIfChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	k := pkey(digestOf("gen"), "eu-1", "a")
	p := must(s.StagePlacement(ctx, k, 10, 1))
	if _, changed, err := s.PlacementIfChanged(ctx, k, p.Generation); err != nil || changed {
		t.Fatalf("unchanged row: changed=%v err=%v", changed, err)
	}
	must(s.VerifyPlacement(ctx, k, k.Digest, 10, 1))
	got, changed, err := s.PlacementIfChanged(ctx, k, p.Generation)
	if err != nil || !changed || got.Generation != p.Generation+1 || got.State != placement.Verified {
		t.Fatalf("changed row: %+v changed=%v err=%v", got, changed, err)
	}
	if _, _, err := s.PlacementIfChanged(ctx, pkey(k.Digest, "eu-1", "nope"), 0); !errors.Is(err, errNotFound) {
		t.Fatalf("absent row: %v", err)
	}
}

// Every routing category through the one indexed query.
func TestPlacementRoutingCategories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := placementSetup(t)
	dg := digestOf("routing")
	bringTo(t, s, pkey(dg, "eu-1", "local"), placement.Verified)
	bringTo(t, s, pkey(dg, "us-1", "remote"), placement.Verified)
	bringTo(t, s, pkey(dg, "eu-1", "pending"), placement.Pending)
	bringTo(t, s, pkey(dg, "ap-1", "failed"), placement.Failed)
	bringTo(t, s, pkey(dg, "eu-1", "revoked"), placement.Revoked)
	r := must(s.PlacementRouting(ctx, dg, "eu-1"))
	if !r.Known || !r.Serveable || len(r.Local) != 1 || r.Local[0].Location != "local" ||
		len(r.VerifiedRemote) != 1 || r.VerifiedRemote[0].Location != "remote" ||
		len(r.Pending) != 1 || len(r.Failed) != 1 || len(r.Revoked) != 1 {
		t.Fatalf("routing from eu-1: %+v", r)
	}
	// From us-1 the same rows swap local and remote.
	r = must(s.PlacementRouting(ctx, dg, "us-1"))
	if len(r.Local) != 1 || r.Local[0].Location != "remote" || len(r.VerifiedRemote) != 1 {
		t.Fatalf("routing from us-1: %+v", r)
	}
	// Known but not serveable vs unknown.
	only := digestOf("pending only")
	bringTo(t, s, pkey(only, "eu-1", "p"), placement.Pending)
	bringTo(t, s, pkey(only, "eu-1", "f"), placement.Failed)
	if r := must(s.PlacementRouting(ctx, only, "eu-1")); !r.Known || r.Serveable {
		t.Fatalf("pending/failed only: %+v", r)
	}
	if r := must(s.PlacementRouting(ctx, digestOf("never"), "eu-1")); r.Known || r.Serveable {
		t.Fatalf("unknown digest: %+v", r)
	}
}

// Digests must be canonical sha256:<64 lowercase hex> (issue 4) for every
// write and for the routing query.
func TestPlacementMalformedDigestsRejected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, d := placementSetup(t)
	good := string(digestOf("good"))
	for name, bad := range map[string]string{
		"uppercase":        "sha256:" + strings.ToUpper(good[7:]),
		"short":            good[:len(good)-1],
		"long":             good + "0",
		"other algorithm":  "sha512:" + good[7:],
		"leading space":    " " + good,
		"trailing newline": good + "\n",
		"no algorithm":     good[7:],
		"empty":            "",
	} {
		k := pkey(blobplane.Digest(bad), "eu-1", "a")
		if _, err := s.StagePlacement(ctx, k, 1, 1); !errors.Is(err, errInvalid) {
			t.Errorf("stage %s: %v, want invalid", name, err)
		}
		if _, err := s.VerifyPlacement(ctx, k, k.Digest, 1, 1); !errors.Is(err, errInvalid) {
			t.Errorf("verify %s: %v, want invalid", name, err)
		}
		if _, err := s.PlacementRouting(ctx, blobplane.Digest(bad), "eu-1"); !errors.Is(err, errInvalid) {
			t.Errorf("routing %s: %v, want invalid", name, err)
		}
	}
	if _, err := s.PlacementRouting(ctx, blobplane.Digest(good), "EU 1"); !errors.Is(err, errInvalid) {
		t.Errorf("bad datacenter: %v", err)
	}
	if _, err := s.StagePlacement(ctx, pkey(blobplane.Digest(good), "eu-1", "a"), -1, 1); !errors.Is(err, errInvalid) {
		t.Errorf("negative size: %v", err)
	}
	if _, err := s.StagePlacement(ctx, pkey(blobplane.Digest(good), "eu-1", "a"), 1, -1); !errors.Is(err, errInvalid) {
		t.Errorf("negative epoch: %v", err)
	}
	if _, err := s.FailPlacement(ctx, pkey(blobplane.Digest(good), "eu-1", "a"), "gremlins", 1); !errors.Is(err, errInvalid) {
		t.Errorf("unknown reason: %v", err)
	}
	if _, err := s.RevokePlacement(ctx, pkey(blobplane.Digest(good), "eu-1", "a"), "whim", 1); !errors.Is(err, errInvalid) {
		t.Errorf("unknown revoke reason: %v", err)
	}
	// Nothing invalid reached the database (the invalid writes never even
	// created the ledger).
	var reg *string
	if err := d.Pool.QueryRow(ctx, `SELECT to_regclass('placements')::text`).Scan(&reg); err != nil || reg != nil {
		t.Fatalf("invalid writes created the ledger: %v (%v)", reg, err)
	}
}

var sqlBlock = regexp.MustCompile("(?s)```sql\n(.*?)```")

// The ready queries of docs/placements.md run against a real ledger, so the
// page cannot drift from the schema. Each statement must run; the three the
// issue asks for must find the rows seeded for them.
func TestPlacementDocQueries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, d := placementSetup(t)
	page, err := os.ReadFile("../docs/placements.md")
	if err != nil {
		t.Fatal(err)
	}
	unserveable, pendingOld, failed := digestOf("doc: pending only"), digestOf("doc: old pending"), digestOf("doc: failed")
	bringTo(t, s, pkey(unserveable, "eu-1", "a"), placement.Pending)
	bringTo(t, s, pkey(pendingOld, "eu-1", "a"), placement.Pending)
	bringTo(t, s, pkey(failed, "us-1", "a"), placement.Failed)
	bringTo(t, s, pkey(digestOf("doc: fine"), "eu-1", "a"), placement.Verified)
	if _, err := d.Pool.Exec(ctx, `UPDATE placements SET updated_at = now() - interval '2 hours' WHERE digest = $1`, string(pendingOld)); err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	n := 0
	for _, m := range sqlBlock.FindAllStringSubmatch(string(page), -1) {
		for _, stmt := range strings.Split(m[1], ";\n") {
			if strings.TrimSpace(stripComments(stmt)) == "" {
				continue
			}
			n++
			rows, err := d.Pool.Query(ctx, stmt)
			if err != nil {
				t.Fatalf("docs query fails:\n%s\n%v", stmt, err)
			}
			for rows.Next() {
				vals, err := rows.Values()
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintln(&all, vals...)
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("docs query fails:\n%s\n%v", stmt, err)
			}
		}
	}
	if n < 3 {
		t.Fatalf("found %d queries in docs/placements.md", n)
	}
	out := all.String()
	for _, want := range []string{string(unserveable), string(pendingOld), "backend_refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("no docs query found %s; output:\n%s", want, out)
		}
	}
}

func stripComments(sql string) string {
	var out []string
	for _, line := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// Issue 26 point 3: the routing query's visibility test runs in SQL
// (ReadScopeOf turns grants into names and prefixes), and must agree with
// auth.Principal.Allowed, the rule every other permission uses: for each
// set of grants and each digest, the digest is visible exactly when some
// repository referencing it is readable. The repositories sit on the
// edges of the pattern grammar ("team" is not under "team/*", "teamx/app"
// is not either, '_' and '.' are literal). A digest no repository
// references is visible only to ReadScope{All: true}.
func TestReadScopeAgreesWithAllowed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := store.New(db.Pool, nil)
	digestOf := func(s string) blobplane.Digest {
		sum := sha256.Sum256([]byte(s))
		return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
	}
	stage := func(d blobplane.Digest) {
		k := placement.Key{Digest: d, Backend: "filesystem", Datacenter: "eu-1", Location: "l"}
		if _, err := st.StagePlacement(ctx, k, 3, 1); err != nil {
			t.Fatal(err)
		}
	}
	repos := []string{"team", "team/app", "team/a/b", "teamx/app", "other", "a_b/c", "axb/c", "a.b/c"}
	refs := map[blobplane.Digest]string{}
	for _, repo := range repos {
		if err := st.CreateRepository(ctx, repo); err != nil {
			t.Fatal(err)
		}
		d := digestOf(repo)
		stage(d)
		if _, err := db.Pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, 3)`, string(d)); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO blob_references (repository, digest, operation_id) VALUES ($1, $2, gen_random_uuid())`, repo, string(d)); err != nil {
			t.Fatal(err)
		}
		refs[d] = repo
	}
	orphan := digestOf("staged, published nowhere")
	stage(orphan)

	for _, grants := range [][]string{
		nil, {"team:read"}, {"team/*:read"}, {"team/a/*:write"}, {"teamx/*:admin"}, {"*:read"}, {"*:admin"},
		{"other:read", "team/a/b:read"}, {"a_b/*:read"}, {"a.b/c:read"}, {"a/*:read"},
	} {
		gs, err := auth.ParseGrants(grants)
		if err != nil {
			t.Fatal(err)
		}
		p := auth.Principal{Name: "p", Grants: gs}
		for d, repo := range refs {
			rt, err := st.PlacementRoutingFor(ctx, d, "eu-1", store.ReadScopeOf(gs))
			if err != nil {
				t.Fatal(err)
			}
			if want := p.Allowed(repo, auth.Read); rt.Known != want || len(rt.Pending) != map[bool]int{true: 1}[want] {
				t.Errorf("grants %v, digest of %s: known %v (%d pending), want %v", grants, repo, rt.Known, len(rt.Pending), want)
			}
		}
		if rt, err := st.PlacementRoutingFor(ctx, orphan, "eu-1", store.ReadScopeOf(gs)); err != nil || rt.Known {
			t.Errorf("grants %v see an unreferenced digest: %+v %v", grants, rt, err)
		}
	}
	if rt, err := st.PlacementRoutingFor(ctx, orphan, "eu-1", store.ReadScope{All: true}); err != nil || !rt.Known || len(rt.Pending) != 1 {
		t.Errorf("All does not see an unreferenced digest: %+v %v", rt, err)
	}
	// No ledger yet (a fresh database): every digest is unknown, no error.
	fresh := pgtest.NewStore(t)
	if rt, err := fresh.PlacementRoutingFor(ctx, orphan, "eu-1", store.ReadScope{All: true}); err != nil || rt.Known {
		t.Errorf("before the ledger exists: %+v %v", rt, err)
	}
}

// A digest found visible to a scope is served from the existence cache
// (the plain routing query, no reference lookup), and forgotten with the
// reference that made it visible: a deletion empties the cache, so the
// scope's next query asks again and the digest is hidden (issue 26 point
// 3; docs/performance.md).
func TestRoutingVisibilityCachedUntilAReferenceGoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	stop := u.s.StartCaches(ctx, store.CacheOptions{Existence: &store.ExistenceCacheOptions{}})
	defer stop()
	waitFor(t, "the existence cache listens", func() bool { return u.s.ExistenceCacheStats().Listening })
	d, _ := publish(t, u, upRepo, "visible through team/app")
	scope := store.ReadScopeOf(grants(t, "team/*:read"))
	stranger := store.ReadScopeOf(grants(t, "other/*:read"))
	for i := range 3 {
		rt, err := u.s.PlacementRoutingFor(ctx, d, upDC, scope)
		if err != nil || !rt.Known {
			t.Fatalf("query %d of a reader: %+v, %v", i, rt, err)
		}
		if rt, err := u.s.PlacementRoutingFor(ctx, d, upDC, stranger); err != nil || rt.Known {
			t.Fatalf("query %d of a stranger: %+v, %v", i, rt, err)
		}
	}
	if st := u.s.ExistenceCacheStats(); st.Hits < 2 {
		t.Fatalf("cache stats %+v: the reader's later queries should be hits", st)
	}
	if err := u.s.DeleteReference(ctx, upRepo, d); err != nil {
		t.Fatal(err)
	}
	if rt, err := u.s.PlacementRoutingFor(ctx, d, upDC, scope); err != nil || rt.Known {
		t.Fatalf("after the only reference went: %+v, %v; want hidden", rt, err)
	}
}
