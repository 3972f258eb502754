package store

import (
	"context"
	"errors"
	"fmt"
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
// error: alreadyVerified, whatever its epoch. A failed or revoked row is
// taken over at its own epoch (an equal epoch applies), so an upload can
// always store the bytes of a copy that was lost, corrupt or reclaimed,
// even one a transfer or a read failed under a newer epoch (issue 29: the
// "re-put is a no-op" trap, ADR-00018); the close verifies under that
// epoch (Stage.Epoch). A pending row under a newer epoch is a transfer
// into this datacenter in flight: stale_epoch, retryable, and the retry
// finds it verified.
func (s *Store) restageClaimed(ctx context.Context, k placement.Key, size int64) (st upload.Stage, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL synchronous_commit = off"}, func(tx pgx.Tx) error {
		if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(k.Digest)}); err != nil {
			return err
		}
		var epoch int64
		cur, err := s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k)))
		switch {
		case err == nil && placement.State(cur.State) == placement.Verified:
			st = upload.Stage{Generation: cur.Generation, Epoch: cur.Epoch, AlreadyVerified: true}
			return nil
		case err == nil && (placement.State(cur.State) == placement.Failed || placement.State(cur.State) == placement.Revoked):
			epoch = cur.Epoch
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		p, err := s.restageLockedTx(ctx, tx, k, size, epoch)
		st = upload.Stage{Generation: p.Generation, Epoch: epoch}
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

// PendingPublication is one repository's uploads accepted (202) and not
// yet published at its home: work its partition has to consume (ZBP-5
// R138).
type PendingPublication struct {
	Repository string
	Count      int
	// OldestAge is how long the oldest has waited, on the database's
	// clock.
	OldestAge time.Duration
}

// PendingPublications returns up to 10,000 repositories with uploads
// accepted and not yet published.
func (s *Store) PendingPublications(ctx context.Context) ([]PendingPublication, error) {
	rows, err := s.q.PendingPublicationsByRepository(ctx, s.pool, 10000)
	if err != nil {
		return nil, dbErr("store.PendingPublications", err)
	}
	out := make([]PendingPublication, len(rows))
	for i, r := range rows {
		out[i] = PendingPublication{Repository: r.Repository, Count: int(r.Pending), OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second))}
	}
	return out, nil
}
