package store

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/store/internal/pipeline"
	"github.com/blobplane/blobplane/upload"
)

// Chained closes (docs/performance.md, item 31). A close at the home is
// its claim (a single-request upload's OpenAndStage, a session PUT's
// ClaimSessionAndStage), the link of its bytes at their key, then
// Finalize: the claim must commit before the bytes appear at the key
// (flow 1, S6), and Finalize's statements waited for the link. With one
// client that is three round trips in a row, and Finalize's first (its
// reads, the verification, the blob row, the writes) took longer than
// the bytes' sync it overlaps.
//
// A chained close sends both at once on one connection: the claim's
// statements with their Sync (their implicit transaction, committed
// asynchronously as OpenAndStage's), then BEGIN and Finalize's
// statements with theirs. The server answers the claim as soon as it
// committed; the caller links the bytes; meanwhile the server runs
// Finalize's statements, whose row locks hold until the caller decides
// on their answers (exactly as Finalize does, decide) and, once the
// bytes are durable, sends the COMMIT. Nothing of Finalize can commit
// before the link and the sync, as before: only the order in which the
// server runs its statements changed, not what waits for what.
//
// Only a close whose bytes are in hand and hash to the declared digest
// chains (nothing to wait for between the claim and Finalize's
// statements but the link), and only while no claim and no Finalize is
// in flight on this Store (with more clients the batches of
// claim_batch.go and finalize_batch.go save more, and a chain holds a
// slot of both while it runs). Whatever is not Finalize's common path
// (the key staged already, a refusal, an error) goes the way it would
// have without the chain: the chain rolls back its transaction first.

// ChainedClose is a chained close in flight: ChainOpenAndStage or
// ChainClaimSessionAndStage sent its statements; Claim (or ClaimSession)
// answers as OpenAndStage (ClaimSessionAndStage) would, Finalize as
// Finalize would. Release (after the claim, if Finalize is not called)
// gives the connection back and rolls back what did not commit. Its
// methods are called in turn, not concurrently.
type ChainedClose struct {
	s       *Store
	ctx     context.Context // the chain's: it is not cancelled
	conn    *pgxpool.Conn
	pipe    *pipeline.Pipe // nil once its answers were read
	open    *openStaging   // ChainOpenAndStage's claim
	session *claimStaging  // ChainClaimSessionAndStage's
	call    *finalizeCall

	claimSlot, finSlot bool // the batchers' slots it holds
}

// ChainOpenAndStage starts a chained close of a single-request upload:
// OpenAndStage(n, k), then Finalize(req) of the intent it creates
// (req.OperationID and req.BeforeCommit are ignored: Finalize passes the
// latter). req must verify k as holding the declared content
// (req.Verify), which the caller's bytes must already have proven. nil
// means the close does not chain (this Store has claims or publications
// in flight, or the arguments are anything but the common case): the
// caller then calls OpenAndStage and Finalize.
func (s *Store) ChainOpenAndStage(ctx context.Context, n upload.NewIntent, k placement.Key, req upload.FinalizeRequest) upload.Chain {
	if req.Size != n.ExpectedSize {
		return nil
	}
	ch := s.startChain(ctx)
	if ch == nil {
		return nil
	}
	o, err := s.newOpenStaging(ch.ctx, n, k)
	if err != nil {
		ch.Release()
		return nil // OpenAndStage says why
	}
	req.OperationID = o.id.String()
	ch.open = o
	return ch.send(o.call, o.id, k, req).chain()
}

// ChainClaimSessionAndStage is ChainOpenAndStage for the PUT that closes
// the upload session op of repository with its whole body:
// ClaimSessionAndStage(op, repository, k, size), then Finalize(req) of op.
func (s *Store) ChainClaimSessionAndStage(ctx context.Context, op, repository string, k placement.Key, size int64, req upload.FinalizeRequest) upload.Chain {
	id, err := parseOpID(op)
	if err != nil || repository == "" || req.Size != size {
		return nil
	}
	ch := s.startChain(ctx)
	if ch == nil {
		return nil
	}
	c, err := s.newClaimStaging(ch.ctx, id, k, size, repository)
	if err != nil {
		ch.Release()
		return nil
	}
	req.OperationID = op
	ch.session = c
	return ch.send(c.call, id, k, req).chain()
}

// chain is ch as an upload.Chain: nil (no chain) when ch is nil.
func (ch *ChainedClose) chain() upload.Chain {
	if ch == nil {
		return nil
	}
	return ch
}

