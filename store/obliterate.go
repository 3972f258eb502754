package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Obliteration by an operator (issue 29, docs/obliteration.md,
// migration 00026, db/queries/obliterate.sql).
//
// The mark comes first (ADR-00018: "the mark must be taken before the
// association is deleted; the reverse order lets a put racing the
// obliteration re-associate the very partition being obliterated"):
// Obliterate locks the blob state row, the row every publication locks
// (EnsureBlob), sets it obliterated, records who, when and why, deletes
// every reference (a statement of its own after the lock, so it sees a
// reference committed while the mark waited) and inserts the obliterate
// job, in one transaction. A publication that locked the row first
// committed its reference before the mark, and the mark's transaction
// deletes it; one that locks the row after finds it obliterated and is
// refused (upload.ErrObliterated). Either way no reference outlives the
// mark's commit, and none can be made while it holds.
//
// The job (jobs.ObliterateWorker) then runs ObliterationSteps, each an
// idempotent transaction that first re-checks, under the blob row's
// share lock, that its mark still holds (ErrMarkGone otherwise): the
// references again, the pending uploads claiming the digest (abandoned:
// they could never publish, and their claims would keep the bytes), and
// the placements (revoked, one deletion recorded per placement and its
// delete_bytes job enqueued in that datacenter's queue). Its last step,
// SettleObliteration, repeats them all in one transaction until a pass
// finds nothing to do at least a settle period after the mark: a close
// whose claim was already in flight when the mark committed is caught by
// it (docs/obliteration.md, "The race").
//
// Unmark lifts the mark: the row becomes collected (every placement
// revoked: exactly what the collector leaves), or live while a placement
// is left unrevoked (an unfinished job's; the collector reclaims it). A
// re-upload after it stores the bytes again and revives the row, as after
// a collection: no reference survived the obliteration, so the re-put is
// never a no-op (ADR-00018's trap).

// ObliterationAction is what an audit row records.
type ObliterationAction string

const (
	// ActionObliterate: the mark was taken.
	ActionObliterate ObliterationAction = "obliterate"
	// ActionUnmark: the mark was lifted.
	ActionUnmark ObliterationAction = "unmark"
)

// MaxObliterationReason bounds a reason, in bytes (the audit table's
// CHECK says the same).
const MaxObliterationReason = 1024

// ErrMarkGone is returned (wrapped, code conflict) by an obliteration
// step whose mark no longer holds: the digest was unmarked, or marked
// again (a newer mark's own job does the work). The job ends there.
var ErrMarkGone = errors.New("the obliteration mark no longer holds")

// CheckObliterationReason validates an operator's reason: 1 to
// MaxObliterationReason bytes of UTF-8, not only white space, no
// control characters. Errors: invalid.
func CheckObliterationReason(reason string) error {
	switch {
	case strings.TrimSpace(reason) == "":
		return blobplane.Errorf(blobplane.CodeInvalid, "a reason is required: say why the blob is obliterated or unmarked")
	case len(reason) > MaxObliterationReason:
		return blobplane.Errorf(blobplane.CodeInvalid, "the reason is %d bytes; at most %d", len(reason), MaxObliterationReason)
	case !utf8.ValidString(reason) || strings.ContainsFunc(reason, unicode.IsControl):
		return blobplane.Errorf(blobplane.CodeInvalid, "the reason must be UTF-8 text without control characters")
	}
	return nil
}

// Obliteration is one audit row (table blob_obliterations).
type Obliteration struct {
	ID        int64
	Digest    blobplane.Digest
	Action    ObliterationAction
	Principal string
	Reason    string
	At        time.Time
	// FinishedAt, for an obliterate row, is when its job found nothing
	// left to do; zero while it runs.
	FinishedAt time.Time
}

// ObliterationLeft is what an obliteration still has to remove.
type ObliterationLeft struct {
	References     int64 // references to the digest
	PendingUploads int64 // pending intents claiming it
	Placements     int64 // placements not revoked
	OwedDeletions  int64 // byte deletions recorded and not finished
}

// ObliterationStatus is a digest's obliteration state.
type ObliterationStatus struct {
	Digest blobplane.Digest
	// State is the blob state row's: live, collected or obliterated.
	State string
	// Mark is the current mark when State is obliterated.
	Mark *Obliteration
	Left ObliterationLeft
	// History is the digest's audit rows, newest first (at most
	// maxObliterationHistory).
	History []Obliteration
}

// maxObliterationHistory bounds the audit rows a status carries.
const maxObliterationHistory = 100

// ObliterateArgs is the River job that finishes an obliteration after its
// mark (kind "obliterate"; jobs.ObliterateWorker works it). It is
// declared here, where the marking transaction inserts it, because jobs
// imports store: the admin API and the CLI need no River client of their
// own to obliterate.
type ObliterateArgs struct {
	Digest blobplane.Digest `json:"digest"`
	// Mark is the audit row (blob_obliterations.id) of the mark the job
	// finishes: a later mark of the same digest gets a job of its own.
	Mark int64 `json:"mark"`
}

// Kind is the job kind.
func (ObliterateArgs) Kind() string { return "obliterate" }

// InsertOpts: the default queue (the job touches Postgres only), unique
// per digest and mark among unfinished jobs.
func (ObliterateArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: river.QueueDefault, UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}}
}

