package authority

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/blobplane/blobplane"
)

// LeaseRecord is the one record per partition in the lease store, holding
// ownership, the epoch and the checkpoint pointer together so they move
// atomically with respect to each other (spec: "The lease record"). It is
// the reference model for the Postgres lease table: each field is a column.
type LeaseRecord struct {
	Partition         string
	Epoch             uint64 // R15: incremented by the write that claims the lease
	OwnerNode         string // R14: a named owner
	OwnerEndpoint     string
	State             PrimaryState  // R23: holding the lease and being ready are distinct
	TTL               time.Duration // R14: lease_ttl_ms
	RenewInterval     time.Duration // R14: renew_interval_ms
	ExpiresAt         time.Time     // R14: never absent; the store's wall time (a record, not a duration)
	CheckpointPointer string        // R22: "" means none yet
	SealedLSN         *uint64       // set once, by the seal (R74)
	TakenBy           string        // R28: operator of the last force-takeover
	TakenReason       string
	TakenAt           *time.Time
}

// MarshalJSON renders the record with the spec's field names (R131).
func (r LeaseRecord) MarshalJSON() ([]byte, error) {
	type wire struct {
		Partition         string       `json:"partition"`
		Epoch             uint64       `json:"epoch"`
		OwnerNode         string       `json:"owner_node"`
		OwnerEndpoint     string       `json:"owner_endpoint"`
		State             PrimaryState `json:"state"`
		TTL               int64        `json:"lease_ttl_ms"`
		RenewInterval     int64        `json:"renew_interval_ms"`
		ExpiresAt         time.Time    `json:"expires_at"`
		CheckpointPointer *string      `json:"checkpoint_pointer"`
		SealedLSN         *uint64      `json:"sealed_lsn"`
		TakenBy           *string      `json:"taken_by"`
		TakenReason       *string      `json:"taken_reason"`
		TakenAt           *time.Time   `json:"taken_at"`
	}
	w := wire{Partition: r.Partition, Epoch: r.Epoch, OwnerNode: r.OwnerNode, OwnerEndpoint: r.OwnerEndpoint, State: r.State,
		TTL: r.TTL.Milliseconds(), RenewInterval: r.RenewInterval.Milliseconds(), ExpiresAt: r.ExpiresAt.UTC(),
		CheckpointPointer: nonEmpty(r.CheckpointPointer), SealedLSN: r.SealedLSN, TakenBy: nonEmpty(r.TakenBy), TakenReason: nonEmpty(r.TakenReason), TakenAt: r.TakenAt}
	return json.Marshal(w)
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// LeaseOpKind names the conditional writes that may touch a lease record
// (spec: "Three conditional writes, and no others" plus FORCE).
type LeaseOpKind uint8

// The lease writes.
const (
	Acquire LeaseOpKind = iota + 1 // claim at :new_epoch once expired, or taken back (R15; LeaseOp.TakeBack)
	Renew                          // extend expires_at under my epoch (R14)
	Fence                          // checkpoint pointer / state / sealed LSN under my epoch (R20, R22)
	Force                          // operator takeover: ACQUIRE without the expiry test (R26–R28)
)

func (k LeaseOpKind) String() string {
	switch k {
	case Acquire:
		return "ACQUIRE"
	case Renew:
		return "RENEW"
	case Fence:
		return "FENCE"
	case Force:
		return "FORCE"
	}
	return "UNKNOWN"
}

// LeaseOp is one conditional write with its parameters.
type LeaseOp struct {
	Kind      LeaseOpKind
	Partition string // required when no record exists yet; must match otherwise
	Node      string // :me
	Endpoint  string // ACQUIRE, FORCE: the claimant's endpoint
	// Epoch is :new_epoch for ACQUIRE and FORCE (the epoch read a moment
	// earlier plus one; see NextEpoch, ChildEpoch) and :my_epoch for RENEW
	// and FENCE.
	Epoch uint64
	// Now is the lease store's clock (Postgres now()), never the node's:
	// records use the database's time, durations the monotonic clock.
	Now time.Time
	// TTL and RenewInterval: ACQUIRE, FORCE and RENEW set
	// expires_at = Now + TTL (R14).
	TTL           time.Duration
	RenewInterval time.Duration
	// FENCE payload; at least one must be set.
	CheckpointPointer *string
	State             *PrimaryState
	SealedLSN         *uint64
	// FORCE: the human override's audit trail (R28).
	Operator string
	Reason   string
	// TakeBack (ACQUIRE only; issue 27): the claimant has just started
	// and claims a live record it owns — left by an earlier process with
	// the same node id — without waiting for its expiry, at :new_epoch
	// like any claim, which fences that earlier process (R15, R20). Not a
	// sealed or quarantined record (R74, R59). See TakesBack.
	TakeBack bool
}

// NextEpoch is :new_epoch for a claim after reading cur (nil: no record):
// the record's epoch plus one (R15).
func NextEpoch(cur *LeaseRecord) uint64 {
	if cur == nil {
		return 1
	}
	return cur.Epoch + 1
}

// ChildEpoch is the first epoch of a split or merge child: above every
// parent's, because an epoch must not reset across a split or merge (R16).
// (A.5 step 5's "epoch 1" is superseded by R16.)
func ChildEpoch(parentEpochs ...uint64) uint64 {
	var e uint64
	for _, p := range parentEpochs {
		e = max(e, p)
	}
	return e + 1
}

// LeaseVerdict is the outcome of a conditional write, in the spec's words.
type LeaseVerdict string

// Verdicts.
const (
	Accept           LeaseVerdict = "ACCEPT"
	RejectStaleEpoch LeaseVerdict = "REJECT_STALE_EPOCH" // the fence (R20)
	RejectLeaseHeld  LeaseVerdict = "REJECT_LEASE_HELD"  // ACQUIRE before expiry: LOST_RACE, re-read and retry
	RejectSealed     LeaseVerdict = "REJECT_SEALED"      // R74: no un-sealing under the same epoch
	RejectInvalid    LeaseVerdict = "REJECT_INVALID"     // malformed op: a bug in the caller
)

// VerdictOf classifies an error from ApplyLease.
func VerdictOf(err error) LeaseVerdict {
	switch {
	case err == nil:
		return Accept
	case errors.Is(err, ErrSealed):
		return RejectSealed
	case errors.Is(err, ErrLeaseHeld):
		return RejectLeaseHeld
	case blobplane.ErrorCode(err) == blobplane.CodeStaleEpoch:
		return RejectStaleEpoch
	}
	return RejectInvalid
}

// ApplyLease is the pure reference model of the lease store's conditional
// writes. cur is the current record (nil: attribute_not_exists). It
// returns the record after the write, or cur unchanged and an error:
//
//	ACQUIRE  cur absent, or (cur.epoch < new_epoch AND (cur.expires_at < now
//	         OR TakesBack(cur, op)))
//	         → epoch, owner, endpoint, state=RESTORING, expires_at=now+ttl
//	RENEW    cur.epoch = my_epoch AND cur.owner = me AND cur.state <> SEALED
//	         → expires_at=now+ttl
//	FENCE    cur.epoch = my_epoch AND cur.owner = me → pointer / state / sealed_lsn
//	FORCE    cur absent, or cur.epoch < new_epoch (no expiry test)
//	         → as ACQUIRE, plus taken_by/reason/at
//
// Errors: CodeStaleEpoch chaining to ErrStaleEpoch or ErrNotOwner for a
// failed fence (R20 — harmless, and the writer need not know more);
// CodeConflict chaining to ErrLeaseHeld when ACQUIRE finds a live lease
// (retryable); CodeInvalid for a malformed op. Epochs never decrease and
// ownership never changes without an epoch increase (R15, R16, R27).
func ApplyLease(cur *LeaseRecord, op LeaseOp) (LeaseRecord, error) {
	opName := "authority.ApplyLease " + op.Kind.String()
	if err := checkLeaseOp(cur, op, opName); err != nil {
		return zeroOr(cur), err
	}
	switch op.Kind {
	case Acquire, Force:
		return claim(cur, op, opName)
	case Renew, Fence:
		return holderWrite(cur, op, opName)
	}
	return zeroOr(cur), invalidf(opName, ErrMalformed, "unknown lease operation %d", op.Kind)
}

// TakesBack reports whether op, an ACQUIRE, may claim cur while it is live
// (issue 27): the claimant asks to take back (it has just started and
// holds nothing in this process), it owns the record — an earlier
// process with the same node id left it — and the record is held the
// ordinary way. A sealed record moves only to its successor (R74), a
// quarantined one is not placed (R59). The claim still needs a higher
// epoch, which fences that earlier process (R15, R20, R27).
func TakesBack(cur *LeaseRecord, op LeaseOp) bool {
	if cur == nil || op.Kind != Acquire || !op.TakeBack || cur.OwnerNode != op.Node {
		return false
	}
	switch cur.State {
	case PrimaryRestoring, PrimaryCatchingUp, PrimaryServing:
		return true
	}
	return false
}

// checkLeaseOp refuses a malformed op before any record is consulted.
func checkLeaseOp(cur *LeaseRecord, op LeaseOp, opName string) error {
	switch {
	case op.Node == "" || op.Epoch == 0 || op.Now.IsZero():
		return invalidf(opName, ErrMissingField, "node, epoch and now are required")
	case cur != nil && op.Partition != "" && op.Partition != cur.Partition:
		return invalidf(opName, ErrMalformed, "op for %q applied to record %q", op.Partition, cur.Partition)
	case op.TakeBack && op.Kind != Acquire:
		return invalidf(opName, ErrMalformed, "only ACQUIRE takes a lease back")
	}
	return nil
}

// claim is ACQUIRE and FORCE: a well-formed claim that the record allows
// writes the claimant in at op.Epoch.
func claim(cur *LeaseRecord, op LeaseOp, opName string) (LeaseRecord, error) {
	if err := checkClaimOp(cur, op, opName); err != nil {
		return zeroOr(cur), err
	}
	if err := claimable(cur, op, opName); err != nil {
		return *cur, err
	}
	return claimed(cur, op), nil
}

// checkClaimOp refuses a claim without a partition to create, without a
// lease timing (R14) or, for FORCE, without its audit trail (R28).
func checkClaimOp(cur *LeaseRecord, op LeaseOp, opName string) error {
	switch {
	case cur == nil && op.Partition == "":
		return invalidf(opName, ErrMissingField, "partition")
	case op.TTL <= 0 || op.RenewInterval <= 0 || op.RenewInterval >= op.TTL || op.Endpoint == "":
		return invalidf(opName, ErrLeaseTiming, "ttl %v renew %v endpoint %q", op.TTL, op.RenewInterval, op.Endpoint) // R14
	case op.Kind == Force && (op.Operator == "" || op.Reason == ""): // R28
		return invalidf(opName, ErrMissingField, "force-takeover needs an operator and a reason")
	}
	return nil
}

// claimable is the claim's condition on an existing record: a strictly
// higher epoch (R15, R20, R27), and for ACQUIRE an expired record or one
// it takes back (FORCE skips only the expiry test, R26).
func claimable(cur *LeaseRecord, op LeaseOp, opName string) error {
	switch {
	case cur == nil:
		return nil
	case cur.Epoch >= op.Epoch:
		return coded(blobplane.CodeStaleEpoch, opName, fmt.Errorf("record at epoch %d, claim at %d: %w", cur.Epoch, op.Epoch, ErrStaleEpoch))
	case op.Kind == Acquire && !cur.ExpiresAt.Before(op.Now) && !TakesBack(cur, op):
		return retryable(blobplane.CodeConflict, opName, fmt.Errorf("owner %s until %s: %w", cur.OwnerNode, cur.ExpiresAt.UTC().Format(time.RFC3339Nano), ErrLeaseHeld))
	}
	return nil
}

// claimed is the record after an accepted claim.
func claimed(cur *LeaseRecord, op LeaseOp) LeaseRecord {
	next := zeroOr(cur)
	if cur == nil {
		next.Partition = op.Partition
	}
	next.Epoch, next.OwnerNode, next.OwnerEndpoint = op.Epoch, op.Node, op.Endpoint
	next.State = PrimaryRestoring // R23: holding is not ready
	next.TTL, next.RenewInterval, next.ExpiresAt = op.TTL, op.RenewInterval, op.Now.Add(op.TTL)
	if op.Kind == Force { // R28
		at := op.Now
		next.TakenBy, next.TakenReason, next.TakenAt = op.Operator, op.Reason, &at
	}
	return next
}

// holderWrite is RENEW and FENCE: writes of the holder at its epoch (R20).
func holderWrite(cur *LeaseRecord, op LeaseOp, opName string) (LeaseRecord, error) {
	switch {
	case cur == nil:
		return LeaseRecord{}, coded(blobplane.CodeStaleEpoch, opName, fmt.Errorf("no lease record: %w", ErrNotOwner))
	case cur.Epoch != op.Epoch: // R20: the fence
		return *cur, coded(blobplane.CodeStaleEpoch, opName, fmt.Errorf("record at epoch %d, write at %d: %w", cur.Epoch, op.Epoch, ErrStaleEpoch))
	case cur.OwnerNode != op.Node:
		return *cur, coded(blobplane.CodeStaleEpoch, opName, fmt.Errorf("owner %s, writer %s: %w", cur.OwnerNode, op.Node, ErrNotOwner))
	case op.Kind == Renew && cur.State == PrimarySealed:
		// R74: after the seal the outgoing primary never serves again;
		// its renewal is refused like a stale one, and it fences itself.
		return *cur, coded(blobplane.CodeStaleEpoch, opName, fmt.Errorf("sealed at epoch %d: %w", cur.Epoch, ErrStaleEpoch))
	case op.Kind == Renew:
		return renew(cur, op, opName)
	}
	return fence(cur, *cur, op, opName)
}

// renew extends the holder's lease by op.TTL, or by the record's own TTL
// when op names none (R14).
func renew(cur *LeaseRecord, op LeaseOp, opName string) (LeaseRecord, error) {
	ttl := op.TTL
	if ttl == 0 {
		ttl = cur.TTL
	}
	if ttl <= 0 {
		return *cur, invalidf(opName, ErrLeaseTiming, "ttl %v", ttl)
	}
	next := *cur
	next.TTL, next.ExpiresAt = ttl, op.Now.Add(ttl)
	return next, nil
}

func fence(cur *LeaseRecord, next LeaseRecord, op LeaseOp, opName string) (LeaseRecord, error) {
	if op.CheckpointPointer == nil && op.State == nil && op.SealedLSN == nil {
		return *cur, invalidf(opName, ErrMissingField, "FENCE without a pointer, state or sealed LSN")
	}
	if op.CheckpointPointer != nil { // R22: the pointer moves only under the epoch
		next.CheckpointPointer = *op.CheckpointPointer
	}
	if op.State != nil {
		switch s := *op.State; {
		case !s.Known() || s == PrimaryUnassigned:
			return *cur, invalidf(opName, ErrUnknownState, "lease state %q", s)
		case cur.State == PrimarySealed && s != PrimarySealed:
			// R74, R76: after the seal the outgoing primary never serves
			// again; only a new epoch moves the partition forward.
			return *cur, coded(blobplane.CodeConflict, opName, fmt.Errorf("sealed at epoch %d, cannot become %s: %w", cur.Epoch, s, ErrSealed))
		}
		next.State = *op.State
	}
	if op.SealedLSN != nil {
		if cur.SealedLSN != nil && *cur.SealedLSN != *op.SealedLSN { // R74: one seal per epoch
			return *cur, coded(blobplane.CodeConflict, opName, fmt.Errorf("already sealed at LSN %d: %w", *cur.SealedLSN, ErrSealed))
		}
		lsn := *op.SealedLSN
		next.SealedLSN = &lsn
	}
	return next, nil
}

func zeroOr(cur *LeaseRecord) LeaseRecord {
	if cur == nil {
		return LeaseRecord{}
	}
	return *cur
}
