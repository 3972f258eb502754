package authority

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

const testKey = "acme/web" // slot 3143 at 12 bits

// routeFixture: two signed maps of the same layout at versions 1487 and
// 1488. In 1487 testKey's partition has primary n_00; in 1488 it moved to
// n_01 at epoch+1.
type routeFixture struct {
	f         *sigFixture
	v1487     *VerifiedMap
	v1488     *VerifiedMap
	delta     *Delta // 1487 -> 1488, signed
	partition string
	epoch1487 uint64
}

func setupRoute(t testing.TB) *routeFixture {
	t.Helper()
	f := setupSig(t)
	m := testMap(t, 12, 16, 4)
	m.Version = 1487
	ix := mustIndex(t, m)
	r, _ := ix.ResolveKey(testKey)
	p := m.Partition(r.Partition.ID)
	p.Primary = Primary{Node: "n_00", Endpoint: "10.0.0.1:7443", State: PrimaryServing}
	p.Standbys = []Standby{{Node: "n_01", Endpoint: "10.0.1.1:7443", State: StandbySynced}}
	if err := f.aug.signer.SignMap(m); err != nil {
		t.Fatal(err)
	}
	next := m.Clone()
	next.Version = 1488
	q := next.Partition(p.ID)
	q.Epoch++
	q.Primary = Primary{Node: "n_01", Endpoint: "10.0.1.1:7443", State: PrimaryServing}
	q.Standbys = []Standby{{Node: "n_00", Endpoint: "10.0.0.1:7443", State: StandbySyncing}}
	if err := f.aug.signer.SignMap(next); err != nil {
		t.Fatal(err)
	}
	d, err := Diff(m, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.aug.signer.SignDelta(d); err != nil {
		t.Fatal(err)
	}
	rf := &routeFixture{f: f, delta: d, partition: p.ID, epoch1487: p.Epoch}
	if rf.v1487, err = f.verifier.VerifyMap(m, sep1); err != nil {
		t.Fatal(err)
	}
	if rf.v1488, err = f.verifier.VerifyMap(next, sep1); err != nil {
		t.Fatal(err)
	}
	return rf
}

func (rf *routeFixture) server(self string, vm *VerifiedMap, leases map[string]LeaseState) *Server {
	return &Server{
		Self: self, Map: vm,
		Leases: LeaseViewFunc(func(id string) LeaseState { return leases[id] }),
		Deltas: func(base uint64) *Delta {
			if base == 1487 && vm.Version() == 1488 {
				return rf.delta
			}
			return nil
		},
		Retry: RetryDelays{NotReady: 250 * time.Millisecond, StaleMap: 100 * time.Millisecond, ByClass: map[string]time.Duration{"ded.8x": time.Second}},
	}
}

func req(version uint64) Request {
	return Request{Key: testKey, Slot: SlotOf(testKey, 12), MapVersion: version}
}

// TestV4_RoutingDecision is the complete outcome table of R99–R102 (the
// spec's reference route(owns, ready, server_v, client_v)). Rows 4 and 6
// look alike to a client and have opposite causes.
func TestV4_RoutingDecision(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	serving := LeaseState{Held: true, Epoch: rf.epoch1487 + 1, Serving: true}
	restoring := LeaseState{Held: true, Epoch: rf.epoch1487 + 1, Serving: false}
	for _, tc := range []struct {
		name     string
		self     string
		lease    LeaseState
		server   *VerifiedMap
		clientV  uint64
		want     Outcome
		wantCode RouteCode
	}{
		{"1_R99_OwnsReady_SameVersion", "n_01", serving, rf.v1488, 1488, Serve, ""},
		{"2_R99_OwnsReady_ClientNewer", "n_01", serving, rf.v1487, 1488, Serve, ""},
		{"2b_R99_OwnsReady_ClientOlder", "n_01", serving, rf.v1488, 1487, Serve, ""},
		{"3_R100_OwnsNotReady_NeverRedirect", "n_01", restoring, rf.v1488, 1487, NotReady, RouteNotReady},
		{"4_R101_NotOwner_ServerNewer_MOVED", "n_00", LeaseState{}, rf.v1488, 1487, Moved, RouteMoved},
		{"5_R101_NotOwner_SameVersion_MISROUTED", "n_02", LeaseState{}, rf.v1488, 1488, Misrouted, RouteMisrouted},
		{"6_R101_NotOwner_ServerOlder_STALE_MAP", "n_02", LeaseState{}, rf.v1487, 1488, StaleMap, RouteStaleMap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := rf.server(tc.self, tc.server, map[string]LeaseState{rf.partition: tc.lease})
			d := s.Decide(req(tc.clientV))
			if d.Outcome != tc.want {
				t.Fatalf("outcome %v (%s), want %v", d.Outcome, d.Reason, tc.want)
			}
			if d.Partition != rf.partition || d.MapVersion != tc.server.Version() {
				t.Fatalf("attribution %s@%d", d.Partition, d.MapVersion)
			}
			if tc.want == Serve {
				if d.Envelope != nil || d.Epoch != tc.lease.Epoch {
					t.Fatalf("serve with envelope %+v epoch %d", d.Envelope, d.Epoch)
				}
				return
			}
			e := d.Envelope
			if e.Code != tc.wantCode || e.Slot != SlotOf(testKey, 12) || e.MapVersion != tc.server.Version() {
				t.Fatalf("envelope %+v", e)
			}
			switch tc.want {
			case Moved: // R101: current assignment; R103: signed delta from the client's version
				if e.Assignment == nil || e.Assignment.Primary.Node != "n_01" || e.Assignment.Epoch != rf.epoch1487+1 || e.MapDelta == nil || e.MapDelta.BaseVersion != 1487 || e.RetryAfterMS != nil {
					t.Fatalf("MOVED envelope %+v", e)
				}
			case Misrouted: // R101: no assignment
				if e.Assignment != nil || e.MapDelta != nil || e.RetryAfterMS != nil {
					t.Fatalf("MISROUTED envelope %+v", e)
				}
			case NotReady, StaleMap:
				if e.Assignment != nil || e.MapDelta != nil || e.RetryAfterMS == nil || *e.RetryAfterMS <= 0 {
					t.Fatalf("%v envelope %+v", tc.want, e)
				}
			}
		})
	}
}

