package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/authority/keeper"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
)

// fleet is a published map over api nodes a and b (datacenter eu-1), each
// with a lease keeper on a manual clock and its presence lock held, and a
// controller service; nothing runs by itself: the test drives every step.
type fleet struct {
	st      *store.Store
	svc     *controller.Service
	keepers map[string]*keeper.Keeper
	present map[string]*store.Presence
	clock   *authority.ManualClock
	key     controller.KeyFile
}

func newFleet(t *testing.T, partitions int, nodes ...string) *fleet {
	t.Helper()
	return newFleetBits(t, 0, partitions, nodes...)
}

func newFleetBits(t *testing.T, slotBits, partitions int, nodes ...string) *fleet {
	t.Helper()
	ctx := context.Background()
	st, k := setup(t)
	f := &fleet{st: st, keepers: map[string]*keeper.Keeper{}, present: map[string]*store.Presence{}, clock: &authority.ManualClock{}, key: k}
	for i, n := range nodes {
		register(t, st, n, "http://127.0.0.1:"+string(rune('1'+i))+"000")
		f.hold(t, n)
		kp, err := keeper.New(st, keeper.Config{NodeID: n, Endpoint: "127.0.0.1:" + string(rune('1'+i)) + "000", Clock: f.clock})
		if err != nil {
			t.Fatal(err)
		}
		f.keepers[n] = kp
	}
	if _, err := controller.Publish(ctx, st, k.Signer(), controller.PublishOptions{Partitions: partitions, SlotBits: slotBits}); err != nil {
		t.Fatal(err)
	}
	f.svc = &controller.Service{Store: st, Signer: k.Signer(), Settings: controller.Settings{}}
	f.tick(t, nodes...)
	t.Cleanup(func() {
		for _, p := range f.present {
			p.Release()
		}
	})
	return f
}

func (f *fleet) hold(t *testing.T, node string) {
	t.Helper()
	p, err := f.st.HoldPresence(context.Background(), node)
	if err != nil {
		t.Fatal(err)
	}
	f.present[node] = p
}

// gone releases node's presence: its process died (the lock went with its
// Postgres sessions).
func (f *fleet) gone(node string) {
	f.present[node].Release()
	delete(f.present, node)
	// The lock goes when Postgres has ended the session, a moment after
	// the connection closed: wait for it to be seen gone.
	for deadline := time.Now().Add(10 * time.Second); ; {
		pres, err := f.st.PresentNodes(context.Background())
		if err == nil && !pres.Present[node] {
			return
		}
		if time.Now().After(deadline) {
			panic(fmt.Sprintf("node %s still present 10 s after its presence was released (%v)", node, err))
		}
		time.Sleep(5 * time.Millisecond) // polling pg_locks for the ended session
	}
}

func (f *fleet) tick(t *testing.T, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		f.keepers[n].RefreshMap(context.Background())
		f.keepers[n].Tick(context.Background())
	}
}

