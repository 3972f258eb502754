package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// BatchThenForTest sends, in one pgx batch as OpenAndStage does, the
// CreateIntent of n and then the statement then, and returns the intent's
// operation id and the batch's error: what TestBatchIsOneTransaction
// needs to see that a later statement's failure undoes an earlier write.
func (s *Store) BatchThenForTest(ctx context.Context, n NewIntent, then string) (string, error) {
	arg, err := createIntentArgs(n)
	if err != nil {
		return "", err
	}
	arg.OperationID = pgtype.UUID{Bytes: [16]byte{0: 0xb1, 6: 0x40, 8: 0x80, 15: 1}, Valid: true}
	var b pgx.Batch
	var row dbsqlc.Intent
	var createErr error
	queueRow(&b, func(db dbsqlc.DBTX) (dbsqlc.Intent, error) { return s.q.CreateIntent(ctx, db, arg) }, &row, &createErr)
	b.Queue(then)
	err = s.pool.SendBatch(ctx, &b).Close()
	return arg.OperationID.String(), err
}

// MigrateToForTest applies (up or down) Blobplane's goose migrations until
// the schema is at version: what a test of one migration's conversion
// needs to build the schema before it.
func MigrateToForTest(ctx context.Context, pool *pgxpool.Pool, version int64) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := gooseProvider(sqlDB)
	if err != nil {
		return err
	}
	cur, err := p.GetDBVersion(ctx)
	if err != nil {
		return err
	}
	if cur > version {
		_, err = p.DownTo(ctx, version)
	} else {
		_, err = p.UpTo(ctx, version)
	}
	return err
}
