package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

const (
	upRepo      = "team/app"
	upPrincipal = "alice"
	upPartition = "p-0001"
	upNode      = "node-a"
	upDC        = "eu-1"
)

type uploads struct {
	s     *store.Store
	pool  *pgxpool.Pool
	lease authority.LeaseRecord
	river *river.Client[pgx.Tx]
}

// setupUploads gives a repository, a principal with write access to it, and
// this node holding the repository's partition lease.
func setupUploads(t *testing.T) *uploads {
	t.Helper()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	if err := s.CreateRepository(ctx, upRepo); err != nil {
		t.Fatal(err)
	}
	if err := s.GrantPrincipal(ctx, upPrincipal, grants(t, "team/*:write")); err != nil {
		t.Fatal(err)
	}
	lease, err := s.AcquireLease(ctx, upPartition, upNode, upNode+":7443", leaseTTL, leaseRenew)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverpgxv5.New(d.Pool), &river.Config{}) // insert-only, like the API's
	if err != nil {
		t.Fatal(err)
	}
	return &uploads{s: s, pool: d.Pool, lease: lease, river: rc}
}

func contentOf(b []byte) (blobplane.Digest, int64) {
	sum := sha256.Sum256(b)
	return blobplane.Digest(blobplane.DigestPrefix + hex.EncodeToString(sum[:])), int64(len(b))
}

// admitted is the factory for an upload closed at the ingress: an intent
// with its verified content recorded and a verified placement in upDC.
func (u *uploads) admitted(t *testing.T, content string) (upload.Intent, upload.FinalizeRequest) {
	t.Helper()
	return u.admittedIn(t, upRepo, content)
}

// open is a new pending intent of upPrincipal in repo, nothing received.
func (u *uploads) open(t *testing.T, repo string) upload.Intent {
	t.Helper()
	in, err := u.s.CreateIntent(context.Background(), upload.NewIntent{
		Repository: repo, Principal: upPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func (u *uploads) admittedIn(t *testing.T, repo, content string) (upload.Intent, upload.FinalizeRequest) {
	t.Helper()
	ctx := context.Background()
	in := u.open(t, repo)
	var err error
	d, size := contentOf([]byte(content))
	if _, err := u.s.ExtendIntent(ctx, in.OperationID, "0123456789abcdef0123456789abcdef", size, time.Hour); err != nil {
		t.Fatal(err)
	}
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
	if _, err := u.s.StagePlacement(ctx, k, size, 0); err != nil && !errors.Is(err, errConflict) { // conflict: already verified
		t.Fatal(err)
	} else if err == nil {
		if _, err := u.s.VerifyPlacement(ctx, k, d, size, 0); err != nil {
			t.Fatal(err)
		}
	}
	if in, err = u.s.RecordIntentContent(ctx, in.OperationID, d, size); err != nil {
		t.Fatal(err)
	}
	return in, upload.FinalizeRequest{
		OperationID: in.OperationID, Digest: d, Size: size,
		Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch,
		Replication: jobs.Replication{Client: u.river},
		Proven:      true, // this uploader hashed its bytes (S9)
	}
}

func (u *uploads) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := u.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (u *uploads) outcomes(t *testing.T) int {
	return u.count(t, `SELECT count(*) FROM operation_outcomes`)
}

func (u *uploads) references(t *testing.T) int {
	return u.count(t, `SELECT count(*) FROM blob_references`)
}

func TestIntentLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	in, err := u.s.CreateIntent(ctx, upload.NewIntent{
		Repository: upRepo, Principal: upPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if in.State != upload.IntentPending || in.StagedLocation != "" || in.ExpectedDigest != "" || in.ExpectedSize != upload.SizeUnknown || !in.ExpiresAt.After(in.CreatedAt) {
		t.Fatalf("new intent: %+v", in)
	}
	got, err := u.s.ExtendIntent(ctx, in.OperationID, "loc1", 10, time.Hour)
	if err != nil || got.ReceivedBytes != 10 || got.StagedLocation != "loc1" || !got.ExpiresAt.After(in.ExpiresAt) {
		t.Fatalf("extend: %+v %v", got, err)
	}
	if _, err := u.s.ExtendIntent(ctx, in.OperationID, "other", 20, time.Hour); !errors.Is(err, errConflict) {
		t.Fatalf("extend at another staged location: %v", err)
	}
	if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.ReceivedBytes != 10 {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := u.s.AbandonIntent(ctx, in.OperationID); err != nil {
		t.Fatal(err)
	}
	// Terminal states take no progress.
	if _, err := u.s.ExtendIntent(ctx, in.OperationID, "", 30, time.Hour); !errors.Is(err, upload.ErrIntentClosed) {
		t.Fatalf("extend after abandon: %v", err)
	}
	if _, err := u.s.AbandonIntent(ctx, in.OperationID); !errors.Is(err, upload.ErrIntentClosed) {
		t.Fatalf("abandon twice: %v", err)
	}
	for _, id := range []string{"nope", "00000000-0000-0000-0000-000000000000"} {
		if _, err := u.s.GetIntent(ctx, id); !errors.Is(err, errNotFound) {
			t.Fatalf("get %q: %v", id, err)
		}
	}
	if _, err := u.s.CreateIntent(ctx, upload.NewIntent{Repository: "team/none", Principal: upPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Minute}); !errors.Is(err, errNotFound) {
		t.Fatalf("unknown repository: %v", err)
	}
	// A declared digest is what close must confirm.
	d, size := contentOf([]byte("declared"))
	in, err = u.s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := contentOf([]byte("other"))
	if _, err := u.s.RecordIntentContent(ctx, in.OperationID, other, size); !errors.Is(err, upload.ErrContentIdentity) {
		t.Fatalf("close with another digest: %v", err)
	}
	if got, err := u.s.RecordIntentContent(ctx, in.OperationID, d, size); err != nil || got.ReceivedBytes != size {
		t.Fatalf("close: %+v %v", got, err)
	}
}

func TestFinalizePublishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	in, req := u.admitted(t, "hello")
	out, err := u.s.Finalize(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if out.OperationID != in.OperationID || out.Repository != upRepo || out.Digest != req.Digest || out.Size != req.Size ||
		!out.NewReference || out.Epoch != u.lease.Epoch || len(out.ReplicationTargets) != 0 || out.PublishedAt.IsZero() {
		t.Fatalf("outcome: %+v", out)
	}
	if got, _ := u.s.GetIntent(ctx, in.OperationID); got.State != upload.IntentAdmitted {
		t.Fatalf("intent: %+v", got)
	}
	if size, err := u.s.ReferencedBlob(ctx, upRepo, req.Digest); err != nil || size != req.Size {
		t.Fatalf("referenced blob: %d %v", size, err)
	}
	if stored, err := u.s.Outcome(ctx, in.OperationID); err != nil || stored.Digest != req.Digest || !stored.PublishedAt.Equal(out.PublishedAt) {
		t.Fatalf("stored outcome: %+v %v", stored, err)
	}
	// Single-datacenter run: no job nobody could work.
	if n := u.count(t, `SELECT count(*) FROM river_job`); n != 0 {
		t.Fatalf("%d jobs enqueued in a single-datacenter run", n)
	}
	// Abandoning a published intent is refused on the row.
	if _, err := u.s.AbandonIntent(ctx, in.OperationID); !errors.Is(err, upload.ErrIntentClosed) {
		t.Fatalf("abandon after publish: %v", err)
	}
	// DELETE removes the reference only.
	if err := u.s.DeleteReference(ctx, upRepo, req.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.ReferencedBlob(ctx, upRepo, req.Digest); !errors.Is(err, errNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if n := u.count(t, `SELECT count(*) FROM blobs`); n != 1 {
		t.Fatalf("blob rows after delete: %d", n)
	}
}

// Spec "Validation": every refusal has its code, and stores no outcome, so
// it can succeed once its cause clears.
func TestFinalizeRefusalsStoreNoOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	other, _ := contentOf([]byte("other"))
	cases := []struct {
		name     string
		mutate   func(t *testing.T, u *uploads, req *upload.FinalizeRequest)
		sentinel error
		code     blobplane.Code
	}{
		{"authority unassigned", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) { req.Partition = "p-none" },
			upload.ErrAuthorityUnassigned, blobplane.CodeUnavailable},
		{"authority wrong node", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) { req.Node = "node-b" },
			upload.ErrAuthorityFence, blobplane.CodeStaleEpoch},
		{"authority superseded epoch", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) { req.Epoch++ },
			upload.ErrAuthorityFence, blobplane.CodeStaleEpoch},
		{"content identity digest", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) { req.Digest = other },
			upload.ErrContentIdentity, blobplane.CodeMismatch},
		{"content identity size", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) { req.Size++ },
			upload.ErrContentIdentity, blobplane.CodeMismatch},
		{"no verified placement", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			k := placement.Key{Digest: req.Digest, Backend: "fs", Datacenter: upDC, Location: req.Digest.Hex()}
			if _, err := u.s.FailPlacement(context.Background(), k, placement.SourceUnavailable, 0); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrNoVerifiedPlacement, blobplane.CodeUnavailable},
		{"write access revoked", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			if err := u.s.RevokePrincipalGrants(context.Background(), upPrincipal, grants(t, "team/*:write")); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrWriteRevoked, blobplane.CodeForbidden},
		{"abandoned", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			if _, err := u.s.AbandonIntent(context.Background(), req.OperationID); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrIntentClosed, blobplane.CodeConflict},
		{"obliterated", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			if _, err := u.pool.Exec(context.Background(), `INSERT INTO blobs (digest, size_bytes, state) VALUES ($1, $2, 'obliterated')`, req.Digest, req.Size); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrObliterated, blobplane.CodeConflict},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := setupUploads(t)
			_, req := u.admitted(t, "content of "+tc.name)
			tc.mutate(t, u, &req)
			_, err := u.s.Finalize(ctx, req)
			if !errors.Is(err, tc.sentinel) || blobplane.ErrorCode(err) != tc.code {
				t.Fatalf("err = %v (code %s), want %v with code %s", err, blobplane.ErrorCode(err), tc.sentinel, tc.code)
			}
			if n := u.outcomes(t); n != 0 {
				t.Fatalf("%d outcomes stored after a refusal", n)
			}
			if n := u.references(t); n != 0 {
				t.Fatalf("%d references after a refusal", n)
			}
			if _, err := u.s.Outcome(ctx, req.OperationID); !errors.Is(err, errNotFound) {
				t.Fatalf("outcome after refusal: %v", err)
			}
		})
	}
}