func (f *fleet) round(t *testing.T) controller.Plan {
	t.Helper()
	p, err := f.svc.Round(context.Background(), nil, controller.Override{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fleet) held(node string) []string {
	m := f.keepers[node].Map().Map()
	var out []string
	for _, p := range m.Partitions {
		if f.keepers[node].Lease(p.ID).Held {
			out = append(out, p.ID)
		}
	}
	return out
}

func (f *fleet) primaryOf(t *testing.T, partition string) (string, uint64) {
	t.Helper()
	m, err := f.st.LatestMap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p := m.Partition(partition)
	return p.Primary.Node, m.Version
}

func (f *fleet) handoff(t *testing.T, partition string) authority.Handoff {
	t.Helper()
	hs, err := f.st.RecentHandoffs(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Partition == partition {
			return h
		}
	}
	t.Fatalf("no handoff of %s", partition)
	return authority.Handoff{}
}

// A draining node's partition moves by live handoff, one step per actor,
// and the map names the target only once it serves (ZBP-5 A.4, R74, R75,
// R79, R83).
func TestDrainHandsOffLiveAndPublishesOnlyWhenReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	from := f.keepers["a"].Lease(part).Epoch
	if err := f.st.MarkNodeDraining(ctx, "a"); err != nil {
		t.Fatal(err)
	}

	p := f.round(t)
	if len(p.Moves) != 1 || p.Moves[0].Partition != part || p.Moves[0].To != "b" || p.Moves[0].Kind != authority.KindHandoff {
		t.Fatalf("plan %+v: one handoff of %s to b", p, part)
	}
	if h := f.handoff(t, part); h.State != authority.HandoffPreparing || h.FromEpoch != from {
		t.Fatalf("handoff %+v", h)
	}
	// Nothing has changed yet (R75): a still admits under its epoch.
	if _, err := f.keepers["a"].Admit(part, from); err != nil {
		t.Fatalf("before the seal a must serve: %v", err)
	}
	// The round published one map, for b's partition's standby on the
	// draining a (R60), naming no new primary.
	if primary, v := f.primaryOf(t, part); primary != "a" || v != 2 {
		t.Fatalf("after the first round: map v%d names %s", v, primary)
	}

	f.tick(t, "b") // target: synced
	if h := f.handoff(t, part); h.State != authority.HandoffSynced {
		t.Fatalf("after the target's tick: %s", h.State)
	}
	f.tick(t, "a") // outgoing: seal
	if h := f.handoff(t, part); h.State != authority.HandoffSealed {
		t.Fatalf("after the outgoing primary's tick: %s", h.State)
	}
	if _, err := f.keepers["a"].Admit(part, from); err == nil {
		t.Fatal("R74: after the seal the outgoing primary admits nothing")
	}
	rec, err := f.st.Lease(ctx, part)
	if err != nil || rec.State != authority.PrimarySealed || rec.Epoch != from || rec.OwnerNode != "a" {
		t.Fatalf("lease after the seal: %+v %v", rec, err)
	}
	if _, err := f.st.RenewLease(ctx, part, "a", from); blobplane.ErrorCode(err) != blobplane.CodeStaleEpoch {
		t.Fatalf("R74: renewal of a sealed lease: %v", err)
	}
	// R77, R132: a request at the sealed home is refused retryably,
	// attributed to the partition, and told where it goes.
	refusal := homeProbe(t, f.keepers["a"], "a", part)
	if refusal.status != http.StatusServiceUnavailable || refusal.env.Code != authority.RouteNotReady ||
		refusal.partition != part || refusal.env.Assignment == nil ||
		refusal.env.Assignment.Primary.Node != "b" || refusal.env.Assignment.Epoch != from+1 || refusal.env.Assignment.Primary.Endpoint == "" {
		t.Fatalf("R77: refusal at the sealed home %+v (assignment %+v)", refusal, refusal.env.Assignment)
	}
	if !strings.Contains(refusal.metrics, "blobplane_handoff_refused_requests_total{partition=\""+part+"\"} 1\n") {
		t.Fatal("R135: the refusal during the handoff is not counted")
	}

	// R79: no map names b before b reports ready.
	f.round(t)
	if primary, v := f.primaryOf(t, part); primary != "a" || v != 2 {
		t.Fatalf("map v%d names %s before the target is ready", v, primary)
	}
	f.tick(t, "b") // target: claims the sealed lease at epoch + 1, serves, reports ready
	h := f.handoff(t, part)
	if h.State != authority.HandoffReady || h.ToEpoch != from+1 {
		t.Fatalf("after the target's claim: %+v", h)
	}
	if ls := f.keepers["b"].Lease(part); !ls.Held || !ls.Serving || ls.Epoch != from+1 {
		t.Fatalf("b's lease %+v", ls)
	}
	f.round(t)
	primary, v := f.primaryOf(t, part)
	if primary != "b" || v != 3 {
		t.Fatalf("after ready: map v%d names %s", v, primary)
	}
	h = f.handoff(t, part)
	if h.State != authority.HandoffPublished || h.MapVersion != 3 || h.Unavailable() <= 0 {
		t.Fatalf("published handoff %+v (unavailable %s)", h, h.Unavailable())
	}
	if n := testutil.CollectAndCount(f.svc.Metrics.Registry, "blobplane_partition_unavailability_seconds"); n != 1 {
		t.Fatalf("unavailability histogram series: %d", n)
	}
	m, _ := f.st.LatestMap(ctx)
	if m.Partition(part).Epoch != from+1 {
		t.Fatalf("R16: the map's epoch %d, the lease's %d", m.Partition(part).Epoch, from+1)
	}
	// b was its standby and is its primary now; a drains: no standby is
	// left to place (R114: fewer, reported).
	if ss := m.Partition(part).Standbys; len(ss) != 0 {
		t.Fatalf("standbys after the drain: %+v", ss)
	}
	f.tick(t, "a")
	if next := f.keepers["a"].Successor(part); next != nil {
		t.Fatalf("the map names b: no successor left to announce, got %+v", next)
	}
	if l, n := f.keepers["a"].Holding(); l+n != 0 {
		t.Fatalf("drained node still holds %d leases, named in %d partitions", l, n)
	}
}

// A lease that expires on a node that is gone is recovered on a live node
// and published once it serves; a lease that expires on a node still
// connected is left for that node's keeper (a blip moves nothing).
func TestRecoverAfterExpiryOnAGoneNodeOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	expire := func() {
		t.Helper()
		if _, err := f.st.Pool().Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 second' WHERE partition_id = $1`, part); err != nil {
			t.Fatal(err)
		}
	}
	expire()
	if p := f.round(t); len(p.Moves)+len(p.Held) != 0 {
		t.Fatalf("a is connected: nothing moves within the live grace: %+v", p)
	}
	f.gone("a")
	p := f.round(t)
	if len(p.Moves) != 1 || p.Moves[0].Kind != authority.KindRecover || p.Moves[0].To != "b" {
		t.Fatalf("plan %+v: recover %s on b", p, part)
	}
	f.round(t)
	if primary, _ := f.primaryOf(t, part); primary != "a" {
		t.Fatal("R79: published before the target serves")
	}
	f.tick(t, "b")
	if h := f.handoff(t, part); h.State != authority.HandoffReady {
		t.Fatalf("recover after b's tick: %+v", h)
	}
	f.round(t)
	if primary, _ := f.primaryOf(t, part); primary != "b" {
		t.Fatalf("after recovery the map names %s", primary)
	}
	h := f.handoff(t, part)
	if h.UnavailableSince.IsZero() || h.Unavailable() <= time.Second {
		t.Fatalf("a recovery's outage runs from the old lease's last renewal: %+v", h)
	}
}

