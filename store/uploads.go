package store

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/upload"
)

// Admission and finalization (DESIGN flows 1-2,
// ../shared/spec/finalizing-admitted-content.md).
//
// An intent row is committed before any byte is staged (CreateIntent), so
// every staged key is claimed by a row a sweeper can see. Publication
// (Finalize) and abandonment (AbandonIntent) are both decided on that row
// while it is locked FOR UPDATE and only from pending, so exactly one of them
// happens (S5). Finalize writes the reference, the blob state row, the
// replication jobs, the operation outcome and the transition to admitted in
// one transaction; a retry of the operation id returns the stored outcome
// (S4); a refusal stores nothing and may succeed later.

func refusal(code blobplane.Code, op string, sentinel error, format string, args ...any) error {
	return &blobplane.Error{Code: code, Op: "finalize " + op, Message: fmt.Sprintf(format, args...),
		Retryable: code == blobplane.CodeUnavailable, Err: sentinel}
}

// CreateIntent records a new pending intent and returns it with its
// operation id. It commits before the caller stages any byte. Errors:
// invalid (malformed fields), not_found (no such repository).
func (s *Store) CreateIntent(ctx context.Context, n upload.NewIntent) (upload.Intent, error) {
	arg, err := createIntentArgs(n)
	if err != nil {
		return upload.Intent{}, err
	}
	// The intent commits without waiting for its WAL flush: nothing is
	// staged or published on it until a later, synchronous commit of this
	// upload (ExtendIntent naming the staged upload, ClaimAndStage,
	// Finalize), whose flush makes it durable first (the WAL is flushed in
	// order). A crash before then loses only an empty session, which the
	// client sees as UPLOAD_UNKNOWN and restarts. This saves one WAL flush
	// per upload (docs/performance.md), in the same single statement.
	// Under load it is batched with other claims (claim_batch.go).
	var row dbsqlc.Intent
	var rowErr error
	claim := &claimCall{digest: n.ExpectedDigest}
	claim.create = &createClaim{arg: arg, row: &row, err: &rowErr}
	claim.queue = func(b *pgx.Batch) {
		arg := claim.create.arg // with the id a merged batch drew, should this run alone after it
		queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.Intent, error) { return s.q.CreateIntent(ctx, db, arg) }, &row, &rowErr)
	}
	if err := s.sendClaim(ctx, claim); err != nil {
		return upload.Intent{}, createIntentErr(n, err)
	}
	if rowErr != nil {
		return upload.Intent{}, createIntentErr(n, rowErr)
	}
	return intentFromRow(row), nil
}

// createIntentArgs validates n into CreateIntent's arguments.
func createIntentArgs(n upload.NewIntent) (dbsqlc.CreateIntentParams, error) {
	if err := auth.CheckRepository(n.Repository); err != nil {
		return dbsqlc.CreateIntentParams{}, err
	}
	if n.TTL <= 0 {
		return dbsqlc.CreateIntentParams{}, blobplane.Errorf(blobplane.CodeInvalid, "intent TTL %s: must be positive", n.TTL)
	}
	arg := dbsqlc.CreateIntentParams{
		Repository: n.Repository, Principal: n.Principal, IngressDatacenter: n.IngressDatacenter, Backend: n.Backend,
		StagedLocation: optText(n.StagedLocation), TtlSeconds: n.TTL.Seconds(),
	}
	if n.ExpectedDigest != "" {
		if _, err := blobplane.ParseDigest(string(n.ExpectedDigest)); err != nil {
			return dbsqlc.CreateIntentParams{}, err
		}
		arg.ExpectedDigest = optText(string(n.ExpectedDigest))
	}
	if n.ExpectedSize != upload.SizeUnknown {
		if n.ExpectedSize < 0 {
			return dbsqlc.CreateIntentParams{}, blobplane.Errorf(blobplane.CodeInvalid, "expected size %d: must be >= 0", n.ExpectedSize)
		}
		arg.ExpectedSize = pgtype.Int8{Int64: n.ExpectedSize, Valid: true}
	}
	return arg, nil
}

// createIntentErr is CreateIntent's error: a foreign key violation means
// the repository does not exist.
func createIntentErr(n upload.NewIntent, err error) error {
	const op = "create intent"
	if e := dbErr(op, err); blobplane.ErrorCode(e) == blobplane.CodeConflict {
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: fmt.Sprintf("repository %q does not exist", n.Repository), Err: err}
	} else {
		return e
	}
}

// OpenAndStage is a single-request upload's first step: CreateIntent of
// an intent that declares its digest and size (which is the claim S6
// needs: ClaimAndStage would record the same) and the stage of k under
// the digest's stage lock, in one round trip and one transaction, whose
// commit, like CreateIntent's, does not wait for its WAL flush (the
// close's Finalize flushes past it). staged is false when k was not
// staged (k has a row already, or the digest is at its bound): the intent
// exists and claims the content, and the caller stages through
// ClaimAndStage. Errors: those of CreateIntent; on error nothing is
// recorded.
func (s *Store) OpenAndStage(ctx context.Context, n upload.NewIntent, k placement.Key) (in upload.Intent, staged bool, err error) {
	o, err := s.newOpenStaging(ctx, n, k)
	if err != nil {
		return upload.Intent{}, false, err
	}
	return o.answer(s.sendClaim(ctx, o.call))
}

// openStaging is OpenAndStage's claim: its statements (call) and where
// their answers go until answer reads them.
type openStaging struct {
	n                            upload.NewIntent
	id                           pgtype.UUID
	call                         *claimCall
	row                          dbsqlc.Intent
	stage                        dbsqlc.Placement
	createErr, lockErr, stageErr error
}