// Obliterate takes the obliteration mark of d for principal, with
// reason, in one transaction with the removal of every reference, the
// audit row and the obliterate job (see the top of this file). marked
// is false when d was obliterated already: nothing new is recorded, and
// the current mark's job is enqueued again unless it is still
// unfinished (a way to sweep again). Errors: invalid (digest, principal,
// reason), not_found (no blob state row: the digest was never
// published), unavailable.
func (s *Store) Obliterate(ctx context.Context, d blobplane.Digest, principal, reason string) (st ObliterationStatus, marked bool, err error) {
	const op = "obliterate"
	if err := checkObliteration(d, principal, reason); err != nil {
		return ObliterationStatus{}, false, err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return ObliterationStatus{}, false, err
	}
	jobs, err := river.NewClient(riverpgxv5.New(s.pool), &river.Config{Logger: s.logger}) // insert-only
	if err != nil {
		return ObliterationStatus{}, false, fmt.Errorf("%s: river client: %w", op, err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b, err := s.q.LockBlob(ctx, tx, string(d))
		if err != nil {
			return err
		}
		mark, err := s.currentMark(ctx, tx, d)
		if err != nil {
			return err
		}
		if b.State == "obliterated" && mark != nil {
			_, err := jobs.InsertTx(ctx, tx, ObliterateArgs{Digest: d, Mark: mark.ID}, nil)
			return err
		}
		// A row obliterated by hand (no audit row) is recorded now.
		if _, err := s.q.MarkObliterated(ctx, tx, string(d)); err != nil {
			return err
		}
		row, err := s.q.InsertObliterationAudit(ctx, tx, dbsqlc.InsertObliterationAuditParams{
			Digest: string(d), Action: string(ActionObliterate), Principal: principal, Reason: reason,
		})
		if err != nil {
			return err
		}
		if _, err := s.q.DeleteReferencesOf(ctx, tx, string(d)); err != nil {
			return err
		}
		marked = true
		_, err = jobs.InsertTx(ctx, tx, ObliterateArgs{Digest: d, Mark: row.ID}, nil)
		return err
	})
	s.invalidateExistenceCache() // whatever the outcome: a commit may hide behind an error
	if err != nil {
		return ObliterationStatus{}, false, obliterationErr(op, d, err)
	}
	st, err = s.ObliterationStatus(ctx, d)
	return st, marked, err
}

