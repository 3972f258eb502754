package authority

import "time"

// HandoffKind says how a partition moves (docs/authority.md "Moves").
type HandoffKind string

const (
	// KindHandoff is the live path (A.4): the outgoing primary seals under
	// its epoch, the target claims the sealed lease at epoch + 1.
	KindHandoff HandoffKind = "handoff"
	// KindRecover is the cold path (A.3): the primary's lease expired (its
	// node died or stopped renewing); the target claims the expired lease.
	KindRecover HandoffKind = "recover"
	// KindSplit and KindMerge seal the parent(s) of a group and the target
	// claims the children's leases (A.5, A.6): Handoff.Children.
	KindSplit HandoffKind = "split"
	KindMerge HandoffKind = "merge"
)

// Grouped reports whether k is a split or a merge.
func (k HandoffKind) Grouped() bool { return k == KindSplit || k == KindMerge }

// Child is a partition a split or merge creates (R89–R91).
type Child struct {
	ID         string      `json:"id"`
	Generation uint64      `json:"generation"`
	Epoch      uint64      `json:"epoch"` // its first epoch: above every parent's (R16)
	Slots      []SlotRange `json:"slots"`
	Parents    []ParentRef `json:"parents"`
	Ready      bool        `json:"ready"`
}

// HandoffState is where a move stands. preparing → synced → sealed →
// ready → published for a handoff; preparing → ready → published for a
// recovery; aborted from preparing or synced only (R75, R76).
type HandoffState string

const (
	HandoffPreparing HandoffState = "preparing"
	HandoffSynced    HandoffState = "synced"
	HandoffSealed    HandoffState = "sealed"
	HandoffReady     HandoffState = "ready"
	HandoffPublished HandoffState = "published"
	HandoffAborted   HandoffState = "aborted"
)

// Handoff is one move of a partition from its primary to a target node,
// as the handoffs table records it.
type Handoff struct {
	ID         int64
	PlanID     int64 // 0: none
	Partition  string
	Kind       HandoffKind
	From       string
	FromEpoch  uint64
	To         string
	ToEndpoint string
	State      HandoffState
	Reason     string
	Deadline   time.Time
	CreatedAt  time.Time
	// UnavailableSince is when the partition stopped being served: the
	// seal, or for a recovery the expired lease's last renewal (an upper
	// bound: its holder may have written until it died). Zero until known.
	UnavailableSince time.Time
	SealedAt         time.Time
	ToEpoch          uint64
	ReadyAt          time.Time
	MapVersion       uint64
	FinishedAt       time.Time
	AbortReason      string
	// GroupID and Children: a split or merge's group (its parents are
	// the group's handoffs) and the partitions that replace them.
	GroupID  int64
	Children []Child
}

// Active reports whether the move is in flight.
func (h Handoff) Active() bool {
	switch h.State {
	case HandoffPreparing, HandoffSynced, HandoffSealed, HandoffReady:
		return true
	}
	return false
}

// PastSeal reports whether the move passed its point of no return (R74):
// it can only go forward (R76).
func (h Handoff) PastSeal() bool {
	return h.State == HandoffSealed || h.State == HandoffReady || h.State == HandoffPublished
}

// Unavailable is the partition's outage for a published move: from
// UnavailableSince to the publication of the map naming the target (the
// moment clients can learn where it is, R79; R135).
func (h Handoff) Unavailable() time.Duration {
	if h.State != HandoffPublished || h.UnavailableSince.IsZero() {
		return 0
	}
	return h.FinishedAt.Sub(h.UnavailableSince)
}
