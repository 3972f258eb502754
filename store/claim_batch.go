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
// claimSlots of them in flight, the next claims queue (slots.go) and the
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
	// For merged batches (below): what the claim is, when it is one of
	// the kinds a batch can merge; nil otherwise.
	open   *openClaim
	create *createClaim
}

// openClaim is an OpenAndStage claim: its intent (with its operation
// id), the key it stages, and where its answers go.
type openClaim struct {
	arg       dbsqlc.CreateIntentParams
	key       placement.Key
	size      int64
	row       *dbsqlc.Intent
	createErr *error
	lockErr   *error
	stage     *dbsqlc.Placement
	stageErr  *error
}

// createClaim is a CreateIntent claim (an OCI POST): its intent and where
// its answer goes.
type createClaim struct {
	arg dbsqlc.CreateIntentParams
	row *dbsqlc.Intent
	err *error
}

// byClaimDigest orders a claim batch: stage locks in digest order.
func byClaimDigest(a, b *claimCall) int { return strings.Compare(string(a.digest), string(b.digest)) }

// ClaimBatchStats reads the counters of claim batching.
func (s *Store) ClaimBatchStats() BatchStats {
	st := s.claims.stats()
	st.Merged = s.claimsMerged.Load()
	return st
}

// sendClaim sends c's statements, alone or in a batch, and returns the
// error of their implicit transaction (nil: committed; else nothing of
// it was recorded).
func (s *Store) sendClaim(ctx context.Context, c *claimCall) error {
	var err error
	alone := func(c *claimCall) {
		var b pgx.Batch
		c.queue(&b)
		err = s.pool.SendBatch(ctx, &b).Close()
	}
	commit := func(calls []*claimCall) bool {
		var b pgx.Batch
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
			s.claimsMerged.Add(1)
		}
		return true
	}
	if s.claims.do(c, alone, commit) {
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
// (else it queues nothing and returns nil).
func (s *Store) queueMergedClaims(ctx context.Context, b *pgx.Batch, calls []*claimCall) (*mergedClaims, error) {
	open, create := true, true
	for i, c := range calls {
		open = open && c.open != nil && (i == 0 || calls[i-1].digest != c.digest)
		create = create && c.create != nil
	}
	if len(calls) < 2 || !open && !create {
		return nil, nil
	}
	n := len(calls)
	var arg dbsqlc.CreateIntentsParams
	for _, c := range calls {
		a := c.open.argOr(c.create)
		if !a.OperationID.Valid { // CreateIntent draws its id in SQL; here it is drawn now, to match the rows
			id, err := newOperationID()
			if err != nil {
				return nil, err
			}
			a.OperationID = id
			c.create.arg.OperationID = id
		}
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
	}
	m := &mergedClaims{}
	// No plan made for these scans a table whole (see queueMergedFinalize).
	b.Queue("SELECT set_config('enable_seqscan', 'off', true)")
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.Intent, error) { return s.q.CreateIntents(ctx, db, arg) }, &m.intents, &m.errs[0])
	if !open {
		m.errs[1], m.errs[2] = nil, nil
		return m, nil
	}
	digests := make([]string, n)
	ins := dbsqlc.InsertPlacementsIfAbsentParams{MaxPerDigest: placement.MaxPerDigest}
	for i, c := range calls {
		k := c.open.key
		digests[i] = string(k.Digest)
		ins.Digests = append(ins.Digests, string(k.Digest))
		ins.Backends = append(ins.Backends, k.Backend)
		ins.Datacenters = append(ins.Datacenters, k.Datacenter)
		ins.Locations = append(ins.Locations, k.Location)
		ins.Sizes = append(ins.Sizes, c.open.size)
		ins.Epochs = append(ins.Epochs, 0)
		ins.ClaimedBy = append(ins.ClaimedBy, c.open.arg.OperationID)
	}
	queueExec(b, func(db dbsqlc.DBTX) error {
		return s.q.LockPlacementDigests(ctx, db, dbsqlc.LockPlacementDigestsParams{LockClass: placementDigestLockClass, Digests: digests})
	}, &m.errs[1])
	queueRows(b, func(db dbsqlc.DBTX) ([]dbsqlc.Placement, error) { return s.q.InsertPlacementsIfAbsent(ctx, db, ins) }, &m.stages, &m.errs[2])
	return m, nil
}

// argOr is the CreateIntent arguments of the claim: o's, else c's.
func (o *openClaim) argOr(c *createClaim) dbsqlc.CreateIntentParams {
	if o != nil {
		return o.arg
	}
	return c.arg
}

// answer gives each call of a committed merged batch its own answers:
// its intent, and for OpenAndStage the lock and its stage (pgx.ErrNoRows
// when its key was not staged, as its own insert would have answered).
// The batch committed, so it is never sent again: an answer that could
// not be read is every call's error.
func (m *mergedClaims) answer(calls []*claimCall) {
	if err := errors.Join(m.errs[:]...); err != nil {
		for _, c := range calls {
			_, rowErr, _ := c.open.outputs(c.create)
			*rowErr = err
		}
		return
	}
	intents := indexBy(m.intents, func(r dbsqlc.Intent) pgtype.UUID { return r.OperationID })
	stages := indexBy(m.stages, rowKey)
	for _, c := range calls {
		row, rowErr, id := c.open.outputs(c.create)
		r, ok := intents[id]
		*row, *rowErr = r, nil
		if !ok {
			*rowErr = pgx.ErrNoRows
		}
		if o := c.open; o != nil {
			*o.lockErr = nil
			st, ok := stages[o.key]
			*o.stage, *o.stageErr = st, nil
			if !ok {
				*o.stageErr = pgx.ErrNoRows
			}
		}
	}
}

// outputs are where the claim's intent answer goes, and its id.
func (o *openClaim) outputs(c *createClaim) (*dbsqlc.Intent, *error, pgtype.UUID) {
	if o != nil {
		return o.row, o.createErr, o.arg.OperationID
	}
	return c.row, c.err, c.arg.OperationID
}