// Unmark lifts the obliteration mark of d for principal, with reason:
// the digest may be uploaded, mounted and published again (a re-upload
// stores its bytes again). The blob state row becomes collected, or live
// while a placement is left unrevoked (unmarkedState). Errors: invalid,
// not_found (no blob state row, or d is not obliterated), unavailable.
func (s *Store) Unmark(ctx context.Context, d blobplane.Digest, principal, reason string) (ObliterationStatus, error) {
	const op = "unmark"
	if err := checkObliteration(d, principal, reason); err != nil {
		return ObliterationStatus{}, err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return ObliterationStatus{}, err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b, err := s.q.LockBlob(ctx, tx, string(d))
		if err != nil {
			return err
		}
		if b.State != "obliterated" {
			return blobplane.Errorf(blobplane.CodeNotFound, "%s is not obliterated (its state is %s)", d, b.State)
		}
		left, err := s.q.ObliterationProgress(ctx, tx, string(d))
		if err != nil {
			return err
		}
		if _, err := s.q.UnmarkObliterated(ctx, tx, dbsqlc.UnmarkObliteratedParams{Digest: string(d), State: unmarkedState(left.Unrevoked)}); err != nil {
			return err
		}
		_, err = s.q.InsertObliterationAudit(ctx, tx, dbsqlc.InsertObliterationAuditParams{
			Digest: string(d), Action: string(ActionUnmark), Principal: principal, Reason: reason,
		})
		return err
	})
	if err != nil {
		return ObliterationStatus{}, obliterationErr(op, d, err)
	}
	return s.ObliterationStatus(ctx, d)
}

// unmarkedState is the state an unmarked blob row takes, given how many
// of its placements are not revoked: collected when none is (the
// obliteration finished what a collection does), live otherwise, so that
// the collector, which only decides live rows, reclaims the rest.
func unmarkedState(unrevoked int64) string {
	if unrevoked == 0 {
		return "collected"
	}
	return "live"
}

// ObliterationStatus reads d's obliteration state: the blob row's state,
// the current mark, what is left to remove and the audit history.
// Errors: invalid, not_found (no blob state row and no audit row),
// unavailable.
func (s *Store) ObliterationStatus(ctx context.Context, d blobplane.Digest) (ObliterationStatus, error) {
	const op = "obliteration status"
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return ObliterationStatus{}, err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return ObliterationStatus{}, err
	}
	st := ObliterationStatus{Digest: d}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		b, err := s.q.GetBlob(ctx, tx, string(d))
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		st.State = b.State
		hist, err := s.q.ObliterationHistory(ctx, tx, dbsqlc.ObliterationHistoryParams{Digest: string(d), MaxRows: maxObliterationHistory})
		if err != nil {
			return err
		}
		if st.State == "" && len(hist) == 0 {
			return pgx.ErrNoRows
		}
		for _, h := range hist {
			st.History = append(st.History, obliterationFromRow(h))
		}
		if st.State == "obliterated" && len(st.History) > 0 && st.History[0].Action == ActionObliterate {
			st.Mark = &st.History[0]
		}
		left, err := s.q.ObliterationProgress(ctx, tx, string(d))
		st.Left = ObliterationLeft{References: left.Refs, PendingUploads: left.PendingIntents, Placements: left.Unrevoked, OwedDeletions: left.OwedDeletions}
		return err
	})
	if err != nil {
		return ObliterationStatus{}, obliterationErr(op, d, err)
	}
	return st, nil
}

// Obliterated reports whether d is obliterated now (upload.Store: the
// flow's explanation of a claim its statements refused). Errors:
// unavailable.
func (s *Store) Obliterated(ctx context.Context, d blobplane.Digest) (bool, error) {
	ok, err := s.q.IsObliterated(ctx, s.pool, string(d))
	if err != nil {
		return false, dbErr("is obliterated", err)
	}
	return ok, nil
}

// ObliterationStep is one step of the obliterate job.
type ObliterationStep string

const (
	// StepReferences deletes every reference (the mark's transaction did;
	// a re-run finds none).
	StepReferences ObliterationStep = "references"
	// StepUploads abandons every pending intent claiming the digest.
	StepUploads ObliterationStep = "uploads"
	// StepPlacements revokes every placement, records one deletion per
	// placement whose bytes may remain and enqueues their delete_bytes
	// jobs.
	StepPlacements ObliterationStep = "placements"
)

// ObliterationSteps are the job's steps in the order it runs them,
// before SettleObliteration.
var ObliterationSteps = []ObliterationStep{StepReferences, StepUploads, StepPlacements}

