package keeper_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/authority/keeper"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

type bundle struct {
	st     *store.Store
	signer authority.Signer
	m      *authority.Map
	part   string
}

// setup publishes a signed one-partition map whose primary is node "a".
func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	st := pgtest.NewStore(t)
	pub, priv, _ := ed25519.GenerateKey(nil)
	now := time.Now()
	if err := st.PublishSigningKey(ctx, authority.TrustedKey{KeyID: "k1", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: now, Partitions: 1, State: authority.PrimaryServing, Epoch: 1, Class: "standard", Mode: authority.ModeDerived,
		Nodes: []authority.NodeAddr{{Node: "a", Endpoint: "127.0.0.1:1"}}}.Build()
	if err != nil {
		t.Fatal(err)
	}
	s := authority.Signer{KeyID: "k1", Key: priv}
	if err := s.SignMap(m); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishMap(ctx, m, nil); err != nil {
		t.Fatal(err)
	}
	return &bundle{st: st, signer: s, m: m, part: m.Partitions[0].ID}
}

func newKeeper(t *testing.T, st *store.Store, node string, clock authority.MonoClock, onReject func(authority.Rejection)) *keeper.Keeper {
	t.Helper()
	k, err := keeper.New(st, keeper.Config{NodeID: node, Endpoint: "127.0.0.1:1", Clock: clock, OnReject: onReject})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestAcquireServeAndRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	k := newKeeper(t, b.st, "a", &authority.ManualClock{}, nil)
	k.RefreshMap(ctx)
	k.Tick(ctx)
	ls := k.Lease(b.part)
	if !ls.Held || !ls.Serving || ls.Epoch < 1 {
		t.Fatalf("after acquire: %+v", ls)
	}
	rec, err := b.st.Lease(ctx, b.part)
	if err != nil || rec.OwnerNode != "a" || rec.State != authority.PrimaryServing {
		t.Fatalf("lease row %+v (%v): R23 the row records SERVING once ready", rec, err)
	}
	if _, err := k.Admit(b.part, ls.Epoch); err != nil {
		t.Fatal(err)
	}

	// A clean stop gives the lease up: another node acquires at once.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.Run(runCtx) }()
	cancel()
	<-done
	next, err := b.st.AcquireLease(ctx, b.part, "b", "127.0.0.1:2", 10*time.Second, 2*time.Second)
	if err != nil || next.Epoch != ls.Epoch+1 {
		t.Fatalf("acquire after release: %+v %v", next, err)
	}
}

