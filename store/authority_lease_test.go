package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

const (
	leaseTTL   = 15 * time.Second
	leaseRenew = 3 * time.Second
)

var (
	isStale    = &blobplane.Error{Code: blobplane.CodeStaleEpoch}
	isConflict = &blobplane.Error{Code: blobplane.CodeConflict}
	isInvalid  = &blobplane.Error{Code: blobplane.CodeInvalid}
)

// setupLeases returns a store over a fresh database and the raw pool, for
// seeding states and for playing the database clock forward.
func setupLeases(t *testing.T) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	d := pgtest.New(t)
	return store.New(d.Pool, slog.New(slog.DiscardHandler)), d.Pool
}

// seed is a starting lease state; expiresIn is relative to the database
// clock (negative: already expired).
type seed struct {
	epoch     uint64
	owner     string
	state     authority.PrimaryState
	expiresIn time.Duration
	pointer   string
	sealedLSN *uint64
}

func seedLease(t *testing.T, pool *pgxpool.Pool, partition string, s seed) {
	t.Helper()
	state := s.state
	if state == "" {
		state = authority.PrimaryServing
	}
	var ptr *string
	if s.pointer != "" {
		ptr = &s.pointer
	}
	_, err := pool.Exec(context.Background(), `
		INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, state, lease_ttl_ms, renew_interval_ms,
		                    expires_at, checkpoint_pointer, sealed_lsn)
		VALUES ($1, $2, $3, $3 || ':7443', $4, $5, $6, now() + $7 * interval '1 millisecond', $8, $9)`,
		partition, int64(s.epoch), s.owner, string(state), leaseTTL.Milliseconds(), leaseRenew.Milliseconds(),
		s.expiresIn.Milliseconds(), ptr, s.sealedLSN)
	if err != nil {
		t.Fatal(err)
	}
}