// ObliterationPass is what one step (or a settle pass) did.
type ObliterationPass struct {
	References int64 // references deleted
	Abandoned  int64 // pending intents abandoned
	Revoked    int64 // placements revoked
	Recorded   int64 // deletions recorded
	// Busy counts rows another transaction held (a close or a transfer
	// in flight), skipped for a later pass.
	Busy int64
	// Deletions are the digest's owed deletions after the pass, whose
	// delete_bytes jobs it enqueued.
	Deletions []Deletion
}

// Changed reports whether the pass did or skipped anything.
func (p ObliterationPass) Changed() bool {
	return p.References+p.Abandoned+p.Revoked+p.Recorded+p.Busy > 0
}

// ObliterationStep runs step for the mark args names, in one
// transaction that first checks the mark still holds (ErrMarkGone,
// conflict, otherwise) and ends with beforeCommit (nil: none), in which
// the job records the step done (River's resumable step) so that it
// commits exactly with the step's work. enq enqueues the delete_bytes
// jobs of StepPlacements in the same transaction (nil: the deletions
// stay owed for the collector's requeue). Errors: invalid, not_found,
// conflict, unavailable, and those of enq and beforeCommit.
func (s *Store) ObliterationStep(ctx context.Context, args ObliterateArgs, step ObliterationStep, enq DeletionEnqueuer, beforeCommit func(context.Context, pgx.Tx) error) (ObliterationPass, error) {
	var p ObliterationPass
	err := s.obliterationTx(ctx, args, "obliteration step "+string(step), func(tx pgx.Tx, _ dbsqlc.LockObliterationMarkRow) error {
		p = ObliterationPass{}
		var err error
		switch step {
		case StepReferences:
			p.References, err = s.q.DeleteReferencesOf(ctx, tx, string(args.Digest))
		case StepUploads:
			err = s.abandonClaims(ctx, tx, args.Digest, &p)
		case StepPlacements:
			err = s.revokePlacements(ctx, tx, args.Digest, enq, &p)
		default:
			err = blobplane.Errorf(blobplane.CodeInvalid, "unknown obliteration step %q", step)
		}
		if err == nil && beforeCommit != nil {
			err = beforeCommit(ctx, tx)
		}
		return err
	})
	return p, err
}

// SettleObliteration is the job's last step: every step again, in one
// transaction. done is true when the pass found nothing to do and the
// mark is at least settle old (by the database clock): the audit row is
// then finished. Otherwise wait is how long the job should wait before
// the next pass (settle after a pass that found something: a close or a
// transfer that was in flight, caught now). Errors: those of
// ObliterationStep.
func (s *Store) SettleObliteration(ctx context.Context, args ObliterateArgs, enq DeletionEnqueuer, settle time.Duration) (done bool, wait time.Duration, p ObliterationPass, err error) {
	err = s.obliterationTx(ctx, args, "settle obliteration", func(tx pgx.Tx, m dbsqlc.LockObliterationMarkRow) error {
		done, wait, p = false, 0, ObliterationPass{}
		var err error
		if p.References, err = s.q.DeleteReferencesOf(ctx, tx, string(args.Digest)); err != nil {
			return err
		}
		if err := s.abandonClaims(ctx, tx, args.Digest, &p); err != nil {
			return err
		}
		if err := s.revokePlacements(ctx, tx, args.Digest, enq, &p); err != nil {
			return err
		}
		age := time.Duration(m.MarkAgeSeconds * float64(time.Second))
		switch {
		case p.Changed():
			wait = settle
		case age < settle:
			wait = settle - age
		default:
			_, err := s.q.FinishObliterationAudit(ctx, tx, args.Mark) // 0 rows: finished by an earlier run
			done = err == nil
			return err
		}
		return nil
	})
	return done, wait, p, err
}

