package authority

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
)

var (
	storeT0 = time.Date(2026, 8, 21, 9, 14, 4, 482_000_000, time.UTC) // lease store's now()
	timing  = LeaseTiming{TTL: 15 * time.Second, RenewInterval: 3 * time.Second, MaxRenewRTT: time.Second, MaxClockError: 500 * time.Millisecond}
)

func ptr[T any](v T) *T { return &v }

// record73 is p_0002 at epoch 73, owned by n_7a2c and SERVING, renewed at
// storeT0 (expires 15 s later).
func record73() *LeaseRecord {
	return &LeaseRecord{
		Partition: "p_0002", Epoch: 73, OwnerNode: "n_7a2c", OwnerEndpoint: "10.0.4.11:7443", State: PrimaryServing,
		TTL: timing.TTL, RenewInterval: timing.RenewInterval, ExpiresAt: storeT0.Add(timing.TTL),
		CheckpointPointer: "lease-test/p_0002/g5/e73/ckpt-000000918233.manifest.json",
	}
}

func acquire(node, ep string, epoch uint64, now time.Time) LeaseOp {
	return LeaseOp{Kind: Acquire, Node: node, Endpoint: ep, Epoch: epoch, Now: now, TTL: timing.TTL, RenewInterval: timing.RenewInterval}
}

func fenceOp(node string, epoch uint64, now time.Time, ptrV string) LeaseOp {
	return LeaseOp{Kind: Fence, Node: node, Epoch: epoch, Now: now, CheckpointPointer: &ptrV}
}