// newOpenStaging validates OpenAndStage's arguments and makes its claim.
func (s *Store) newOpenStaging(ctx context.Context, n upload.NewIntent, k placement.Key) (*openStaging, error) {
	if n.ExpectedDigest != k.Digest || n.ExpectedSize < 0 {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "open and stage: the intent must declare %s and its size", k.Digest)
	}
	arg, err := createIntentArgs(n)
	if err != nil {
		return nil, err
	}
	if err := checkTransition(k, 0); err != nil {
		return nil, err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return nil, err
	}
	// The id is drawn here so the stage can name the intent whose claim
	// it requires, in the same batch: one implicit transaction (pgx sends
	// a single Sync), committed by the server when the batch ends.
	if arg.OperationID, err = newOperationID(); err != nil {
		return nil, err
	}
	o := &openStaging{n: n, id: arg.OperationID}
	o.call = &claimCall{digest: k.Digest, create: &createClaim{arg: arg, row: &o.row, err: &o.createErr},
		stage: &stageClaim{key: k, size: n.ExpectedSize, lockErr: &o.lockErr, row: &o.stage, err: &o.stageErr}}
	o.call.queue = func(b *pgx.Batch) {
		queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.Intent, error) { return s.q.CreateIntent(ctx, db, arg) }, &o.row, &o.createErr)
		queueExec(b, func(db dbsqlc.DBTX) error {
			return s.q.LockPlacementDigest(ctx, db, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(k.Digest)})
		}, &o.lockErr)
		queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.Placement, error) {
			return s.q.InsertPlacementIfAbsent(ctx, db, insertPlacementArgs(k, n.ExpectedSize, 0, arg.OperationID))
		}, &o.stage, &o.stageErr)
	}
	return o, nil
}

// answer is OpenAndStage's answer once the claim was sent; sendErr is
// its implicit transaction's error (nil: committed).
func (o *openStaging) answer(sendErr error) (in upload.Intent, staged bool, err error) {
	if sendErr != nil { // the first statement's error, the batch undone
		return upload.Intent{}, false, createIntentErr(o.n, sendErr)
	}
	if err := errors.Join(o.createErr, o.lockErr); err != nil {
		return upload.Intent{}, false, dbErr("open and stage", err)
	}
	if errors.Is(o.stageErr, pgx.ErrNoRows) {
		return intentFromRow(o.row), false, nil
	}
	if o.stageErr != nil {
		return upload.Intent{}, false, placementErr("open and stage", o.stageErr)
	}
	return intentFromRow(o.row), true, nil
}

// GetIntent returns the intent op. Errors: not_found (also for a malformed
// id).
func (s *Store) GetIntent(ctx context.Context, op string) (upload.Intent, error) {
	id, err := parseOpID(op)
	if err != nil {
		return upload.Intent{}, err
	}
	row, err := s.q.GetIntent(ctx, s.pool, id)
	if err != nil {
		return upload.Intent{}, dbErr("get intent", err)
	}
	return intentFromRow(row), nil
}

// ExtendIntent records that the intent's staged upload now holds received
// bytes (at stagedLocation, recorded the first time; "" leaves it) and moves
// its expiry to at least now() + ttl. Called per chunk. Errors: not_found;
// conflict (wrapping ErrIntentClosed) when the intent is admitted or
// abandoned, or stagedLocation differs from the recorded one.
func (s *Store) ExtendIntent(ctx context.Context, op string, stagedLocation string, received int64, ttl time.Duration) (upload.Intent, error) {
	id, err := parseOpID(op)
	if err != nil {
		return upload.Intent{}, err
	}
	if received < 0 || ttl <= 0 {
		return upload.Intent{}, blobplane.Errorf(blobplane.CodeInvalid, "extend intent: received %d and TTL %s must be non-negative and positive", received, ttl)
	}
	row, err := s.q.ExtendIntent(ctx, s.pool, dbsqlc.ExtendIntentParams{
		ReceivedBytes: received, StagedLocation: optText(stagedLocation), TtlSeconds: ttl.Seconds(), OperationID: id,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return upload.Intent{}, s.notPending(ctx, "extend intent", id)
	}
	if err != nil {
		return upload.Intent{}, dbErr("extend intent", err)
	}
	return intentFromRow(row), nil
}

// RecordIntentContent records the digest and size a closing upload claims
// on its pending intent, before any byte is promoted to the digest's key:
// from then until the intent is admitted or abandoned it claims the digest
// (the collector keeps it, S6), and Finalize publishes exactly these.
// Errors: not_found; conflict (ErrIntentClosed) when the intent is not
// pending; digest_mismatch (ErrContentIdentity) when the intent already
// claimed another digest or size.
func (s *Store) RecordIntentContent(ctx context.Context, op string, d blobplane.Digest, size int64) (upload.Intent, error) {
	id, err := parseOpID(op)
	if err != nil {
		return upload.Intent{}, err
	}
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return upload.Intent{}, err
	}
	row, err := s.q.RecordIntentContent(ctx, s.pool, dbsqlc.RecordIntentContentParams{Digest: string(d), SizeBytes: size, OperationID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return upload.Intent{}, s.claimRefused(ctx, op, id, d, size)
	}
	if err != nil {
		return upload.Intent{}, dbErr("record intent content", err)
	}
	return intentFromRow(row), nil
}

// claimRefused explains a RecordIntentContent that touched no row.
func (s *Store) claimRefused(ctx context.Context, op string, id pgtype.UUID, d blobplane.Digest, size int64) error {
	cur, err := s.q.GetIntent(ctx, s.pool, id)
	if err == nil && upload.IntentState(cur.State) == upload.IntentPending {
		return refusal(blobplane.CodeMismatch, op, upload.ErrContentIdentity, "upload %s: content %s (%d bytes) differs from the declared %s (%s bytes)",
			op, d, size, cur.ExpectedDigest.String, sizeText(cur.ExpectedSize))
	}
	return s.notPending(ctx, "record intent content", id)
}

// ClaimAndStage is a close's first step: RecordIntentContent of k's
// digest and size on the intent op, then StagePlacement of k. So the
// claim precedes any byte written at k (S6). When k has no row yet (the
// common case) both are one implicit transaction in one round trip, and
// on error nothing is recorded. When k has a row (or the digest is at its
// bound), the claim commits first and k is re-staged in a second
// transaction under the digest's stage lock; if that fails, the claim
// stands (a claim with nothing staged, as a monolithic upload's intent
// has before its close), so a retried close of the same content stages
// it and a close of other content is refused. alreadyVerified reports
// that k is verified already: the stage is refused, the claim stands, and
// the caller still writes the bytes to prove them (S8) but has nothing to
// verify. Errors: those of RecordIntentContent and of StagePlacement
// (other than the refusal of a verified row).
func (s *Store) ClaimAndStage(ctx context.Context, op string, k placement.Key, size int64) (upload.Stage, error) {
	id, err := parseOpID(op)
	if err != nil {
		return upload.Stage{}, err
	}
	_, claimed, st, err := s.claimAndStage(ctx, id, k, size, "")
	if err == nil && !claimed {
		err = s.claimRefused(ctx, op, id, k.Digest, size)
	}
	return st, err
}

// ClaimSessionAndStage is ClaimAndStage for an OCI PUT that closes the
// upload session op of repository with its body, before it read the
// session: it claims only a pending session of repository on k's backend
// with nothing staged yet whose declared content (if any) is k's digest
// and size, and returns it. claimed is false, and nothing is recorded,
// when the session is anything else (unknown, another repository's,
// another backend's, staged, closed, declaring other content): the caller
// then reads the session and takes the path that explains or handles it.
// So the PUT's session read and its claim are one round trip. Errors:
// those of ClaimAndStage's stage.
func (s *Store) ClaimSessionAndStage(ctx context.Context, op, repository string, k placement.Key, size int64) (in upload.Intent, claimed bool, st upload.Stage, err error) {
	id, err := parseOpID(op)
	if err != nil || repository == "" {
		return upload.Intent{}, false, upload.Stage{}, nil
	}
	row, claimed, st, err := s.claimAndStage(ctx, id, k, size, repository)
	if err != nil || !claimed {
		return upload.Intent{}, false, upload.Stage{}, err
	}
	return intentFromRow(dbsqlc.Intent(row)), true, st, nil
}

// claimAndStage is ClaimAndStage of the intent id, and with repository
// set ClaimSessionAndStage's; claimed is false when the claim touched no
// row (nothing is recorded then).
func (s *Store) claimAndStage(ctx context.Context, id pgtype.UUID, k placement.Key, size int64, repository string) (row dbsqlc.ClaimIntentContentRow, claimed bool, st upload.Stage, err error) {
	c, err := s.newClaimStaging(ctx, id, k, size, repository)
	if err != nil {
		return row, false, upload.Stage{}, err
	}
	return c.answer(ctx, s.sendClaim(ctx, c.call))
}

// claimStaging is claimAndStage's claim: its statements (call) and where
// their answers go until answer reads them.
type claimStaging struct {
	s                  *Store
	k                  placement.Key
	size               int64
	call               *claimCall
	row                dbsqlc.ClaimIntentContentRow
	staged             dbsqlc.Placement
	claimErr, stageErr error
}

// newClaimStaging validates claimAndStage's arguments and makes its claim.
func (s *Store) newClaimStaging(ctx context.Context, id pgtype.UUID, k placement.Key, size int64, repository string) (*claimStaging, error) {
	if err := checkTransition(k, 0); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "size %d: must be >= 0", size)
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return nil, err
	}
	// Like CreateIntent's, these commits do not wait for their WAL flush:
	// the close's next commit (Finalize recording the verification, or
	// VerifyPlacement away from the home) is synchronous and flushes the
	// WAL past them. A crash before then loses the claim and the stage;
	// bytes already written at k are then either another upload's (owned,
	// kept) or an orphan for the inventory.
	//
	// One round trip, one implicit transaction (a single Sync): the
	// setting, the claim with the digest's stage lock, and the common
	// stage, an insert that happens only if the claim did, after the lock.
	c := &claimStaging{s: s, k: k, size: size}
	c.call = &claimCall{digest: k.Digest, queue: func(b *pgx.Batch) {
		b.Queue("SELECT set_config('synchronous_commit', 'off', true)")
		queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.ClaimIntentContentRow, error) {
			return s.q.ClaimIntentContent(ctx, db, dbsqlc.ClaimIntentContentParams{
				LockClass: placementDigestLockClass, Digest: string(k.Digest), SizeBytes: size, OperationID: id,
				SessionRepository: optText(repository), SessionBackend: optText(k.Backend),
			})
		}, &c.row, &c.claimErr)
		queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.Placement, error) {
			return s.q.InsertPlacementIfAbsent(ctx, db, insertPlacementArgs(k, size, 0, id))
		}, &c.staged, &c.stageErr)
	}}
	return c, nil
}

