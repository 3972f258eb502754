package store

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// RepositoryQuota is a repository's quota (zero: none) and the usage the
// ledger holds for it (issue 33).
type RepositoryQuota struct {
	Repository string
	Limit      quota.Limit
	SetBy      string
	SetAt      time.Time // zero without a quota
	Usage      quota.Usage
	// Applied, on a change's answer: the repository's home holds the
	// change (false: it did not apply it within QuotaApplyWait; it will
	// when it serves again).
	Applied bool
	// Position, on a change's answer, is the partition position its home
	// applied it at (ZBP-5-R107: partition:epoch:lsn); "" when it did
	// not apply it yet, or no journal held the repository.
	Position string
}

// QuotaApplyWait bounds how long a quota change waits for its home to
// apply it.
const QuotaApplyWait = 5 * time.Second

// SetRepositoryQuota sets repository's quota to limit (a zero field: no
// limit on that measure) on behalf of by. Its home holds it from the
// journal record the table's trigger writes in the same transaction.
// Lowering a quota below the usage refuses new content, never removes
// any. Errors: invalid (a bad name, a negative or an all-zero limit: clear
// it instead), not_found (no such repository), conflict (a rate below
// cluster format level 2: the release before reads no "at"; finalize
// first).
func (s *Store) SetRepositoryQuota(ctx context.Context, repository string, limit quota.Limit, by string) (RepositoryQuota, error) {
	if err := auth.CheckRepository(repository); err != nil {
		return RepositoryQuota{}, err
	}
	if limit.Bytes < 0 || limit.Blobs < 0 || limit.BytesPerMinute < 0 || limit.BlobsPerMinute < 0 || limit == (quota.Limit{}) {
		return RepositoryQuota{}, blobplane.Errorf(blobplane.CodeInvalid, "a quota limits bytes, blobs, bytes per minute or blobs per minute, each a positive number or 0 for no limit, at least one positive (got bytes %d, blobs %d, bytes per minute %d, blobs per minute %d); to remove a quota, clear it",
			limit.Bytes, limit.Blobs, limit.BytesPerMinute, limit.BlobsPerMinute)
	}
	if by == "" {
		by = "admin"
	}
	var id int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if limit.Rated() {
			// A rated repository's ref+ records carry "at" (migration
			// 00041), which only level 2 readers read (R44).
			if err := s.requireFormatLevel(ctx, tx, formats.Level2, "an upload rate"); err != nil {
				return err
			}
		}
		if _, err := s.q.SetRepositoryQuota(ctx, tx, dbsqlc.SetRepositoryQuotaParams{Repository: repository, MaxBytes: limit.Bytes, MaxBlobs: limit.Blobs,
			MaxBytesPerMinute: limit.BytesPerMinute, MaxBlobsPerMinute: limit.BlobsPerMinute, SetBy: by}); err != nil {
			return err
		}
		var err error
		id, err = s.q.QuotaAppendID(ctx, tx)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return RepositoryQuota{}, blobplane.Errorf(blobplane.CodeNotFound, "no repository %s", repository)
	}
	if e := (*blobplane.Error)(nil); errors.As(err, &e) {
		return RepositoryQuota{}, err
	}
	if err != nil {
		return RepositoryQuota{}, dbErr("set repository quota", err)
	}
	applied, pos, err := s.waitQuotaApplied(ctx, id)
	if err != nil {
		return RepositoryQuota{}, err
	}
	q, err := s.RepositoryQuota(ctx, repository)
	q.Applied, q.Position = applied, pos
	return q, err
}