// Issue 6: a grant revoked between close and finalization is refused;
// restored, the same operation succeeds (a refusal is not terminal).
func TestFinalizeRevokedGrantThenRestored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, req := u.admitted(t, "grant")
	if err := u.s.RevokePrincipalGrants(ctx, upPrincipal, grants(t, "team/*:write")); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrWriteRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	if err := u.s.GrantPrincipal(ctx, upPrincipal, grants(t, "team/app:write")); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatalf("restored: %v", err)
	}
}

// S4: a retry after a lost response returns the stored outcome, with no new
// reference and no new job set.
func TestFinalizeRetryReturnsStoredOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, req := u.admitted(t, "retry")
	req.Targets = []string{"us-1", "ap-1"}
	first, err := u.s.Finalize(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The retry even survives a later refusal cause: the outcome is terminal.
	if err := u.s.RevokePrincipalGrants(ctx, upPrincipal, grants(t, "team/*:write")); err != nil {
		t.Fatal(err)
	}
	again, err := u.s.Finalize(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !again.PublishedAt.Equal(first.PublishedAt) || again.OperationID != first.OperationID || !again.NewReference || len(again.ReplicationTargets) != 2 {
		t.Fatalf("retry: %+v, first %+v", again, first)
	}
	if n := u.references(t); n != 1 {
		t.Fatalf("references: %d", n)
	}
	rivertest.RequireManyInserted(ctx, t, riverpgxv5.New(u.pool), []rivertest.ExpectedJob{
		{Args: &jobs.ReplicateArgs{OperationID: req.OperationID, Digest: req.Digest, Size: req.Size, SourceDatacenter: upDC, TargetDatacenter: "us-1"}, Opts: &rivertest.RequireInsertedOpts{Queue: jobs.ReplicationQueue("us-1")}},
		{Args: &jobs.ReplicateArgs{OperationID: req.OperationID, Digest: req.Digest, Size: req.Size, SourceDatacenter: upDC, TargetDatacenter: "ap-1"}, Opts: &rivertest.RequireInsertedOpts{Queue: jobs.ReplicationQueue("ap-1")}},
	})
}

// The default replication policy: every registered datacenter but the
// ingress; and without an enqueuer a multi-datacenter publication rolls
// back rather than commit without its replication record.
func TestFinalizeDefaultTargets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	for _, n := range []store.Node{{ID: "a1", Datacenter: upDC, Role: "api"}, {ID: "b1", Datacenter: "us-1", Role: "api"}, {ID: "b2", Datacenter: "us-1", Role: "worker"}} {
		if _, err := u.s.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	_, req := u.admitted(t, "targets")
	noEnq := req
	noEnq.Replication = nil
	if _, err := u.s.Finalize(ctx, noEnq); !errors.Is(err, upload.ErrNoEnqueuer) {
		t.Fatalf("without enqueuer: %v", err)
	}
	if n := u.outcomes(t) + u.references(t); n != 0 {
		t.Fatalf("rolled-back publication left %d rows", n)
	}
	out, err := u.s.Finalize(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.ReplicationTargets) != 1 || out.ReplicationTargets[0] != "us-1" {
		t.Fatalf("targets: %v", out.ReplicationTargets)
	}
	rivertest.RequireInserted(ctx, t, riverpgxv5.New(u.pool), &jobs.ReplicateArgs{
		OperationID: req.OperationID, Digest: req.Digest, Size: req.Size, SourceDatacenter: upDC, TargetDatacenter: "us-1",
	}, nil)
}

// S4: two concurrent finalizations of one operation publish once and
// enqueue one job set; both callers get the same outcome.
func TestFinalizeConcurrentOnePublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, req := u.admitted(t, "concurrent")
	req.Targets = []string{"us-1"}
	const n = 8
	outs := make([]upload.Outcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { outs[i], errs[i] = u.s.Finalize(ctx, req) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("finalization %d: %v", i, errs[i])
		}
		if !outs[i].PublishedAt.Equal(outs[0].PublishedAt) {
			t.Fatalf("outcomes differ: %+v vs %+v", outs[i], outs[0])
		}
	}
	if got := u.outcomes(t); got != 1 {
		t.Fatalf("outcomes: %d", got)
	}
	if got := u.references(t); got != 1 {
		t.Fatalf("references: %d", got)
	}
	if got := u.count(t, `SELECT count(*) FROM river_job WHERE kind = 'replicate'`); got != 1 {
		t.Fatalf("replication jobs: %d", got)
	}
}