// stagedAll reports whether the claim, sent and committed, claimed and
// staged k: the common case, all in its one round trip.
func (c *claimStaging) stagedAll() bool { return c.claimErr == nil && c.stageErr == nil }

// answer is claimAndStage's answer once the claim was sent; sendErr is
// its implicit transaction's error (nil: committed). A claim that did
// not stage k re-stages it here.
func (c *claimStaging) answer(ctx context.Context, sendErr error) (row dbsqlc.ClaimIntentContentRow, claimed bool, st upload.Stage, err error) {
	if sendErr != nil { // the first error, the batch undone
		return row, false, upload.Stage{}, placementErr("claim and stage", sendErr)
	}
	switch {
	case errors.Is(c.claimErr, pgx.ErrNoRows):
		return row, false, upload.Stage{}, nil
	case c.claimErr != nil:
		return row, false, upload.Stage{}, placementErr("claim and stage", c.claimErr)
	case errors.Is(c.stageErr, pgx.ErrNoRows):
		st, err = c.s.restageClaimed(ctx, c.k, c.size)
		return c.row, true, st, err
	case c.stageErr != nil:
		return row, false, upload.Stage{}, placementErr("claim and stage", c.stageErr)
	}
	return c.row, true, upload.Stage{Generation: c.staged.Generation}, nil
}

// restageClaimed re-stages k, which has a row already (or whose digest is
// at its bound), for a close whose claim committed: under the digest's
// stage lock, in a transaction of its own. A verified row is not an
// error: alreadyVerified.
func (s *Store) restageClaimed(ctx context.Context, k placement.Key, size int64) (st upload.Stage, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL synchronous_commit = off"}, func(tx pgx.Tx) error {
		if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(k.Digest)}); err != nil {
			return err
		}
		p, err := s.restageLockedTx(ctx, tx, k, size, 0)
		st.Generation = p.Generation
		if err != nil && !errors.Is(err, ErrPlacementLimit) && blobplane.ErrorCode(err) == blobplane.CodeConflict {
			cur, gerr := s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k)))
			if gerr == nil && placement.State(cur.State) == placement.Verified {
				st, err = upload.Stage{Generation: cur.Generation, AlreadyVerified: true}, nil
			}
		}
		return err
	})
	if err != nil {
		return upload.Stage{}, placementErr("claim and stage", err)
	}
	return st, nil
}