// TestV6_EpochFencing runs the spec's handoff sequence for p_0002 from
// n_7a2c to n_1f90 against the pure lease model, with n_7a2c paused past
// its lease (fake monotonic clock), so the ACQUIRE's expiry clause holds.
// Steps 4 and 5 are the safety argument: the zombie's write is rejected
// without it knowing, and it cannot climb back at the epoch it thinks of.
func TestV6_EpochFencing(t *testing.T) {
	t.Parallel()
	rec := record73()
	clock := &ManualClock{}
	zombie, err := NewSelfFence(timing)
	if err != nil {
		t.Fatal(err)
	}
	// n_7a2c's last RENEW: sent at 0, acknowledged 20 ms later.
	if err := zombie.Acknowledged(73, clock.Now(), clock.Now().Add(20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		before func()
		op     LeaseOp
		want   LeaseVerdict
		epoch  uint64
		owner  string
	}{
		{"1_n_7a2c_FENCE_at_73_still_owner", nil, fenceOp("n_7a2c", 73, storeT0.Add(time.Second), "ckpt-A"), Accept, 73, "n_7a2c"},
		{"2_n_1f90_ACQUIRE_at_74_ownership_moves", func() {
			clock.Advance(20 * time.Second) // n_7a2c paused: no renewals for 20 s
		}, acquire("n_1f90", "10.0.5.23:7443", 74, storeT0.Add(20*time.Second)), Accept, 74, "n_1f90"},
		{"3_n_1f90_FENCE_at_74", nil, LeaseOp{Kind: Fence, Node: "n_1f90", Epoch: 74, Now: storeT0.Add(21 * time.Second), State: ptr(PrimaryServing)}, Accept, 74, "n_1f90"},
		{"4_n_7a2c_FENCE_at_73_rejected_harmlessly", nil, fenceOp("n_7a2c", 73, storeT0.Add(22*time.Second), "ckpt-zombie"), RejectStaleEpoch, 74, "n_1f90"},
		{"5_n_7a2c_ACQUIRE_at_74_cannot_climb_back", nil, acquire("n_7a2c", "10.0.4.11:7443", 74, storeT0.Add(40*time.Second)), RejectStaleEpoch, 74, "n_1f90"},
		{"6_n_7a2c_RENEW_at_73_rejected", nil, LeaseOp{Kind: Renew, Node: "n_7a2c", Epoch: 73, Now: storeT0.Add(23 * time.Second)}, RejectStaleEpoch, 74, "n_1f90"},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		next, err := ApplyLease(rec, st.op)
		if got := VerdictOf(err); got != st.want {
			t.Fatalf("%s: %s (%v), want %s", st.name, got, err, st.want)
		}
		if next.Epoch != st.epoch || next.OwnerNode != st.owner {
			t.Fatalf("%s: record epoch %d owner %s", st.name, next.Epoch, next.OwnerNode)
		}
		if err == nil {
			rec = &next
		}
	}
	// The zombie's checkpoint pointer never landed (R22).
	if rec.CheckpointPointer != "ckpt-A" || rec.State != PrimaryServing {
		t.Fatalf("record %+v", rec)
	}
	// And it would not even have tried: its own monotonic deadline
	// (ack + ttl − margin = 13.52 s) passed during the pause (R17, R18).
	wantErr(t, zombie.Check(clock.Now()), ErrLeaseExpired)
	if zombie.State(clock.Now(), true).Held {
		t.Fatal("paused node still believes it holds the lease")
	}
}

func TestR15_AcquireRules(t *testing.T) {
	t.Parallel()
	// First acquisition: no record.
	rec, err := ApplyLease(nil, LeaseOp{Kind: Acquire, Partition: "p_x", Node: "n_1", Endpoint: "h:1", Epoch: 1, Now: storeT0, TTL: timing.TTL, RenewInterval: timing.RenewInterval})
	if err != nil || rec.Epoch != 1 || rec.State != PrimaryRestoring || !rec.ExpiresAt.Equal(storeT0.Add(timing.TTL)) || rec.Partition != "p_x" {
		t.Fatalf("%+v %v", rec, err)
	}
	// R23: holding the lease is not being ready.
	if rec.State == PrimaryServing {
		t.Fatal("acquired straight into SERVING")
	}
	// ACQUIRE while the lease is live → LOST_RACE (retryable), unchanged.
	same, err := ApplyLease(&rec, acquire("n_2", "h:2", 2, storeT0.Add(time.Second)))
	if VerdictOf(err) != RejectLeaseHeld || same.OwnerNode != "n_1" {
		t.Fatalf("%v", err)
	}
	wantErr(t, err, ErrLeaseHeld)
	if !blobplane.IsRetryable(err) {
		t.Fatal("LOST_RACE must be retryable (A.3 step 1: re-read and retry)")
	}
	// Exactly at expires_at the lease is still live (expires_at < now).
	if _, err := ApplyLease(&rec, acquire("n_2", "h:2", 2, rec.ExpiresAt)); VerdictOf(err) != RejectLeaseHeld {
		t.Fatalf("at expiry: %v", err)
	}
	// Two racing acquirers both read epoch 1 and claim 2: one wins, the
	// other's condition is false and it must re-read and go higher.
	after := rec.ExpiresAt.Add(time.Millisecond)
	won, err := ApplyLease(&rec, acquire("n_2", "h:2", 2, after))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyLease(&won, acquire("n_3", "h:3", 2, after)); VerdictOf(err) != RejectStaleEpoch {
		t.Fatalf("second racer: %v", err)
	}
	if NextEpoch(&won) != 3 || NextEpoch(nil) != 1 {
		t.Fatal("NextEpoch")
	}
}

// Issue 27, "Acknowledged means kept": a restarted process that keeps
// its node id takes its live lease back at once, at epoch + 1, which
// fences the incarnation it replaces; nobody else can, and a sealed or
// quarantined record is never taken back (R74, R59).
func TestTakeBackOwnLiveLease(t *testing.T) {
	t.Parallel()
	rec := record73() // live until storeT0 + 15 s, owner n_7a2c
	now := storeT0.Add(2 * time.Second)
	back := acquire("n_7a2c", "10.0.4.11:7444", 74, now) // a new process: new port
	back.TakeBack = true

	// A plain ACQUIRE by the owner itself waits out the TTL.
	if _, err := ApplyLease(rec, acquire("n_7a2c", "10.0.4.11:7444", 74, now)); VerdictOf(err) != RejectLeaseHeld {
		t.Fatalf("plain ACQUIRE of a live lease: %v", err)
	}
	if !TakesBack(rec, back) {
		t.Fatal("TakesBack refuses the owner's restart")
	}
	next, err := ApplyLease(rec, back)
	if err != nil {
		t.Fatalf("take-back: %v", err)
	}
	// R15: the epoch moves in the claiming write; R23: holding is not ready.
	if next.Epoch != 74 || next.OwnerNode != "n_7a2c" || next.OwnerEndpoint != "10.0.4.11:7444" || next.State != PrimaryRestoring ||
		!next.ExpiresAt.Equal(now.Add(timing.TTL)) || next.CheckpointPointer != rec.CheckpointPointer {
		t.Fatalf("taken back: %+v", next)
	}
	// R20: the earlier incarnation's writes under epoch 73 are fenced.
	if _, err := ApplyLease(&next, fenceOp("n_7a2c", 73, now, "ckpt-zombie")); VerdictOf(err) != RejectStaleEpoch {
		t.Fatalf("old incarnation's FENCE: %v", err)
	}
	if _, err := ApplyLease(&next, LeaseOp{Kind: Renew, Node: "n_7a2c", Epoch: 73, Now: now}); VerdictOf(err) != RejectStaleEpoch {
		t.Fatalf("old incarnation's RENEW: %v", err)
	}

	refused := []struct {
		name string
		cur  *LeaseRecord
		op   LeaseOp
		want LeaseVerdict
	}{
		{"another node", rec, func() LeaseOp { o := back; o.Node = "n_1f90"; return o }(), RejectLeaseHeld},
		{"not a higher epoch", rec, func() LeaseOp { o := back; o.Epoch = 73; return o }(), RejectStaleEpoch},
		{"sealed (R74)", func() *LeaseRecord {
			r := record73()
			r.State, r.SealedLSN = PrimarySealed, ptr(uint64(918408))
			return r
		}(), back, RejectLeaseHeld},
		{"quarantined (R59)", func() *LeaseRecord { r := record73(); r.State = PrimaryQuarantined; return r }(), back, RejectLeaseHeld},
		{"RENEW cannot take back", rec, LeaseOp{Kind: Renew, Node: "n_7a2c", Epoch: 73, Now: now, TakeBack: true}, RejectInvalid},
		{"FORCE cannot take back", rec, func() LeaseOp { o := back; o.Kind, o.Operator, o.Reason = Force, "alice", "r"; return o }(), RejectInvalid},
	}
	for _, c := range refused {
		got, err := ApplyLease(c.cur, c.op)
		if VerdictOf(err) != c.want {
			t.Errorf("%s: %s (%v), want %s", c.name, VerdictOf(err), err, c.want)
		}
		if got.Epoch != c.cur.Epoch || got.OwnerNode != c.cur.OwnerNode || got.State != c.cur.State {
			t.Errorf("%s: refused write changed the record: %+v", c.name, got)
		}
	}
	// An expired record is claimed with or without the flag, by anyone.
	if _, err := ApplyLease(rec, func() LeaseOp { o := back; o.Node, o.Now = "n_1f90", rec.ExpiresAt.Add(time.Millisecond); return o }()); err != nil {
		t.Fatalf("take-back flag on an expired record of another owner: %v", err)
	}
}

func TestR14_NoLeaseWithoutExpiry(t *testing.T) {
	t.Parallel()
	for _, op := range []LeaseOp{
		{Kind: Acquire, Partition: "p", Node: "n", Endpoint: "h:1", Epoch: 1, Now: storeT0},                                                    // no TTL
		{Kind: Acquire, Partition: "p", Node: "n", Endpoint: "h:1", Epoch: 1, Now: storeT0, TTL: time.Second, RenewInterval: 2 * time.Second},  // renew >= ttl
		{Kind: Acquire, Partition: "p", Node: "n", Endpoint: "h:1", Epoch: 0, Now: storeT0, TTL: time.Second, RenewInterval: time.Millisecond}, // epoch 0
		{Kind: Acquire, Partition: "p", Node: "n", Endpoint: "h:1", Epoch: 1, TTL: time.Second, RenewInterval: time.Millisecond},               // no now
		{Kind: Acquire, Node: "n", Endpoint: "h:1", Epoch: 1, Now: storeT0, TTL: time.Second, RenewInterval: time.Millisecond},                 // no partition
	} {
		if _, err := ApplyLease(nil, op); VerdictOf(err) != RejectInvalid {
			t.Errorf("%+v: %v", op, err)
		}
	}
}

func TestR26_R27_R28_ForceTakeover(t *testing.T) {
	t.Parallel()
	rec := record73() // live for 15 s
	now := storeT0.Add(time.Second)
	force := LeaseOp{Kind: Force, Node: "n_1f90", Endpoint: "10.0.5.23:7443", Epoch: 74, Now: now, TTL: timing.TTL, RenewInterval: timing.RenewInterval}
	// R28: needs an operator and a reason.
	if _, err := ApplyLease(rec, force); VerdictOf(err) != RejectInvalid {
		t.Fatalf("force without audit: %v", err)
	}
	force.Operator, force.Reason = "alice@ops", "n_7a2c host lost power"
	next, err := ApplyLease(rec, force)
	if err != nil {
		t.Fatalf("R26: force must not wait for expiry: %v", err)
	}
	// R27: through the same epoch increment; R28: audit recorded.
	if next.Epoch != 74 || next.OwnerNode != "n_1f90" || next.State != PrimaryRestoring || next.TakenBy != "alice@ops" || next.TakenReason == "" || next.TakenAt == nil || !next.TakenAt.Equal(now) {
		t.Fatalf("%+v", next)
	}
	// The displaced node is fenced by exactly the ordinary mechanism.
	if _, err := ApplyLease(&next, fenceOp("n_7a2c", 73, now, "x")); VerdictOf(err) != RejectStaleEpoch {
		t.Fatalf("displaced fence: %v", err)
	}
	// R27: no path takes ownership without advancing the epoch.
	force.Epoch = 74
	if _, err := ApplyLease(&next, force); VerdictOf(err) != RejectStaleEpoch {
		t.Fatalf("force at same epoch: %v", err)
	}
}

func TestR74_SealIsFinalUnderAnEpoch(t *testing.T) {
	t.Parallel()
	rec := record73()
	sealed, err := ApplyLease(rec, LeaseOp{Kind: Fence, Node: "n_7a2c", Epoch: 73, Now: storeT0, State: ptr(PrimarySealed), SealedLSN: ptr(uint64(918408))})
	if err != nil || sealed.State != PrimarySealed || *sealed.SealedLSN != 918408 {
		t.Fatalf("%+v %v", sealed, err)
	}
	if _, err := ApplyLease(&sealed, LeaseOp{Kind: Fence, Node: "n_7a2c", Epoch: 73, Now: storeT0, State: ptr(PrimaryServing)}); VerdictOf(err) != RejectSealed || blobplane.IsRetryable(err) {
		t.Fatalf("unseal: %v", err)
	}
	if _, err := ApplyLease(&sealed, LeaseOp{Kind: Fence, Node: "n_7a2c", Epoch: 73, Now: storeT0, SealedLSN: ptr(uint64(918500))}); VerdictOf(err) != RejectSealed {
		t.Fatalf("reseal: %v", err)
	}
	if _, err := ApplyLease(&sealed, LeaseOp{Kind: Fence, Node: "n_7a2c", Epoch: 73, Now: storeT0}); VerdictOf(err) != RejectInvalid {
		t.Fatalf("empty fence: %v", err)
	}
	if _, err := ApplyLease(&sealed, LeaseOp{Kind: Fence, Node: "n_7a2c", Epoch: 73, Now: storeT0, State: ptr(PrimaryState("DONE"))}); VerdictOf(err) != RejectInvalid {
		t.Fatalf("unknown state: %v", err)
	}
}

// TestR16_EpochsNeverDecrease applies random operations from random nodes
// and checks the model's invariants after every step: the epoch never
// decreases (R16), ownership never changes without an epoch increase
// (R15, R27), and the record always has an expiry (R14).
func TestR16_EpochsNeverDecrease(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(16, 16))
	var rec *LeaseRecord
	now := storeT0
	accepted := 0
	for range 20000 {
		now = now.Add(time.Duration(rng.IntN(8000)) * time.Millisecond)
		node := []string{"n_a", "n_b", "n_c"}[rng.IntN(3)]
		base := uint64(0)
		if rec != nil {
			base = rec.Epoch
		}
		epoch := base + uint64(rng.IntN(3)) // may be stale, current or next
		if epoch == 0 {
			epoch = 1
		}
		op := LeaseOp{Partition: "p", Node: node, Endpoint: node + ":1", Epoch: epoch, Now: now, TTL: timing.TTL, RenewInterval: timing.RenewInterval, Operator: "op", Reason: "r"}
		switch rng.IntN(4) {
		case 0:
			op.Kind = Acquire
			op.TakeBack = rng.IntN(2) == 0 // issue 27: a restart's claim
		case 1:
			op.Kind = Renew
		case 2:
			op.Kind = Fence
			op.State = ptr([]PrimaryState{PrimaryServing, PrimaryCatchingUp, PrimarySealed}[rng.IntN(3)])
		case 3:
			op.Kind = Force
		}
		next, err := ApplyLease(rec, op)
		if err != nil {
			continue
		}
		accepted++
		if rec != nil {
			if next.Epoch < rec.Epoch {
				t.Fatalf("epoch decreased %d -> %d by %v", rec.Epoch, next.Epoch, op.Kind)
			}
			if next.OwnerNode != rec.OwnerNode && next.Epoch <= rec.Epoch {
				t.Fatalf("owner changed without an epoch increase by %v", op.Kind)
			}
		}
		if next.ExpiresAt.IsZero() || next.TTL <= 0 {
			t.Fatal("record without expiry")
		}
		rec = &next
	}
	if accepted < 1000 {
		t.Fatalf("only %d operations accepted; the walk is not exercising the model", accepted)
	}
}