// Two operations publishing one digest into two repositories at once: two
// references, one blob state row, both succeed. Driven deterministically
// (issue 27): a third connection inserts the digest's blob row and holds
// its transaction open, so both publications queue on that row's insert
// (EnsureBlobUnderLease's ON CONFLICT waits for the holder's outcome);
// then it rolls back, and the two race for the insert itself, the case
// where neither row existed: one inserts, the other waits for it and
// takes the conflict path.
func TestFinalizeSameDigestTwoRepositories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	if err := u.s.CreateRepository(ctx, "team/other"); err != nil {
		t.Fatal(err)
	}
	_, a := u.admittedIn(t, upRepo, "shared")
	_, b := u.admittedIn(t, "team/other", "shared")
	holder, err := u.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2)", string(a.Digest), a.Size); err != nil {
		t.Fatal(err)
	}
	var errA, errB error
	var wg sync.WaitGroup
	wg.Go(func() { _, errA = u.s.Finalize(ctx, a) })
	wg.Go(func() { _, errB = u.s.Finalize(ctx, b) })
	pgtest.WaitForLockWaiters(t, u.pool, 2)
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("finalize: %v / %v", errA, errB)
	}
	if u.references(t) != 2 || u.count(t, `SELECT count(*) FROM blobs`) != 1 {
		t.Fatalf("%d references, %d blob rows; want 2 and 1", u.references(t), u.count(t, `SELECT count(*) FROM blobs`))
	}
}

// S5, driven deterministically: a third connection holds the intent row
// lock while a publish and an abandon both queue behind it; on release
// exactly one of them wins and the row says which.
func TestPublishVersusAbandonOneWins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for round := range 4 {
		u := setupUploads(t)
		in, req := u.admitted(t, "race")
		holder, err := u.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Exec(ctx, `SELECT 1 FROM intents WHERE operation_id = $1 FOR UPDATE`, in.OperationID); err != nil {
			t.Fatal(err)
		}
		var pubErr, abErr error
		var wg sync.WaitGroup
		// Alternate which contender queues first.
		contenders := []func(){
			func() { _, pubErr = u.s.Finalize(ctx, req) },
			func() { _, abErr = u.s.AbandonIntent(ctx, in.OperationID) },
		}
		if round%2 == 1 {
			contenders[0], contenders[1] = contenders[1], contenders[0]
		}
		for i, c := range contenders {
			wg.Go(c)
			pgtest.WaitForLockWaiters(t, u.pool, i+1)
		}
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		got, err := u.s.GetIntent(ctx, in.OperationID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case pubErr == nil && errors.Is(abErr, upload.ErrIntentClosed):
			if got.State != upload.IntentAdmitted || u.outcomes(t) != 1 || u.references(t) != 1 {
				t.Fatalf("publish won but intent %s, %d outcomes", got.State, u.outcomes(t))
			}
		case abErr == nil && errors.Is(pubErr, upload.ErrIntentClosed):
			if got.State != upload.IntentAbandoned || u.outcomes(t) != 0 || u.references(t) != 0 {
				t.Fatalf("abandon won but intent %s, %d outcomes", got.State, u.outcomes(t))
			}
		default:
			t.Fatalf("round %d: publish %v, abandon %v: want exactly one winner", round, pubErr, abErr)
		}
	}
}

// S5: a late publish after a reap fails on the row, not on a stale reply.
func TestPublishAfterAbandonFailsOnTheRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	in, req := u.admitted(t, "late")
	if _, err := u.s.AbandonIntent(ctx, in.OperationID); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrIntentClosed) || blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("late publish: %v", err)
	}
	if u.outcomes(t) != 0 || u.references(t) != 0 {
		t.Fatal("a late publish left rows behind")
	}
	// The only blob row is the abandonment's hand-back of the verified
	// bytes to the collector (L1), not a publication.
	if n := u.count(t, `SELECT count(*) FROM blobs WHERE digest = $1 AND state = 'live'`, string(req.Digest)); n != 1 || u.count(t, `SELECT count(*) FROM blobs`) != 1 {
		t.Fatalf("blob rows after the abandonment: %d handed back", n)
	}
}

