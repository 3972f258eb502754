package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// Tenant quotas (issue 33, ADR 0009 item 6): a tenant's usage row moves
// in each reference write's transaction, under its lock, so two
// publications into two repositories of one tenant (at two homes) cannot
// both take its last room. Driven deterministically: the first holds the
// row, the second waits on it, the first commits, the second is refused.
func TestTenantQuotaIsExactAcrossRepositories(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	ctx := context.Background()
	for _, r := range []string{"team/a", "team/b", "other/c"} {
		if err := s.CreateRepository(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	blob := func(i, size int) string {
		dg := fmt.Sprintf("sha256:%064x", i)
		if _, err := d.Pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, $2) ON CONFLICT DO NOTHING`, dg, size); err != nil {
			t.Fatal(err)
		}
		return dg
	}
	insert := func(tx pgx.Tx, repo, dg string) error {
		_, err := tx.Exec(ctx, `INSERT INTO blob_references (repository, digest, operation_id) VALUES ($1, $2, gen_random_uuid())`, repo, dg)
		return err
	}
	// Usage before the quota is counted when it is set: 40 bytes.
	if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return insert(tx, "team/a", blob(1, 40)) }); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"team", "", "/", "Team/", "team//"} {
		if _, err := s.SetTenantQuota(ctx, bad, quota.Limit{Bytes: 1}, "root"); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
			t.Fatalf("tenant %q: %v, want invalid", bad, err)
		}
	}
	tq, err := s.SetTenantQuota(ctx, "team/", quota.Limit{Bytes: 150}, "root")
	if err != nil || tq.Usage != (quota.Usage{Bytes: 40, Blobs: 1}) {
		t.Fatalf("set: %+v, %v; want the 40 bytes team holds counted", tq, err)
	}

	// Two publications of 100 bytes into team/a and team/b: 40 + 100 fits
	// 150, 40 + 100 + 100 does not.
	first, err := d.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if err := insert(first, "team/a", blob(2, 100)); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		second <- pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return insert(tx, "team/b", blob(3, 100)) })
	}()
	pgtest.WaitForLockWaiters(t, d.Pool, 1)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-second
	var be *blobplane.Error
	if mapped := store.DBErrForTest("finalize", err); blobplane.ErrorCode(mapped) != blobplane.CodeForbidden || !errors.Is(mapped, upload.ErrOverQuota) || !errors.As(mapped, &be) ||
		be.Message != "tenant team/ is over its quota of 150 bytes: it holds 140, and this upload adds 100" {
		t.Fatalf("the second publication: %v (mapped %v), want forbidden naming the tenant's quota", err, mapped)
	}
	// Another tenant's repository is not counted; a delete makes room.
	if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return insert(tx, "other/c", blob(4, 1000)) }); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(ctx, `DELETE FROM blob_references WHERE repository = 'team/a' AND digest = $1`, blob(1, 40)); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return insert(tx, "team/b", blob(5, 50)) }); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	got, err := s.TenantQuota(ctx, "team/")
	if err != nil || got.Usage != (quota.Usage{Bytes: 150, Blobs: 2}) {
		t.Fatalf("usage: %+v, %v; want 150 bytes in 2 blobs", got, err)
	}
	var sum, n int64
	if err := d.Pool.QueryRow(ctx, `SELECT coalesce(sum(b.size_bytes), 0), count(*) FROM blob_references r JOIN blobs b USING (digest) WHERE r.repository LIKE 'team/%'`).Scan(&sum, &n); err != nil {
		t.Fatal(err)
	}
	if sum != got.Usage.Bytes || n != got.Usage.Blobs {
		t.Fatalf("the row says %+v, the ledger %d bytes in %d", got.Usage, sum, n)
	}
	if err := s.ClearTenantQuota(ctx, "team/"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TenantQuota(ctx, "team/"); blobplane.ErrorCode(err) != blobplane.CodeNotFound {
		t.Fatalf("after clearing: %v", err)
	}
}
