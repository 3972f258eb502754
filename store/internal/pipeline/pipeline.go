// Package pipeline sends several pgx.Batches on one connection in
// pgconn's pipeline mode and reads their answers one batch at a time
// (Pipe), for the store's chained closes (store/chain.go).
package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A Pipe sends pgx.Batches on one connection in pipeline mode, all of
// them at once, each ending with its own Sync, and reads their answers
// one batch at a time: the first batch's answers arrive (the server
// flushes at each Sync) while the later batches still run. pgx.SendBatch
// sends one Sync for the whole batch, so nothing of it can be read
// before all of it ran; a chained close (store/chain.go) needs its
// claim's answer first. The batches' statements, callbacks (the store's
// queueRow and its kin) and errors are those pgx.SendBatch would give;
// each batch is traced as pgx traces one (pgx.BatchTracer), so the
// statements show in the same places.
type Pipe struct {
	conn   *pgx.Conn
	p      *pgconn.Pipeline
	tracer pgx.BatchTracer
	sent   []pipeBatch // sent, answers not read yet, in order
}

type pipeBatch struct {
	b   *pgx.Batch
	ctx context.Context // the tracer's
}

// Open sends batches on conn. Each statement runs as a prepared
// statement of conn's (prepared the first time conn sends its text, a
// round trip then, none after). On error nothing was sent, or the
// connection is broken.
func Open(ctx context.Context, conn *pgx.Conn, tracer pgx.BatchTracer, batches ...*pgx.Batch) (*Pipe, error) {
	sds := make([][]*pgconn.StatementDescription, len(batches))
	for i, b := range batches {
		for _, qq := range b.QueuedQueries {
			sd, err := conn.Prepare(ctx, qq.SQL, qq.SQL)
			if err != nil {
				return nil, err
			}
			sds[i] = append(sds[i], sd)
		}
	}
	p := &Pipe{conn: conn, tracer: tracer, p: conn.PgConn().StartPipeline(ctx)}
	var eqb pgx.ExtendedQueryBuilder
	for i, b := range batches {
		tctx := ctx
		if tracer != nil {
			tctx = tracer.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: b})
		}
		for j, qq := range b.QueuedQueries {
			if err := eqb.Build(conn.TypeMap(), sds[i][j], qq.Arguments); err != nil {
				p.sent = append(p.sent, pipeBatch{b: b, ctx: tctx})
				_ = p.p.Close() // with requests unsynced, it closes the connection
				return nil, p.failed(fmt.Errorf("pipeline: %w", err))
			}
			// The pipeline keeps the result formats until the answer
			// comes; eqb reuses its slice.
			p.p.SendQueryStatement(sds[i][j], eqb.ParamValues, eqb.ParamFormats, slices.Clone(eqb.ResultFormats))
		}
		p.p.SendPipelineSync()
		p.sent = append(p.sent, pipeBatch{b: b, ctx: tctx})
	}
	if err := p.p.Flush(); err != nil {
		return nil, p.failed(err) // the pipeline closed the connection
	}
	return p, nil
}

// failed ends the traces of the batches sent (or being sent) when
// sending them failed, and returns err.
func (p *Pipe) failed(err error) error {
	if p.tracer != nil {
		for _, pb := range p.sent {
			p.tracer.TraceBatchEnd(pb.ctx, p.conn, pgx.TraceBatchEndData{Err: err})
		}
	}
	p.sent = nil
	return err
}

