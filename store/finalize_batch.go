package store

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/upload"
)

// Finalize batches (docs/performance.md, item 27). While this Store has
// finalizeSlots publishing transactions in flight, a Finalize does not
// open another: it queues (internal/slots), and when a transaction ends the
// caller at the head of the queue takes every queued Finalize (up to
// maxFinalizeBatch) into one transaction: the calls' statements in one
// round trip (each call's own, queueFinalize, or, on the common path,
// each kind once for all of them: merged batches, below), each call
// decided on its own answers as alone (decide), one COMMIT for them all.
// A batch costs Postgres one BEGIN, one COMMIT and two round trips
// instead of one each per upload, and the uploads of a batch share one
// WAL flush. One alone (no other in flight) runs at once, as it always
// did.
//
// A batch commits only when every Finalize in it would have committed
// alone: a refusal, an error, a failed BeforeCommit or COMMIT of any rolls
// the whole batch back, and every one of its callers then runs Finalize
// alone, in its own goroutine, with its own transaction, which decides
// exactly as before (the refusal is returned to its caller, the others
// publish; BeforeCommit is once-only, so no bytes are waited for twice).
// The semantics of Finalize are therefore unchanged: the same checks on
// the same locked rows, the same writes, one transaction per publication
// from each client's point of view — a batch is several of them committed
// together, which no reader can tell from in sequence. A COMMIT whose
// outcome is unknown (the connection lost) is safe too: each caller's
// retry alone finds its intent admitted and returns the stored outcome
// (S4).
//
// Locks: a batch of each call's own statements takes each Finalize's
// locks in its order (intent, then placement, blob, lease share), holding
// earlier ones while it takes later ones, as one transaction of several
// statements does, and its calls go in the order of their digests, so
// two batches (of two api processes) that share digests lock their rows
// in the same order. A merged batch takes them kind by kind, each kind in
// digest order: every batch still takes every kind in one order.
// Should a deadlock still happen (with another kind of transaction),
// Postgres aborts one side; a batch's callers then run alone. That costs
// the deadlock timeout, never a wrong answer.

// finalizeSlots is how many publishing transactions one Store runs at a
// time before Finalize calls queue for a batch: two keep both of the
// reference machine's cores busy (BenchmarkUploadLedger: one slot makes
// larger batches but leaves Postgres idle between them, four smaller
// ones).
const finalizeSlots = 2

// maxFinalizeBatch bounds one batch (its pipeline and the locks it
// holds until its commit).
const maxFinalizeBatch = 64

// FinalizeBatchStats reads the counters of Finalize batching.
func (s *Store) FinalizeBatchStats() BatchStats { return s.fin.Stats() }

// finalizeBatched runs c alone when a slot is free, else in the next
// batch; a batch that does not commit leaves each of its calls to run
// alone.
func (s *Store) finalizeBatched(ctx context.Context, c *finalizeCall) (out upload.Outcome, verified bool, err error) {
	alone := func(c *finalizeCall) { out, verified, err = s.finalizeAlone(ctx, c) }
	commit := func(calls []*finalizeCall) bool { return s.commitFinalizeBatch(context.WithoutCancel(ctx), calls) }
	if s.fin.Do(c, alone, commit) {
		return c.out, c.verified, nil
	}
	return out, verified, err
}

// byFinalizeDigest orders a Finalize batch: placement and blob rows' locks
// in digest order.
func byFinalizeDigest(a, b *finalizeCall) int {
	return strings.Compare(string(a.req.Digest), string(b.req.Digest))
}

// commitFinalizeBatch runs every call of batch in one transaction and
// reports whether it committed; the outcomes are then in the calls.
func (s *Store) commitFinalizeBatch(ctx context.Context, batch []*finalizeCall) bool {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(genericPlans)
	var merged *mergedFinalize
	if mergeable(batch) {
		var err error
		if merged, err = s.queueMergedFinalize(ctx, &b, batch); err != nil {
			return false
		}
	} else {
		for _, c := range batch {
			if err := s.queueFinalize(ctx, &b, c); err != nil {
				return false
			}
		}
	}
	br := s.pool.SendBatch(ctx, &b)
	tx := br.Tx()
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := br.Close(); err != nil {
		return false
	}
	if merged != nil && !merged.answer(batch) {
		return false
	}
	for _, c := range batch {
		out, verified, err := s.decide(ctx, tx, c)
		if err != nil {
			return false
		}
		c.out, c.verified = out, verified
	}
	for _, c := range batch {
		if before := c.req.BeforeCommit; before != nil {
			if err := before(); err != nil {
				return false
			}
		}
	}
	if tx.Commit(ctx) != nil {
		return false
	}
	if merged != nil {
		s.fin.CountMerged()
	}
	return true
}