// waitQuotaApplied waits, up to QuotaApplyWait, until the home applied
// the journal record id (read-your-writes for an admin's quota change:
// the next upload meets it), and returns the position the home reported
// then (ZBP-5-R107). id 0 (no journal holds the repository yet: its home
// will bootstrap it from the table) is applied, at no position.
func (s *Store) waitQuotaApplied(ctx context.Context, id int64) (bool, string, error) {
	if id == 0 {
		return true, "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, QuotaApplyWait)
	defer cancel()
	for {
		row, err := s.q.QuotaRecordApplied(ctx, s.pool, id)
		if err == nil && row.Applied {
			if row.PartitionID == "" { // trimmed: applied, its position gone
				return true, "", nil
			}
			return true, row.PartitionID + ":" + strconv.FormatInt(row.Epoch, 10) + ":" + strconv.FormatInt(row.AppliedLsn, 10), nil
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == context.DeadlineExceeded {
				return false, "", nil
			}
			return false, "", dbErr("wait for the quota's home", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ClearRepositoryQuota removes repository's quota, and says whether its
// home applied the change and at which position (as SetRepositoryQuota);
// clearing none succeeds. Errors: invalid.
func (s *Store) ClearRepositoryQuota(ctx context.Context, repository string) (applied bool, position string, err error) {
	if err := auth.CheckRepository(repository); err != nil {
		return false, "", err
	}
	var id int64
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := s.q.ClearRepositoryQuota(ctx, tx, repository); err != nil {
			return err
		}
		var err error
		id, err = s.q.QuotaAppendID(ctx, tx)
		return err
	})
	if err != nil {
		return false, "", dbErr("clear repository quota", err)
	}
	return s.waitQuotaApplied(ctx, id)
}

// ReportJournalApplied records that partition's primary at epoch applied
// its journal up to lsn of generation (after a quota record), for the
// admins waiting on a quota change.
func (s *Store) ReportJournalApplied(ctx context.Context, partition string, generation int64, epoch, lsn uint64) error {
	err := s.q.ReportJournalApplied(ctx, s.pool, dbsqlc.ReportJournalAppliedParams{PartitionID: partition, Generation: generation, Epoch: int64(epoch), AppliedLsn: int64(lsn)})
	return dbErr("report journal applied", err)
}

// RepositoryQuota is repository's quota and usage. Errors: invalid,
// not_found (no such repository).
func (s *Store) RepositoryQuota(ctx context.Context, repository string) (RepositoryQuota, error) {
	if err := auth.CheckRepository(repository); err != nil {
		return RepositoryQuota{}, err
	}
	rows, err := s.repositoryUsage(ctx, pgtype.Text{String: repository, Valid: true})
	if err != nil {
		return RepositoryQuota{}, err
	}
	if len(rows) == 0 {
		return RepositoryQuota{}, blobplane.Errorf(blobplane.CodeNotFound, "no repository %s", repository)
	}
	return rows[0], nil
}

// RepositoryQuotas lists every repository with a quota, by name, with
// its usage.
func (s *Store) RepositoryQuotas(ctx context.Context) ([]RepositoryQuota, error) {
	return s.repositoryUsage(ctx, pgtype.Text{})
}

func (s *Store) repositoryUsage(ctx context.Context, repository pgtype.Text) ([]RepositoryQuota, error) {
	rows, err := s.q.RepositoryUsage(ctx, s.pool, repository)
	if err != nil {
		return nil, dbErr("repository usage", err)
	}
	out := make([]RepositoryQuota, len(rows))
	for i, r := range rows {
		out[i] = RepositoryQuota{Repository: r.Repository, Limit: quota.Limit{Bytes: r.MaxBytes, Blobs: r.MaxBlobs, BytesPerMinute: r.MaxBytesPerMinute, BlobsPerMinute: r.MaxBlobsPerMinute},
			SetBy: r.SetBy, SetAt: timeOf(r.SetAt), Usage: quota.Usage{Bytes: r.Bytes, Blobs: r.Blobs}}
	}
	return out, nil
}

// timeOf is t's time, zero when null.
func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

// TenantQuota is a tenant's quota and what its repositories hold
// together (issue 33, ADR 0009 item 6).
type TenantQuota struct {
	Prefix string // "team/"
	Limit  quota.Limit
	Usage  quota.Usage
	SetBy  string
	SetAt  time.Time
}

// CheckTenant validates a tenant: a repository name prefix ending in
// "/" ("team/", "team/ml/"). Errors: invalid.
func CheckTenant(prefix string) error {
	name, ok := strings.CutSuffix(prefix, "/")
	if !ok || auth.CheckRepository(name) != nil {
		return blobplane.Errorf(blobplane.CodeInvalid, "tenant %q: want a repository name prefix ending in / (team/)", prefix)
	}
	return nil
}

// SetTenantQuota sets the quota of every repository under prefix
// together, on behalf of by. A new one counts what they hold from the
// ledger while no reference is written (a SHARE lock on blob_references,
// a moment's pause of publications); from then on each reference row's
// transaction moves it under the row's lock, and a publication that would
// take the tenant past it is refused (forbidden, ErrOverQuota). Lowering
// it below the usage refuses new content and removes none. Errors:
// invalid.
func (s *Store) SetTenantQuota(ctx context.Context, prefix string, limit quota.Limit, by string) (TenantQuota, error) {
	if err := CheckTenant(prefix); err != nil {
		return TenantQuota{}, err
	}
	if limit.Rated() {
		// A tenant's repositories publish at many homes: no one of them
		// sees the tenant's rate (docs/quotas.md, "Upload rates").
		return TenantQuota{}, blobplane.Errorf(blobplane.CodeInvalid, "a tenant quota limits bytes and blobs only: upload rates are set per repository")
	}
	if limit.Bytes < 0 || limit.Blobs < 0 || limit == (quota.Limit{}) {
		return TenantQuota{}, blobplane.Errorf(blobplane.CodeInvalid, "a quota limits bytes, blobs or both, each a positive number (got bytes %d, blobs %d); to remove a quota, clear it", limit.Bytes, limit.Blobs)
	}
	var row dbsqlc.TenantQuota
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.q.LockReferencesForTenantQuota(ctx, tx); err != nil {
			return err
		}
		var err error
		row, err = s.q.SetTenantQuota(ctx, tx, dbsqlc.SetTenantQuotaParams{Prefix: prefix, MaxBytes: limit.Bytes, MaxBlobs: limit.Blobs, SetBy: cmp.Or(by, "admin")})
		return err
	})
	if err != nil {
		return TenantQuota{}, dbErr("set tenant quota", err)
	}
	return TenantQuota{Prefix: row.Prefix, Limit: quota.Limit{Bytes: row.MaxBytes, Blobs: row.MaxBlobs},
		Usage: quota.Usage{Bytes: row.UsedBytes, Blobs: row.UsedBlobs}, SetBy: row.SetBy, SetAt: timeOf(row.SetAt)}, nil
}

// ClearTenantQuota removes prefix's quota; clearing none succeeds.
// Errors: invalid.
func (s *Store) ClearTenantQuota(ctx context.Context, prefix string) error {
	if err := CheckTenant(prefix); err != nil {
		return err
	}
	_, err := s.q.ClearTenantQuota(ctx, s.pool, prefix)
	return dbErr("clear tenant quota", err)
}

// TenantQuota is prefix's quota and usage. Errors: invalid, not_found.
func (s *Store) TenantQuota(ctx context.Context, prefix string) (TenantQuota, error) {
	if err := CheckTenant(prefix); err != nil {
		return TenantQuota{}, err
	}
	qs, err := s.tenantQuotas(ctx, pgtype.Text{String: prefix, Valid: true})
	if err != nil {
		return TenantQuota{}, err
	}
	if len(qs) == 0 {
		return TenantQuota{}, blobplane.Errorf(blobplane.CodeNotFound, "no quota for tenant %s", prefix)
	}
	return qs[0], nil
}

// TenantQuotas lists every tenant quota by prefix.
func (s *Store) TenantQuotas(ctx context.Context) ([]TenantQuota, error) {
	return s.tenantQuotas(ctx, pgtype.Text{})
}

func (s *Store) tenantQuotas(ctx context.Context, prefix pgtype.Text) ([]TenantQuota, error) {
	rows, err := s.q.TenantQuotas(ctx, s.pool, prefix)
	if err != nil {
		return nil, dbErr("tenant quotas", err)
	}
	out := make([]TenantQuota, len(rows))
	for i, r := range rows {
		out[i] = TenantQuota{Prefix: r.Prefix, Limit: quota.Limit{Bytes: r.MaxBytes, Blobs: r.MaxBlobs},
			Usage: quota.Usage{Bytes: r.UsedBytes, Blobs: r.UsedBlobs}, SetBy: r.SetBy, SetAt: timeOf(r.SetAt)}
	}
	return out, nil
}
