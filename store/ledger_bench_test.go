package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/procstat"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// BenchmarkUploadLedger is the ledger's share of a single-request 4 KiB
// upload at the home, without HTTP or bytes: OpenAndStage (the intent,
// its claim and the placement's stage) then Finalize recording the
// verification, as handlers.close runs them (clients=16/post-put: an OCI
// POST's CreateIntent, then the PUT's ClaimSessionAndStage and Finalize;
// clients=1/chained: the same as a chained close, ChainOpenAndStage, its
// Claim, then its Finalize, with nothing between them to overlap, so it
// shows what the chain costs or saves Postgres, not its gain end to end:
// docs/performance.md item 31), with 1 and 16 uploads at a
// time on a pool configured like the api's (synchronous commits, 8
// connections); with 16, also with batching off (each claim and each
// publication its own transaction: claim_batch.go, finalize_batch.go)
// for the ratio. Besides uploads/s it reports pg-cpu-us/op: the CPU time
// (/proc) of the Postgres backends serving the pool, per upload — the
// figure docs/performance.md compares with MinIO's whole cost per PUT.
//
// The floor sub-benchmarks (clients=1/floor, clients=16/floor) write the
// same rows with the same commits on the same pool, but in the fewest
// statements that can write them and with none of the checks: one
// statement for the intent and its pending placement (asynchronous
// commit), one for the intent's admission, the verification, the blob
// row, the reference and the outcome (synchronous commit), as pgbench
// would send them (ledgerFloor). No lease fence, grants, stage lock,
// placement bound or stored-outcome JSON: what the spec's ledger costs
// Postgres at the least on this machine, beside what Blobplane's costs
// (docs/performance.md, "Why small uploads trail MinIO, measured").
// clients=16/floor-rows=6 writes the same rows six uploads per statement
// (unnest of their arguments), through 16/6 workers: the floor of a
// ledger whose batches send one statement per kind instead of one per
// upload. clients=16/floor-tx=6 sends the same six uploads' statements
// one upload per statement, pipelined in one transaction per kind (as
// the store's batches do): the two figures part what batched commits
// save from what multi-row statements save.
//
// Run: go test ./store -run '^$' -bench UploadLedger -benchtime 3000x
func BenchmarkUploadLedger(b *testing.B) {
	for _, tc := range []struct {
		clients int
		batches bool
		floor   bool
		rows    int  // the floor's uploads per statement (floorRows)
		postPut bool // the OCI POST+PUT path instead of the single request
		chained bool // the single request as a chained close (ChainOpenAndStage)
	}{{1, true, false, 1, false, false}, {1, true, false, 1, false, true}, {1, false, true, 1, false, false}, {16, false, false, 1, false, false}, {16, true, false, 1, false, false}, {16, true, false, 1, true, false},
		{16, false, true, 1, false, false}, {16, false, true, floorBatch, false, false}, {16, false, true, -floorBatch, false, false}} {
		clients := tc.clients
		name := fmt.Sprintf("clients=%d", clients)
		switch {
		case tc.floor && tc.rows > 1:
			name += fmt.Sprintf("/floor-rows=%d", tc.rows)
		case tc.floor && tc.rows < -1:
			name += fmt.Sprintf("/floor-tx=%d", -tc.rows)
		case tc.floor:
			name += "/floor"
		case tc.postPut:
			name += "/post-put"
		case tc.chained:
			name += "/chained"
		case clients > 1:
			name += fmt.Sprintf("/batches=%v", tc.batches)
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			cfg, err := pgxpool.ParseConfig(db.URL) // synchronous commits, as the api
			if err != nil {
				b.Fatal(err)
			}
			cfg.MaxConns = 8
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			s := store.New(pool, nil)
			s.SetFinalizeBatchingForTest(tc.batches)
			s.SetClaimBatchingForTest(tc.batches)
			if err := s.CreateRepository(ctx, upRepo); err != nil {
				b.Fatal(err)
			}
			gs, err := auth.ParseGrants([]string{"team/*:write"})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.GrantPrincipal(ctx, upPrincipal, gs); err != nil {
				b.Fatal(err)
			}
			lease, err := s.AcquireLease(ctx, upPartition, upNode, upNode+":7443", time.Hour, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
			if err != nil {
				b.Fatal(err)
			}
			seed := rand.Uint64()
			var seq atomic.Uint64
			upload := func() error {
				var buf [16]byte
				binary.LittleEndian.PutUint64(buf[:8], seed)
				binary.LittleEndian.PutUint64(buf[8:], seq.Add(1))
				sum := sha256.Sum256(buf[:])
				d := blobplane.Digest(blobplane.DigestPrefix + hex.EncodeToString(sum[:]))
				const size = 4096
				k := placement.Key{Digest: d, Backend: "fs", Datacenter: upDC, Location: d.Hex()}
				var in upload.Intent
				req := upload.FinalizeRequest{Digest: d, Size: size,
					Partition: upPartition, Node: upNode, Epoch: lease.Epoch, Replication: jobs.Replication{Client: rc},
					Verify: &upload.Verification{Key: k, Digest: d, Size: size}, Proven: true}
				n := upload.NewIntent{Repository: upRepo, Principal: upPrincipal,
					ExpectedDigest: d, ExpectedSize: size, IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}
				finalize := s.Finalize
				var ch upload.Chain
				if tc.chained { // nil while other uploads are in flight (the warm-up's)
					ch = s.ChainOpenAndStage(ctx, n, k, req)
				}
				if ch != nil {
					defer ch.Release()
					var staged bool
					var err error
					if in, staged, err = ch.Claim(); err != nil || !staged {
						return fmt.Errorf("%s: staged %v, %v", d, staged, err)
					}
					finalize = ch.Finalize
				} else if tc.postPut { // the POST's session, then the PUT's claim of it
					var err error
					if in, err = s.CreateIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedSize: upload.SizeUnknown,
						IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}); err != nil {
						return err
					}
					if _, claimed, _, err := s.ClaimSessionAndStage(ctx, in.OperationID, upRepo, k, size); err != nil || !claimed {
						return fmt.Errorf("%s: claimed %v, %v", d, claimed, err)
					}
				} else {
					var staged bool
					var err error
					if in, staged, err = s.OpenAndStage(ctx, n, k); err != nil {
						return err
					}
					if !staged {
						return fmt.Errorf("%s: not staged", d)
					}
				}
				req.OperationID = in.OperationID
				out, err := finalize(ctx, req)
				if err == nil && !out.NewReference {
					err = fmt.Errorf("%s: published no new reference", d)
				}
				return err
			}
			workers, perCall := clients, 1
			if tc.floor {
				if err := upload(); err != nil { // creates the placement ledger (ensurePlacements)
					b.Fatal(err)
				}
				// With rows > 1, the 16 clients' uploads go rows at a time
				// through 16/rows workers, as the store's batches gather them.
				rows := max(tc.rows, -tc.rows)
				workers, perCall = max(clients/rows, 1), rows
				upload = func() error {
					ds := make([]string, perCall)
					for i := range ds {
						var buf [16]byte
						binary.LittleEndian.PutUint64(buf[:8], seed)
						binary.LittleEndian.PutUint64(buf[8:], seq.Add(1))
						sum := sha256.Sum256(buf[:])
						ds[i] = blobplane.DigestPrefix + hex.EncodeToString(sum[:])
					}
					if tc.rows < 0 {
						return ledgerFloorTx(ctx, pool, ds)
					}
					return ledgerFloor(ctx, pool, ds)
				}
			}
			// Warm every connection of the pool (and its plans) first.
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 20 {
						if err := upload(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			backends := poolBackends(b, pool)

			stats, claims, chained := s.FinalizeBatchStats(), s.ClaimBatchStats(), s.ChainedCloses()
			b.ResetTimer()
			before := procstat.Times(backends)
			start := time.Now()
			per := b.N/(workers*perCall) + 1
			for range workers {
				wg.Go(func() {
					for range per {
						if err := upload(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			used := procstat.Used(before, procstat.Times(backends))
			ops := float64(per * workers * perCall)
			b.ReportMetric(ops/elapsed.Seconds(), "uploads/s")
			if len(before) > 0 {
				b.ReportMetric(float64(used.Microseconds())/ops, "pg-cpu-us/op")
			}
			if tc.chained {
				b.ReportMetric(float64(s.ChainedCloses()-chained)/ops, "chained/op")
			}
			if st := s.FinalizeBatchStats(); st.Batches > stats.Batches {
				b.ReportMetric(float64(st.Batched-stats.Batched)/float64(st.Batches-stats.Batches), "finalizes/batch")
				b.ReportMetric(float64(st.Merged-stats.Merged)/float64(st.Batches-stats.Batches), "merged/batch")
			}
			if st := s.ClaimBatchStats(); st.Batches > claims.Batches {
				b.ReportMetric(float64(st.Batched-claims.Batched)/float64(st.Batches-claims.Batches), "claims/batch")
				b.ReportMetric(float64(st.Merged-claims.Merged)/float64(st.Batches-claims.Batches), "merged-claims/batch")
			}
		})
	}
}

// poolBackends are the process ids of the Postgres backends serving
// pool's connections (none where the server is not on this machine).
func poolBackends(b *testing.B, pool *pgxpool.Pool) []int {
	b.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = '' AND backend_type = 'client backend'`)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

// floorBatch is how many uploads one statement of the batched floor
// writes: about what the store's claim and Finalize batches gather with
// 16 clients (claims/batch, finalizes/batch).
const floorBatch = 6

// The floor's two statements (BenchmarkUploadLedger): the rows of one or
// more single-request uploads, in one statement per commit.
const (
	floorClaim = `WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
intent AS (
    INSERT INTO intents (operation_id, repository, principal, expected_digest, expected_size, ingress_datacenter, backend, expires_at)
    SELECT u.id, $2, $3, u.d, 4096, $4, 'fs', now() + interval '1 hour' FROM unnest($1::uuid[], $5::text[]) AS u(id, d), async
    RETURNING expected_digest)
INSERT INTO placements (digest, backend, datacenter, location, state, size_bytes, epoch)
SELECT expected_digest, 'fs', $4, substr(expected_digest, 8), 'pending', 4096, 0 FROM intent`
	floorPublish = `WITH admitted AS (
    UPDATE intents SET state = 'admitted', updated_at = now()
    WHERE operation_id = ANY ($1::uuid[]) AND state = 'pending'
    RETURNING operation_id, repository, expected_digest AS digest),
verified AS (
    UPDATE placements p SET state = 'verified', generation = generation + 1, updated_at = now(), verified_at = now()
    FROM unnest($2::text[]) AS v(d)
    WHERE p.digest = v.d AND p.backend = 'fs' AND p.datacenter = $3 AND p.location = substr(v.d, 8) AND p.state = 'pending'
    RETURNING p.digest),
blob AS (
    INSERT INTO blobs (digest, size_bytes) SELECT digest, 4096 FROM admitted
    ON CONFLICT (digest) DO UPDATE SET digest = blobs.digest),
ref AS (
    INSERT INTO blob_references (repository, digest, operation_id) SELECT repository, digest, operation_id FROM admitted
    ON CONFLICT (repository, digest) DO NOTHING)
INSERT INTO operation_outcomes (operation_id, repository, digest, size_bytes, result)
SELECT a.operation_id, a.repository, a.digest, 4096, '{}' FROM admitted a JOIN verified v ON v.digest = a.digest`
)

// ledgerFloor writes one upload of each digest in ds with the floor's two
// statements.
func ledgerFloor(ctx context.Context, pool *pgxpool.Pool, ds []string) error {
	ids := make([]pgtype.UUID, len(ds))
	for i, d := range ds {
		ids[i] = floorID(d)
	}
	if _, err := pool.Exec(ctx, floorClaim, ids, upRepo, upPrincipal, upDC, ds); err != nil {
		return err
	}
	tag, err := pool.Exec(ctx, floorPublish, ids, ds, upDC)
	if err == nil && tag.RowsAffected() != int64(len(ds)) {
		err = fmt.Errorf("%s...: the floor published %d outcomes of %d", ds[0], tag.RowsAffected(), len(ds))
	}
	return err
}

// ledgerFloorTx is ledgerFloor one upload per statement, the uploads'
// statements of each kind pipelined in one transaction: batched commits
// without multi-row statements.
func ledgerFloorTx(ctx context.Context, pool *pgxpool.Pool, ds []string) error {
	var published int64
	for _, q := range []string{floorClaim, floorPublish} {
		var b pgx.Batch
		b.Queue("BEGIN")
		for _, d := range ds {
			ids, digests := []pgtype.UUID{floorID(d)}, []string{d}
			if q == floorClaim {
				b.Queue(q, ids, upRepo, upPrincipal, upDC, digests)
				continue
			}
			b.Queue(q, ids, digests, upDC).Exec(func(tag pgconn.CommandTag) error {
				published += tag.RowsAffected()
				return nil
			})
		}
		b.Queue("COMMIT")
		if err := pool.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
	}
	if published != int64(len(ds)) {
		return fmt.Errorf("%s...: the floor published %d outcomes of %d", ds[0], published, len(ds))
	}
	return nil
}

// floorID is the floor's operation id for digest d.
func floorID(d string) pgtype.UUID {
	id := pgtype.UUID{Valid: true}
	copy(id.Bytes[:], d[len(blobplane.DigestPrefix):][:16])
	return id
}