// expire plays the database clock past the lease's expiry without
// sleeping: the record now says it expired a second ago.
func expire(t *testing.T, pool *pgxpool.Pool, partition string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE leases SET expires_at = now() - interval '1 second' WHERE partition_id = $1`, partition); err != nil {
		t.Fatal(err)
	}
}

func u64(v uint64) *uint64 { return &v }

// Each SQL lease write decides exactly what the pure model
// authority.ApplyLease decides, from the same starting record, and leaves
// the same record behind (R14–R28).
func TestLeaseSQLMatchesModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)

	starts := map[string]*seed{
		"absent":                nil,
		"live_e5_A":             {epoch: 5, owner: "A", expiresIn: time.Hour, pointer: "ckpt-1"},
		"expired_e5_A":          {epoch: 5, owner: "A", expiresIn: -time.Minute, pointer: "ckpt-1"},
		"sealed_live_e5_A":      {epoch: 5, owner: "A", state: authority.PrimarySealed, expiresIn: time.Hour, sealedLSN: u64(900)},
		"quarantined_live_e5_A": {epoch: 5, owner: "A", state: authority.PrimaryQuarantined, expiresIn: time.Hour},
		"restoring_live_e5_A":   {epoch: 5, owner: "A", state: authority.PrimaryRestoring, expiresIn: time.Hour},
		"catching_up_live_e5_A": {epoch: 5, owner: "A", state: authority.PrimaryCatchingUp, expiresIn: time.Hour},
	}
	type opCase struct {
		name string
		kind authority.LeaseOpKind
		node string
		// epoch is :my_epoch for RENEW/FENCE; ignored for ACQUIRE/FORCE,
		// whose new epoch the statement computes (record + 1).
		epoch uint64
		fw    *store.LeaseFenceWrite
		// takeBack: ACQUIRE through TakeBackLease (issue 27).
		takeBack bool
	}
	serving, sealed := authority.PrimaryServing, authority.PrimarySealed
	ptrB := "ckpt-2"
	ops := []opCase{
		{name: "acquire_by_A", kind: authority.Acquire, node: "A"},
		{name: "acquire_by_B", kind: authority.Acquire, node: "B"},
		{name: "take_back_by_A", kind: authority.Acquire, node: "A", takeBack: true},
		{name: "take_back_by_B", kind: authority.Acquire, node: "B", takeBack: true},
		{name: "force_by_B", kind: authority.Force, node: "B"},
		{name: "force_by_A", kind: authority.Force, node: "A"},
	}
	for _, e := range []uint64{4, 5, 6} {
		for _, n := range []string{"A", "B"} {
			ops = append(ops,
				opCase{name: fmt.Sprintf("renew_%s_e%d", n, e), kind: authority.Renew, node: n, epoch: e},
				opCase{name: fmt.Sprintf("fence_%s_e%d", n, e), kind: authority.Fence, node: n, epoch: e},
				opCase{name: fmt.Sprintf("fence_ptr_%s_e%d", n, e), kind: authority.Fence, node: n, epoch: e, fw: &store.LeaseFenceWrite{CheckpointPointer: &ptrB}},
			)
		}
	}
	ops = append(ops,
		opCase{name: "fence_state_serving_A_e5", kind: authority.Fence, node: "A", epoch: 5, fw: &store.LeaseFenceWrite{State: &serving}},
		opCase{name: "fence_seal_A_e5", kind: authority.Fence, node: "A", epoch: 5, fw: &store.LeaseFenceWrite{State: &sealed, SealedLSN: u64(900)}},
		opCase{name: "fence_reseal_A_e5", kind: authority.Fence, node: "A", epoch: 5, fw: &store.LeaseFenceWrite{SealedLSN: u64(901)}},
	)

	i := 0
	for sname, st := range starts {
		for _, oc := range ops {
			i++
			name := sname + "/" + oc.name
			partition := fmt.Sprintf("p_%04d", i)
			if st != nil {
				seedLease(t, pool, partition, *st)
			}
			var cur *authority.LeaseRecord
			if st != nil {
				r, err := s.Lease(ctx, partition)
				if err != nil {
					t.Fatal(err)
				}
				cur = &r
			}
			var dbNow time.Time
			if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
				t.Fatal(err)
			}

			// The SQL write.
			var got authority.LeaseRecord
			var sqlErr error
			switch oc.kind {
			case authority.Acquire:
				claim := s.AcquireLease
				if oc.takeBack {
					claim = s.TakeBackLease
				}
				got, sqlErr = claim(ctx, partition, oc.node, oc.node+":7443", leaseTTL, leaseRenew)
			case authority.Force:
				got, sqlErr = s.ForceLease(ctx, partition, oc.node, oc.node+":7443", "alice", "node gone")
			case authority.Renew:
				got, sqlErr = s.RenewLease(ctx, partition, oc.node, oc.epoch)
			case authority.Fence:
				if oc.fw == nil {
					sqlErr = s.FenceLease(ctx, partition, oc.node, oc.epoch)
				} else {
					got, sqlErr = s.FenceLeaseWrite(ctx, partition, oc.node, oc.epoch, *oc.fw)
				}
			}

			// The model, at the store's clock: the ack time of an accepted
			// write (ExpiresAt − TTL is the statement's now()), else the
			// time read just before.
			now := dbNow
			if sqlErr == nil && oc.kind != authority.Fence {
				now = got.ExpiresAt.Add(-got.TTL)
			}
			op := authority.LeaseOp{Kind: oc.kind, Partition: partition, Node: oc.node, Endpoint: oc.node + ":7443", Epoch: oc.epoch, Now: now}
			switch oc.kind {
			case authority.Acquire:
				op.Epoch, op.TTL, op.RenewInterval, op.TakeBack = authority.NextEpoch(cur), leaseTTL, leaseRenew, oc.takeBack
			case authority.Force:
				op.Epoch, op.Operator, op.Reason = authority.NextEpoch(cur), "alice", "node gone"
				op.TTL, op.RenewInterval = store.DefaultLeaseTTL, store.DefaultLeaseRenewInterval
				if cur != nil { // an existing record keeps its timing
					op.TTL, op.RenewInterval = cur.TTL, cur.RenewInterval
				}
			case authority.Fence:
				if oc.fw == nil { // FENCE moving nothing: rewrite the pointer it has
					p := ""
					if cur != nil {
						p = cur.CheckpointPointer
					}
					op.CheckpointPointer = &p
				} else {
					op.CheckpointPointer, op.State, op.SealedLSN = oc.fw.CheckpointPointer, oc.fw.State, oc.fw.SealedLSN
				}
			}
			want, modelErr := authority.ApplyLease(cur, op)

			if gv, wv := authority.VerdictOf(sqlErr), authority.VerdictOf(modelErr); gv != wv {
				t.Errorf("%s: SQL %s (%v), model %s (%v)", name, gv, sqlErr, wv, modelErr)
				continue
			}
			after, err := s.Lease(ctx, partition)
			if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
				if cur != nil || modelErr == nil {
					t.Errorf("%s: record missing after the write", name)
				}
				continue
			} else if err != nil {
				t.Fatal(err)
			}
			if modelErr != nil {
				want = *cur // a refused write changes nothing (S3)
			}
			if !reflect.DeepEqual(after, want) {
				t.Errorf("%s:\n SQL   %+v\n model %+v", name, after, want)
			}
			if sqlErr == nil && oc.kind != authority.Fence && !reflect.DeepEqual(got, after) {
				t.Errorf("%s: returned %+v, stored %+v", name, got, after)
			}
		}
	}
}

// V6 against SQL: the handoff of p_0002 from n_7a2c to n_1f90, with
// n_7a2c paused past its lease (the database clock moved by UPDATE, not
// by sleeping). Steps 4 and 5 are the safety argument.
func TestV6_EpochFencingSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	const p = "p_0002"
	seedLease(t, pool, p, seed{epoch: 73, owner: "n_7a2c", expiresIn: leaseTTL, pointer: "ckpt-72"})

	// 1. n_7a2c FENCE at 73 → ACCEPT (still the owner).
	ckptA := "p_0002/g5/e73/ckpt-A"
	if _, err := s.FenceLeaseWrite(ctx, p, "n_7a2c", 73, store.LeaseFenceWrite{CheckpointPointer: &ckptA}); err != nil {
		t.Fatalf("step 1: %v", err)
	}
	// n_7a2c pauses; its lease passes expiry at the store.
	expire(t, pool, p)
	// 2. n_1f90 ACQUIRE → ACCEPT at 74 (ownership moves).
	rec, err := s.AcquireLease(ctx, p, "n_1f90", "10.0.5.23:7443", leaseTTL, leaseRenew)
	if err != nil || rec.Epoch != 74 || rec.OwnerNode != "n_1f90" || rec.State != authority.PrimaryRestoring {
		t.Fatalf("step 2: %+v %v", rec, err)
	}
	// 3. n_1f90 FENCE at 74 → ACCEPT (ready after restoring, R23).
	serving := authority.PrimaryServing
	if _, err := s.FenceLeaseWrite(ctx, p, "n_1f90", 74, store.LeaseFenceWrite{State: &serving}); err != nil {
		t.Fatalf("step 3: %v", err)
	}
	// 4. n_7a2c FENCE at 73 → REJECT_STALE_EPOCH (harmless, and it need not know).
	zombie := "p_0002/g5/e73/ckpt-zombie"
	_, err = s.FenceLeaseWrite(ctx, p, "n_7a2c", 73, store.LeaseFenceWrite{CheckpointPointer: &zombie})
	if authority.VerdictOf(err) != authority.RejectStaleEpoch || !errors.Is(err, authority.ErrStaleEpoch) || !errors.Is(err, isStale) {
		t.Fatalf("step 4: %v", err)
	}
	if err := s.FenceLease(ctx, p, "n_7a2c", 73); !errors.Is(err, isStale) {
		t.Fatalf("step 4 (bare fence): %v", err)
	}
	// 5. n_7a2c cannot climb back: its ACQUIRE against the live lease is
	// refused, and no write can name epoch 74 for it — the statement
	// computes the epoch, and only ever above the record's.
	if _, err := s.AcquireLease(ctx, p, "n_7a2c", "10.0.4.11:7443", leaseTTL, leaseRenew); !errors.Is(err, authority.ErrLeaseHeld) {
		t.Fatalf("step 5: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE leases SET owner_node = 'n_7a2c' WHERE partition_id = $1`, p); sqlstate(err) != "BPE01" {
		t.Fatalf("step 5 (raw owner change at the same epoch): %v", err)
	}
	// 6. n_7a2c RENEW at 73 → REJECT_STALE_EPOCH.
	if _, err := s.RenewLease(ctx, p, "n_7a2c", 73); !errors.Is(err, isStale) {
		t.Fatalf("step 6: %v", err)
	}
	final, err := s.Lease(ctx, p)
	if err != nil || final.Epoch != 74 || final.OwnerNode != "n_1f90" || final.State != authority.PrimaryServing || final.CheckpointPointer != ckptA {
		t.Fatalf("final %+v %v", final, err)
	}
}

