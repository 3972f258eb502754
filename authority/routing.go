package authority

import (
	"time"
)

// Outcome is the server's routing decision for one request (A.2).
type Outcome uint8

// The five things a server can say (R99–R102).
const (
	Serve     Outcome = iota // R99
	NotReady                 // R100
	Moved                    // R101: server map newer
	Misrouted                // R101: equal versions, or slot disagreement (A.2 step 1)
	StaleMap                 // R101: server map older
)

func (o Outcome) String() string {
	switch o {
	case Serve:
		return "SERVE"
	case NotReady:
		return string(RouteNotReady)
	case Moved:
		return string(RouteMoved)
	case Misrouted:
		return string(RouteMisrouted)
	case StaleMap:
		return string(RouteStaleMap)
	}
	return "UNKNOWN"
}

// LeaseState is what this node knows, locally, about its lease on one
// partition. The lease keeper maintains it; the routing decision only reads
// it, so serving never waits on the lease store.
type LeaseState struct {
	// Held: this node holds the lease at Epoch, its last RENEW was
	// acknowledged, and its self-fence deadline has not passed (R17, R18,
	// A.2 step 2). The keeper computes this from a LeaseTimer.
	Held bool
	// Epoch is the epoch this node believes it holds.
	Epoch uint64
	// Serving: the lease record's state is SERVING. Holding the lease and
	// being ready are distinct (R23).
	Serving bool
}

// LeaseView answers LeaseState by partition id. Implementations must be
// cheap and non-blocking: it is called on every request.
type LeaseView interface {
	Lease(partitionID string) LeaseState
}

// LeaseViewFunc adapts a function to LeaseView.
type LeaseViewFunc func(partitionID string) LeaseState

// Lease implements LeaseView.
func (f LeaseViewFunc) Lease(id string) LeaseState { return f(id) }

// DeltaSource returns the signed delta from base to the server's current
// map version, or nil when none is retained (R9 keeps every version
// addressable for the longest client cache lifetime; the controller signs
// the deltas, R10, since nodes hold no signing key).
type DeltaSource func(base uint64) *Delta

// RetryDelays are the delays the server puts in NOT_READY and STALE_MAP
// answers.
type RetryDelays struct {
	NotReady time.Duration            // default class retry delay (R100)
	ByClass  map[string]time.Duration // per-class NOT_READY delay, by class name
	StaleMap time.Duration            // R101
}

func (r RetryDelays) notReady(class string) time.Duration {
	if d, ok := r.ByClass[class]; ok {
		return d
	}
	return r.NotReady
}

// Server is the local, read-only state a routing decision is made from.
// Build one per map change (or share one and swap the map atomically).
type Server struct {
	Self   string       // this node's id
	Map    *VerifiedMap // the local verified map; nil means none yet
	Leases LeaseView    // nil means this node holds no leases
	Deltas DeltaSource  // may be nil: MOVED then carries no delta
	Retry  RetryDelays
}

// Request is what a client sends (R98): the key, the slot it computed and
// the map version it resolved against. SlotBits is the slot_bits the client
// computed at, when it says so; 0 means unknown.
type Request struct {
	Key        string
	Slot       Slot
	SlotBits   int
	MapVersion uint64
}

// Decision is the outcome of Decide, with what the caller needs to act,
// attribute (R132) and count it.
type Decision struct {
	Outcome    Outcome
	Slot       Slot   // the slot the server computed
	MapVersion uint64 // the server's map version
	Partition  string // owning partition in the server's map ("" if unknown)
	Epoch      uint64 // the lease epoch when serving; the map's epoch otherwise
	RetryAfter time.Duration
	Reason     Reason
	Envelope   *Envelope // nil when Outcome is Serve
}

// Reason says why a decision was reached; a label for metrics and logs.
type Reason string

// Decision reasons.
const (
	ReasonOwnerServing    Reason = "owner_serving"          // R99
	ReasonOwnerNotServing Reason = "owner_not_serving"      // R100, R23: lease held, not SERVING
	ReasonMapOwnerNoLease Reason = "map_owner_no_lease"     // R100: the map names me, my lease is not held
	ReasonSlotMismatch    Reason = "slot_mismatch"          // A.2 step 1, R105
	ReasonSameVersion     Reason = "same_version_not_owner" // R101, R105
	ReasonServerMapNewer  Reason = "server_map_newer"       // R101 MOVED
	ReasonServerMapOlder  Reason = "server_map_older"       // R101 STALE_MAP, R102
	ReasonNoMap           Reason = "no_local_map"           // R101 STALE_MAP: no map is older than any
	ReasonUncoveredSlot   Reason = "uncovered_slot"         // impossible for a verified map
)