// CreateMountIntent records a mount's intent: n's content declared, its
// possession the mount from repository from (S9), which Finalize
// re-checks at the home: from must still reference the digest and the
// principal still read it. Errors: those of CreateIntent.
func (s *Store) CreateMountIntent(ctx context.Context, n upload.NewIntent, from string) (upload.Intent, error) {
	arg, err := createIntentArgs(n)
	if err != nil {
		return upload.Intent{}, err
	}
	if err := auth.CheckRepository(from); err != nil {
		return upload.Intent{}, err
	}
	if n.ExpectedDigest == "" || n.ExpectedSize < 0 {
		return upload.Intent{}, blobplane.Errorf(blobplane.CodeInvalid, "a mount declares its digest and size")
	}
	row, err := s.q.CreateMountIntent(ctx, s.pool, dbsqlc.CreateMountIntentParams{
		Repository: arg.Repository, Principal: arg.Principal, ExpectedDigest: string(n.ExpectedDigest), ExpectedSize: n.ExpectedSize,
		IngressDatacenter: arg.IngressDatacenter, Backend: arg.Backend, TtlSeconds: arg.TtlSeconds, MountedFrom: from,
	})
	if err != nil {
		return upload.Intent{}, createIntentErr(n, err)
	}
	return intentFromRow(row), nil
}

// AcceptIntent records that the client is answered 202 for the pending
// intent op, whose bytes it proved (RecordPossession): acknowledged means
// kept, so the reaper never abandons it and its finalize job publishes it
// once a home can, however long that takes (issue 27). Idempotent.
// Errors: not_found; conflict when op is not pending or proved nothing.
//
// enqueue, when set, runs in the accepting transaction (the finalize
// job's insert, jobs.FinalizeQueue.EnqueueFinalizeTx): an accepted intent
// then always has its job, and a job never exists for an intent that was
// not accepted.
func (s *Store) AcceptIntent(ctx context.Context, op string, enqueue func(ctx context.Context, tx pgx.Tx) error) error {
	id, err := parseOpID(op)
	if err != nil {
		return err
	}
	var n int64
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if n, err = s.q.AcceptIntent(ctx, tx, id); err != nil || n == 0 || enqueue == nil {
			return err
		}
		return enqueue(ctx, tx)
	})
	if err != nil {
		return placementErr("accept intent", err)
	}
	if n == 0 {
		if err := s.notPending(ctx, "accept intent", id); blobplane.ErrorCode(err) != blobplane.CodeConflict || errors.Is(err, upload.ErrIntentClosed) {
			return err
		}
		return &blobplane.Error{Code: blobplane.CodeConflict, Op: "accept intent", Message: fmt.Sprintf("upload %s proved no content; it cannot be accepted", op)}
	}
	return nil
}

// OpenUsages returns the open usage of every principal holding at least
// minSessions sessions or minStaged staged bytes (the per-principal
// bounds of issue 26 read it periodically; one aggregate over the pending
// intents). Errors: unavailable, internal.
func (s *Store) OpenUsages(ctx context.Context, minSessions, minStaged int64) (map[string]upload.OpenUsage, error) {
	rows, err := s.q.OpenUsage(ctx, s.pool, dbsqlc.OpenUsageParams{MinSessions: minSessions, MinStaged: minStaged})
	if err != nil {
		return nil, dbErr("open usage", err)
	}
	out := make(map[string]upload.OpenUsage, len(rows))
	for _, r := range rows {
		out[r.Principal] = upload.OpenUsage{Sessions: r.Sessions, StagedBytes: r.StagedBytes}
	}
	return out, nil
}

// RecordPossession records that the caller streamed the bytes of the
// pending intent op and hashed them to d, size bytes (S9): from then on a
// retried close, the home's forwarded finalization or the finalize job
// may publish it. v, when set, is the verification of the placement those
// bytes landed in, recorded in the same transaction (VerifyPlacement,
// whose errors it returns). Errors: not_found; conflict (ErrIntentClosed)
// when op is not pending or claims other content.
func (s *Store) RecordPossession(ctx context.Context, op string, d blobplane.Digest, size int64, v *upload.Verification) error {
	return s.recordPossession(ctx, op, d, size, v, true)
}

// recordPossession records v (when set) and op's possession of d, in one
// transaction; strict: an intent that cannot take it is an error (else it
// is left as it is, and v recorded alone).
func (s *Store) recordPossession(ctx context.Context, op string, d blobplane.Digest, size int64, v *upload.Verification, strict bool) error {
	id, err := parseOpID(op)
	if err != nil {
		if !strict && v != nil {
			_, err = s.VerifyPlacement(ctx, v.Key, v.Digest, v.Size, v.Epoch)
		}
		return err
	}
	if v != nil {
		if err := s.ensurePlacements(ctx); err != nil {
			return err
		}
	}
	var mismatch error
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if v != nil {
			p, err := s.verifyTx(ctx, tx, v.Key, v.Digest, v.Size, v.Epoch, v.Hashed)
			if err != nil && blobplane.ErrorCode(err) == blobplane.CodeMismatch && p.State == placement.Failed {
				mismatch = err // commit the failed row, prove nothing
				return nil
			}
			if err != nil {
				return err
			}
		}
		n, err := s.q.RecordPossession(ctx, tx, dbsqlc.RecordPossessionParams{OperationID: id, Digest: string(d), SizeBytes: size})
		if err == nil && n == 0 && strict {
			err = errNoPossession
		}
		return err
	})
	switch {
	case mismatch != nil:
		return mismatch
	case errors.Is(err, errNoPossession):
		return s.claimRefused(ctx, op, id, d, size)
	case err != nil:
		return placementErr("record possession", err)
	}
	return nil
}

var errNoPossession = errors.New("no pending intent claims the content")

// AbandonIntent moves a pending intent to abandoned, deciding on the locked
// row: it cannot overlap a publication of the same intent (S5). Content the
// intent closed but never published is handed back to the collector in the
// same transaction (see handBack). The caller
// deletes staged bytes only after this returns. Errors: not_found; conflict
// (ErrIntentClosed) when the intent is already admitted or abandoned.
func (s *Store) AbandonIntent(ctx context.Context, op string) (upload.Intent, error) {
	id, err := parseOpID(op)
	if err != nil {
		return upload.Intent{}, err
	}
	var row dbsqlc.Intent
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if row, err = s.q.AbandonIntent(ctx, tx, id); err != nil {
			return err
		}
		return s.handBack(ctx, tx, row)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return upload.Intent{}, s.notPending(ctx, "abandon intent", id)
	}
	if err != nil {
		return upload.Intent{}, dbErr("abandon intent", err)
	}
	return intentFromRow(row), nil
}