// The paused-node scenario of the issue: A holds, the database clock
// passes expiry, B acquires at epoch + 1, and A's later FENCE and RENEW are
// rejected with CodeStaleEpoch.
func TestLeasePausedNodeIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	a, err := s.AcquireLease(ctx, "p_paused", "A", "a:7443", leaseTTL, leaseRenew)
	if err != nil || a.Epoch != 1 || a.OwnerNode != "A" || a.State != authority.PrimaryRestoring {
		t.Fatalf("A acquires: %+v %v", a, err)
	}
	if a.ExpiresAt.IsZero() || a.TTL != leaseTTL || a.RenewInterval != leaseRenew {
		t.Fatalf("R14: %+v", a)
	}
	// While A's lease is live, B is refused: conflict, not retryable.
	_, err = s.AcquireLease(ctx, "p_paused", "B", "b:7443", leaseTTL, leaseRenew)
	if !errors.Is(err, isConflict) || !errors.Is(err, authority.ErrLeaseHeld) || blobplane.IsRetryable(err) {
		t.Fatalf("B against a live lease: %v (retryable %v)", err, blobplane.IsRetryable(err))
	}
	if r, err := s.RenewLease(ctx, "p_paused", "A", 1); err != nil || !r.ExpiresAt.After(a.ExpiresAt) && !r.ExpiresAt.Equal(a.ExpiresAt) {
		t.Fatalf("A renews: %+v %v", r, err)
	}
	expire(t, pool, "p_paused") // A is paused past its expiry
	b, err := s.AcquireLease(ctx, "p_paused", "B", "b:7443", leaseTTL, leaseRenew)
	if err != nil || b.Epoch != 2 || b.OwnerNode != "B" {
		t.Fatalf("B acquires: %+v %v", b, err)
	}
	if err := s.FenceLease(ctx, "p_paused", "A", 1); !errors.Is(err, isStale) || !errors.Is(err, authority.ErrStaleEpoch) {
		t.Fatalf("A's late FENCE: %v", err)
	}
	if _, err := s.RenewLease(ctx, "p_paused", "A", 1); !errors.Is(err, isStale) {
		t.Fatalf("A's late RENEW: %v", err)
	}
	if err := s.FenceLease(ctx, "p_paused", "B", 2); err != nil {
		t.Fatalf("B's FENCE: %v", err)
	}
	if _, err := s.RenewLease(ctx, "p_unknown", "A", 1); !errors.Is(err, isStale) {
		t.Fatalf("RENEW without a record: %v", err)
	}
}

