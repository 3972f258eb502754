package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Pipelined statements: the hot paths (ClaimAndStage, Finalize) send
// several sqlc statements in one pgx.Batch, one round trip for all of
// them, instead of one round trip each (docs/performance.md). queueRow
// puts a sqlc method's own statement on a batch and runs the method's own
// Scan on its answer, so no SQL text or column list is written twice.

// errNotAnswered is a queued statement's error until its answer is read:
// what it keeps when the batch failed before reaching it.
var errNotAnswered = errors.New("store: batched statement not answered")

// queueRow queues on b the statement call sends and, when b's results are
// read, runs call again on that statement's row. *out and *err receive
// call's results (pgx.ErrNoRows included); until then *err is
// errNotAnswered. call must send exactly one QueryRow (a sqlc :one
// method) and depend on nothing but its arguments.
func queueRow[T any](b *pgx.Batch, call func(dbsqlc.DBTX) (T, error), out *T, err *error) {
	var r recorder
	_, _ = call(&r)
	*err = errNotAnswered
	b.Queue(r.sql, r.args...).QueryRow(func(row pgx.Row) error {
		*out, *err = call(answered{row})
		return nil
	})
}

// queueRows is queueRow for a sqlc :many method: *out receives every
// row of the statement's answer.
func queueRows[T any](b *pgx.Batch, call func(dbsqlc.DBTX) ([]T, error), out *[]T, err *error) {
	var r recorder
	_, _ = call(&r)
	*err = errNotAnswered
	b.Queue(r.sql, r.args...).Query(func(rows pgx.Rows) error {
		*out, *err = call(answeredRows{rows})
		return nil
	})
}

// indexBy maps each of rows by key(row): how a merged batch hands every
// call the rows its own statements would have returned.
func indexBy[K comparable, R any](rows []R, key func(R) K) map[K]R {
	m := make(map[K]R, len(rows))
	for _, r := range rows {
		m[key(r)] = r
	}
	return m
}

// rowKey is a placement row's key.
func rowKey(r dbsqlc.Placement) placement.Key {
	return placement.Key{Digest: blobplane.Digest(r.Digest), Backend: r.Backend, Datacenter: r.Datacenter, Location: r.Location}
}

// queueExec is queueRow for a sqlc :exec method: *err receives the
// statement's error.
func queueExec(b *pgx.Batch, call func(dbsqlc.DBTX) error, err *error) {
	var r recorder
	_ = call(&r)
	*err = errNotAnswered
	b.Queue(r.sql, r.args...).Exec(func(pgconn.CommandTag) error {
		*err = nil
		return nil
	})
}

// recorder is a dbsqlc.DBTX that records the statement a sqlc method
// issues instead of sending it.
type recorder struct {
	sql  string
	args []any
}

var errRecorded = errors.New("store: statement recorded, not sent")

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.sql, r.args = sql, args
	return pgconn.CommandTag{}, errRecorded
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.sql, r.args = sql, args
	return nil, errRecorded
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.sql, r.args = sql, args
	return errRow{errRecorded}
}

// answered is a dbsqlc.DBTX that hands a sqlc method the row its
// statement already got as part of a batch.
type answered struct{ row pgx.Row }

var errNotARow = errors.New("store: only a single-row statement can be batched")

func (a answered) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotARow
}

func (a answered) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errNotARow
}

func (a answered) QueryRow(context.Context, string, ...any) pgx.Row { return a.row }

// answeredRows is answered for a sqlc :many method: the rows its
// statement already got as part of a batch.
type answeredRows struct{ rows pgx.Rows }

func (a answeredRows) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotARow
}

func (a answeredRows) Query(context.Context, string, ...any) (pgx.Rows, error) { return a.rows, nil }

func (a answeredRows) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{errNotARow} }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// genericPlans is queued first in a hot path's transaction: its
// statements run the generic plans (PREPAREd once per connection) that
// TestByKeyStatementsUseTheKeyInANewStore checks, not plans made anew
// for each call's arguments (docs/performance.md item 35).
const genericPlans = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"