// The paused-node scenario on a fake monotonic clock (R17, R18, R24,
// V6): the paused node refuses work before the store lets another node
// acquire, and its later writes under the old epoch are rejected.
func TestPausedNodeFencesItselfFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	clock := &authority.ManualClock{}
	a := newKeeper(t, b.st, "a", clock, nil)
	a.RefreshMap(ctx)
	a.Tick(ctx)
	held := a.Lease(b.part)
	if !held.Held {
		t.Fatal("a did not acquire")
	}
	work, err := a.Admit(b.part, held.Epoch)
	if err != nil {
		t.Fatal(err)
	}

	// The node pauses for a whole TTL by its own monotonic clock. Its
	// self-fence deadline (ack + ttl − margin) has passed...
	clock.Advance(keeper.DefaultTiming.TTL)
	if ls := a.Lease(b.part); ls.Held {
		t.Fatalf("paused node still claims the lease: %+v", ls)
	}
	if _, err := a.Admit(b.part, held.Epoch); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeUnavailable}) || !blobplane.IsRetryable(err) {
		t.Fatalf("paused node admitted work: %v", err)
	}
	a.Tick(ctx) // the timer check: in-flight work is failed
	if work.Err() == nil {
		t.Fatal("in-flight work was not cancelled by the self-fence (R24)")
	}
	// ...while the store, on its own clock, does not yet let another node
	// acquire: the node stops before it can be superseded.
	if _, err := b.st.AcquireLease(ctx, b.part, "b", "127.0.0.1:2", 10*time.Second, 2*time.Second); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
		t.Fatalf("b acquired a lease the store still considers held: %v", err)
	}

	// The store's expiry passes (set rather than slept): b takes over at a
	// higher epoch.
	if _, err := b.st.Pool().Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 second' WHERE partition_id = $1`, b.part); err != nil {
		t.Fatal(err)
	}
	rec, err := b.st.AcquireLease(ctx, b.part, "b", "127.0.0.1:2", 10*time.Second, 2*time.Second)
	if err != nil || rec.Epoch != held.Epoch+1 {
		t.Fatalf("b acquire: %+v %v", rec, err)
	}
	// a wakes up: its FENCE and RENEW under the old epoch are rejected.
	if err := b.st.FenceLease(ctx, b.part, "a", held.Epoch); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeStaleEpoch}) {
		t.Fatalf("stale FENCE: %v", err)
	}
	if _, err := b.st.RenewLease(ctx, b.part, "a", held.Epoch); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeStaleEpoch}) {
		t.Fatalf("stale RENEW: %v", err)
	}
	a.Tick(ctx) // tries to acquire again and is refused: b holds it
	if ls := a.Lease(b.part); ls.Held {
		t.Fatalf("a holds again: %+v", ls)
	}
	if cur, _ := b.st.Lease(ctx, b.part); cur.OwnerNode != "b" || cur.Epoch != rec.Epoch {
		t.Fatalf("lease moved: %+v", cur)
	}
}

// A map that fails verification is rejected and counted even though it is
// newer, and serving continues on the last verified map (R11, R12, R110).
func TestTamperedMapIsRejectedAndServingContinues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var rejected []authority.Rejection
	k := newKeeper(t, b.st, "a", &authority.ManualClock{}, func(r authority.Rejection) { rejected = append(rejected, r) })
	k.RefreshMap(ctx)
	k.Tick(ctx)

	// Version 2, signed, then altered after signing: the primary moves to
	// a node of the attacker's choosing.
	m2 := *b.m
	m2.Version, m2.Signature = 2, nil
	m2.Partitions = append([]authority.Partition(nil), b.m.Partitions...)
	if err := b.signer.SignMap(&m2); err != nil {
		t.Fatal(err)
	}
	m2.Partitions[0].Primary.Node = "mallory"
	doc, _ := json.Marshal(&m2)
	if _, err := b.st.Pool().Exec(ctx, `INSERT INTO partition_maps (version, document, key_id, generated_at) VALUES (2, $1, 'k1', now())`, string(doc)); err != nil {
		t.Fatal(err)
	}
	k.RefreshMap(ctx)
	if v := k.Map().Version(); v != 1 {
		t.Fatalf("adopted tampered map version %d", v)
	}
	if len(rejected) != 1 {
		t.Fatalf("rejections: %d, want 1", len(rejected))
	}
	k.Tick(ctx)
	if ls := k.Lease(b.part); !ls.Held || !ls.Serving {
		t.Fatalf("serving stopped: %+v", ls)
	}
}