// Decide admits or answers one request exactly per A.2 and R99–R102. It is
// pure: it reads s and r and nothing else.
//
//   - A client slot that disagrees with the key's slot → MISROUTED (A.2 step 1).
//   - The slot's partition is held by this node at an epoch no older than
//     the map's, and SERVING → serve, whatever the client's map version (R99).
//   - Held but not SERVING, or the map names this node primary but its lease
//     is not held → NOT_READY with the class's delay; never a redirect (R100).
//   - Otherwise by map version (R101): mine newer → MOVED with the current
//     assignment and a signed delta from the client's version; equal →
//     MISROUTED, no assignment; mine older → STALE_MAP with a delay. MOVED
//     is only ever derived from a map newer than the client's (R102).
func (s *Server) Decide(r Request) Decision {
	if s.Map == nil { // no map: older than any client's
		d := Decision{Outcome: StaleMap, Slot: r.Slot, RetryAfter: s.Retry.StaleMap, Reason: ReasonNoMap}
		d.Envelope = &Envelope{Code: RouteStaleMap, Slot: r.Slot, RetryAfterMS: retryMS(d.RetryAfter)}
		return d
	}
	ix := s.Map.ix
	mine := s.Map.Version()
	h := HashKey(r.Key)
	slot := h.Slot(ix.bits)
	d := Decision{Slot: slot, MapVersion: mine}

	// A.2 step 1: recompute the slot.
	if !clientSlotAgrees(h, r, ix.bits, mine) {
		return s.misrouted(d, ReasonSlotMismatch)
	}
	p := ix.Lookup(slot)
	if p == nil {
		d.Outcome, d.RetryAfter, d.Reason = NotReady, s.Retry.NotReady, ReasonUncoveredSlot
		d.Envelope = &Envelope{Code: RouteNotReady, Slot: slot, MapVersion: mine, RetryAfterMS: retryMS(d.RetryAfter)}
		return d
	}
	d.Partition, d.Epoch = p.ID, p.Epoch

	// A.2 step 2: the lease. A map recording a higher epoch than the one I
	// believe I hold means I have been superseded (R16, R20).
	var ls LeaseState
	if s.Leases != nil {
		ls = s.Leases.Lease(p.ID)
	}
	held := ls.Held && ls.Epoch >= p.Epoch
	if held && ls.Serving { // R99, A.2 step 3–4 (capacity shedding, R130, is the caller's)
		d.Outcome, d.Epoch, d.Reason = Serve, ls.Epoch, ReasonOwnerServing
		return d
	}
	if held || p.Primary.Node == s.Self { // R100: mine, not ready: never redirect
		d.Outcome, d.RetryAfter = NotReady, s.Retry.notReady(p.Class)
		d.Reason = ReasonMapOwnerNoLease
		if held {
			d.Epoch, d.Reason = ls.Epoch, ReasonOwnerNotServing
		}
		d.Envelope = &Envelope{Code: RouteNotReady, Slot: slot, MapVersion: mine, RetryAfterMS: retryMS(d.RetryAfter)}
		return d
	}

	// A.2 step 5: not the owner; compare map versions (R101).
	switch {
	case mine > r.MapVersion: // R101 MOVED; R102 holds because mine is newer
		d.Outcome, d.Reason = Moved, ReasonServerMapNewer
		d.Envelope = &Envelope{
			Code: RouteMoved, Slot: slot, MapVersion: mine,
			Assignment: &Assignment{Partition: p.ID, Epoch: p.Epoch, Primary: AssignedNode{Node: p.Primary.Node, Endpoint: p.Primary.Endpoint}},
		}
		if s.Deltas != nil { // R103: enough map to route the retry
			if delta := s.Deltas(r.MapVersion); delta != nil && delta.BaseVersion == r.MapVersion && delta.Version == mine {
				d.Envelope.MapDelta = delta
			}
		}
		return d
	case mine == r.MapVersion: // R101 MISROUTED: same map, and still sent here
		return s.misrouted(d, ReasonSameVersion)
	default: // R101 STALE_MAP; R102: never redirect from an older map
		d.Outcome, d.RetryAfter, d.Reason = StaleMap, s.Retry.StaleMap, ReasonServerMapOlder
		d.Envelope = &Envelope{Code: RouteStaleMap, Slot: slot, MapVersion: mine, RetryAfterMS: retryMS(d.RetryAfter)}
		return d
	}
}

func (s *Server) misrouted(d Decision, why Reason) Decision {
	d.Outcome, d.Reason = Misrouted, why
	d.Envelope = &Envelope{Code: RouteMisrouted, Slot: d.Slot, MapVersion: d.MapVersion} // R101: no assignment
	return d
}

// clientSlotAgrees reports whether the client's slot is the key's slot at
// the slot_bits the client computed at (A.2 step 1). When the client names
// its bits, that is exact. When it does not and its map version equals the
// server's, the bits are the server's. When the versions differ the client
// may predate an R3 refinement, so its slot is accepted if it is the key's
// slot at any valid slot_bits: a staleness is then answered by version
// (MOVED or STALE_MAP), and a hash or encoding disagreement still shows.
func clientSlotAgrees(h Hash128, r Request, serverBits int, serverVersion uint64) bool {
	switch {
	case r.SlotBits != 0:
		return ValidSlotBits(r.SlotBits) && h.Slot(r.SlotBits) == r.Slot
	case r.MapVersion == serverVersion:
		return h.Slot(serverBits) == r.Slot
	}
	for b := MinSlotBits; b <= MaxSlotBits; b++ {
		if uint64(r.Slot) < SlotCount(b) && h.Slot(b) == r.Slot {
			return true
		}
	}
	return false
}