// Past its deadline before the seal a handoff aborts: the outgoing primary
// keeps serving, the map and the lease are unchanged (R75, R82).
func TestHandoffAbortsBeforeTheSeal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	from := f.keepers["a"].Lease(part).Epoch
	if err := f.st.MarkNodeDraining(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	first := f.handoff(t, part)
	f.tick(t, "b")
	if _, err := f.st.Pool().Exec(ctx, `UPDATE handoffs SET deadline = now() - interval '1 second' WHERE partition_id = $1`, part); err != nil {
		t.Fatal(err)
	}
	f.tick(t, "a") // the seal is refused: the deadline passed
	if _, err := f.keepers["a"].Admit(part, from); err != nil {
		t.Fatalf("R75: a refused seal leaves the primary serving: %v", err)
	}
	p := f.round(t)
	h, err := f.st.Handoff(ctx, first.ID)
	if err != nil || h.State != authority.HandoffAborted || !strings.Contains(h.AbortReason, "deadline") {
		t.Fatalf("handoff %+v", h)
	}
	rec, _ := f.st.Lease(ctx, part)
	if rec.OwnerNode != "a" || rec.Epoch != from || rec.State != authority.PrimaryServing {
		t.Fatalf("R75: lease after the abort %+v", rec)
	}
	// v2 is the first round's: b's partition lost its standby on the
	// draining a (R60); nothing published since.
	if primary, v := f.primaryOf(t, part); primary != "a" || v != 2 {
		t.Fatalf("R75: map v%d names %s", v, primary)
	}
	// a still drains: the next round starts a new handoff (A.8 step 6:
	// a failed step ends its plan, the next plan starts from observed state).
	if len(p.Moves) != 1 || p.Moves[0].Partition != part {
		t.Fatalf("the round after the abort: %+v", p)
	}
	if ok, err := f.st.AbortHandoff(ctx, h.ID, "again"); ok || err != nil {
		t.Fatalf("an aborted handoff aborts once: %v %v", ok, err)
	}
}

