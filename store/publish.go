package store

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/upload"
)

// Publication (Finalize): one decision function, decide, for a call
// alone and in a batch (finalize_batch.go).

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
		// The mark holds (store/obliterate.go): locked here, so an
		// obliteration committed before this publication's lock refuses
		// it, and one after deletes its reference.
		return refusal(blobplane.CodeConflict, op, upload.ErrObliterated, "%s", upload.ObliteratedMessage(req.Digest))
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