// Spec: "A former home cannot publish work after an authority transfer
// advances the epoch" — whether the transfer lands before validation or
// while the publication waits on the intent row.
func TestFormerHomeCannotPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("before validation", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		_, req := u.admitted(t, "former")
		if _, err := u.s.ForceLease(ctx, upPartition, "node-b", "node-b:7443", "op", "drill"); err != nil {
			t.Fatal(err)
		}
		if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrAuthorityFence) || blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
			t.Fatalf("former home: %v", err)
		}
		if u.outcomes(t) != 0 || u.references(t) != 0 {
			t.Fatal("former home published")
		}
	})
	t.Run("between check and commit", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in, req := u.admitted(t, "slip")
		holder, err := u.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Exec(ctx, `SELECT 1 FROM intents WHERE operation_id = $1 FOR UPDATE`, in.OperationID); err != nil {
			t.Fatal(err)
		}
		var finErr error
		var wg sync.WaitGroup
		wg.Go(func() { _, finErr = u.s.Finalize(ctx, req) })
		pgtest.WaitForLockWaiters(t, u.pool, 1) // validated, now waiting on the intent row
		if _, err := u.s.ForceLease(ctx, upPartition, "node-b", "node-b:7443", "op", "drill"); err != nil {
			t.Fatal(err)
		}
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if !errors.Is(finErr, upload.ErrAuthorityFence) {
			t.Fatalf("publication after a transfer: %v", finErr)
		}
		if u.outcomes(t) != 0 || u.references(t) != 0 {
			t.Fatal("former home published")
		}
	})
}

// Spec: "A former home cannot publish work after an authority transfer
// advances the epoch", from the other side: a publication that passed the
// fence holds it until its commit, so a transfer (any change of the
// epoch) waits for it, and the publication lands under the epoch it was
// fenced with, before the new one exists; the owner's renewal does not.
func TestTransferWaitsForFencedPublication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, req := u.admitted(t, "fenced")
	fenced, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release() // also when the test fails while holding
	// Held after the fence, before COMMIT:
	req.BeforeCommit = func() error { close(fenced); <-hold; return nil }
	var out upload.Outcome
	var finErr, forceErr error
	var forced authority.LeaseRecord
	var fin, force sync.WaitGroup
	fin.Go(func() { out, finErr = u.s.Finalize(ctx, req) })
	<-fenced
	// The owner's renewal does not wait for the publication (migration
	// 00028): held publications that overlap without a gap once starved
	// it past the self-fence margin. A wait here would fail the test at
	// its lock timeout instead of hanging it.
	renewCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	renewed, err := u.s.RenewLease(renewCtx, upPartition, upNode, u.lease.Epoch)
	cancel()
	if err != nil || renewed.Epoch != u.lease.Epoch {
		t.Fatalf("renewal while a publication holds the fence: %+v, %v", renewed, err)
	}
	force.Go(func() { forced, forceErr = u.s.ForceLease(ctx, upPartition, "node-b", "node-b:7443", "op", "drill") })
	pgtest.WaitForLockWaiters(t, u.pool, 1) // the transfer waits for the publication
	release()
	fin.Wait()
	force.Wait()
	if finErr != nil || out.Epoch != u.lease.Epoch {
		t.Fatalf("fenced publication: %+v, %v; want published under epoch %d", out, finErr, u.lease.Epoch)
	}
	if forceErr != nil || forced.Epoch <= u.lease.Epoch {
		t.Fatalf("transfer after the publication: %+v, %v", forced, forceErr)
	}
	if u.outcomes(t) != 1 || u.references(t) != 1 {
		t.Fatal("the fenced publication did not land")
	}
}

// ZBP-5 R19, R20: a reference is removed at the home under its lease
// epoch; once a takeover advanced the epoch, the former home's delete
// changes nothing and says why (stale_epoch, retryable), and the new
// home's succeeds.
func TestFormerHomeCannotDeleteAReference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, req := u.admitted(t, "deleted at home")
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	forced, err := u.s.ForceLease(ctx, upPartition, "node-b", "node-b:7443", "op", "drill")
	if err != nil {
		t.Fatal(err)
	}
	former := upload.Home{Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch}
	err = u.s.DeleteReferenceAtHome(ctx, former, upRepo, req.Digest)
	if blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch || !blobplane.IsRetryable(err) || u.references(t) != 1 {
		t.Fatalf("former home's delete: %v, %d references left; want stale_epoch and the reference kept", err, u.references(t))
	}
	now := upload.Home{Partition: upPartition, Node: "node-b", Epoch: forced.Epoch}
	if err := u.s.DeleteReferenceAtHome(ctx, now, upRepo, req.Digest); err != nil || u.references(t) != 0 {
		t.Fatalf("new home's delete: %v, %d references left", err, u.references(t))
	}
	if err := u.s.DeleteReferenceAtHome(ctx, now, upRepo, req.Digest); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("second delete: %v; want not_found", err)
	}
}

// ZBP-5 R74: the seal comes after every write fenced before it (it waits
// for a held publication, which lands under the epoch), and after it the
// outgoing primary neither renews, publishes nor deletes a reference.
func TestSealWaitsForFencedWritesThenRefusesThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, before := u.admitted(t, "fenced before the seal")
	fenced, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	before.BeforeCommit = func() error { close(fenced); <-hold; return nil }
	sealed, lsn := authority.PrimarySealed, uint64(7)
	var finErr, sealErr error
	var fin, seal sync.WaitGroup
	fin.Go(func() { _, finErr = u.s.Finalize(ctx, before) })
	<-fenced
	seal.Go(func() {
		_, sealErr = u.s.FenceLeaseWrite(ctx, upPartition, upNode, u.lease.Epoch, store.LeaseFenceWrite{State: &sealed, SealedLSN: &lsn})
	})
	pgtest.WaitForLockWaiters(t, u.pool, 1) // the seal waits for the publication
	release()
	fin.Wait()
	seal.Wait()
	if finErr != nil || sealErr != nil || u.references(t) != 1 {
		t.Fatalf("publication before the seal: %v; seal: %v; %d references", finErr, sealErr, u.references(t))
	}

	// Sealed: nothing more under this epoch.
	if _, err := u.s.RenewLease(ctx, upPartition, upNode, u.lease.Epoch); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("renewal of a sealed lease: %v; want stale_epoch", err)
	}
	_, after := u.admitted(t, "after the seal")
	if _, err := u.s.Finalize(ctx, after); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("publication under a sealed lease: %v; want stale_epoch", err)
	}
	home := upload.Home{Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch}
	if err := u.s.DeleteReferenceAtHome(ctx, home, upRepo, before.Digest); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch || u.references(t) != 1 {
		t.Fatalf("delete under a sealed lease: %v, %d references", err, u.references(t))
	}
}

