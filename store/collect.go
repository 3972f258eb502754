package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Collection of unreferenced content and the inventory's ownership checks
// (issue 7, DESIGN flow 5, S1, S6, L1; docs/sweeps.md).
//
// Ownership of a content-addressed key is a refcount over live references
// plus claims: a pending intent whose expected digest names it, or a
// pending placement of it (a close in progress: the close path stages the
// placement before it promotes bytes to the key). Abandoning one attempt
// never deletes another's bytes, because nothing is deleted while anything
// owns the key.
//
// The decision is made in Postgres first, on the blob state row, the row a
// publication locks in EnsureBlob. CollectUnreferenced locks a candidate
// FOR UPDATE SKIP LOCKED, takes the digest's placement lock (the advisory
// lock StagePlacement takes), re-checks ownership with fresh statements,
// then in the same transaction marks the row collected, revokes every
// placement (reclamation), writes one deletion record per revoked placement
// and enqueues the byte-deletion jobs. Bytes go only after that commit.
//
// A publication that locks the row after the decision finds it collected:
// it revives the row only if a placement verified again since (a new upload
// re-staged and re-stored the bytes: a re-staged placement is no longer
// revoked, so its pending deletion is superseded), and is otherwise refused
// retryably (ErrCollected). It never references deleted bytes (S1).
//
// Bytes are deleted only while the digest's placement lock is held and
// only when the placement is still revoked and nothing owns the digest, so
// a StagePlacement of a new upload waits until the delete has finished and
// writes its bytes after it.

// ErrCollected is returned (wrapped, code unavailable, retryable) by
// Finalize when the digest was collected and no placement of it has
// verified since: the client uploads the bytes again (or retries once a
// concurrent upload of the same content verified).
var ErrCollected = errors.New("the digest was collected; upload its bytes again")

// DeletionEnqueuer inserts byte-deletion work in the transaction that
// decides a collection, so the jobs exist exactly when the decision does
// and run only after it commits. jobs.Deletion implements it.
type DeletionEnqueuer interface {
	// EnqueueDeletionsTx inserts one job per deletion in tx. An error
	// rolls the decision back.
	EnqueueDeletionsTx(ctx context.Context, tx pgx.Tx, ds []Deletion) error
}

// Deletion is the durable record of one placement whose bytes a collection
// decided to delete.
type Deletion struct {
	ID        int64
	Key       placement.Key
	Size      int64 // content size recorded on the placement
	DecidedAt time.Time
	DeletedAt time.Time      // zero while owed
	Result    DeletionResult // "" while owed
}

// DeletionResult is how a byte deletion finished.
type DeletionResult string

const (
	// DeletionDeleted: the bytes are gone (a missing object counts).
	DeletionDeleted DeletionResult = "deleted"
	// DeletionSuperseded: the placement was re-staged or the digest owned
	// again before the job ran; the bytes were kept.
	DeletionSuperseded DeletionResult = "superseded"
	// DeletionNone: no unfinished deletion of that key (already finished).
	DeletionNone DeletionResult = ""
)

// Collected is one digest a collection decided to reclaim.
type Collected struct {
	Digest    blobplane.Digest
	Size      int64
	Deletions []Deletion
}

// CollectUnreferenced decides the collection of up to limit unowned live
// digests, in short transactions of a bounded batch (collectTxBatch), and
// enqueues their byte
// deletions with enq in the deciding transaction (nil enq enqueues nothing:
// the deletion records stay owed, see UnfinishedDeletions). Safe to run
// concurrently (SKIP LOCKED) and to re-run. Errors: invalid, unavailable.
func (s *Store) CollectUnreferenced(ctx context.Context, limit int, enq DeletionEnqueuer) ([]Collected, error) {
	const op = "collect unreferenced"
	if limit <= 0 {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "%s: limit %d must be positive", op, limit)
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return nil, err
	}
	// The pass starts where the last one stopped (collector_cursor), walks
	// to the last digest, then wraps around to where it started: a pass
	// with room for every candidate sees them all, and passes cut short by
	// their limit take turns over the key space instead of each stepping
	// over the same referenced rows from the first digest again.
	start, err := s.q.GetCollectorCursor(ctx, s.pool)
	if err != nil {
		return nil, placementErr(op, err)
	}
	var out []Collected
	after, upto := start, "" // candidates come in digest order in (after, upto]
	wrapped := start == ""
	defer func() {
		cursor := after // cut short by the limit: resume after the last candidate
		if len(out) < limit {
			cursor = "" // a whole cycle: start from the first digest
		}
		if err := s.q.SetCollectorCursor(context.WithoutCancel(ctx), s.pool, cursor); err != nil {
			s.logger.WarnContext(ctx, "cannot save the collector's cursor; the next pass starts over", "err", err)
		}
	}()
	for len(out) < limit {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		var (
			batch []Collected
			last  string
		)
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			batch, last = nil, ""
			rows, err := s.q.LockCollectCandidates(ctx, tx, dbsqlc.LockCollectCandidatesParams{After: after, Upto: upto, MaxRows: int32(min(limit-len(out), collectTxBatch))})
			if err != nil || len(rows) == 0 {
				return err
			}
			last = rows[len(rows)-1].Digest
			if batch, err = s.decideCollection(ctx, tx, rows); err != nil {
				return err
			}
			var all []Deletion
			for _, c := range batch {
				all = append(all, c.Deletions...)
			}
			if enq != nil && len(all) > 0 {
				return enq.EnqueueDeletionsTx(ctx, tx, all)
			}
			return nil
		})
		if err != nil {
			return out, placementErr(op, err)
		}
		if last == "" {
			if wrapped {
				return out, nil
			}
			wrapped, after, upto = true, "", start
			continue
		}
		out = append(out, batch...)
		after = last
	}
	return out, nil
}