func TestR17_R18_SelfFenceOnMonotonicClock(t *testing.T) {
	t.Parallel()
	clock := &ManualClock{}
	f, err := NewSelfFence(timing)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, f.Check(clock.Now()), ErrLeaseExpired) // nothing held yet
	sent := clock.Now()
	clock.Advance(100 * time.Millisecond)
	if err := f.Acknowledged(7, sent, clock.Now()); err != nil {
		t.Fatal(err)
	}
	// deadline = ack (0.1 s) + ttl (15 s) − margin (1.5 s) = 13.6 s
	d, epoch, held := f.Deadline()
	if d != Mono(13600*time.Millisecond) || epoch != 7 || !held {
		t.Fatalf("deadline %v epoch %d held %v", time.Duration(d), epoch, held)
	}
	if d != FenceDeadline(Mono(100*time.Millisecond), timing.TTL, timing.Margin()) {
		t.Fatal("FenceDeadline disagrees")
	}
	clock.Advance(13 * time.Second) // 13.1 s
	if err := f.Check(clock.Now()); err != nil {
		t.Fatalf("before deadline: %v", err)
	}
	if s := f.State(clock.Now(), true); !s.Held || !s.Serving || s.Epoch != 7 {
		t.Fatalf("state %+v", s)
	}
	clock.Advance(500 * time.Millisecond) // 13.6 s: stop, before the store's 15.1 s expiry
	wantErr(t, f.Check(clock.Now()), ErrLeaseExpired)
	// A renewal whose round-trip exceeds the margin's assumption extends
	// nothing (the store may have set expiry at send time).
	slowSent := clock.Now()
	clock.Advance(2 * time.Second)
	wantErr(t, f.Acknowledged(7, slowSent, clock.Now()), ErrLeaseTiming)
	wantErr(t, f.Check(clock.Now()), ErrLeaseExpired)
	// A prompt renewal restores it; losing the lease drops it at once.
	s2 := clock.Now()
	clock.Advance(10 * time.Millisecond)
	if err := f.Acknowledged(7, s2, clock.Now()); err != nil || f.Check(clock.Now()) != nil {
		t.Fatalf("renewal: %v", err)
	}
	f.Lost()
	wantErr(t, f.Check(clock.Now()), ErrLeaseExpired)
	// A backwards Advance does nothing: the clock is monotonic.
	before := clock.Now()
	clock.Advance(-time.Hour)
	if clock.Now() != before {
		t.Fatal("manual clock went backwards")
	}
}