// Merged batches. With 16 clients most of the ledger's Postgres CPU is
// per statement, not per row (docs/performance.md, "The floor of a
// batched ledger"): a batch whose calls all take the common path sends
// each of queueFinalize's four statements once for all of them
// (FinalizeContexts, VerifyPendingPlacements, EnsureBlobsUnderLease,
// PublishMany: one array per parameter), then hands every call the rows
// its own statements would have returned and decides each as alone
// (decide). The locks are taken kind by kind, each kind in digest order
// (the intents, the placements, the leases and blob rows, then the
// writes), where separate statements took them call by call; two
// batches still take every kind in one order.

// mergeable reports whether batch's calls can share one statement per
// kind: at least two; each verifies its placement on the common path
// (pipelinable) of its own digest; all take the same fallback targets
// (FinalizeRequest.Targets: an api's are its configuration's,
// BLOBPLANE_REPLICATE_TO, or nil; a call whose repository has a
// replication policy takes the policy's, which PublishMany reads per
// call); no digest twice (a blob row's ON CONFLICT DO UPDATE cannot
// touch a row twice in one statement, and rows are matched by digest).
// batch is in digest order (byFinalizeDigest).
func mergeable(batch []*finalizeCall) bool {
	if len(batch) < 2 {
		return false
	}
	for i, c := range batch {
		if !pipelinable(c.req) || c.req.Verify.Key.Digest != c.req.Digest || !sameTargets(c.req.Targets, batch[0].req.Targets) {
			return false
		}
		if i > 0 && batch[i-1].req.Digest == c.req.Digest {
			return false
		}
	}
	return true
}

// sameTargets reports whether two calls' fallback replication targets
// are the same: both nil (every registered datacenter), or the same list.
func sameTargets(a, b []string) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// mergedFinalize holds the answers of a merged batch's statements until
// answer hands them to the calls.
type mergedFinalize struct {
	fcs     []dbsqlc.FinalizeContextsRow
	fcsErr  error
	vrows   []dbsqlc.Placement
	vErr    error
	blobs   []dbsqlc.Blob
	blobErr error
	pubs    []dbsqlc.PublishManyRow
	pubErr  error
}

// mergedBatchSettings is the first statement of a merged batch's
// transaction (see queueMergedFinalize). Sequential scans off gives a
// table that only a scan can read (replication_policies, read by
// PublishMany) Postgres' disable cost, 10^10, and a plan that expensive
// crosses jit_above_cost: every PublishMany was compiled by LLVM, 0.35-0.5
// s of Postgres CPU per batch (auto_explain: "JIT: Timing: ... Total 491
// ms"), which took one4k-16 from ~1,500 to ~50 uploads/s. JIT is off in
// the same transaction: these statements run in well under a millisecond.
const mergedBatchSettings = "SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"

// queueMergedFinalize queues the four statements of a mergeable batch.
func (s *Store) queueMergedFinalize(ctx context.Context, b *pgx.Batch, batch []*finalizeCall) (*mergedFinalize, error) {
	n := len(batch)
	var (
		ids                                   = make([]pgtype.UUID, n)
		digests, partitions, nodes            = make([]string, n), make([]string, n), make([]string, n)
		backends, datacenters, locations      = make([]string, n), make([]string, n), make([]string, n)
		sizes, epochs, verifySizes, keyEpochs = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
		results                               = make([][]byte, n)
	)
	for i, c := range batch {
		req, v := c.req, c.req.Verify
		result, err := publishResult(req)
		if err != nil {
			return nil, err
		}
		c.pipelineVerify = true
		ids[i], digests[i], sizes[i], partitions[i], nodes[i] = c.id, string(req.Digest), req.Size, req.Partition, req.Node
		epochs[i], results[i] = int64(req.Epoch), result
		backends[i], datacenters[i], locations[i], verifySizes[i], keyEpochs[i] = v.Key.Backend, v.Key.Datacenter, v.Key.Location, v.Size, int64(v.Epoch)
	}
	m := &mergedFinalize{}
	// These statements reach every row by its key. Their generic plans
	// (genericPlans: the batch's transaction runs no other) are made once
	// per connection, and one made while the tables were small (a fresh
	// store's first batches) scanned them whole, batch after batch, until
	// an ANALYZE replaced it (seen with auto_explain: 0.2-5 ms per
	// batch). They run only in merged batches, whose transaction turns
	// sequential scans off, so no plan made for them scans a table
	// whole. (What decide runs in the same transaction for a call off
	// the common path, and plans there first, is planned with them off
	// too: those statements also reach their rows by key. Planning each
	// batch afresh cost 0.3-0.5 ms of Postgres CPU per statement and
	// batch: docs/performance.md items 30 and 35.)
	b.Queue(mergedBatchSettings)
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.FinalizeContextsRow, error) {
		return s.q.FinalizeContexts(ctx, db, dbsqlc.FinalizeContextsParams{OperationIds: ids, Digests: digests, Sizes: sizes, PartitionIds: partitions})
	}, &m.fcs, &m.fcsErr)
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.Placement, error) {
		return s.q.VerifyPendingPlacements(ctx, db, dbsqlc.VerifyPendingPlacementsParams{Digests: digests, Backends: backends,
			Datacenters: datacenters, Locations: locations, Sizes: verifySizes, Epochs: keyEpochs})
	}, &m.vrows, &m.vErr)
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.Blob, error) {
		return s.q.EnsureBlobsUnderLease(ctx, db, dbsqlc.EnsureBlobsUnderLeaseParams{Digests: digests, Sizes: sizes,
			PartitionIds: partitions, Nodes: nodes, Epochs: epochs})
	}, &m.blobs, &m.blobErr)
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.PublishManyRow, error) {
		return s.q.PublishMany(ctx, db, dbsqlc.PublishManyParams{OperationIds: ids, Digests: digests, Sizes: sizes, Results: results,
			Targets: batch[0].req.Targets})
	}, &m.pubs, &m.pubErr)
	return m, nil
}