// CollectCandidates lists up to limit digests a collection pass would
// decide now (`worker sweep --dry-run`): unowned live digests, from an
// unlocked read, so a pass may still find some owned. Errors: invalid,
// unavailable.
func (s *Store) CollectCandidates(ctx context.Context, limit int) ([]blobplane.Digest, error) {
	if limit <= 0 || limit > math.MaxInt32 {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "collect candidates: limit %d must be from 1 to %d", limit, math.MaxInt32)
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return nil, err
	}
	rows, err := s.q.CollectCandidates(ctx, s.pool, int32(limit))
	if err != nil {
		return nil, placementErr("collect candidates", err)
	}
	out := make([]blobplane.Digest, len(rows))
	for i, d := range rows {
		out[i] = blobplane.Digest(d)
	}
	return out, nil
}

// collectTxBatch bounds the candidates one deciding transaction locks: one
// candidate scan and one deciding statement serve up to this many
// decisions, and the row locks a re-publication of one of them may wait on
// are held this long at most (~0.1 s on the benchmark machine).
const collectTxBatch = 500

// decideCollection decides the locked candidate rows in tx: it takes their
// digests' placement locks (in digest order), then one statement, whose
// snapshot follows those locks, re-checks ownership (a reference or claim
// committed after the candidate scan's snapshot, before the row lock, is
// visible now) and, for each digest still unowned, marks the row
// collected, revokes every placement and records one deletion per revoked
// placement. Owned candidates are left alone (the pass's cursor moves past
// them).
func (s *Store) decideCollection(ctx context.Context, tx pgx.Tx, candidates []dbsqlc.LockCollectCandidatesRow) ([]Collected, error) {
	ds := make([]string, len(candidates))
	for i, c := range candidates {
		ds[i] = c.Digest
	}
	if err := s.q.LockPlacementDigests(ctx, tx, dbsqlc.LockPlacementDigestsParams{LockClass: placementDigestLockClass, Digests: ds}); err != nil {
		return nil, err
	}
	rows, err := s.q.DecideCollection(ctx, tx, ds)
	if err != nil {
		return nil, err
	}
	var out []Collected
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].Digest != blobplane.Digest(r.Digest) {
			out = append(out, Collected{Digest: blobplane.Digest(r.Digest), Size: r.BlobSize})
		}
		if !r.DeletionID.Valid {
			continue
		}
		c := &out[len(out)-1]
		c.Deletions = append(c.Deletions, Deletion{
			ID:        r.DeletionID.Int64,
			Key:       placement.Key{Digest: blobplane.Digest(r.Digest), Backend: r.Backend.String, Datacenter: r.Datacenter.String, Location: r.Location.String},
			Size:      r.DeletionSize.Int64,
			DecidedAt: r.DecidedAt.Time,
		})
	}
	return out, nil
}

// owned re-checks, inside the caller's transaction and after its locks,
// whether anything owns d: a reference, a pending intent naming it, or a
// pending placement (a close in progress).
func (s *Store) owned(ctx context.Context, tx pgx.Tx, d string) (bool, error) {
	o, err := s.q.BlobOwnership(ctx, tx, d)
	if err != nil {
		return false, err
	}
	if o.Refs > 0 || o.Claims > 0 {
		return true, nil
	}
	ps, err := s.q.ListPlacementsTx(ctx, tx, d)
	if err != nil {
		return false, err
	}
	for _, p := range ps {
		if placement.State(p.State) == placement.Pending {
			return true, nil
		}
	}
	return false, nil
}