func TestR18_LeaseTimingValidation(t *testing.T) {
	t.Parallel()
	if err := timing.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []LeaseTiming{
		{TTL: 15 * time.Second, RenewInterval: 3 * time.Second},                                                      // no RTT bound
		{TTL: 5 * time.Second, RenewInterval: 3 * time.Second, MaxRenewRTT: time.Second, MaxClockError: time.Second}, // renew cannot land before the deadline
		{TTL: 2 * time.Second, RenewInterval: time.Second, MaxRenewRTT: 2 * time.Second, MaxClockError: 0},           // margin >= ttl
	} {
		if _, err := NewSelfFence(bad); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
	if m := timing.Margin(); m != 1500*time.Millisecond {
		t.Fatalf("margin %v", m)
	}
}

func TestR16_ChildEpoch(t *testing.T) {
	t.Parallel()
	if got := ChildEpoch(73, 9); got != 74 {
		t.Fatalf("ChildEpoch = %d", got)
	}
}

func TestR131_LeaseRecordJSON(t *testing.T) {
	t.Parallel()
	data, err := json.Marshal(record73())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"partition":"p_0002"`, `"epoch":73`, `"lease_ttl_ms":15000`, `"renew_interval_ms":3000`, `"expires_at":"2026-08-21T09:14:19.482Z"`, `"sealed_lsn":null`, `"taken_by":null`} {
		if !strings.Contains(string(data), want) {
			t.Fatalf("lacks %s: %s", want, data)
		}
	}
}