// startChain takes a claim slot and a Finalize slot for a chain when
// this Store has neither kind in flight; nil otherwise.
func (s *Store) startChain(ctx context.Context) *ChainedClose {
	// The claim completes whatever happens to the request.
	ch := &ChainedClose{s: s, ctx: context.WithoutCancel(ctx)}
	if ch.claimSlot = s.claims.TakeIfIdle(); !ch.claimSlot {
		return nil
	}
	if ch.finSlot = s.fin.TakeIfIdle(); !ch.finSlot {
		ch.Release()
		return nil
	}
	return ch
}

// send sends claim's statements, then BEGIN and Finalize's first round
// trip for req, on one connection. nil (the chain released): req is not
// Finalize's common case, or the statements could not be sent.
func (ch *ChainedClose) send(claim *claimCall, id pgtype.UUID, k placement.Key, req upload.FinalizeRequest) *ChainedClose {
	s, ctx := ch.s, ch.ctx
	req.BeforeCommit = nil
	ch.call = &finalizeCall{req: req, id: id}
	if req.Verify == nil || req.Verify.Key != k || req.Digest != k.Digest || !pipelinable(req) {
		ch.Release()
		return nil
	}
	var cb, fb pgx.Batch
	cb.Queue(genericPlans)
	claim.queue(&cb)
	fb.BeginTx(pgx.TxOptions{})
	fb.Queue(genericPlans)
	if err := s.queueFinalize(ctx, &fb, ch.call); err != nil {
		ch.Release()
		return nil
	}
	var err error
	if ch.conn, err = s.pool.Acquire(ctx); err != nil {
		ch.Release()
		return nil
	}
	// If sending fails the connection is closed: the server has not
	// committed the claim, or (the write cut short after its Sync) has
	// committed one nobody goes on with, which expires and is swept.
	if ch.pipe, err = pipeline.Open(ctx, ch.conn.Conn(), s.batchTracer, &cb, &fb); err != nil {
		ch.Release()
		return nil
	}
	s.chained.Add(1)
	return ch
}

// ChainedCloses counts the closes this Store chained since it was made
// (exported as a metric by the api).
func (s *Store) ChainedCloses() int64 { return s.chained.Load() }

// ErrNotThisChain is Claim (ClaimSession) of a chain another claim started.
var ErrNotThisChain = errors.New("store: the chained close was started for another claim")

// readClaim reads the claim's answers: its implicit transaction's error.
func (ch *ChainedClose) readClaim() error {
	err := ch.pipe.Read()
	ch.s.claims.Release()
	ch.claimSlot = false
	return err
}

// Claim waits for ChainOpenAndStage's claim and answers as OpenAndStage
// would. Unless it staged k, the chain is over (released): the caller
// goes on as after OpenAndStage, and Finalize is Store.Finalize.
func (ch *ChainedClose) Claim() (in upload.Intent, staged bool, err error) {
	if ch.open == nil {
		return upload.Intent{}, false, ErrNotThisChain
	}
	in, staged, err = ch.open.answer(ch.readClaim())
	if err != nil || !staged {
		ch.Release()
	}
	return in, staged, err
}

// ClaimSession waits for ChainClaimSessionAndStage's claim and answers
// as ClaimSessionAndStage would. Unless the claim staged k, the chain is
// over (released before anything else runs, such as re-staging k).
func (ch *ChainedClose) ClaimSession() (in upload.Intent, claimed bool, st upload.Stage, err error) {
	c := ch.session
	if c == nil {
		return upload.Intent{}, false, upload.Stage{}, ErrNotThisChain
	}
	sendErr := ch.readClaim()
	if sendErr != nil || !c.stagedAll() {
		ch.Release()
	}
	row, claimed, st, err := c.answer(ch.ctx, sendErr)
	if err != nil || !claimed {
		return upload.Intent{}, false, upload.Stage{}, err
	}
	return intentFromRow(dbsqlc.Intent(row)), true, st, nil
}

// Finalize publishes as Store.Finalize(req) does. req must be the
// chain's request (the same content, fence, targets and verification)
// for the chain's statements to count; otherwise, or once the chain is
// over, it runs Store.Finalize.
func (ch *ChainedClose) Finalize(ctx context.Context, req upload.FinalizeRequest) (upload.Outcome, error) {
	if ch.pipe == nil || ch.claimSlot || !ch.sameRequest(req) {
		ch.Release()
		return ch.s.Finalize(ctx, req)
	}
	return ch.s.finalizeWith(ctx, req, ch.finalize)
}

