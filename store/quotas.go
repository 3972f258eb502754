package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
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
}

// SetRepositoryQuota sets repository's quota to limit (a zero field: no
// limit on that measure) on behalf of by. Its home holds it from the
// journal record the table's trigger writes in the same transaction.
// Lowering a quota below the usage refuses new content, never removes
// any. Errors: invalid (a bad name, a negative or an all-zero limit: clear
// it instead), not_found (no such repository).
func (s *Store) SetRepositoryQuota(ctx context.Context, repository string, limit quota.Limit, by string) (RepositoryQuota, error) {
	if err := auth.CheckRepository(repository); err != nil {
		return RepositoryQuota{}, err
	}
	if limit.Bytes < 0 || limit.Blobs < 0 || limit == (quota.Limit{}) {
		return RepositoryQuota{}, blobplane.Errorf(blobplane.CodeInvalid, "a quota limits bytes, blobs or both, each a positive number (got bytes %d, blobs %d); to remove a quota, clear it", limit.Bytes, limit.Blobs)
	}
	if by == "" {
		by = "admin"
	}
	if _, err := s.q.SetRepositoryQuota(ctx, s.pool, dbsqlc.SetRepositoryQuotaParams{Repository: repository, MaxBytes: limit.Bytes, MaxBlobs: limit.Blobs, SetBy: by}); err != nil {
		if err := dbErr("set repository quota", err); blobplane.ErrorCode(err) == blobplane.CodeNotFound {
			return RepositoryQuota{}, blobplane.Errorf(blobplane.CodeNotFound, "no repository %s", repository)
		} else {
			return RepositoryQuota{}, err
		}
	}
	return s.RepositoryQuota(ctx, repository)
}

// ClearRepositoryQuota removes repository's quota; clearing none
// succeeds. Errors: invalid.
func (s *Store) ClearRepositoryQuota(ctx context.Context, repository string) error {
	if err := auth.CheckRepository(repository); err != nil {
		return err
	}
	_, err := s.q.ClearRepositoryQuota(ctx, s.pool, repository)
	return dbErr("clear repository quota", err)
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
		out[i] = RepositoryQuota{Repository: r.Repository, Limit: quota.Limit{Bytes: r.MaxBytes, Blobs: r.MaxBlobs},
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