// A close's claim decides its stage: a refused claim stages nothing, a
// verified key keeps the claim and reports alreadyVerified instead of
// failing, and a refused re-stage of a key with a row keeps the claim.
func TestClaimAndStageIsOneDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	open := func(d blobplane.Digest, size int64) upload.Intent {
		t.Helper()
		in, err := u.s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: size,
			IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	d, size := contentOf([]byte("claimed and staged"))
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
	placements := func() int {
		return u.count(t, `SELECT count(*) FROM placements WHERE digest = $1`, string(d))
	}

	// A claim that contradicts the declared content stages nothing.
	liar := open(d, size+1)
	if _, err := u.s.ClaimAndStage(ctx, liar.OperationID, k, size); !errors.Is(err, upload.ErrContentIdentity) {
		t.Fatalf("contradicting claim: %v", err)
	}
	// An abandoned intent claims nothing and stages nothing.
	gone := open("", upload.SizeUnknown)
	if _, err := u.s.AbandonIntent(ctx, gone.OperationID); err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.ClaimAndStage(ctx, gone.OperationID, k, size); !errors.Is(err, upload.ErrIntentClosed) {
		t.Fatalf("abandoned intent: %v", err)
	}
	if n := placements(); n != 0 {
		t.Fatalf("a refused claim staged %d placements", n)
	}

	first := open("", upload.SizeUnknown)
	if st, err := u.s.ClaimAndStage(ctx, first.OperationID, k, size); err != nil || st.AlreadyVerified {
		t.Fatalf("first close: already verified %v, %v", st.AlreadyVerified, err)
	}
	if got, err := u.s.GetIntent(ctx, first.OperationID); err != nil || got.ExpectedDigest != d || got.ExpectedSize != size {
		t.Fatalf("claim: %+v, %v", got, err)
	}
	if p, err := u.s.Placement(ctx, k); err != nil || p.State != placement.Pending {
		t.Fatalf("stage: %+v, %v", p, err)
	}
	if _, err := u.s.VerifyPlacement(ctx, k, d, size, 0); err != nil {
		t.Fatal(err)
	}
	second := open("", upload.SizeUnknown)
	if st, err := u.s.ClaimAndStage(ctx, second.OperationID, k, size); err != nil || !st.AlreadyVerified {
		t.Fatalf("close of verified content: already verified %v, %v", st.AlreadyVerified, err)
	}
	if got, err := u.s.GetIntent(ctx, second.OperationID); err != nil || got.ExpectedDigest != d {
		t.Fatalf("claim on verified content: %+v, %v", got, err)
	}
	if p, err := u.s.Placement(ctx, k); err != nil || p.State != placement.Verified {
		t.Fatalf("verified placement after a second close: %+v, %v", p, err)
	}

	// A key with a row is re-staged after the claim committed: a refused
	// re-stage (here a row held under a higher epoch) leaves the claim,
	// which a retried close of the same content keeps and other content
	// cannot take.
	d2, size2 := contentOf([]byte("re-staged under a higher epoch"))
	k2 := placement.Key{Digest: d2, Backend: "fs", Datacenter: upDC, Location: d2.Hex()}
	if _, err := u.s.StagePlacement(ctx, k2, size2, 7); err != nil {
		t.Fatal(err)
	}
	third := open("", upload.SizeUnknown)
	if _, err := u.s.ClaimAndStage(ctx, third.OperationID, k2, size2); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("re-stage of a row at a higher epoch: %v, want stale_epoch", err)
	}
	if got, err := u.s.GetIntent(ctx, third.OperationID); err != nil || got.ExpectedDigest != d2 || got.ExpectedSize != size2 || got.State != upload.IntentPending {
		t.Fatalf("claim after a refused re-stage: %+v, %v", got, err)
	}
	if p, err := u.s.Placement(ctx, k2); err != nil || p.State != placement.Pending || p.Epoch != 7 {
		t.Fatalf("refused re-stage changed the row: %+v, %v", p, err)
	}
	if _, err := u.s.ClaimAndStage(ctx, third.OperationID, k, size); !errors.Is(err, upload.ErrContentIdentity) {
		t.Fatalf("close of other content after the claim: %v, want a content identity refusal", err)
	}
}

// closing is admitted without the verification: the bytes are stored and
// confirmed, and the request carries the confirmation for Finalize to
// record (what a close at the home does, upload.Verification).
func (u *uploads) closing(t *testing.T, content string) (upload.Intent, upload.FinalizeRequest) {
	t.Helper()
	in := u.open(t, upRepo)
	d, size := contentOf([]byte(content))
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
	if st, err := u.s.ClaimAndStage(context.Background(), in.OperationID, k, size); err != nil || st.AlreadyVerified {
		t.Fatalf("claim and stage: already verified %v, %v", st.AlreadyVerified, err)
	}
	return in, upload.FinalizeRequest{
		OperationID: in.OperationID, Digest: d, Size: size,
		Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch,
		Replication: jobs.Replication{Client: u.river},
		Verify:      &upload.Verification{Key: k, Digest: d, Size: size},
		Proven:      true,
	}
}

