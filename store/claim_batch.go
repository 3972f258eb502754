package store

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Claim batches (docs/performance.md, item 28). An upload's claim and
// stage (OpenAndStage, ClaimAndStage, ClaimSessionAndStage) are one
// implicit transaction: their statements in one round trip, committed
// by the server at its end, asynchronously. While this Store has
// claimSlots of them in flight, the next claims queue (internal/slots) and the
// head of the queue sends all of theirs in one round trip and one
// implicit transaction. Should any statement of it fail, the server
// rolls all of them back and each claim is sent again alone, so its
// answer (its error included) is its own. Each claim's statements stay
// together and in their order, and the claims go in the order of their
// digests, so two batches take the digests' stage locks in one order.

// claimSlots is how many claim transactions one Store runs at a time
// before claims queue for a batch.
const claimSlots = 2

// maxClaimBatch bounds one claim batch.
const maxClaimBatch = 64

// claimCall is one claim: queue puts its statements on a batch (and
// points their answers at its caller's variables, overwritten each time
// it is queued).
type claimCall struct {
	digest blobplane.Digest
	queue  func(b *pgx.Batch)
	// For merged batches (below): the intent the claim creates (a POST's,
	// a single-request upload's) and, for a single-request upload, the
	// stage of its key; nil for other claims.
	create *createClaim
	stage  *stageClaim
}

// createClaim is a claim's CreateIntent: its arguments and where its
// answer goes.
type createClaim struct {
	arg dbsqlc.CreateIntentParams
	row *dbsqlc.Intent
	err *error
}

// stageClaim is an OpenAndStage claim's stage lock and stage of key,
// claimed by its intent, and where their answers go.
type stageClaim struct {
	key     placement.Key
	size    int64
	lockErr *error
	row     *dbsqlc.Placement
	err     *error
}

// byClaimDigest orders a claim batch: stage locks in digest order.
func byClaimDigest(a, b *claimCall) int { return strings.Compare(string(a.digest), string(b.digest)) }

// ClaimBatchStats reads the counters of claim batching.
func (s *Store) ClaimBatchStats() BatchStats { return s.claims.Stats() }

// sendClaim sends c's statements, alone or in a batch, and returns the
// error of their implicit transaction (nil: committed; else nothing of
// it was recorded).
func (s *Store) sendClaim(ctx context.Context, c *claimCall) error {
	var err error
	alone := func(c *claimCall) {
		var b pgx.Batch
		b.Queue(genericPlans)
		c.queue(&b)
		err = s.pool.SendBatch(ctx, &b).Close()
	}
	commit := func(calls []*claimCall) bool {
		var b pgx.Batch
		b.Queue(genericPlans)
		m, err := s.queueMergedClaims(context.WithoutCancel(ctx), &b, calls)
		if err != nil {
			return false
		}
		if m == nil {
			for _, c := range calls {
				c.queue(&b)
			}
		}
		if s.pool.SendBatch(context.WithoutCancel(ctx), &b).Close() != nil {
			return false
		}
		if m != nil { // committed: its answers are the calls' own, whatever they are
			m.answer(calls)
			s.claims.CountMerged()
		}
		return true
	}
	if s.claims.Do(c, alone, commit) {
		return nil
	}
	return err
}

// Merged claim batches (as merged Finalize batches, finalize_batch.go):
// a batch of OpenAndStage claims of distinct digests sends CreateIntents,
// LockPlacementDigests and InsertPlacementsIfAbsent once for all of them,
// a batch of CreateIntent claims CreateIntents alone, in one implicit
// transaction as before; every call then gets the rows its own
// statements would have returned. Any other batch sends each claim's own
// statements. A failing statement fails the batch, and each claim is sent
// again alone, as before.

// mergedClaims holds a merged batch's answers until answer hands them
// out.
type mergedClaims struct {
	intents []dbsqlc.Intent
	stages  []dbsqlc.Placement
	errs    [3]error // CreateIntents, LockPlacementDigests, InsertPlacementsIfAbsent
}