// The freeze holds new moves but never a handoff past its seal (R76,
// R122, R123); after the seal a handoff cannot be aborted.
func TestFreezeHoldsNewMovesNotSealedOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 4, "a", "b", "c")
	parts := f.held("a")
	if len(parts) < 2 {
		t.Fatalf("a holds %v", parts)
	}
	f.svc.Settings.MaxPerNode = 1 // one move off a at a time
	if err := f.st.MarkNodeDraining(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	p := f.round(t)
	if len(p.Moves) != 1 || len(p.Held) != 1 || !strings.HasPrefix(p.Held[0].Held, "concurrency") {
		t.Fatalf("plan %+v", p)
	}
	first := p.Moves[0]
	f.tick(t, first.To)
	f.tick(t, "a")
	h := f.handoff(t, first.Partition)
	if h.State != authority.HandoffSealed {
		t.Fatalf("%+v", h)
	}
	if ok, _ := f.st.AbortHandoff(ctx, h.ID, "changed my mind"); ok {
		t.Fatal("R76: a sealed handoff aborted")
	}
	if err := f.st.Freeze(ctx, "alice", "incident 42"); err != nil {
		t.Fatal(err)
	}
	f.tick(t, first.To)
	p = f.round(t)
	if primary, _ := f.primaryOf(t, first.Partition); primary != first.To {
		t.Fatalf("R122/R123: the freeze held back a sealed handoff's publication (primary %s)", primary)
	}
	if len(p.Moves) != 0 || len(p.Held) == 0 || !strings.HasPrefix(p.Held[0].Held, "frozen by alice") {
		t.Fatalf("R123: frozen plan %+v", p)
	}
	if _, err := f.st.Unfreeze(ctx); err != nil {
		t.Fatal(err)
	}
	if p := f.round(t); len(p.Moves) != 1 {
		t.Fatalf("after unfreeze: %+v", p)
	}
}

// A force-takeover is served by its target at once, not after a TTL, and
// the controller's map follows it (R26).
func TestForcedTakeoverIsAdoptedAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	from := f.keepers["a"].Lease(part).Epoch
	rec, err := controller.Takeover(ctx, f.st, part, "b", "", "alice", "a is wedged")
	if err != nil || rec.Epoch != from+1 {
		t.Fatalf("takeover %+v %v", rec, err)
	}
	f.tick(t, "b")
	if ls := f.keepers["b"].Lease(part); !ls.Held || !ls.Serving || ls.Epoch != from+1 {
		t.Fatalf("R26: b serves the forced lease at once: %+v", ls)
	}
	f.tick(t, "a")
	if ls := f.keepers["a"].Lease(part); ls.Held {
		t.Fatalf("the displaced node still holds it: %+v", ls)
	}
	p := f.round(t)
	_ = p
	if primary, _ := f.primaryOf(t, part); primary != "b" {
		t.Fatalf("the map follows the forced lease: %s", primary)
	}
	f.tick(t, "a", "b")
	if ls := f.keepers["b"].Lease(part); !ls.Held || ls.Epoch != from+1 {
		t.Fatalf("b keeps it under the map: %+v", ls)
	}
}

// One controller acts at a time; a standby takes over when the leader's
// session ends; `controller apply` beside an active service asks it
// rather than acting.
func TestOneControllerActsAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, k := setup(t)
	l1, err := st.TryControllerLock(ctx)
	if err != nil || l1 == nil {
		t.Fatalf("first lock: %v %v", l1, err)
	}
	if err := l1.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if running, _ := st.ControllerRunning(ctx); !running {
		t.Fatal("ControllerRunning misses the leader")
	}
	l2, err := st.TryControllerLock(ctx)
	if err != nil || l2 != nil {
		t.Fatalf("second lock while the first is held: %v %v", l2, err)
	}
	svc := &controller.Service{Store: st, Signer: k.Signer()}
	// Beside an active service apply only queues a request: nothing
	// rounds here, and a leader that never takes it is reported.
	if _, _, err := controller.Apply(ctx, svc, controller.Override{}, 300*time.Millisecond); blobplane.ErrorCode(err) != blobplane.CodeUnavailable || !strings.Contains(err.Error(), "not taken") {
		t.Fatalf("apply beside a service that does not round: %v", err)
	}
	l1.Release()
	l2, err = st.TryControllerLock(ctx)
	if err != nil || l2 == nil {
		t.Fatalf("standby after release: %v %v", l2, err)
	}
	l2.Release()
}