// Issue 27, "Acknowledged means kept": node a is killed with its lease
// live (its keeper dropped without the clean stop that releases it). A
// new process as a takes the lease back on its first tick, at epoch + 1,
// and serves without waiting out the TTL (no clock moved, no sleep). The
// old incarnation, were it only paused, is fenced: its renewal is refused,
// its in-flight work cancelled, and it cannot take the lease back in turn
// (it held it in its own process): no flapping. Another node that a newer
// map names is refused while a's lease is live.
func TestRestartedNodeTakesItsLeaseBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	old := newKeeper(t, b.st, "a", &authority.ManualClock{}, nil)
	old.RefreshMap(ctx)
	old.Tick(ctx)
	was := old.Lease(b.part)
	if !was.Held || !was.Serving {
		t.Fatalf("first incarnation: %+v", was)
	}
	inFlight, err := old.Admit(b.part, was.Epoch)
	if err != nil {
		t.Fatal(err)
	}

	restarted := newKeeper(t, b.st, "a", &authority.ManualClock{}, nil)
	restarted.RefreshMap(ctx)
	restarted.Tick(ctx)
	now := restarted.Lease(b.part)
	if !now.Held || !now.Serving || now.Epoch != was.Epoch+1 {
		t.Fatalf("restarted node: %+v, want held and serving at epoch %d", now, was.Epoch+1)
	}
	if rec, err := b.st.Lease(ctx, b.part); err != nil || rec.OwnerNode != "a" || rec.Epoch != now.Epoch || rec.State != authority.PrimaryServing {
		t.Fatalf("lease row %+v %v", rec, err)
	}
	if _, err := restarted.Admit(b.part, now.Epoch); err != nil {
		t.Fatal(err)
	}

	// The old incarnation's next renewal is refused (R20): it stops
	// admitting and fails its in-flight work (R24).
	old.Tick(ctx)
	if ls := old.Lease(b.part); ls.Held {
		t.Fatalf("old incarnation still holds: %+v", ls)
	}
	if inFlight.Err() == nil {
		t.Fatal("old incarnation's in-flight work was not cancelled")
	}
	if _, err := old.Admit(b.part, was.Epoch); err == nil {
		t.Fatal("old incarnation admitted work under the fenced epoch")
	}
	// It does not take the lease back: it held it in this process.
	old.Tick(ctx)
	restarted.Tick(ctx)
	if ls := restarted.Lease(b.part); !ls.Held || ls.Epoch != now.Epoch {
		t.Fatalf("restarted node lost the lease to the old incarnation: %+v", ls)
	}
	if rec, _ := b.st.Lease(ctx, b.part); rec.Epoch != now.Epoch {
		t.Fatalf("the lease flapped: %+v", rec)
	}

	// Node m, named by a newer map, cannot take a's live lease.
	m2 := *b.m
	m2.Version, m2.Signature, m2.GeneratedAt = 2, nil, time.Now()
	m2.Partitions = append([]authority.Partition(nil), b.m.Partitions...)
	m2.Partitions[0].Primary = authority.Primary{Node: "m", Endpoint: "127.0.0.1:3", State: authority.PrimaryServing}
	if err := b.signer.SignMap(&m2); err != nil {
		t.Fatal(err)
	}
	if err := b.st.PublishMap(ctx, &m2, nil); err != nil {
		t.Fatal(err)
	}
	m := newKeeper(t, b.st, "m", &authority.ManualClock{}, nil)
	m.RefreshMap(ctx)
	m.Tick(ctx)
	if ls := m.Lease(b.part); ls.Held {
		t.Fatalf("another node took a's live lease: %+v", ls)
	}
	if rec, _ := b.st.Lease(ctx, b.part); rec.OwnerNode != "a" || rec.Epoch != now.Epoch {
		t.Fatalf("lease moved: %+v", rec)
	}
}

// Every lease TTL BLOBPLANE_LEASE_TTL accepts gives a timing whose
// renewal fits before its self-fence deadline (R17, R18).
func TestTimingForEveryAcceptedTTL(t *testing.T) {
	for _, ttl := range []time.Duration{2 * time.Second, 4 * time.Second, 10 * time.Second, time.Minute, 5 * time.Minute} {
		if err := keeper.TimingFor(ttl).Validate(); err != nil {
			t.Errorf("ttl %s: %v", ttl, err)
		}
	}
	if keeper.TimingFor(0) != keeper.DefaultTiming {
		t.Error("no TTL set is the default timing")
	}
	if keeper.TimingFor(keeper.DefaultTiming.TTL) != keeper.DefaultTiming {
		t.Error("the default timing is TimingFor its TTL")
	}
}