// queueMergedClaims queues calls' statements merged, when they can be
// (else it queues nothing and returns nil): every call creates an intent,
// and either none stages or every one stages, no digest twice.
func (s *Store) queueMergedClaims(ctx context.Context, b *pgx.Batch, calls []*claimCall) (*mergedClaims, error) {
	staging := calls[0].stage != nil
	for i, c := range calls {
		if c.create == nil || (c.stage != nil) != staging || staging && i > 0 && calls[i-1].digest == c.digest {
			return nil, nil
		}
	}
	if len(calls) < 2 {
		return nil, nil
	}
	var arg dbsqlc.CreateIntentsParams
	ins := dbsqlc.InsertPlacementsIfAbsentParams{MaxPerDigest: placement.MaxPerDigest}
	for _, c := range calls {
		if !c.create.arg.OperationID.Valid { // CreateIntent draws its id in SQL; here it is drawn now, to match the rows
			id, err := newOperationID()
			if err != nil {
				return nil, err
			}
			c.create.arg.OperationID = id
		}
		a := c.create.arg
		arg.OperationIds = append(arg.OperationIds, a.OperationID)
		arg.Repositories = append(arg.Repositories, a.Repository)
		arg.Principals = append(arg.Principals, a.Principal)
		arg.ExpectedDigests = append(arg.ExpectedDigests, a.ExpectedDigest.String) // "" when NULL
		size := int64(-1)
		if a.ExpectedSize.Valid {
			size = a.ExpectedSize.Int64
		}
		arg.ExpectedSizes = append(arg.ExpectedSizes, size)
		arg.IngressDatacenters = append(arg.IngressDatacenters, a.IngressDatacenter)
		arg.Backends = append(arg.Backends, a.Backend)
		arg.StagedLocations = append(arg.StagedLocations, a.StagedLocation.String)
		arg.TtlSeconds = append(arg.TtlSeconds, a.TtlSeconds)
		if st := c.stage; st != nil {
			ins.Digests = append(ins.Digests, string(st.key.Digest))
			ins.Backends = append(ins.Backends, st.key.Backend)
			ins.Datacenters = append(ins.Datacenters, st.key.Datacenter)
			ins.Locations = append(ins.Locations, st.key.Location)
			ins.Sizes = append(ins.Sizes, st.size)
			ins.Epochs = append(ins.Epochs, 0)
			ins.ClaimedBy = append(ins.ClaimedBy, a.OperationID)
		}
	}
	m := &mergedClaims{}
	// No plan made for these scans a table whole (see queueMergedFinalize).
	b.Queue(mergedBatchSettings)
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.Intent, error) { return s.q.CreateIntents(ctx, db, arg) }, &m.intents, &m.errs[0])
	if !staging {
		m.errs[1], m.errs[2] = nil, nil
		return m, nil
	}
	queueExec(b, func(db dbsqlc.DBTX) error {
		return s.q.LockPlacementDigests(ctx, db, dbsqlc.LockPlacementDigestsParams{LockClass: placementDigestLockClass, Digests: ins.Digests})
	}, &m.errs[1])
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.Placement, error) { return s.q.InsertPlacementsIfAbsent(ctx, db, ins) }, &m.stages, &m.errs[2])
	return m, nil
}

// answer gives each call of a committed merged batch its own answers:
// its intent, and for a staging call the lock and its stage (pgx.ErrNoRows
// when its key was not staged, as its own insert would have answered).
// The batch committed, so it is never sent again: an answer that could
// not be read is every call's error.
func (m *mergedClaims) answer(calls []*claimCall) {
	if err := errors.Join(m.errs[:]...); err != nil {
		for _, c := range calls {
			*c.create.err = err
		}
		return
	}
	intents := indexBy(m.intents, func(r dbsqlc.Intent) pgtype.UUID { return r.OperationID })
	stages := indexBy(m.stages, rowKey)
	for _, c := range calls {
		r, ok := intents[c.create.arg.OperationID]
		*c.create.row, *c.create.err = r, nil
		if !ok {
			*c.create.err = pgx.ErrNoRows
		}
		if st := c.stage; st != nil {
			*st.lockErr = nil
			p, ok := stages[st.key]
			*st.row, *st.err = p, nil
			if !ok {
				*st.err = pgx.ErrNoRows
			}
		}
	}
}