// After its seal a handoff only goes forward (R76): past its deadline,
// even with its target gone, the controller publishes the map naming the
// target instead of aborting (R82); the target claims the lease once it
// expires, or a recovery moves it on.
func TestSealedHandoffPastItsDeadlineCompletesForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	if err := f.st.MarkNodeDraining(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	f.tick(t, "b")
	f.tick(t, "a")
	h := f.handoff(t, part)
	if h.State != authority.HandoffSealed {
		t.Fatalf("%+v", h)
	}
	f.gone("b")
	if _, err := f.st.Pool().Exec(ctx, `UPDATE handoffs SET deadline = now() - interval '1 second' WHERE handoff_id = $1`, h.ID); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	h, err := f.st.Handoff(ctx, h.ID)
	if err != nil || h.State != authority.HandoffPublished || h.AbortReason != "" {
		t.Fatalf("R76, R82: a sealed handoff past its deadline: %+v %v", h, err)
	}
	if primary, _ := f.primaryOf(t, part); primary != "b" {
		t.Fatalf("the map names %s, want the target b", primary)
	}
	if _, err := f.keepers["a"].Admit(part, h.FromEpoch); err == nil {
		t.Fatal("R76: the outgoing primary serves again")
	}
}

// A node that joins gets its share by live handoffs once balance is
// applied (R115), each published only when its target serves (R79); a
// second round finds nothing to do.
func TestBalanceHandsPartitionsToAJoinedNode(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 4, "a")
	register(t, f.st, "b", "http://127.0.0.1:2000")
	f.hold(t, "b")
	kb, err := keeper.New(f.st, keeper.Config{NodeID: "b", Endpoint: "127.0.0.1:2000", Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.keepers["b"] = kb
	// By default balance waits for an operator (R118)...
	if p := f.round(t); len(p.Moves) != 0 || len(p.Held) != 2 || p.Held[0].Trigger != controller.TriggerBalance {
		t.Fatalf("balance not applied automatically: %+v", p)
	}
	// ... who asks the running service for it: the request widens its
	// next round (R118), recorded with who asked.
	id, err := f.st.RequestApply(context.Background(), store.ApplyRequest{Kinds: []string{controller.TriggerBalance}, By: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	p := f.round(t)
	if taken, plan, err := f.st.ApplyRequestState(context.Background(), id); !taken || plan == 0 || err != nil {
		t.Fatalf("request after the round: taken %v, plan %d (%v)", taken, plan, err)
	}
	if len(p.Moves) != 2 {
		t.Fatalf("4/0 takes two moves: %+v", p)
	}
	f.tick(t, "b") // synced
	f.tick(t, "a") // sealed
	f.tick(t, "b") // claimed at epoch + 1, ready
	f.round(t)     // published
	m, err := f.st.LatestMap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	homes := map[string]int{}
	for _, part := range m.Partitions {
		homes[part.Primary.Node]++
		if part.Primary.Node == "b" && !f.keepers["b"].Lease(part.ID).Serving {
			t.Fatalf("map names b for %s before it serves", part.ID)
		}
	}
	if homes["a"] != 2 || homes["b"] != 2 {
		t.Fatalf("homes after balance: %v", homes)
	}
	if p := f.round(t); len(p.Moves)+len(p.Held) != 0 {
		t.Fatalf("balanced, yet: %+v", p)
	}
}

type refusal struct {
	status    int
	partition string
	env       authority.Envelope
	metrics   string // the node's /metrics after the request
}

// homeProbe asks node's routing middleware (over real HTTP, keeper k)
// for a repository of partition, as a client without a map would.
func homeProbe(t *testing.T, k *keeper.Keeper, node, partition string) refusal {
	t.Helper()
	repo := ""
	for i := 0; repo == ""; i++ {
		name := fmt.Sprintf("probe/r%d", i)
		if res, err := k.Map().ResolveKey(name); err == nil && res.Partition.ID == partition {
			repo = name
		}
	}
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Authority: &handlers.Authority{NodeID: node, Keeper: k}}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/home/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := refusal{status: resp.StatusCode, partition: resp.Header.Get(handlers.HeaderRoutePartition)}
	if err := json.NewDecoder(resp.Body).Decode(&r.env); err != nil {
		t.Fatal(err)
	}
	mresp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	m, _ := io.ReadAll(mresp.Body)
	r.metrics = string(m)
	return r
}