// Issue 27, "Acknowledged means kept": node N holds a live lease and is
// killed; a new process as N takes it back at once at epoch + 1 (no expiry
// played forward, no sleep), another node M cannot, and the old
// incarnation's writes under its epoch are fenced afterwards (R15, R20).
func TestLeaseTakeBackByTheRestartedOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := setupLeases(t)
	const p = "p_restart"
	old, err := s.AcquireLease(ctx, p, "N", "10.0.0.1:7443", time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetLeaseState(ctx, p, "N", old.Epoch, authority.PrimaryServing); err != nil {
		t.Fatal(err)
	}
	ckpt := "ckpt-before-the-kill"
	if _, err := s.FenceLeaseWrite(ctx, p, "N", old.Epoch, store.LeaseFenceWrite{CheckpointPointer: &ckpt}); err != nil {
		t.Fatal(err)
	}

	// Another node: refused while the lease is live, take-back or not.
	for _, claim := range []func(context.Context, string, string, string, time.Duration, time.Duration) (authority.LeaseRecord, error){s.AcquireLease, s.TakeBackLease} {
		if _, err := claim(ctx, p, "M", "10.0.0.2:7443", leaseTTL, leaseRenew); !errors.Is(err, authority.ErrLeaseHeld) || !errors.Is(err, isConflict) {
			t.Fatalf("M against N's live lease: %v", err)
		}
	}
	// N itself, the ordinary way: it waits out the TTL like anyone.
	if _, err := s.AcquireLease(ctx, p, "N", "10.0.0.1:7444", leaseTTL, leaseRenew); !errors.Is(err, authority.ErrLeaseHeld) {
		t.Fatalf("plain ACQUIRE by N: %v", err)
	}
	if cur, _ := s.Lease(ctx, p); cur.Epoch != old.Epoch || cur.OwnerNode != "N" || cur.State != authority.PrimaryServing {
		t.Fatalf("refused claims changed the record: %+v", cur)
	}

	// The restarted N (a new port) takes it back at once, at epoch + 1.
	back, err := s.TakeBackLease(ctx, p, "N", "10.0.0.1:7444", leaseTTL, leaseRenew)
	if err != nil {
		t.Fatalf("take-back: %v", err)
	}
	if back.Epoch != old.Epoch+1 || back.OwnerNode != "N" || back.OwnerEndpoint != "10.0.0.1:7444" || back.State != authority.PrimaryRestoring ||
		back.TTL != leaseTTL || back.RenewInterval != leaseRenew || back.CheckpointPointer != ckpt || back.TakenBy != "" {
		t.Fatalf("taken back: %+v", back)
	}

	// The old incarnation's writes under its epoch are fenced (R20), and
	// its late clean stop does not release the new one's lease.
	zombie := "ckpt-zombie"
	if _, err := s.FenceLeaseWrite(ctx, p, "N", old.Epoch, store.LeaseFenceWrite{CheckpointPointer: &zombie}); !errors.Is(err, isStale) || !errors.Is(err, authority.ErrStaleEpoch) {
		t.Fatalf("old epoch's FENCE: %v", err)
	}
	if err := s.FenceLease(ctx, p, "N", old.Epoch); !errors.Is(err, isStale) {
		t.Fatalf("old epoch's bare FENCE: %v", err)
	}
	if _, err := s.RenewLease(ctx, p, "N", old.Epoch); !errors.Is(err, isStale) {
		t.Fatalf("old epoch's RENEW: %v", err)
	}
	if err := s.SetLeaseState(ctx, p, "N", old.Epoch, authority.PrimaryServing); !errors.Is(err, isStale) {
		t.Fatalf("old epoch's state write: %v", err)
	}
	if err := s.ReleaseLease(ctx, p, "N", old.Epoch); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Lease(ctx, p)
	if err != nil || cur.Epoch != back.Epoch || cur.CheckpointPointer != ckpt || !cur.ExpiresAt.Equal(back.ExpiresAt) {
		t.Fatalf("after the old incarnation's writes: %+v %v", cur, err)
	}
	// The new incarnation's own writes land.
	if err := s.SetLeaseState(ctx, p, "N", back.Epoch, authority.PrimaryServing); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewLease(ctx, p, "N", back.Epoch); err != nil {
		t.Fatal(err)
	}
}