// answer gives each call of batch the rows its own statements would have
// returned (pgx.ErrNoRows where its statement would have returned none);
// false when a statement failed.
func (m *mergedFinalize) answer(batch []*finalizeCall) bool {
	if errors.Join(m.fcsErr, m.vErr, m.blobErr, m.pubErr) != nil {
		return false
	}
	fcs := indexBy(m.fcs, func(r dbsqlc.FinalizeContextsRow) pgtype.UUID { return r.OperationID })
	vrows := indexBy(m.vrows, rowKey)
	blobs := indexBy(m.blobs, func(r dbsqlc.Blob) string { return r.Digest })
	pubs := indexBy(m.pubs, func(r dbsqlc.PublishManyRow) pgtype.UUID { return r.OperationID })
	for _, c := range batch {
		c.fcErr, c.vErr, c.blobErr, c.pubErr = pgx.ErrNoRows, pgx.ErrNoRows, pgx.ErrNoRows, pgx.ErrNoRows
		if r, ok := fcs[c.id]; ok {
			c.fc, c.fcErr = finalizeContextOf(r), nil
		}
		if r, ok := vrows[c.req.Verify.Key]; ok {
			c.vrow, c.vErr = r, nil
		}
		if r, ok := blobs[string(c.req.Digest)]; ok {
			c.blob, c.blobErr = r, nil
		}
		if r, ok := pubs[c.id]; ok {
			c.pub, c.pubErr = dbsqlc.PublishRow{Result: r.Result, PublishedAt: r.PublishedAt}, nil
		}
	}
	return true
}

// finalizeContextOf is FinalizeContext's row for a row of FinalizeContexts
// (whose lease owner is "" where FinalizeContext's is NULL: no lease).
func finalizeContextOf(r dbsqlc.FinalizeContextsRow) dbsqlc.FinalizeContextRow {
	return dbsqlc.FinalizeContextRow{
		Intent: dbsqlc.Intent{OperationID: r.OperationID, Repository: r.Repository, Principal: r.Principal,
			ExpectedDigest: r.ExpectedDigest, ExpectedSize: r.ExpectedSize, IngressDatacenter: r.IngressDatacenter,
			Backend: r.Backend, StagedLocation: r.StagedLocation, State: r.State, ReceivedBytes: r.ReceivedBytes,
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt, StagedDeletedAt: r.StagedDeletedAt,
			Possession: r.Possession, MountedFrom: r.MountedFrom, AcceptedAt: r.AcceptedAt},
		OutcomeResult: r.OutcomeResult, OutcomePublishedAt: r.OutcomePublishedAt,
		LeaseOwner:      pgtype.Text{String: r.LeaseOwner, Valid: r.LeaseOwner != ""},
		LeaseEpoch:      pgtype.Int8{Int64: r.LeaseEpoch, Valid: r.LeaseOwner != ""},
		PrincipalGrants: r.PrincipalGrants, Verified: r.Verified, MountSourceReferences: r.MountSourceReferences,
	}
}