// notPending explains why a pending-only write touched no row.
func (s *Store) notPending(ctx context.Context, op string, id pgtype.UUID) error {
	cur, err := s.q.GetIntent(ctx, s.pool, id)
	if err != nil {
		return dbErr(op, err)
	}
	if upload.IntentState(cur.State) == upload.IntentPending {
		return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: fmt.Sprintf("upload %s: staged at another location", id.String())}
	}
	return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: fmt.Sprintf("upload %s is %s", id.String(), cur.State), Err: upload.ErrIntentClosed}
}

// Finalize publishes an admitted upload at the repository's authority home,
// deciding in one transaction on the intent's row, locked FOR UPDATE (a
// publication and an abandonment of one intent cannot both happen, S5).
// A retry of an operation id that already published returns the stored
// outcome and changes nothing (S4). Otherwise it validates, in the spec's
// order: the authority fence (ErrAuthorityUnassigned, ErrAuthorityFence),
// content identity (ErrContentIdentity), a verified placement
// (ErrNoVerifiedPlacement), write access of the intent's principal
// (ErrWriteRevoked), then that the intent is not abandoned
// (ErrIntentClosed). It re-checks the lease under FOR SHARE while it
// ensures the blob state row, so a transfer cannot slip in before the
// commit (obliterated: ErrObliterated; collected with no placement
// verified since: ErrCollected, retryable), then inserts the reference,
// enqueues replication, stores the outcome and admits the intent. A
// refusal stores no outcome.
//
// With req.Verify set, the placement's verification is recorded in the
// publishing transaction, after the intent's lock (the order a close
// takes them in: claim, then stage), so a close pays one synchronous
// commit instead of two (docs/performance.md). It is recorded whatever
// the publication's fate: on a refusal or any error the transaction rolls
// back and the verification is recorded on its own; an error of the
// verification itself (e.g. digest_mismatch) is then what Finalize
// returns, as a separate VerifyPlacement before it would have.
//
// Round trips: one for BEGIN, FinalizeContext (the intent's lock and
// everything the checks read), [the verification,] EnsureBlobUnderLease
// and Publish (reference, admission and outcome), which queueFinalize
// pipelines and the checks then decide on; [replication;]
// [req.BeforeCommit;] COMMIT.
//
// While this Store already has two publishing transactions in flight, a
// Finalize queues and is published with the others queued meanwhile in
// one transaction: each with its own statements and checks, one COMMIT
// for all; any refusal or error in the batch rolls it back and each of
// its calls then runs alone (finalize_batch.go). Its answer is the same
// either way.
// Other errors: not_found (unknown operation), invalid, unavailable.
func (s *Store) Finalize(ctx context.Context, req upload.FinalizeRequest) (upload.Outcome, error) {
	return s.finalizeWith(ctx, req, s.finalize)
}

// finalizeWith is Finalize with run as its transaction (finalize, or a
// chained close's, chain.go): req.BeforeCommit runs once, and a
// verification that run did not record is recorded alone.
func (s *Store) finalizeWith(ctx context.Context, req upload.FinalizeRequest, run func(context.Context, upload.FinalizeRequest) (upload.Outcome, bool, error)) (upload.Outcome, error) {
	if before := req.BeforeCommit; before != nil {
		var once sync.Once
		var berr error
		req.BeforeCommit = func() error {
			once.Do(func() { berr = before() })
			return berr
		}
	}
	out, verified, err := run(ctx, req)
	if (req.Verify != nil && !verified) || (req.Proven && err != nil) {
		if req.BeforeCommit != nil {
			if berr := req.BeforeCommit(); berr != nil {
				return upload.Outcome{}, berr
			}
		}
		v := req.Verify
		if verified {
			v = nil
		}
		// The verification's error is the answer, as a VerifyPlacement
		// before Finalize would have been; an intent that cannot take the
		// possession (closed, other content) keeps Finalize's refusal.
		var perr error
		switch {
		case req.Proven && err != nil:
			perr = s.recordPossession(ctx, req.OperationID, req.Digest, req.Size, v, false)
		case v != nil:
			_, perr = s.VerifyPlacement(ctx, v.Key, v.Digest, v.Size, v.Epoch)
		}
		if perr != nil {
			return upload.Outcome{}, perr
		}
	}
	return out, err
}

// finalize is Finalize; verified reports that req.Verify was recorded in
// its committed transaction.
func (s *Store) finalize(ctx context.Context, req upload.FinalizeRequest) (out upload.Outcome, verified bool, err error) {
	id, err := parseOpID(req.OperationID)
	if err != nil {
		return upload.Outcome{}, false, err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return upload.Outcome{}, false, err
	}
	c := &finalizeCall{req: req, id: id}
	if out, verified, err = s.finalizeBatched(ctx, c); err != nil {
		var e *blobplane.Error
		if errors.As(err, &e) {
			return upload.Outcome{}, false, err
		}
		return upload.Outcome{}, false, dbErr("finalize "+req.OperationID, err)
	}
	return out, verified, nil
}

// finalizeCall is one Finalize: its request and, once queueFinalize's
// statements were sent, their answers.
type finalizeCall struct {
	req upload.FinalizeRequest
	id  pgtype.UUID

	fc             dbsqlc.FinalizeContextRow
	fcErr          error
	pipelineVerify bool // VerifyPendingPlacement was queued
	vrow           dbsqlc.Placement
	vErr           error
	blob           dbsqlc.Blob // EnsureBlobUnderLease; blobErr pgx.ErrNoRows: the lease moved
	blobErr        error
	pub            dbsqlc.PublishRow // pgx.ErrNoRows: the intent was not pending, or no blob row
	pubErr         error

	// A batch's answer (finalize_batch.go).
	out      upload.Outcome
	verified bool
}