// A sealed or quarantined lease is not taken back (R74, R59), not even
// by its owner: the partition moves on only through its successor.
func TestLeaseTakeBackRefusesASealedLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	for _, st := range []authority.PrimaryState{authority.PrimarySealed, authority.PrimaryQuarantined} {
		p := "p_" + string(st)
		var lsn *uint64
		if st == authority.PrimarySealed {
			lsn = u64(918408)
		}
		seedLease(t, pool, p, seed{epoch: 9, owner: "N", state: st, expiresIn: time.Hour, sealedLSN: lsn})
		if _, err := s.TakeBackLease(ctx, p, "N", "10.0.0.1:7444", leaseTTL, leaseRenew); !errors.Is(err, authority.ErrLeaseHeld) {
			t.Fatalf("%s: take-back: %v", st, err)
		}
		if cur, _ := s.Lease(ctx, p); cur.Epoch != 9 || cur.State != st {
			t.Fatalf("%s: record changed: %+v", st, cur)
		}
	}
}

// Two nodes ACQUIRE the same expired lease while a third connection holds
// the row lock; once it lets go exactly one wins, at epoch + 1, and the
// other is told the lease is held. No sleeps: the test waits until both
// claimants are blocked on the lock before releasing it.
func TestLeaseAcquireRaceHasOneWinner(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, pool := setupLeases(t)
	const p = "p_race"
	seedLease(t, pool, p, seed{epoch: 7, owner: "Z", expiresIn: -time.Minute})

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) }) // never leave the claimants blocked
	if _, err := holder.Exec(ctx, `SELECT 1 FROM leases WHERE partition_id = $1 FOR UPDATE`, p); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rec authority.LeaseRecord
		err error
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i, node := range []string{"B", "C"} {
		wg.Go(func() {
			r, err := s.AcquireLease(ctx, p, node, node+":7443", leaseTTL, leaseRenew)
			results[i] = result{r, err}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var blocked int
		// The first claimant waits on the holder, the second on the first
		// (the tuple lock): count backends of this database waiting on a lock.
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO leases%'`).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d claimants blocked on the row lock", blocked)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	winners := 0
	for _, r := range results {
		switch {
		case r.err == nil:
			winners++
			if r.rec.Epoch != 8 {
				t.Fatalf("winner at epoch %d, want 8", r.rec.Epoch)
			}
		case errors.Is(r.err, authority.ErrLeaseHeld) && errors.Is(r.err, isConflict):
		default:
			t.Fatalf("loser: %v", r.err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d winners: %+v", winners, results)
	}
	final, err := s.Lease(ctx, p)
	if err != nil || final.Epoch != 8 {
		t.Fatalf("final %+v %v", final, err)
	}
}

// FORCE takes a live lease at epoch + 1 without waiting for expiry, fences
// the displaced owner, and records who, when and why (R26–R28).
func TestLeaseForceTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := setupLeases(t)
	a, err := s.AcquireLease(ctx, "p_f", "A", "a:7443", time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// R28: no operator or no reason, no takeover — and nothing changes.
	if _, err := s.ForceLease(ctx, "p_f", "B", "b:7443", "", "gone"); !errors.Is(err, isInvalid) {
		t.Fatalf("without operator: %v", err)
	}
	if _, err := s.ForceLease(ctx, "p_f", "B", "b:7443", "alice", ""); !errors.Is(err, isInvalid) {
		t.Fatalf("without reason: %v", err)
	}
	if r, _ := s.Lease(ctx, "p_f"); r.Epoch != a.Epoch || r.OwnerNode != "A" || r.TakenBy != "" {
		t.Fatalf("refused force changed the record: %+v", r)
	}
	f, err := s.ForceLease(ctx, "p_f", "B", "b:7443", "alice", "host n3 lost its disk")
	if err != nil {
		t.Fatal(err)
	}
	if f.Epoch != a.Epoch+1 || f.OwnerNode != "B" || f.OwnerEndpoint != "b:7443" || f.State != authority.PrimaryRestoring {
		t.Fatalf("forced %+v", f)
	}
	if f.TakenBy != "alice" || f.TakenReason != "host n3 lost its disk" || f.TakenAt == nil || !f.TakenAt.Equal(f.ExpiresAt.Add(-f.TTL)) {
		t.Fatalf("audit trail %+v", f)
	}
	if f.TTL != time.Hour || f.RenewInterval != time.Minute {
		t.Fatalf("force changed the timing: %+v", f)
	}
	if err := s.FenceLease(ctx, "p_f", "A", a.Epoch); !errors.Is(err, isStale) {
		t.Fatalf("displaced owner's FENCE: %v", err)
	}
	if _, err := s.RenewLease(ctx, "p_f", "A", a.Epoch); !errors.Is(err, isStale) {
		t.Fatalf("displaced owner's RENEW: %v", err)
	}
	// On a partition with no record, FORCE creates it at epoch 1 with the
	// default timing.
	n, err := s.ForceLease(ctx, "p_new", "B", "b:7443", "alice", "bootstrap")
	if err != nil || n.Epoch != 1 || n.TTL != store.DefaultLeaseTTL || n.TakenBy != "alice" {
		t.Fatalf("force on absent: %+v %v", n, err)
	}
	all, err := s.Leases(ctx)
	if err != nil || len(all) != 2 || all[0].Partition != "p_f" || all[1].Partition != "p_new" {
		t.Fatalf("leases %+v %v", all, err)
	}
	if _, err := s.Lease(ctx, "p_none"); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("absent lease: %v", err)
	}
}

// The table refuses an epoch decrease, an owner change without an epoch
// increase, and a delete, even from a raw statement (R16, R27).
func TestLeaseTriggerRefusesEpochDecrease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := setupLeases(t)
	seedLease(t, pool, "p_t", seed{epoch: 9, owner: "A", expiresIn: time.Minute})
	for _, stmt := range []string{
		`UPDATE leases SET epoch = 8 WHERE partition_id = 'p_t'`,
		`UPDATE leases SET epoch = epoch - 1, owner_node = 'B' WHERE partition_id = 'p_t'`,
		`UPDATE leases SET owner_node = 'B' WHERE partition_id = 'p_t'`,
		`DELETE FROM leases WHERE partition_id = 'p_t'`,
	} {
		if _, err := pool.Exec(ctx, stmt); sqlstate(err) != "BPE01" {
			t.Errorf("%s: %v, want SQLSTATE BPE01", stmt, err)
		}
	}
	// Raising the epoch with a raw statement is allowed (it only fences).
	if _, err := pool.Exec(ctx, `UPDATE leases SET epoch = 10, owner_node = 'B' WHERE partition_id = 'p_t'`); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Lease(ctx, "p_t"); err != nil || r.Epoch != 10 {
		t.Fatalf("%+v %v", r, err)
	}
	// The trigger's refusal surfaces through the store as a stale epoch.
	sealedAt := u64(5)
	sealed := authority.PrimarySealed
	if _, err := s.FenceLeaseWrite(ctx, "p_t", "B", 10, store.LeaseFenceWrite{State: &sealed, SealedLSN: sealedAt}); err != nil {
		t.Fatal(err)
	}
	serving := authority.PrimaryServing
	_, err := s.FenceLeaseWrite(ctx, "p_t", "B", 10, store.LeaseFenceWrite{State: &serving})
	if !errors.Is(err, authority.ErrSealed) || !errors.Is(err, isConflict) {
		t.Fatalf("un-seal: %v", err)
	}
}

func TestLeaseInputValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := setupLeases(t)
	for _, c := range []struct {
		name       string
		ttl, renew time.Duration
		node       string
	}{
		{"zero ttl", 0, time.Second, "A"},
		{"renew not shorter", time.Second, time.Second, "A"},
		{"no node", time.Minute, time.Second, ""},
	} {
		if _, err := s.AcquireLease(ctx, "p_v", c.node, "a:1", c.ttl, c.renew); !errors.Is(err, isInvalid) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := s.FenceLeaseWrite(ctx, "p_v", "A", 1, store.LeaseFenceWrite{}); !errors.Is(err, isInvalid) {
		t.Errorf("empty FENCE: %v", err)
	}
	un := authority.PrimaryUnassigned
	if _, err := s.FenceLeaseWrite(ctx, "p_v", "A", 1, store.LeaseFenceWrite{State: &un}); !errors.Is(err, isInvalid) {
		t.Errorf("FENCE to UNASSIGNED: %v", err)
	}
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