// A close at the home records its placement's verification inside the
// publishing transaction (one synchronous commit), and records it
// whatever the publication's fate: a refusal still leaves the bytes
// verified, and a confirmation that does not match records the failure
// (S2) and publishes nothing.
func TestFinalizeRecordsVerification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	state := func(t *testing.T, u *uploads, k placement.Key) placement.Placement {
		t.Helper()
		p, err := u.s.Placement(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("publishes", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in, req := u.closing(t, "verified by finalize")
		out, err := u.s.Finalize(ctx, req)
		if err != nil || !out.NewReference {
			t.Fatalf("finalize: %+v %v", out, err)
		}
		if p := state(t, u, req.Verify.Key); p.State != placement.Verified || p.Size != req.Size {
			t.Fatalf("placement: %+v", p)
		}
		if got, _ := u.s.GetIntent(ctx, in.OperationID); got.State != upload.IntentAdmitted {
			t.Fatalf("intent: %+v", got)
		}
		// A retry returns the stored outcome; the verification stands.
		again, err := u.s.Finalize(ctx, req)
		if err != nil || !again.PublishedAt.Equal(out.PublishedAt) {
			t.Fatalf("retry: %+v %v", again, err)
		}
	})
	refusals := []struct {
		name     string
		mutate   func(t *testing.T, u *uploads, req *upload.FinalizeRequest)
		sentinel error
	}{
		{"former home", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) { req.Node = "node-b" }, upload.ErrAuthorityFence},
		{"write access revoked", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			if err := u.s.RevokePrincipalGrants(ctx, upPrincipal, grants(t, "team/*:write")); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrWriteRevoked},
		{"abandoned", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			if _, err := u.s.AbandonIntent(ctx, req.OperationID); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrIntentClosed},
		{"obliterated", func(t *testing.T, u *uploads, req *upload.FinalizeRequest) {
			if _, err := u.pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes, state) VALUES ($1, $2, 'obliterated')`, req.Digest, req.Size); err != nil {
				t.Fatal(err)
			}
		}, upload.ErrObliterated},
	}
	for _, tc := range refusals {
		t.Run("refused "+tc.name, func(t *testing.T) {
			t.Parallel()
			u := setupUploads(t)
			_, req := u.closing(t, "refused: "+tc.name)
			tc.mutate(t, u, &req)
			if _, err := u.s.Finalize(ctx, req); !errors.Is(err, tc.sentinel) {
				t.Fatalf("finalize: %v, want %v", err, tc.sentinel)
			}
			if p := state(t, u, req.Verify.Key); p.State != placement.Verified {
				t.Fatalf("placement after a refusal: %+v, want verified", p)
			}
			if n := u.outcomes(t) + u.references(t); n != 0 {
				t.Fatalf("%d outcomes and references after a refusal", n)
			}
		})
	}
	t.Run("mismatching confirmation", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in, req := u.closing(t, "short")
		req.Verify.Size++ // the backend confirmed another size than staged
		_, err := u.s.Finalize(ctx, req)
		if blobplane.ErrorCode(err) != blobplane.CodeMismatch {
			t.Fatalf("finalize: %v, want digest_mismatch", err)
		}
		if p := state(t, u, req.Verify.Key); p.State != placement.Failed || p.Reason != placement.DigestMismatch {
			t.Fatalf("placement: %+v, want failed/digest_mismatch", p)
		}
		if got, _ := u.s.GetIntent(ctx, in.OperationID); got.State != upload.IntentPending {
			t.Fatalf("intent: %+v", got)
		}
		if n := u.outcomes(t) + u.references(t); n != 0 {
			t.Fatalf("%d outcomes and references after a mismatch", n)
		}
	})
}

// Spec "Validation": the authority fence runs first. An abandoned intent
// presented by a former home is refused by the fence, not as closed; the
// abandonment is decided on the locked row after the spec's checks.
func TestFinalizeFenceBeforeAbandonment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	_, req := u.admitted(t, "abandoned at a former home")
	if _, err := u.s.AbandonIntent(ctx, req.OperationID); err != nil {
		t.Fatal(err)
	}
	req.Node = "node-b"
	if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrAuthorityFence) {
		t.Fatalf("former home, abandoned intent: %v, want %v", err, upload.ErrAuthorityFence)
	}
	req.Node = upNode
	if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrIntentClosed) {
		t.Fatalf("the home, abandoned intent: %v, want %v", err, upload.ErrIntentClosed)
	}
}

// A pipelined batch (store/batch.go) is one transaction: pgx ends it with
// a single Sync, so a later statement's failure undoes an earlier
// statement's write. OpenAndStage's atomicity rests on this.
func TestBatchIsOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	n := upload.NewIntent{Repository: upRepo, Principal: upPrincipal, IngressDatacenter: upDC, Backend: "fs", ExpectedSize: upload.SizeUnknown, TTL: time.Hour}
	op, err := u.s.BatchThenForTest(ctx, n, "SELECT 1/0")
	if err == nil {
		t.Fatal("a batch with a failing statement succeeded")
	}
	if _, err := u.s.GetIntent(ctx, op); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("the intent written before the failure: %v, want not_found", err)
	}
	op, err = u.s.BatchThenForTest(ctx, n, "SELECT 1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.s.GetIntent(ctx, op); err != nil {
		t.Fatalf("the intent of a batch that succeeded: %v", err)
	}
}

// OpenAndStage (the single-request upload's first step) records an intent
// that claims the content and the pending placement, or nothing.
func TestOpenAndStage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	d, size := contentOf([]byte("opened and staged"))
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
	n := upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}
	placements := func() int {
		return u.count(t, `SELECT count(*) FROM placements WHERE digest = $1`, string(d))
	}

	// An unknown repository: not_found, and no stage either.
	gone := n
	gone.Repository = "team/none"
	if _, _, err := u.s.OpenAndStage(ctx, gone, k); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("unknown repository: %v, want not_found", err)
	}
	// An intent that does not declare k's content is refused up front.
	undeclared := n
	undeclared.ExpectedSize = upload.SizeUnknown
	if _, _, err := u.s.OpenAndStage(ctx, undeclared, k); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Fatalf("undeclared size: %v, want invalid", err)
	}
	if got := placements(); got != 0 {
		t.Fatalf("refused opens staged %d placements", got)
	}

	first, staged, err := u.s.OpenAndStage(ctx, n, k)
	if err != nil || !staged {
		t.Fatalf("first open: staged %v, %v", staged, err)
	}
	if got, err := u.s.GetIntent(ctx, first.OperationID); err != nil || got.State != upload.IntentPending || got.ExpectedDigest != d || got.ExpectedSize != size {
		t.Fatalf("intent: %+v, %v", got, err)
	}
	if p, err := u.s.Placement(ctx, k); err != nil || p.State != placement.Pending || p.Size != size {
		t.Fatalf("stage: %+v, %v", p, err)
	}
	// k has a row now: a second open records its intent (the claim) and
	// leaves the stage to ClaimAndStage, which re-stages under the lock.
	second, staged, err := u.s.OpenAndStage(ctx, n, k)
	if err != nil || staged {
		t.Fatalf("second open: staged %v, %v", staged, err)
	}
	if second.OperationID == first.OperationID || second.ExpectedDigest != d {
		t.Fatalf("second intent: %+v", second)
	}
	if st, err := u.s.ClaimAndStage(ctx, second.OperationID, k, size); err != nil || st.AlreadyVerified {
		t.Fatalf("second close: already verified %v, %v", st.AlreadyVerified, err)
	}
	if got := placements(); got != 1 {
		t.Fatalf("%d placements of one key", got)
	}
	// And the whole close publishes.
	req := upload.FinalizeRequest{OperationID: first.OperationID, Digest: d, Size: size,
		Partition: upPartition, Node: upNode, Epoch: u.lease.Epoch,
		Replication: jobs.Replication{Client: u.river},
		Verify:      &upload.Verification{Key: k, Digest: d, Size: size}, Proven: true}
	if out, err := u.s.Finalize(ctx, req); err != nil || !out.NewReference {
		t.Fatalf("finalize: %+v, %v", out, err)
	}
}

// FinalizeRequest.BeforeCommit (the bytes' durability, run alongside the
// first round trips) holds the commit: nothing Finalize records is
// visible until it returned, its error leaves everything as it was, and
// a refusal's standalone verification waits for it too.
func TestFinalizeBeforeCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	refs := func(u *uploads, d blobplane.Digest) int {
		return u.count(t, `SELECT count(*) FROM blob_references WHERE digest = $1`, string(d))
	}
	state := func(u *uploads, k placement.Key) placement.State {
		t.Helper()
		p, err := u.s.Placement(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return p.State
	}
	t.Run("holds the commit", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in, req := u.closing(t, "durable first")
		entered, release := make(chan struct{}), make(chan struct{})
		calls := 0
		req.BeforeCommit = func() error {
			calls++
			close(entered)
			<-release
			return nil
		}
		done := make(chan error, 1)
		go func() {
			_, err := u.s.Finalize(ctx, req)
			done <- err
		}()
		select {
		case <-entered:
		case err := <-done:
			t.Fatalf("Finalize returned (%v) without calling BeforeCommit", err)
		}
		// Every statement has run; none of it is committed.
		if n := refs(u, req.Digest); n != 0 {
			t.Fatalf("%d references before the bytes were durable", n)
		}
		if got := state(u, req.Verify.Key); got != placement.Pending {
			t.Fatalf("placement %s before the bytes were durable", got)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if calls != 1 || refs(u, req.Digest) != 1 || state(u, req.Verify.Key) != placement.Verified {
			t.Fatalf("after: %d calls, %d references, %s", calls, refs(u, req.Digest), state(u, req.Verify.Key))
		}
		if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.State != upload.IntentAdmitted {
			t.Fatalf("intent: %+v, %v", got, err)
		}
	})
	t.Run("its error records nothing", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		in, req := u.closing(t, "never durable")
		lost := errors.New("fsync: input/output error")
		calls := 0
		req.BeforeCommit = func() error { calls++; return lost }
		if _, err := u.s.Finalize(ctx, req); !errors.Is(err, lost) {
			t.Fatalf("finalize: %v, want the sync's error", err)
		}
		if calls != 1 || refs(u, req.Digest) != 0 || state(u, req.Verify.Key) != placement.Pending {
			t.Fatalf("after: %d calls, %d references, %s", calls, refs(u, req.Digest), state(u, req.Verify.Key))
		}
		if got, err := u.s.GetIntent(ctx, in.OperationID); err != nil || got.State != upload.IntentPending {
			t.Fatalf("intent: %+v, %v", got, err)
		}
	})
	t.Run("a refusal verifies after it", func(t *testing.T) {
		t.Parallel()
		u := setupUploads(t)
		_, req := u.closing(t, "refused but durable")
		req.Epoch++ // not the lease's: refused by the fence
		calls := 0
		req.BeforeCommit = func() error {
			calls++
			if got := state(u, req.Verify.Key); got != placement.Pending {
				t.Errorf("placement %s before the bytes were durable", got)
			}
			return nil
		}
		if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrAuthorityFence) {
			t.Fatalf("finalize at a wrong epoch: %v", err)
		}
		if calls != 1 || state(u, req.Verify.Key) != placement.Verified {
			t.Fatalf("after: %d calls, %s", calls, state(u, req.Verify.Key))
		}
	})
}

// ClaimSessionAndStage (the OCI PUT's session read and claim in one round
// trip) claims only a pending session of the repository on the key's
// backend with nothing staged and no other content declared; any other
// session it leaves exactly as it was, for the checked path to explain.
// A staging that commits while the claim waits on the session's row wins:
// the claim re-checks its guard on the committed row.
func TestClaimSessionAndStageClaimsOnlyAnUnstagedSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	if err := u.s.CreateRepository(ctx, "team/other"); err != nil {
		t.Fatal(err)
	}
	d, size := contentOf([]byte("a session closed by its PUT"))
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
	placements := func() int {
		if u.count(t, `SELECT count(*) FROM pg_tables WHERE tablename = 'placements'`) == 0 {
			return 0 // the ledger is created by the first store call that needs it
		}
		return u.count(t, `SELECT count(*) FROM placements WHERE digest = $1`, string(d))
	}
	row := func(op string) string {
		t.Helper()
		var s string
		if err := u.pool.QueryRow(ctx, `SELECT i::text FROM intents i WHERE operation_id = $1`, op).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	declines := func(name, op, repo string, k placement.Key) {
		t.Helper()
		var before string
		if len(op) == 36 && op[8] == '-' {
			if err := u.pool.QueryRow(ctx, `SELECT coalesce((SELECT i::text FROM intents i WHERE operation_id = $1::text::uuid), '')`, op).Scan(&before); err != nil {
				t.Fatal(err)
			}
		}
		in, claimed, st, err := u.s.ClaimSessionAndStage(ctx, op, repo, k, size)
		if err != nil || claimed || st.AlreadyVerified || in != (upload.Intent{}) {
			t.Fatalf("%s: claimed %v, already verified %v, %+v, %v; want declined", name, claimed, st.AlreadyVerified, in, err)
		}
		if before != "" && row(op) != before {
			t.Fatalf("%s: the declined claim changed the session: %s, was %s", name, row(op), before)
		}
		if n := placements(); n != 0 {
			t.Fatalf("%s: a declined claim staged %d placements", name, n)
		}
	}

	declines("malformed id", "not-an-id", upRepo, k)
	declines("unknown id", "00000000-0000-4000-8000-000000000000", upRepo, k)
	other := u.open(t, "team/other")
	declines("another repository's session", other.OperationID, upRepo, k)
	s3 := k
	s3.Backend = "s3"
	declines("a session on another backend", u.open(t, upRepo).OperationID, upRepo, s3)
	staged := u.open(t, upRepo)
	if _, err := u.s.ExtendIntent(ctx, staged.OperationID, "0123456789abcdef0123456789abcdef", 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	declines("a session with staged chunks", staged.OperationID, upRepo, k)
	gone := u.open(t, upRepo)
	if _, err := u.s.AbandonIntent(ctx, gone.OperationID); err != nil {
		t.Fatal(err)
	}
	declines("an abandoned session", gone.OperationID, upRepo, k)
	liar, err := u.s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: size + 1,
		IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	declines("a session declaring other content", liar.OperationID, upRepo, k)
	// Sessions that declared this very content (a POST ?digest= without
	// the body), declined for another reason: the stage, which follows
	// the claim in the same transaction, must not happen either.
	declared := func(repo string) upload.Intent {
		t.Helper()
		in, err := u.s.CreateIntent(ctx, upload.NewIntent{Repository: repo, Principal: upPrincipal, ExpectedDigest: d, ExpectedSize: size,
			IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	declines("another repository's session declaring this content", declared("team/other").OperationID, upRepo, k)
	declines("a session declaring this content on another backend", declared(upRepo).OperationID, upRepo, s3)
	stagedDeclared := declared(upRepo)
	if _, err := u.s.ExtendIntent(ctx, stagedDeclared.OperationID, "0123456789abcdef0123456789abcdef", 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	declines("a staged session declaring this content", stagedDeclared.OperationID, upRepo, k)

	// Race: a staging of the session commits while the claim waits on its
	// row; the claim then declines.
	raced := u.open(t, upRepo)
	tx, err := u.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `UPDATE intents SET staged_location = 'fedcba9876543210fedcba9876543210' WHERE operation_id = $1`, raced.OperationID); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		claimed bool
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		_, claimed, _, err := u.s.ClaimSessionAndStage(ctx, raced.OperationID, upRepo, k, size)
		done <- answer{claimed, err}
	}()
	pgtest.WaitForLockWaiters(t, u.pool, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-done; a.err != nil || a.claimed {
		t.Fatalf("claim racing a committed staging: claimed %v, %v; want declined", a.claimed, a.err)
	}
	if n := placements(); n != 0 {
		t.Fatalf("the raced claim staged %d placements", n)
	}

	// The session it can close: claimed and staged, returned as claimed.
	fresh := u.open(t, upRepo)
	in, claimed, st, err := u.s.ClaimSessionAndStage(ctx, fresh.OperationID, upRepo, k, size)
	if err != nil || !claimed || st.AlreadyVerified {
		t.Fatalf("unstaged session: claimed %v, already verified %v, %v", claimed, st.AlreadyVerified, err)
	}
	if in.OperationID != fresh.OperationID || in.Repository != upRepo || in.Principal != upPrincipal || in.Backend != "fs" ||
		in.ExpectedDigest != d || in.ExpectedSize != size || in.ReceivedBytes != size || in.State != upload.IntentPending || in.StagedLocation != "" {
		t.Fatalf("claimed session: %+v", in)
	}
	if got, err := u.s.GetIntent(ctx, fresh.OperationID); err != nil || got.ExpectedDigest != d || got.ExpectedSize != size {
		t.Fatalf("claim: %+v, %v", got, err)
	}
	if p, err := u.s.Placement(ctx, k); err != nil || p.State != placement.Pending || p.Size != size {
		t.Fatalf("stage: %+v, %v", p, err)
	}
	// Verified content: claimed, nothing to stage, alreadyVerified.
	if _, err := u.s.VerifyPlacement(ctx, k, d, size, 0); err != nil {
		t.Fatal(err)
	}
	second := u.open(t, upRepo)
	if in, claimed, st, err := u.s.ClaimSessionAndStage(ctx, second.OperationID, upRepo, k, size); err != nil || !claimed || !st.AlreadyVerified || in.ExpectedDigest != d {
		t.Fatalf("session closing verified content: claimed %v, already verified %v, %+v, %v", claimed, st.AlreadyVerified, in, err)
	}
}

// Finalize counts the grants of the principal's valid tokens beside its
// own, and no others: not a revoked token's, not another principal's
// (FinalizeContext reads them in two index lookups; LoadPrincipal reads
// the same set with PrincipalGrants).
func TestFinalizeCountsTheGrantsOfValidTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	if err := u.s.RevokePrincipalGrants(ctx, upPrincipal, grants(t, "team/*:write")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.s.CreateToken(ctx, "bob", grants(t, "team/*:write")); err != nil {
		t.Fatal(err)
	}
	held := func(want ...string) {
		t.Helper()
		p, err := u.s.LoadPrincipal(ctx, upPrincipal)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]string, len(p.Grants))
		for i, g := range p.Grants {
			got[i] = g.String()
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("%s holds %v, want %v", upPrincipal, got, want)
		}
	}
	held()
	_, req := u.admitted(t, "published through a token's grant")
	if _, err := u.s.Finalize(ctx, req); !errors.Is(err, upload.ErrWriteRevoked) {
		t.Fatalf("with only another principal's token: %v, want ErrWriteRevoked", err)
	}
	_, id, err := u.s.CreateToken(ctx, upPrincipal, grants(t, "team/app:read", "team/app:write"))
	if err != nil {
		t.Fatal(err)
	}
	held("team/app:read", "team/app:write")
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatalf("with its own token's grant: %v", err)
	}
	_, req2 := u.admitted(t, "refused after the token's revocation")
	if err := u.s.RevokeToken(ctx, id); err != nil {
		t.Fatal(err)
	}
	held()
	if _, err := u.s.Finalize(ctx, req2); !errors.Is(err, upload.ErrWriteRevoked) {
		t.Fatalf("after the token's revocation: %v, want ErrWriteRevoked", err)
	}
}