// NotDueError is DeleteCollectedBytesAfter's answer for a deletion
// decided less than its delay ago: nothing was deleted, and it is due in
// Wait.
type NotDueError struct {
	Key  placement.Key
	Wait time.Duration
}

func (e *NotDueError) Error() string {
	return fmt.Sprintf("deletion of %s on %s/%s is not due for %s (collection delete delay)", e.Key.Digest, e.Key.Datacenter, e.Key.Backend, e.Wait.Round(time.Second))
}

// DeleteCollectedBytes is DeleteCollectedBytesAfter with no delay.
func (s *Store) DeleteCollectedBytes(ctx context.Context, k placement.Key, del func(context.Context) error) (DeletionResult, int64, error) {
	return s.DeleteCollectedBytesAfter(ctx, k, 0, del)
}

// DeleteCollectedBytesAfter finishes the owed deletion of k once it was
// decided at least delay ago by the database clock (an obliterated
// digest's at once): before that it deletes nothing and returns a
// *NotDueError. The delay keeps collected bytes for a database restored
// from a backup taken within it (issue 32, docs/database.md). While the digest's
// placement lock is held (so no upload can stage, and so write, the key
// meanwhile) it calls del only when the placement is still revoked and
// nothing owns the digest; otherwise it records the deletion superseded.
// del must treat a missing object as success; an error from del leaves the
// deletion owed and comes back unchanged (the job retries). It returns
// DeletionNone when no deletion of k is owed (a re-run). The size is the
// placement's recorded content size. Errors: those of del, unavailable.
func (s *Store) DeleteCollectedBytesAfter(ctx context.Context, k placement.Key, delay time.Duration, del func(context.Context) error) (DeletionResult, int64, error) {
	const op = "delete collected bytes"
	if err := k.Validate(); err != nil {
		return DeletionNone, 0, err
	}
	var (
		res  DeletionResult
		size int64
		delE error
		wait time.Duration
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(k.Digest)}); err != nil {
			return err
		}
		dl, err := s.q.LockUnfinishedDeletion(ctx, tx, dbsqlc.LockUnfinishedDeletionParams(keyArgs(k)))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if delay > 0 {
			secs, err := s.q.DeletionWait(ctx, tx, dbsqlc.DeletionWaitParams{DelaySeconds: delay.Seconds(), DecidedAt: dl.DecidedAt, Digest: string(k.Digest)})
			if err != nil {
				return err
			}
			if wait = time.Duration(secs * float64(time.Second)); wait > 0 {
				return nil
			}
		}
		size = dl.SizeBytes
		res = DeletionSuperseded
		cur, err := s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k)))
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if errors.Is(err, pgx.ErrNoRows) || (placement.State(cur.State) == placement.Revoked && cur.RevokeReason.String == string(placement.Reclamation)) {
			owned, err := s.owned(ctx, tx, string(k.Digest))
			if err != nil {
				return err
			}
			if !owned {
				if delE = del(ctx); delE != nil {
					return delE
				}
				res = DeletionDeleted
			}
		}
		return s.q.FinishDeletion(ctx, tx, dbsqlc.FinishDeletionParams{ID: dl.ID, Result: optText(string(res))})
	})
	if delE != nil {
		return DeletionNone, 0, delE
	}
	if err != nil {
		return DeletionNone, 0, placementErr(op, err)
	}
	if wait > 0 {
		return DeletionNone, 0, &NotDueError{Key: k, Wait: wait}
	}
	return res, size, nil
}

// UnfinishedDeletions returns up to limit owed deletions, oldest first: a
// pass re-enqueues them (jobs are unique by key) and reports the age of the
// oldest. Errors: unavailable.
func (s *Store) UnfinishedDeletions(ctx context.Context, limit int) ([]Deletion, error) {
	rows, err := s.q.UnfinishedDeletions(ctx, s.pool, int32(min(limit, 1<<20)))
	if err != nil {
		return nil, dbErr("unfinished deletions", err)
	}
	out := make([]Deletion, len(rows))
	for i, r := range rows {
		out[i] = deletionFromRow(r)
	}
	return out, nil
}

// ObjectClass is the inventory's classification of one stored object.
type ObjectClass string