// queueFinalize queues c's statements on b, in the order the checks would
// take the locks in: FinalizeContext (the intent's lock), req.Verify's
// common case (pending -> verified), EnsureBlobUnderLease and Publish.
// decide then decides on their answers; every write it refuses is rolled
// back with the transaction.
func (s *Store) queueFinalize(ctx context.Context, b *pgx.Batch, c *finalizeCall) error {
	req := c.req
	result, err := publishResult(req)
	if err != nil {
		return err
	}
	queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.FinalizeContextRow, error) {
		return s.q.FinalizeContext(ctx, db, dbsqlc.FinalizeContextParams{
			OperationID: c.id, PartitionID: req.Partition, Digest: string(req.Digest), SizeBytes: req.Size,
		})
	}, &c.fc, &c.fcErr)
	v := req.Verify
	c.pipelineVerify = pipelinable(req)
	if c.pipelineVerify {
		queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.Placement, error) {
			return s.q.VerifyPendingPlacement(ctx, db, dbsqlc.VerifyPendingPlacementParams{
				Digest: string(v.Key.Digest), Backend: v.Key.Backend, Datacenter: v.Key.Datacenter, Location: v.Key.Location,
				SizeBytes: v.Size, Epoch: v.Epoch,
			})
		}, &c.vrow, &c.vErr)
	}
	queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.Blob, error) {
		return s.q.EnsureBlobUnderLease(ctx, db, dbsqlc.EnsureBlobUnderLeaseParams{
			Digest: string(req.Digest), SizeBytes: req.Size, PartitionID: req.Partition, Node: req.Node, Epoch: int64(req.Epoch),
		})
	}, &c.blob, &c.blobErr)
	queueRow(b, func(db dbsqlc.DBTX) (dbsqlc.PublishRow, error) {
		return s.q.Publish(ctx, db, dbsqlc.PublishParams{
			OperationID: c.id, Digest: string(req.Digest), SizeBytes: req.Size, Result: result, Targets: req.Targets,
		})
	}, &c.pub, &c.pubErr)
	return nil
}

// newOperationID draws a random (version 4) operation id.
func newOperationID() (pgtype.UUID, error) {
	var id pgtype.UUID
	if _, err := rand.Read(id.Bytes[:]); err != nil {
		return id, err
	}
	id.Bytes[6] = id.Bytes[6]&0x0f | 0x40 // version 4
	id.Bytes[8] = id.Bytes[8]&0x3f | 0x80 // RFC 4122 variant
	id.Valid = true
	return id, nil
}

// publishResult is Publish's outcome for req, less what the statement
// fills in (repository, replication targets, new_reference) and the
// publication time.
func publishResult(req upload.FinalizeRequest) ([]byte, error) {
	return json.Marshal(upload.Outcome{OperationID: req.OperationID, Digest: req.Digest, Size: req.Size, Partition: req.Partition, Epoch: req.Epoch})
}

// pipelinable reports whether req's verification is the common case
// queueFinalize sends with its other statements (VerifyPendingPlacement).
func pipelinable(req upload.FinalizeRequest) bool {
	v := req.Verify
	return v != nil && v.Digest == v.Key.Digest && checkTransition(v.Key, v.Epoch) == nil
}

