package store

import (
	"context"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The reaper of expired intents (DESIGN flow 5, issue 7,
// ../shared/spec/publication-across-two-stores.md).
//
// Abandonment is a decision made on the intent row, in the same statement
// that claims it FOR UPDATE SKIP LOCKED and re-checks that it is pending,
// so a reap and a publication of one intent are mutually exclusive (S5): a
// writer that wakes after its intent was reaped fails on the row
// (ErrIntentClosed). Expiry is only permission to reclaim. The staged bytes
// are deleted by the caller after the decision commits; MarkStagedDeleted
// records that, and until it does the intent stays in
// UndeletedStagedIntents, so a crash or a failed delete is retried.

// ReapedIntent is an abandoned intent whose staged bytes are (or were) to
// be deleted.
type ReapedIntent struct {
	OperationID string
	Repository  string
	// Backend and StagedLocation locate the staged upload: the backend's
	// upload id on the named backend of the ingress datacenter.
	// StagedLocation is "" when staging never started.
	Backend        string
	StagedLocation string
	// ReceivedBytes is the staged size as of the last recorded chunk.
	ReceivedBytes int64
	ExpiresAt     time.Time
	UpdatedAt     time.Time
}

func reapedFromRows(rows []dbsqlc.Intent) []ReapedIntent {
	out := make([]ReapedIntent, 0, len(rows))
	for _, r := range rows {
		out = append(out, ReapedIntent{
			OperationID: r.OperationID.String(), Repository: r.Repository, Backend: r.Backend,
			StagedLocation: r.StagedLocation.String, ReceivedBytes: r.ReceivedBytes,
			ExpiresAt: r.ExpiresAt.Time, UpdatedAt: r.UpdatedAt.Time,
		})
	}
	return out
}

func batch(limit int) (int32, error) {
	if limit <= 0 || limit > math.MaxInt32 {
		return 0, blobplane.Errorf(blobplane.CodeInvalid, "sweep batch %d: must be from 1 to %d", limit, math.MaxInt32)
	}
	return int32(limit), nil
}

// ReapExpiredIntents abandons up to limit pending intents of datacenter
// whose expiry (database clock) has passed, oldest first, in one
// transaction, and returns them. Intents locked by another transaction (a
// chunk being recorded, a publication, another reaper) are skipped, so
// concurrent reapers never reap one intent twice. With dryRun it returns
// what would be reaped now and changes nothing. The caller deletes the
// staged bytes only after this returns, then calls MarkStagedDeleted.
// Errors: invalid (limit), unavailable.
func (s *Store) ReapExpiredIntents(ctx context.Context, datacenter string, limit int, dryRun bool) ([]ReapedIntent, error) {
	n, err := batch(limit)
	if err != nil {
		return nil, err
	}
	if dryRun {
		rows, err := s.q.ExpiredIntents(ctx, s.pool, dbsqlc.ExpiredIntentsParams{IngressDatacenter: datacenter, Batch: n})
		if err != nil {
			return nil, dbErr("reap expired intents", err)
		}
		return reapedFromRows(rows), nil
	}
	var rows []dbsqlc.Intent
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err = s.reapTx(ctx, tx, datacenter, n)
		return err
	})
	if err != nil {
		return nil, dbErr("reap expired intents", err)
	}
	return reapedFromRows(rows), nil
}

// ReapExpiredIntentsTx is ReapExpiredIntents (not a dry run) inside the
// caller's transaction: the decisions and their row locks last until tx
// ends, so a caller can compose them with other writes, and tests can hold
// a reap open while they drive a competing writer.
func (s *Store) ReapExpiredIntentsTx(ctx context.Context, tx pgx.Tx, datacenter string, limit int) ([]ReapedIntent, error) {
	n, err := batch(limit)
	if err != nil {
		return nil, err
	}
	rows, err := s.reapTx(ctx, tx, datacenter, n)
	if err != nil {
		return nil, dbErr("reap expired intents", err)
	}
	return reapedFromRows(rows), nil
}

// reapTx decides the abandonment of up to n expired intents in tx and
// hands their closed content back to the collector.
func (s *Store) reapTx(ctx context.Context, tx pgx.Tx, datacenter string, n int32) ([]dbsqlc.Intent, error) {
	rows, err := s.q.ReapExpiredIntents(ctx, tx, dbsqlc.ReapExpiredIntentsParams{IngressDatacenter: datacenter, Batch: n})
	if err != nil {
		return nil, err
	}
	return rows, s.handBack(ctx, tx, rows...)
}

// handBack ends the claims of just-abandoned intents inside the abandoning
// transaction: content one of them closed (verified bytes at its
// content-addressed key) but never published becomes a collection
// candidate, so the collector reclaims it unless something else owns it
// (L1; docs/sweeps.md "Closed, never published").
func (s *Store) handBack(ctx context.Context, tx pgx.Tx, abandoned ...dbsqlc.Intent) error {
	var ds []string
	for _, r := range abandoned {
		if r.ExpectedDigest.Valid {
			ds = append(ds, r.ExpectedDigest.String)
		}
	}
	if len(ds) == 0 {
		return nil
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return err
	}
	_, err := s.q.HandBackToCollector(ctx, tx, ds)
	return err
}

// UndeletedStagedIntents returns up to limit abandoned intents of
// datacenter whose staged bytes are not confirmed deleted, oldest
// abandonment first: reaps whose delete crashed or failed, and uploads a
// handler abandoned but could not abort. Errors: invalid, unavailable.
func (s *Store) UndeletedStagedIntents(ctx context.Context, datacenter string, limit int) ([]ReapedIntent, error) {
	n, err := batch(limit)
	if err != nil {
		return nil, err
	}
	rows, err := s.q.UndeletedStagedIntents(ctx, s.pool, dbsqlc.UndeletedStagedIntentsParams{IngressDatacenter: datacenter, Batch: n})
	if err != nil {
		return nil, dbErr("undeleted staged intents", err)
	}
	return reapedFromRows(rows), nil
}

// MarkStagedDeleted records, in one statement, that the staged bytes of
// the abandoned intents ops are deleted, so no later pass deletes them
// again. Marking twice, or an intent that is not abandoned, changes
// nothing. Errors: not_found for a malformed id, unavailable.
func (s *Store) MarkStagedDeleted(ctx context.Context, ops ...string) error {
	if len(ops) == 0 {
		return nil
	}
	ids := make([]pgtype.UUID, len(ops))
	for i, op := range ops {
		id, err := parseOpID(op)
		if err != nil {
			return err
		}
		ids[i] = id
	}
	if _, err := s.q.MarkStagedDeleted(ctx, s.pool, ids); err != nil {
		return dbErr("mark staged deleted", err)
	}
	return nil
}

// OldestOverdueIntent is the age of datacenter's oldest overdue reaper
// item: an expired pending intent (since its expiry) or an abandoned intent
// whose staged bytes remain (since its abandonment); 0 when there is none.
// Measured by the database clock.
func (s *Store) OldestOverdueIntent(ctx context.Context, datacenter string) (time.Duration, error) {
	sec, err := s.q.SweepIntentBacklog(ctx, s.pool, datacenter)
	if err != nil {
		return 0, dbErr("sweep intent backlog", err)
	}
	return time.Duration(sec * float64(time.Second)), nil
}