const (
	// ClassReferenced: at least one repository references the digest.
	ClassReferenced ObjectClass = "referenced"
	// ClassClaimed: an unfinished (pending) intent names the digest.
	ClassClaimed ObjectClass = "claimed"
	// ClassStaged: unreferenced and unclaimed, but the ledger holds a
	// pending placement of it on this backend (a write in progress), or a
	// verified one of a digest with a live blob row: content the
	// collector (not the inventory) reclaims.
	ClassStaged ObjectClass = "staged"
	// ClassUnowned: unreferenced and unclaimed, a verified placement on
	// this backend, but no blob row to collect it (or a collected one):
	// an upload abandoned after its verification committed. The
	// inventory hands it back to the collector (Store.HandBack) rather
	// than deleting it: the collector revokes the placement before the
	// bytes go, so no verified placement ever points at deleted bytes.
	ClassUnowned ObjectClass = "unowned"
	// ClassUnrecorded: a repository references the digest, its blob is
	// live, and the ledger has no placement of it on this backend at
	// all: a copy the database lost (restored to before the copy was
	// made, issue 32). Kept; the inventory re-hashes it and records it as
	// verified (Store.RediscoverPlacement).
	ClassUnrecorded ObjectClass = "unrecorded"
	// ClassOrphan: nothing in Postgres accounts for the bytes (a crash
	// between byte write and ledger write, a lost reply, a collected
	// digest whose deletion is still owed).
	ClassOrphan ObjectClass = "orphan"
)

// ClassifyObject classifies the object for d on backend in datacenter from
// one unlocked read. Errors: invalid, unavailable.
func (s *Store) ClassifyObject(ctx context.Context, d blobplane.Digest, backend, datacenter string) (ObjectClass, error) {
	if err := s.ensurePlacements(ctx); err != nil {
		return "", err
	}
	var c ObjectClass
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		c, err = s.classify(ctx, tx, string(d), backend, datacenter)
		return err
	})
	if err != nil {
		return "", placementErr("classify object", err)
	}
	return c, nil
}

// ClassifyObjects classifies a page of objects for ds on backend in
// datacenter from one unlocked read (one statement), in the order of ds.
// Errors: invalid, unavailable.
func (s *Store) ClassifyObjects(ctx context.Context, ds []blobplane.Digest, backend, datacenter string) ([]ObjectClass, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return nil, err
	}
	in := make([]string, len(ds))
	for i, d := range ds {
		in[i] = string(d)
	}
	rows, err := s.q.ClassifyObjects(ctx, s.pool, dbsqlc.ClassifyObjectsParams{Backend: backend, Datacenter: datacenter, Digests: in})
	if err != nil {
		return nil, placementErr("classify objects", err)
	}
	if len(rows) != len(ds) {
		return nil, &blobplane.Error{Code: blobplane.CodeInternal, Op: "classify objects", Message: fmt.Sprintf("%d classes for %d objects", len(rows), len(ds))}
	}
	out := make([]ObjectClass, len(rows))
	for i, r := range rows {
		if r.Digest != in[i] {
			return nil, &blobplane.Error{Code: blobplane.CodeInternal, Op: "classify objects", Message: "classes out of order"}
		}
		out[i] = ObjectClass(r.Class)
	}
	return out, nil
}

// DeleteIfOrphan re-classifies the object for d on backend in datacenter
// under the blob state row lock (when the row exists) and the digest's
// placement lock, and calls del while they are held only when it is still
// an orphan, so a concurrent publication or upload of the same content
// wins. It returns the class found under the locks. Errors: those of del,
// invalid, unavailable.
func (s *Store) DeleteIfOrphan(ctx context.Context, d blobplane.Digest, backend, datacenter string, del func(context.Context) error) (ObjectClass, error) {
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return "", err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return "", err
	}
	var (
		c    ObjectClass
		delE error
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Same order as the collector: blob row, then placement lock.
		if _, err := s.q.LockBlobIfExists(ctx, tx, string(d)); err != nil {
			return err
		}
		if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(d)}); err != nil {
			return err
		}
		var err error
		if c, err = s.classify(ctx, tx, string(d), backend, datacenter); err != nil || c != ClassOrphan {
			return err
		}
		delE = del(ctx)
		return delE
	})
	if delE != nil {
		return c, delE
	}
	if err != nil {
		return "", placementErr("delete orphan", err)
	}
	return c, nil
}