// finalizeAlone runs one Finalize in its own transaction: BEGIN and
// queueFinalize's statements in the first round trip, decide, then
// req.BeforeCommit and COMMIT, the second (docs/performance.md).
func (s *Store) finalizeAlone(ctx context.Context, c *finalizeCall) (out upload.Outcome, verified bool, err error) {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(genericPlans)
	if err := s.queueFinalize(ctx, &b, c); err != nil {
		return upload.Outcome{}, false, err
	}
	br := s.pool.SendBatch(ctx, &b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := br.Close(); err != nil {
		return upload.Outcome{}, false, err
	}
	if out, verified, err = s.decide(ctx, tx, c); err != nil {
		return upload.Outcome{}, false, err
	}
	if c.req.BeforeCommit != nil {
		if err := c.req.BeforeCommit(); err != nil {
			return upload.Outcome{}, false, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return upload.Outcome{}, false, err
	}
	return out, verified, nil
}

// decide validates c on its statements' answers, in the spec's order (see
// Finalize), running on tx whatever the common case did not cover (a
// stored outcome, the general verification, the revival of a collected
// row) and enqueueing replication. It returns the publication's outcome
// and whether req.Verify is recorded in tx; an error is a refusal or a
// failure, and tx must then roll back.
func (s *Store) decide(ctx context.Context, tx pgx.Tx, c *finalizeCall) (out upload.Outcome, verified bool, err error) {
	if c.fcErr != nil {
		return upload.Outcome{}, false, c.fcErr
	}
	req, id, fc := c.req, c.id, c.fc
	pv := pipelinedVerify{done: c.pipelineVerify && !errors.Is(c.vErr, pgx.ErrNoRows)}
	if pv.done {
		pv.row, pv.err = placementFromRow(c.vrow), c.vErr
	}
	if upload.IntentState(fc.Intent.State) == upload.IntentAdmitted { // a retry, or a concurrent finalization that won
		o, _, err := s.outcome(ctx, tx, id)
		return o, false, err
	}
	intent := intentFromRow(fc.Intent)

	// 1. Authority fence; 2. content identity.
	if err := checkFenceAndContent(req, fc, intent); err != nil {
		return upload.Outcome{}, false, err
	}
	// 3. A verified placement somewhere in the topology: one exists,
	// or the verification recorded here makes one.
	if verified, err = s.checkVerified(ctx, tx, c, pv); err != nil {
		return upload.Outcome{}, false, err
	}
	// 4. Write access; 5. possession; then not abandoned.
	if err := checkAdmission(req, fc, intent); err != nil {
		return upload.Outcome{}, false, err
	}
	if err := s.checkBlob(ctx, tx, c); err != nil {
		return upload.Outcome{}, false, err
	}
	stored, err := s.admit(ctx, tx, c, intent)
	if err != nil {
		return upload.Outcome{}, false, err
	}
	return stored, verified, nil
}

// checkFenceAndContent is decide's first two checks, in the spec's
// order: the authority fence, then content identity.
func checkFenceAndContent(req upload.FinalizeRequest, fc dbsqlc.FinalizeContextRow, intent upload.Intent) error {
	op := req.OperationID
	// 1. Authority fence.
	if req.Epoch == 0 || req.Epoch > math.MaxInt64 {
		return refusal(blobplane.CodeStaleEpoch, op, upload.ErrAuthorityFence, "epoch %d is not a lease epoch", req.Epoch)
	}
	if !fc.LeaseOwner.Valid {
		return refusal(blobplane.CodeUnavailable, op, upload.ErrAuthorityUnassigned, "partition %q has no authority yet", req.Partition)
	}
	if fc.LeaseOwner.String != req.Node || uint64(fc.LeaseEpoch.Int64) != req.Epoch {
		return refusal(blobplane.CodeStaleEpoch, op, upload.ErrAuthorityFence, "partition %q is held at epoch %d, not by %s at epoch %d", req.Partition, fc.LeaseEpoch.Int64, req.Node, req.Epoch)
	}
	// 2. Content identity.
	if req.Digest == "" || intent.ExpectedDigest != req.Digest || intent.ExpectedSize != req.Size {
		return refusal(blobplane.CodeMismatch, op, upload.ErrContentIdentity, "content %s (%d bytes) differs from the upload's %s (%s bytes)",
			req.Digest, req.Size, intent.ExpectedDigest, sizeText(fc.Intent.ExpectedSize))
	}
	return nil
}

// checkVerified is decide's third check: a verified placement of the
// content exists, or req.Verify's verification, recorded here (or
// pipelined, pv), makes one; verified reports that it was recorded.
func (s *Store) checkVerified(ctx context.Context, tx pgx.Tx, c *finalizeCall, pv pipelinedVerify) (verified bool, err error) {
	req, fc, op := c.req, c.fc, c.req.OperationID // fc a copy: its Verified is this decision's
	if v := req.Verify; v != nil {
		p, err := pv.row, pv.err
		if !pv.done {
			p, err = s.verifyTx(ctx, tx, v.Key, v.Digest, v.Size, v.Epoch, v.Hashed)
		}
		if err != nil {
			return false, err
		}
		verified = true
		fc.Verified = fc.Verified || (p.State == placement.Verified && p.Key.Digest == req.Digest && p.Size == req.Size)
	}
	if !fc.Verified {
		return verified, refusal(blobplane.CodeUnavailable, op, upload.ErrNoVerifiedPlacement, "no verified placement of %s (%d bytes) exists", req.Digest, req.Size)
	}
	return verified, nil
}

// checkAdmission is decide's checks on the intent's principal and row:
// write access, possession, not abandoned.
func checkAdmission(req upload.FinalizeRequest, fc dbsqlc.FinalizeContextRow, intent upload.Intent) error {
	op := req.OperationID
	// 4. The principal still has write access.
	grants, err := grantsFromTexts(fc.PrincipalGrants)
	if err != nil {
		return err
	}
	principal := auth.Principal{Name: intent.Principal, Grants: grants}
	if !principal.Allowed(intent.Repository, auth.Write) {
		return refusal(blobplane.CodeForbidden, op, upload.ErrWriteRevoked, "principal %s no longer has write access to %s", intent.Principal, intent.Repository)
	}
	// 5. Possession (S9, issue 26): the verified placement above proves
	// the content exists, not that this intent holds it.
	if err := checkPossession(op, req, intent, principal, fc.MountSourceReferences); err != nil {
		return err
	}
	// Decided on the locked row: an abandonment and this publication
	// cannot both happen (S5).
	if intent.State == upload.IntentAbandoned {
		return refusal(blobplane.CodeConflict, op, upload.ErrIntentClosed, "upload %s was abandoned; it can no longer publish", op)
	}

	return nil
}

// checkBlob is decide's checks on the blob state row.
func (s *Store) checkBlob(ctx context.Context, tx pgx.Tx, c *finalizeCall) error {
	req, b, op := c.req, c.blob, c.req.OperationID
	// The lease under FOR SHARE, so a transfer cannot slip in before
	// this commit, and the blob state row (EnsureBlobUnderLease,
	// pipelined by queueFinalize).
	if err := c.blobErr; errors.Is(err, pgx.ErrNoRows) {
		return refusal(blobplane.CodeStaleEpoch, op, upload.ErrAuthorityFence, "partition %q moved past epoch %d before publication", req.Partition, req.Epoch)
	} else if err != nil {
		return err
	}
	if b.State == "obliterated" {
		return refusal(blobplane.CodeConflict, op, upload.ErrObliterated, "%s was obliterated; it cannot be published again", req.Digest)
	}
	if b.State == "collected" {
		// Collected after the context was read: its placements were
		// revoked and its bytes are (being) deleted. Only a placement
		// that verified since (re-staged, so its deletion is
		// superseded) holds the bytes; then publication revives the
		// row (S1).
		if err := s.reviveCollected(ctx, tx, op, req.Digest, req.Size); err != nil {
			return err
		}
	}
	if b.SizeBytes != req.Size {
		return refusal(blobplane.CodeMismatch, op, upload.ErrContentIdentity, "%s is recorded with %d bytes, not %d", req.Digest, b.SizeBytes, req.Size)
	}
	return nil
}

// admit is decide's end: the publication's stored outcome, with its
// replication work enqueued in tx.
func (s *Store) admit(ctx context.Context, tx pgx.Tx, c *finalizeCall, intent upload.Intent) (upload.Outcome, error) {
	req, id, op := c.req, c.id, c.req.OperationID
	// Publish wrote the reference, the outcome and the transition to
	// admitted; with the replication work this one commit is the
	// spec's commit boundary. Its stored outcome names the targets.
	if c.pubErr != nil {
		return upload.Outcome{}, errors.Join(c.pubErr, fmt.Errorf("admit intent %s", op))
	}
	stored, err := decodeOutcome(id, c.pub.Result, c.pub.PublishedAt)
	if err != nil {
		return upload.Outcome{}, err
	}
	if targets := stored.ReplicationTargets; len(targets) > 0 { // single-datacenter runs enqueue nothing nobody could work
		if req.Replication == nil {
			return upload.Outcome{}, &blobplane.Error{Code: blobplane.CodeInternal, Op: "finalize " + op, Message: upload.ErrNoEnqueuer.Error(), Err: upload.ErrNoEnqueuer}
		}
		if err := req.Replication.EnqueueReplicationTx(ctx, tx, upload.Replication{
			OperationID: op, Digest: req.Digest, Size: req.Size, SourceDatacenter: intent.IngressDatacenter, Targets: targets,
		}); err != nil {
			return upload.Outcome{}, err
		}
	}
	return stored, nil
}

// checkPossession is Finalize's possession rule (S9, issue 26): the
// caller hashed this intent's bytes itself (req.Proven), or the intent
// recorded that it did (PossessionUploaded), or it is a mount whose source
// still references the digest (sourceRefs) and which its principal can
// still read.
func checkPossession(op string, req upload.FinalizeRequest, in upload.Intent, p auth.Principal, sourceRefs bool) error {
	switch {
	case req.Proven || in.Possession == upload.PossessionUploaded:
		return nil
	case in.Possession == upload.PossessionMounted:
		if !sourceRefs || !p.Allowed(in.MountedFrom, auth.Read) {
			return refusal(blobplane.CodeForbidden, op, upload.ErrMountSource, "the mount source %s does not grant %s to %s", in.MountedFrom, req.Digest, p.Name)
		}
		return nil
	}
	return refusal(blobplane.CodeInvalid, op, upload.ErrNotProven, "upload %s never sent bytes that hash to %s; send the blob", op, req.Digest)
}

// pipelinedVerify is the answer of the verification queueFinalize
// pipelines (VerifyPendingPlacement); done is false when it sent none or
// the row was not in the common case, and decide runs verifyTx.
type pipelinedVerify struct {
	row  placement.Placement
	err  error
	done bool
}

// Outcome returns the stored outcome of operation op. Errors: not_found
// when op has not published (yet, or ever).
func (s *Store) Outcome(ctx context.Context, op string) (upload.Outcome, error) {
	id, err := parseOpID(op)
	if err != nil {
		return upload.Outcome{}, err
	}
	o, ok, err := s.outcome(ctx, s.pool, id)
	if err == nil && !ok {
		err = &blobplane.Error{Code: blobplane.CodeNotFound, Op: "get outcome", Message: fmt.Sprintf("operation %s has no outcome", op)}
	}
	return o, err
}

func (s *Store) outcome(ctx context.Context, db dbsqlc.DBTX, id pgtype.UUID) (upload.Outcome, bool, error) {
	row, err := s.q.GetOutcome(ctx, db, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return upload.Outcome{}, false, nil
	}
	if err != nil {
		return upload.Outcome{}, false, dbErr("get outcome", err)
	}
	o, err := decodeOutcome(id, row.Result, row.PublishedAt)
	return o, err == nil, err
}

// decodeOutcome reads a stored outcome row's result and publication time.
func decodeOutcome(id pgtype.UUID, result []byte, publishedAt pgtype.Timestamptz) (upload.Outcome, error) {
	var o upload.Outcome
	if err := json.Unmarshal(result, &o); err != nil {
		return upload.Outcome{}, blobplane.Wrap(blobplane.CodeInternal, err, "stored outcome of %s is malformed", id.String())
	}
	o.PublishedAt = publishedAt.Time
	return o, nil
}

// ReferencedBlob answers existence for HEAD from Postgres alone: the size
// of d when repository references it and it is live. Errors: not_found
// otherwise.
//
// With the existence cache running (StartCaches; the API does), a found
// answer is cached and served without a query until a committed reference
// deletion or blob state change anywhere notifies RefsChannel (at once
// after DeleteReference through this Store), or the TTL passes. Not found
// and errors are never cached.
func (s *Store) ReferencedBlob(ctx context.Context, repository string, d blobplane.Digest) (int64, error) {
	cache := s.existenceCache.Load()
	size, hit, ticket := cache.lookup(repository, d) // the ticket is taken before the query: see notifycache.Cache
	if hit {
		return size, nil
	}
	row, err := s.q.GetReferencedBlob(ctx, s.pool, dbsqlc.GetReferencedBlobParams{Repository: repository, Digest: string(d)})
	if err != nil {
		return 0, dbErr("referenced blob", err)
	}
	cache.insert(ticket, repository, d, row.SizeBytes)
	return row.SizeBytes, nil
}

// DeleteReference removes repository's reference to d (not the bytes, not
// the blob state row). Errors: not_found when there is none.
func (s *Store) DeleteReference(ctx context.Context, repository string, d blobplane.Digest) error {
	n, err := s.q.DeleteReference(ctx, s.pool, dbsqlc.DeleteReferenceParams{Repository: repository, Digest: string(d)})
	if err != nil {
		// Unknown outcome: the deletion may have committed.
		s.invalidateExistenceCache()
		return dbErr("delete reference", err)
	}
	if n == 0 {
		// Nothing removed, nothing to forget: a DELETE of a reference one
		// does not have must not empty every api's existence cache (issue
		// 26 point 12; the statement's trigger notifies only for rows it
		// deleted).
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: "delete reference", Message: "blob unknown to repository"}
	}
	s.invalidateExistenceCache() // this process's next HEAD sees it without waiting for the notification
	return nil
}

func hasVerified(ps []placement.Placement, size int64) bool {
	for _, p := range ps {
		if p.State == placement.Verified && p.Size == size {
			return true
		}
	}
	return false
}

func parseOpID(op string) (pgtype.UUID, error) {
	var id pgtype.UUID
	if len(op) != 36 || id.Scan(op) != nil {
		return id, &blobplane.Error{Code: blobplane.CodeNotFound, Op: "parse operation id", Message: fmt.Sprintf("unknown operation %q", truncateID(op))}
	}
	return id, nil
}

func truncateID(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

func optText(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }

func sizeText(v pgtype.Int8) string {
	if !v.Valid {
		return "unknown"
	}
	return fmt.Sprint(v.Int64)
}

func intentFromRow(r dbsqlc.Intent) upload.Intent {
	in := upload.Intent{
		OperationID: r.OperationID.String(), Repository: r.Repository, Principal: r.Principal,
		ExpectedDigest: blobplane.Digest(r.ExpectedDigest.String), ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: r.IngressDatacenter, Backend: r.Backend, StagedLocation: r.StagedLocation.String,
		State: upload.IntentState(r.State), ReceivedBytes: r.ReceivedBytes,
		CreatedAt: r.CreatedAt.Time, UpdatedAt: r.UpdatedAt.Time, ExpiresAt: r.ExpiresAt.Time,
	}
	if r.ExpectedSize.Valid {
		in.ExpectedSize = r.ExpectedSize.Int64
	}
	in.Possession, in.MountedFrom = r.Possession.String, r.MountedFrom.String
	if r.AcceptedAt.Valid {
		in.AcceptedAt = r.AcceptedAt.Time
	}
	return in
}
