package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/upload"
)

// BatchThenForTest sends, in one pgx batch as OpenAndStage does, the
// CreateIntent of n and then the statement then, and returns the intent's
// operation id and the batch's error: what TestBatchIsOneTransaction
// needs to see that a later statement's failure undoes an earlier write.
func (s *Store) BatchThenForTest(ctx context.Context, n upload.NewIntent, then string) (string, error) {
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

// MergedBatchSettingsForTest is the first statement of a merged batch's
// transaction.
const MergedBatchSettingsForTest = mergedBatchSettings

// HotStatementForTest is one statement of a hot path as sqlc sends it.
type HotStatementForTest struct {
	Name string
	SQL  string
	Args []any
	// SeqScanOff: the statement runs only in a merged batch, whose
	// transaction turns sequential scans off before it (queueMergedFinalize).
	SeqScanOff bool
}

// HotStatementsForTest records, without sending them, the statements an
// upload, a read and an authentication send per request, with the
// arguments given: what TestHotStatementsUseIndexes explains.
func (s *Store) HotStatementsForTest(op, repository, principal, tokenID string, d blobplane.Digest) []HotStatementForTest {
	ctx := context.Background()
	var id pgtype.UUID
	_ = id.Scan(op)
	k := placement.Key{Digest: d, Backend: "fs", Datacenter: "eu-1", Location: "sha256/" + d.Hex()}
	var out []HotStatementForTest
	rec := func(name string, call func(dbsqlc.DBTX)) {
		var r recorder
		call(&r)
		out = append(out, HotStatementForTest{Name: name, SQL: r.sql, Args: r.args})
	}
	rec("TokenForAuth", func(db dbsqlc.DBTX) { _, _ = s.q.TokenForAuth(ctx, db, tokenID) })
	rec("PrincipalGrants", func(db dbsqlc.DBTX) { _, _ = s.q.PrincipalGrants(ctx, db, principal) })
	rec("CreateIntent", func(db dbsqlc.DBTX) {
		_, _ = s.q.CreateIntent(ctx, db, dbsqlc.CreateIntentParams{Repository: repository, Principal: principal,
			ExpectedDigest: pgtype.Text{String: string(d), Valid: true}, ExpectedSize: pgtype.Int8{Int64: 4096, Valid: true},
			IngressDatacenter: "eu-1", Backend: "fs", TtlSeconds: 3600})
	})
	rec("GetIntent", func(db dbsqlc.DBTX) { _, _ = s.q.GetIntent(ctx, db, id) })
	rec("ClaimIntentContent", func(db dbsqlc.DBTX) {
		_, _ = s.q.ClaimIntentContent(ctx, db, dbsqlc.ClaimIntentContentParams{LockClass: placementDigestLockClass, Digest: string(d),
			SizeBytes: 4096, OperationID: id, SessionRepository: optText(repository), SessionBackend: optText("fs")})
	})
	rec("ExtendIntent", func(db dbsqlc.DBTX) {
		_, _ = s.q.ExtendIntent(ctx, db, dbsqlc.ExtendIntentParams{ReceivedBytes: 4096, TtlSeconds: 3600, OperationID: id})
	})
	rec("RecordIntentContent", func(db dbsqlc.DBTX) {
		_, _ = s.q.RecordIntentContent(ctx, db, dbsqlc.RecordIntentContentParams{Digest: string(d), SizeBytes: 4096, OperationID: id})
	})
	rec("AbandonIntent", func(db dbsqlc.DBTX) { _, _ = s.q.AbandonIntent(ctx, db, id) })
	rec("AdmitIntent", func(db dbsqlc.DBTX) { _, _ = s.q.AdmitIntent(ctx, db, id) })
	rec("InsertPlacementIfAbsent", func(db dbsqlc.DBTX) {
		_, _ = s.q.InsertPlacementIfAbsent(ctx, db, insertPlacementArgs(k, 4096, 0, id))
	})
	rec("FinalizeContext", func(db dbsqlc.DBTX) {
		_, _ = s.q.FinalizeContext(ctx, db, dbsqlc.FinalizeContextParams{OperationID: id, PartitionID: "p-0001", Digest: string(d), SizeBytes: 4096})
	})
	rec("VerifyPendingPlacement", func(db dbsqlc.DBTX) {
		_, _ = s.q.VerifyPendingPlacement(ctx, db, dbsqlc.VerifyPendingPlacementParams{Digest: string(d), Backend: k.Backend,
			Datacenter: k.Datacenter, Location: k.Location, SizeBytes: 4096})
	})
	rec("EnsureBlobUnderLease", func(db dbsqlc.DBTX) {
		_, _ = s.q.EnsureBlobUnderLease(ctx, db, dbsqlc.EnsureBlobUnderLeaseParams{Digest: string(d), SizeBytes: 4096,
			PartitionID: "p-0001", Node: "node-a", Epoch: 1})
	})
	rec("Publish", func(db dbsqlc.DBTX) {
		_, _ = s.q.Publish(ctx, db, dbsqlc.PublishParams{OperationID: id, Digest: string(d), SizeBytes: 4096, Result: []byte(`{}`)})
	})
	// A merged Finalize batch's statements (finalize_batch.go), for this
	// call and one more.
	other := pgtype.UUID{Bytes: [16]byte{15: 1}, Valid: true}
	ids, digests, sizes := []pgtype.UUID{id, other}, []string{string(d), string(d) + "0"}, []int64{4096, 4096}
	partitions, nodes, epochs := []string{"p-0001", "p-0001"}, []string{"node-a", "node-a"}, []int64{1, 1}
	rec("FinalizeContexts", func(db dbsqlc.DBTX) {
		_, _ = s.q.FinalizeContexts(ctx, db, dbsqlc.FinalizeContextsParams{OperationIds: ids, Digests: digests, Sizes: sizes, PartitionIds: partitions})
	})
	rec("VerifyPendingPlacements", func(db dbsqlc.DBTX) {
		_, _ = s.q.VerifyPendingPlacements(ctx, db, dbsqlc.VerifyPendingPlacementsParams{Digests: digests, Backends: []string{"fs", "fs"},
			Datacenters: []string{"eu-1", "eu-1"}, Locations: []string{k.Location, k.Location + "0"}, Sizes: sizes, Epochs: []int64{0, 0}})
	})
	rec("EnsureBlobsUnderLease", func(db dbsqlc.DBTX) {
		_, _ = s.q.EnsureBlobsUnderLease(ctx, db, dbsqlc.EnsureBlobsUnderLeaseParams{Digests: digests, Sizes: sizes, PartitionIds: partitions, Nodes: nodes, Epochs: epochs})
	})
	rec("PublishMany", func(db dbsqlc.DBTX) {
		_, _ = s.q.PublishMany(ctx, db, dbsqlc.PublishManyParams{OperationIds: ids, Digests: digests, Sizes: sizes, Results: [][]byte{[]byte(`{}`), []byte(`{}`)}})
	})
	// A merged claim batch's statements (claim_batch.go), likewise.
	rec("CreateIntents", func(db dbsqlc.DBTX) {
		_, _ = s.q.CreateIntents(ctx, db, dbsqlc.CreateIntentsParams{OperationIds: ids, Repositories: []string{repository, repository},
			Principals: []string{principal, principal}, ExpectedDigests: digests, ExpectedSizes: sizes,
			IngressDatacenters: []string{"eu-1", "eu-1"}, Backends: []string{"fs", "fs"}, StagedLocations: []string{"", ""},
			TtlSeconds: []float64{3600, 3600}})
	})
	rec("LockPlacementDigests", func(db dbsqlc.DBTX) {
		_ = s.q.LockPlacementDigests(ctx, db, dbsqlc.LockPlacementDigestsParams{LockClass: placementDigestLockClass, Digests: digests})
	})
	rec("InsertPlacementsIfAbsent", func(db dbsqlc.DBTX) {
		_, _ = s.q.InsertPlacementsIfAbsent(ctx, db, dbsqlc.InsertPlacementsIfAbsentParams{Digests: digests, Backends: []string{"fs", "fs"},
			Datacenters: []string{"eu-1", "eu-1"}, Locations: []string{k.Location, k.Location + "0"}, Sizes: sizes,
			Epochs: []int64{0, 0}, ClaimedBy: ids, MaxPerDigest: placement.MaxPerDigest})
	})
	for i := range out {
		switch out[i].Name {
		case "FinalizeContexts", "VerifyPendingPlacements", "EnsureBlobsUnderLease", "PublishMany",
			"CreateIntents", "LockPlacementDigests", "InsertPlacementsIfAbsent":
			out[i].SeqScanOff = true
		}
	}
	rec("GetReferencedBlob", func(db dbsqlc.DBTX) {
		_, _ = s.q.GetReferencedBlob(ctx, db, dbsqlc.GetReferencedBlobParams{Repository: repository, Digest: string(d)})
	})
	rec("ListPlacements", func(db dbsqlc.DBTX) { _, _ = s.q.ListPlacements(ctx, db, string(d)) })
	rec("DeleteReference", func(db dbsqlc.DBTX) {
		_, _ = s.q.DeleteReference(ctx, db, dbsqlc.DeleteReferenceParams{Repository: repository, Digest: string(d)})
	})
	return out
}

// SetFinalizeBatchingForTest turns Finalize batching on or off (on in New).
func (s *Store) SetFinalizeBatchingForTest(on bool) { s.fin.Off = !on }

// SetClaimBatchingForTest turns claim batching on or off (on in New).
func (s *Store) SetClaimBatchingForTest(on bool) { s.claims.Off = !on }

// OnClaimQueuedForTest calls f with the queue's length each time a claim
// joins the batch queue.
func (s *Store) OnClaimQueuedForTest(f func(n int)) { s.claims.Queued = f }

// OnFinalizeQueuedForTest calls f with the queue's length each time a
// Finalize call joins the batch queue.
func (s *Store) OnFinalizeQueuedForTest(f func(n int)) { s.fin.Queued = f }

// PlacementDigestLockClass is the class of the digests' stage locks.
const PlacementDigestLockClass = placementDigestLockClass

// ReapStatementForTest is ReapExpiredIntents' statement and arguments.
func (s *Store) ReapStatementForTest(datacenter string, batch int32) HotStatementForTest {
	var r recorder
	_, _ = s.q.ReapExpiredIntents(context.Background(), &r, dbsqlc.ReapExpiredIntentsParams{IngressDatacenter: datacenter, Batch: batch})
	return HotStatementForTest{Name: "ReapExpiredIntents", SQL: r.sql, Args: r.args}
}

// SetGuardCheckForTest makes g check with fn instead of the database.
func SetGuardCheckForTest(g *Guard, fn func(context.Context) (Replication, error)) { g.check = fn }

// NoticeForTest delivers a server notice to st's pool hook, as a
// connection would.
func NoticeForTest(st *Store, message string) {
	st.pool.Config().ConnConfig.OnNotice(nil, &pgconn.Notice{Severity: "WARNING", Code: "01000", Message: message})
}

// DBErrForTest is dbErr: how the store maps a Postgres error.
func DBErrForTest(op string, err error) error { return dbErr(op, err) }