// TestR99_R102_MatchesReferenceRoute drives Decide with random ownership,
// readiness and versions and checks it against the spec's reference route()
// and against R102: MOVED only from a newer map.
func TestR99_R102_MatchesReferenceRoute(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	ref := func(owns, ready bool, sv, cv uint64) Outcome {
		if owns {
			if ready {
				return Serve
			}
			return NotReady
		}
		if sv > cv {
			return Moved
		}
		if sv == cv {
			return Misrouted
		}
		return StaleMap
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 5000 {
		owns, ready := rng.IntN(2) == 0, rng.IntN(2) == 0
		vm := rf.v1487
		if rng.IntN(2) == 0 {
			vm = rf.v1488
		}
		cv := uint64(1485 + rng.IntN(6))
		self, lease := "n_03", LeaseState{}
		if owns {
			lease = LeaseState{Held: true, Epoch: rf.epoch1487 + 1, Serving: ready}
		}
		d := rf.server(self, vm, map[string]LeaseState{rf.partition: lease}).Decide(req(cv))
		if want := ref(owns, ready, vm.Version(), cv); d.Outcome != want {
			t.Fatalf("owns=%v ready=%v sv=%d cv=%d: %v, want %v", owns, ready, vm.Version(), cv, d.Outcome, want)
		}
		if d.Outcome == Moved && vm.Version() <= cv { // R102
			t.Fatal("redirect derived from a map not newer than the client's")
		}
	}
}

func TestR100_MapNamesMeButLeaseNotHeld_NotReadyNeverMoved(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	// n_00 is primary in 1487 but lost its lease (expired, self-fenced):
	// it must not redirect a client to itself, nor call it MISROUTED.
	s := rf.server("n_00", rf.v1487, nil)
	d := s.Decide(req(1487))
	if d.Outcome != NotReady || d.Reason != ReasonMapOwnerNoLease {
		t.Fatalf("%v %s", d.Outcome, d.Reason)
	}
}

func TestR16_LeaseOlderThanMapEpochIsNotOwnership(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	// n_00 still believes it holds epoch e, but the 1488 map records e+1
	// for n_01: n_00 was superseded and must not serve.
	s := rf.server("n_00", rf.v1488, map[string]LeaseState{rf.partition: {Held: true, Epoch: rf.epoch1487, Serving: true}})
	if d := s.Decide(req(1487)); d.Outcome != Moved {
		t.Fatalf("superseded node decided %v", d.Outcome)
	}
}

func TestA2_Step1_SlotMismatchIsMisrouted(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	s := rf.server("n_01", rf.v1488, map[string]LeaseState{rf.partition: {Held: true, Epoch: rf.epoch1487 + 1, Serving: true}})
	r := req(1488)
	r.Slot ^= 0x5 // client hashed differently
	if d := s.Decide(r); d.Outcome != Misrouted || d.Reason != ReasonSlotMismatch {
		t.Fatalf("%v %s", d.Outcome, d.Reason)
	}
	// Explicit bits: a client at 13 bits is checked at 13 bits.
	r = Request{Key: testKey, Slot: SlotOf(testKey, 13), SlotBits: 13, MapVersion: 1488}
	if d := s.Decide(r); d.Outcome != Serve {
		t.Fatalf("13-bit client: %v %s", d.Outcome, d.Reason)
	}
	// R3: a stale client computed at fewer bits is answered by version, not
	// called misrouted.
	r = Request{Key: testKey, Slot: SlotOf(testKey, 10), MapVersion: 1400}
	if d := s.Decide(r); d.Outcome != Serve {
		t.Fatalf("pre-refinement client: %v %s", d.Outcome, d.Reason)
	}
}

func TestR100_ClassRetryDelay(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	s := rf.server("n_01", rf.v1488, map[string]LeaseState{rf.partition: {Held: true, Epoch: rf.epoch1487 + 1}})
	d := s.Decide(req(1488))
	if d.RetryAfter != 250*time.Millisecond || *d.Envelope.RetryAfterMS != 250 {
		t.Fatalf("retry %v", d.RetryAfter)
	}
}

func TestR101_NoLocalMapIsStale(t *testing.T) {
	t.Parallel()
	s := &Server{Self: "n_00", Leases: LeaseViewFunc(func(string) LeaseState { return LeaseState{} }), Retry: RetryDelays{StaleMap: time.Second}}
	if d := s.Decide(req(5)); d.Outcome != StaleMap || d.Envelope.Code != RouteStaleMap {
		t.Fatalf("%v", d.Outcome)
	}
}

func TestEnvelope_WireFormat(t *testing.T) {
	t.Parallel()
	rf := setupRoute(t)
	d := rf.server("n_00", rf.v1488, nil).Decide(req(1487))
	data, err := json.Marshal(d.Envelope)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"code":"MOVED"`, `"retry_after_ms":null`, `"assignment":{"partition":`, `"map_delta":{"base_version":1487`, `"signature":{"alg":"ed25519"`} {
		if !strings.Contains(string(data), want) {
			t.Fatalf("envelope JSON lacks %s:\n%s", want, data)
		}
	}
	back, err := ParseEnvelope(data)
	if err != nil {
		t.Fatal(err)
	}
	if back.Code != RouteMoved || back.MapDelta == nil || back.MapDelta.Signature == nil {
		t.Fatalf("round trip %+v", back)
	}
	// The spec's example envelope parses (its delta is a placeholder).
	spec := `{"code":"STALE_MAP","slot":1789,"map_version":1486,"retry_after_ms":200,"assignment":null,"map_delta":null}`
	e, err := ParseEnvelope([]byte(spec))
	if err != nil || e.RetryAfter() != 200*time.Millisecond {
		t.Fatalf("%v %v", e, err)
	}
	if _, err := ParseEnvelope([]byte(`{"code":"GO_AWAY"}`)); err == nil {
		t.Fatal("unknown code accepted")
	}
}

func BenchmarkDecide(b *testing.B) {
	rf := setupRoute(b)
	leases := map[string]LeaseState{rf.partition: {Held: true, Epoch: rf.epoch1487 + 1, Serving: true}}
	for _, bc := range []struct {
		name string
		self string
		cv   uint64
	}{{"serve", "n_01", 1488}, {"moved", "n_00", 1487}} {
		b.Run(bc.name, func(b *testing.B) {
			s := rf.server(bc.self, rf.v1488, leases)
			if bc.self == "n_00" {
				s.Leases = LeaseViewFunc(func(string) LeaseState { return LeaseState{} })
			}
			r := req(bc.cv)
			b.ReportAllocs()
			for b.Loop() {
				if d := s.Decide(r); d.Outcome == Misrouted {
					b.Fatal("misrouted")
				}
			}
		})
	}
}