// obliterationTx runs fn in one transaction after checking, under the
// blob row's share lock, that args' mark still holds.
func (s *Store) obliterationTx(ctx context.Context, args ObliterateArgs, op string, fn func(pgx.Tx, dbsqlc.LockObliterationMarkRow) error) error {
	if _, err := blobplane.ParseDigest(string(args.Digest)); err != nil {
		return err
	}
	if args.Mark <= 0 {
		return blobplane.Errorf(blobplane.CodeInvalid, "%s: mark %d is not an audit row id", op, args.Mark)
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		m, err := s.q.LockObliterationMark(ctx, tx, dbsqlc.LockObliterationMarkParams{Mark: args.Mark, Digest: string(args.Digest)})
		if err != nil {
			return err
		}
		if m.State != "obliterated" || m.LatestMark != args.Mark {
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Err: ErrMarkGone,
				Message: fmt.Sprintf("the obliteration %d of %s no longer holds (unmarked or marked again)", args.Mark, args.Digest)}
		}
		return fn(tx, m)
	})
	if err != nil {
		return obliterationErr(op, args.Digest, err)
	}
	return nil
}

// abandonClaims abandons the pending intents claiming d (StepUploads).
func (s *Store) abandonClaims(ctx context.Context, tx pgx.Tx, d blobplane.Digest, p *ObliterationPass) error {
	r, err := s.q.AbandonClaimsOf(ctx, tx, string(d))
	p.Abandoned, p.Busy = p.Abandoned+r.Abandoned, p.Busy+r.Busy
	return err
}

// revokePlacements is StepPlacements: under the digest's stage lock (so
// a stage or a byte deletion of it in flight finishes first), revoke,
// record the deletions, and enqueue every owed deletion's job with enq.
func (s *Store) revokePlacements(ctx context.Context, tx pgx.Tx, d blobplane.Digest, enq DeletionEnqueuer, p *ObliterationPass) error {
	if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(d)}); err != nil {
		return err
	}
	r, err := s.q.RevokeForObliteration(ctx, tx, string(d))
	if err != nil {
		return err
	}
	p.Revoked, p.Busy = p.Revoked+r.Revoked, p.Busy+r.Busy
	if p.Recorded, err = s.q.RecordObliterationDeletions(ctx, tx, string(d)); err != nil {
		return err
	}
	rows, err := s.q.UnfinishedDeletionsOf(ctx, tx, string(d))
	if err != nil {
		return err
	}
	p.Deletions = make([]Deletion, len(rows))
	for i, r := range rows {
		p.Deletions[i] = deletionFromRow(r)
	}
	if enq != nil && len(p.Deletions) > 0 {
		return enq.EnqueueDeletionsTx(ctx, tx, p.Deletions)
	}
	return nil
}

// currentMark is d's newest audit row when it is an obliterate row, nil
// otherwise.
func (s *Store) currentMark(ctx context.Context, tx pgx.Tx, d blobplane.Digest) (*Obliteration, error) {
	hist, err := s.q.ObliterationHistory(ctx, tx, dbsqlc.ObliterationHistoryParams{Digest: string(d), MaxRows: 1})
	if err != nil || len(hist) == 0 || ObliterationAction(hist[0].Action) != ActionObliterate {
		return nil, err
	}
	o := obliterationFromRow(hist[0])
	return &o, nil
}

// checkObliteration validates an obliteration's or an unmark's request.
func checkObliteration(d blobplane.Digest, principal, reason string) error {
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return err
	}
	if err := auth.CheckPrincipal(principal); err != nil {
		return err
	}
	return CheckObliterationReason(reason)
}

// obliterationErr maps an obliteration's error at the store boundary: no
// blob row is not_found, saying so.
func obliterationErr(op string, d blobplane.Digest, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Err: err,
			Message: fmt.Sprintf("%s is unknown: no repository ever published it", d)}
	}
	return placementErr(op, err)
}

func obliterationFromRow(r dbsqlc.BlobObliteration) Obliteration {
	o := Obliteration{ID: r.ID, Digest: blobplane.Digest(r.Digest), Action: ObliterationAction(r.Action),
		Principal: r.Principal, Reason: r.Reason, At: r.At.Time}
	if r.FinishedAt.Valid {
		o.FinishedAt = r.FinishedAt.Time
	}
	return o
}