// RediscoverPlacement records k, a copy the ledger lost, as verified:
// its bytes were just read whole from k and hashed to hashed, size bytes.
// Under the blob state row lock and the digest's placement lock it
// re-classifies the object and records it only while it is still
// unrecorded (a live, referenced blob with no placement row on k's
// backend): a stage of the same key meanwhile (an upload, a transfer),
// an obliteration or a collection wins, and recorded is false. The row is
// staged and verified at epoch 1 in one transaction, so no one sees it
// pending. Errors: invalid (a malformed key, or hashed is not k's digest:
// other bytes are never recorded, S2), unavailable.
func (s *Store) RediscoverPlacement(ctx context.Context, k placement.Key, hashed blobplane.Digest, size int64) (p placement.Placement, recorded bool, err error) {
	const op = "rediscover placement"
	if err := checkTransition(k, 1); err != nil {
		return placement.Placement{}, false, err
	}
	if hashed != k.Digest || size < 0 {
		return placement.Placement{}, false, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op,
			Message: fmt.Sprintf("%s: the bytes hashed to %s (%d bytes): only the digest's own bytes are recorded", keyString(k), hashed, size)}
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return placement.Placement{}, false, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Same order as the collector and DeleteIfOrphan: blob row, then
		// placement lock.
		if _, err := s.q.LockBlobIfExists(ctx, tx, string(k.Digest)); err != nil {
			return err
		}
		if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(k.Digest)}); err != nil {
			return err
		}
		c, err := s.classify(ctx, tx, string(k.Digest), k.Backend, k.Datacenter)
		if err != nil || c != ClassUnrecorded {
			return err
		}
		if _, err := s.stageLockedTx(ctx, tx, k, size, 1); err != nil {
			return err
		}
		if p, err = s.verifyTx(ctx, tx, k, hashed, size, 1, true); err != nil {
			return err
		}
		recorded = true
		return nil
	})
	if err != nil {
		return placement.Placement{}, false, placementErr(op, err)
	}
	return p, recorded, nil
}

// classify is ClassifyObjects of one object, in tx: the page's
// statement, so the unlocked and the locked classification cannot
// disagree on what a class means.
func (s *Store) classify(ctx context.Context, tx pgx.Tx, d, backend, datacenter string) (ObjectClass, error) {
	rows, err := s.q.ClassifyObjects(ctx, tx, dbsqlc.ClassifyObjectsParams{Backend: backend, Datacenter: datacenter, Digests: []string{d}})
	if err != nil {
		return "", err
	}
	if len(rows) != 1 {
		return "", &blobplane.Error{Code: blobplane.CodeInternal, Op: "classify object", Message: fmt.Sprintf("%d classes for one object", len(rows))}
	}
	return ObjectClass(rows[0].Class), nil
}

func deletionFromRow(r dbsqlc.Deletion) Deletion {
	d := Deletion{
		ID:        r.ID,
		Key:       placement.Key{Digest: blobplane.Digest(r.Digest), Backend: r.Backend, Datacenter: r.Datacenter, Location: r.Location},
		Size:      r.SizeBytes,
		DecidedAt: r.DecidedAt.Time,
		Result:    DeletionResult(r.Result.String),
	}
	if r.DeletedAt.Valid {
		d.DeletedAt = r.DeletedAt.Time
	}
	return d
}

// reviveCollected makes a collected digest live again inside Finalize's
// transaction, which holds its blob row: only when a placement of it
// verified after the collection (the collector revoked them all, so a
// verified one was re-staged and re-stored since). Otherwise it refuses
// retryably with ErrCollected.
func (s *Store) reviveCollected(ctx context.Context, tx pgx.Tx, op string, d blobplane.Digest, size int64) error {
	rows, err := s.q.ListPlacementsTx(ctx, tx, string(d))
	if err != nil {
		return err
	}
	ps := make([]placement.Placement, len(rows))
	for i, r := range rows {
		ps[i] = placementFromRow(r)
	}
	if !hasVerified(ps, size) {
		return refusal(blobplane.CodeUnavailable, op, ErrCollected, "%s was collected and no placement of it has verified since; upload its bytes again", d)
	}
	n, err := s.q.ReviveBlob(ctx, tx, string(d))
	if err != nil || n != 1 {
		return errors.Join(err, fmt.Errorf("revive %s: %d rows", d, n))
	}
	return nil
}

// OldestOwedDeletion is the age, by the database clock, of the oldest
// unfinished deletion (0 when none). Errors: unavailable.
func (s *Store) OldestOwedDeletion(ctx context.Context) (time.Duration, error) {
	secs, err := s.q.OldestUnfinishedDeletionAge(ctx, s.pool)
	if err != nil {
		return 0, dbErr("oldest owed deletion", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