// sameRequest reports whether req asks for what the chain sent.
func (ch *ChainedClose) sameRequest(req upload.FinalizeRequest) bool {
	sent := ch.call.req
	return req.OperationID == sent.OperationID && req.Digest == sent.Digest && req.Size == sent.Size &&
		req.Partition == sent.Partition && req.Node == sent.Node && req.Epoch == sent.Epoch &&
		slices.Equal(req.Targets, sent.Targets) && (req.Targets == nil) == (sent.Targets == nil) &&
		req.Verify != nil && *req.Verify == *sent.Verify && req.Proven == sent.Proven
}

// finalize is finalize (publish.go) on the chain's transaction: decide
// on its statements' answers, req.BeforeCommit, COMMIT, as
// finalizeAlone does after its first round trip.
func (ch *ChainedClose) finalize(ctx context.Context, req upload.FinalizeRequest) (out upload.Outcome, verified bool, err error) {
	defer ch.Release()
	c := ch.call
	c.req.BeforeCommit, c.req.Replication = req.BeforeCommit, req.Replication
	out, verified, err = ch.publish(ctx, c)
	if err != nil {
		var e *blobplane.Error
		if errors.As(err, &e) {
			return upload.Outcome{}, false, err
		}
		return upload.Outcome{}, false, dbErr("finalize "+req.OperationID, err)
	}
	return out, verified, nil
}

func (ch *ChainedClose) publish(ctx context.Context, c *finalizeCall) (out upload.Outcome, verified bool, err error) {
	err = ch.pipe.Read()
	if cerr := ch.pipe.Close(); err == nil {
		err = cerr
	}
	ch.pipe = nil
	if err != nil {
		return upload.Outcome{}, false, err
	}
	tx := &chainTx{conn: ch.conn.Conn()}
	if out, verified, err = ch.s.decide(ctx, tx, c); err != nil {
		return upload.Outcome{}, false, err
	}
	if c.req.BeforeCommit != nil {
		if err := c.req.BeforeCommit(); err != nil {
			return upload.Outcome{}, false, err
		}
	}
	if err := ctx.Err(); err != nil {
		return upload.Outcome{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return upload.Outcome{}, false, err
	}
	return out, verified, nil
}

// Release ends the chain: it reads whatever answers are still coming,
// rolls back a transaction that did not commit, gives the connection and
// the batchers' slots back. It may be called more than once.
func (ch *ChainedClose) Release() {
	if ch == nil {
		return
	}
	if ch.pipe != nil {
		_ = ch.pipe.Close()
		ch.pipe = nil
	}
	if ch.conn != nil {
		if pc := ch.conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
			_, _ = ch.conn.Exec(ch.ctx, "ROLLBACK")
		}
		ch.conn.Release() // a connection still in a transaction is closed, not reused
		ch.conn = nil
	}
	if ch.claimSlot {
		ch.s.claims.Release()
		ch.claimSlot = false
	}
	if ch.finSlot {
		ch.s.fin.Release()
		ch.finSlot = false
	}
}

// chainTx is the chained close's transaction, for decide: the
// connection, whose BEGIN the chain sent. Statements run on the
// connection; Begin (a savepoint) first makes pgx's own transaction
// over it, at the cost of a round trip that only replication's enqueue
// may spend.
type chainTx struct {
	conn *pgx.Conn
	tx   pgx.Tx // pgx's, once Begin or LargeObjects asked for it
}

var _ pgx.Tx = (*chainTx)(nil)

var _ upload.Chain = (*ChainedClose)(nil)

// pgxTx makes pgx's transaction over the open one: a statement that
// changes nothing stands for the BEGIN already sent.
func (t *chainTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if t.tx == nil {
		tx, err := t.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "SELECT"})
		if err != nil {
			return nil, err
		}
		t.tx = tx
	}
	return t.tx, nil
}

func (t *chainTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (t *chainTx) Commit(ctx context.Context) error {
	if t.tx != nil {
		return t.tx.Commit(ctx)
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

func (t *chainTx) Rollback(ctx context.Context) error {
	if t.tx != nil {
		return t.tx.Rollback(ctx)
	}
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	return err
}

func (t *chainTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, rows)
}

func (t *chainTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

func (t *chainTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.pgxTx(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

func (t *chainTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *chainTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *chainTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *chainTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *chainTx) Conn() *pgx.Conn { return t.conn }