// Read reads the answers of the oldest batch not read yet, running its
// statements' callbacks in order, and returns its first error (as
// pgx.BatchResults.Close would): a statement's error ends the batch's
// implicit transaction, and the server skips the rest of it, whose
// callbacks do not run.
func (p *Pipe) Read() error {
	if len(p.sent) == 0 {
		return errors.New("pipeline: no batch to read")
	}
	pb := p.sent[0]
	p.sent = p.sent[1:]
	var first error
	for _, qq := range pb.b.QueuedQueries {
		r := &pipeResult{p: p}
		var err error
		if qq.Fn != nil {
			err = qq.Fn(r)
		} else {
			_, err = r.Exec()
		}
		if r.err != nil {
			err = r.err
		}
		if p.tracer != nil {
			p.tracer.TraceBatchQuery(pb.ctx, p.conn, pgx.TraceBatchQueryData{SQL: qq.SQL, Args: qq.Arguments, CommandTag: r.tag, Err: err})
		}
		if err != nil {
			first = err
			break
		}
	}
	// The batch's Sync: after an error the server skipped to it.
	for {
		res, err := p.p.GetResults()
		var pgErr *pgconn.PgError
		if err != nil && !errors.As(err, &pgErr) {
			first = errors.Join(first, err) // the connection is gone
			break
		}
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		if _, ok := res.(*pgconn.PipelineSync); ok {
			break
		}
		if res == nil {
			first = cmp.Or(first, errors.New("pipeline: the batch's sync never came"))
			break
		}
		if rr, ok := res.(*pgconn.ResultReader); ok { // a statement its callback left unread
			_, _ = rr.Close()
		}
	}
	if p.tracer != nil {
		p.tracer.TraceBatchEnd(pb.ctx, p.conn, pgx.TraceBatchEndData{Err: first})
	}
	return first
}

// Close reads every batch not read yet (their errors ignored) and leaves
// pipeline mode: conn is usable again (possibly in a transaction one of
// the batches began).
func (p *Pipe) Close() error {
	for len(p.sent) > 0 {
		_ = p.Read()
	}
	return p.p.Close()
}

// pipeResult is one statement's answer, as pgx.BatchResults hands it to
// a queued statement's callback.
type pipeResult struct {
	p   *Pipe
	tag pgconn.CommandTag
	err error // the statement's own error (not pgx.ErrNoRows)
}

func (r *pipeResult) next() (*pgconn.ResultReader, error) {
	res, err := r.p.p.GetResults()
	if err != nil {
		r.err = err
		return nil, err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		r.err = fmt.Errorf("pipeline: expected a statement's answer, got %T", res)
		return nil, r.err
	}
	return rr, nil
}

func (r *pipeResult) Exec() (pgconn.CommandTag, error) {
	rr, err := r.next()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	r.tag, r.err = rr.Close()
	return r.tag, r.err
}

func (r *pipeResult) Query() (pgx.Rows, error) {
	rr, err := r.next()
	if err != nil {
		return &errRows{err: err}, err
	}
	return &pipeRows{Rows: pgx.RowsFromResultReader(r.p.conn.TypeMap(), rr), r: r}, nil
}

func (r *pipeResult) QueryRow() pgx.Row {
	rows, err := r.Query()
	if err != nil {
		return errRow{err}
	}
	return pipeRow{rows}
}

func (r *pipeResult) Close() error { return r.err }

func (r *pipeResult) Tx() pgx.Tx { return nil }

// pipeRows records the statement's error and command tag when its rows
// are closed.
type pipeRows struct {
	pgx.Rows
	r *pipeResult
}

func (rs *pipeRows) Close() {
	rs.Rows.Close()
	rs.r.tag = rs.Rows.CommandTag()
	if err := rs.Rows.Err(); err != nil && rs.r.err == nil {
		rs.r.err = err
	}
}

// pipeRow is pgx's Row over a statement's rows: the first row, or
// pgx.ErrNoRows.
type pipeRow struct{ rows pgx.Rows }

func (r pipeRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	err := r.rows.Scan(dest...)
	r.rows.Close()
	return cmp.Or(r.rows.Err(), err)
}

// errRows is the rows of a statement whose answer could not be read.
type errRows struct {
	pgx.Rows
	err error
}

func (r *errRows) Next() bool                                   { return false }
func (r *errRows) Err() error                                   { return r.err }
func (r *errRows) Close()                                       {}
func (r *errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }

// errRow is the row of a statement whose answer could not be read.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
