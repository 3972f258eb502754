package upload

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
)

// IntentState is the state of an upload intent.
type IntentState string

const (
	IntentPending   IntentState = "pending"   // accepting bytes or awaiting finalization
	IntentAdmitted  IntentState = "admitted"  // published (terminal)
	IntentAbandoned IntentState = "abandoned" // cancelled or reaped (terminal); never publishes
)

// SizeUnknown is Intent.ExpectedSize before the upload's size is known.
const SizeUnknown int64 = -1

// Intent is the durable record of one upload/admission attempt.
type Intent struct {
	OperationID       string
	Repository        string
	Principal         string
	ExpectedDigest    blobplane.Digest // "" until known
	ExpectedSize      int64            // SizeUnknown until known
	IngressDatacenter string
	Backend           string
	StagedLocation    string // "" until staging starts
	State             IntentState
	ReceivedBytes     int64
	CreatedAt         time.Time
	UpdatedAt         time.Time
	ExpiresAt         time.Time
	// Possession is how the intent proved it holds its content (S9):
	// PossessionUploaded, PossessionMounted, or "" (nothing proven: it
	// cannot publish, whatever verified placements of its digest exist).
	Possession  string
	MountedFrom string // the mount's source repository (PossessionMounted)
	// AcceptedAt, when not zero, is when the client was answered 202 for
	// this upload (AcceptIntent): the reaper never abandons it (issue 27).
	AcceptedAt time.Time
}

// Possession of an intent (Intent.Possession, issue 26): a claim, a size
// or a digest proves nothing; only the intent's own bytes hashed to its
// digest, or a mount from a repository its principal can read.
const (
	PossessionUploaded = "uploaded"
	PossessionMounted  = "mounted"
)

// NewIntent is what CreateIntent records.
type NewIntent struct {
	Repository        string
	Principal         string
	ExpectedDigest    blobplane.Digest // "" when not known yet (chunked uploads)
	ExpectedSize      int64            // SizeUnknown when not known yet
	IngressDatacenter string
	Backend           string
	StagedLocation    string        // usually "": staging starts after the intent commits
	TTL               time.Duration // expires_at = database now() + TTL
}

// Refusals of Finalize. Each comes back wrapped in a *blobplane.Error
// whose code says how to answer the client; test with errors.Is.
var (
	// ErrAuthorityUnassigned: no lease record for the partition (code
	// unavailable, retryable: a home will be assigned).
	ErrAuthorityUnassigned = errors.New("the repository's partition has no authority")
	// ErrAuthorityFence: the caller does not hold the partition at the
	// epoch it presented, e.g. a former home after a transfer (stale_epoch).
	ErrAuthorityFence = errors.New("the caller does not hold the repository's partition at the presented epoch")
	// ErrContentIdentity: the digest or size differs from the intent's
	// (digest_mismatch).
	ErrContentIdentity = errors.New("the digest or size differs from the admission record")
	// ErrNoVerifiedPlacement: no verified placement can supply the content
	// (unavailable, retryable: a placement may verify later).
	ErrNoVerifiedPlacement = errors.New("no verified placement of the content exists")
	// ErrWriteRevoked: the intent's principal no longer has write access to
	// the repository (forbidden; restoring the grant lets a retry succeed).
	ErrWriteRevoked = errors.New("the principal no longer has write access to the repository")
	// ErrNotProven: the intent never proved it holds its content: its own
	// bytes were not streamed and hashed to the digest, and it is no
	// mount (invalid: the client must send the blob). Another upload's
	// verified placement of the same digest proves nothing for this one
	// (S9, issue 26).
	ErrNotProven = errors.New("the upload never proved it holds the content")
	// ErrMountSource: a mount's source no longer references the digest,
	// or its principal can no longer read the source (forbidden).
	ErrMountSource = errors.New("the mount's source does not grant the content")
	// ErrIntentClosed: the intent is abandoned (conflict); an abandoned
	// intent never publishes (S5).
	ErrIntentClosed = errors.New("the upload is no longer pending")
	// ErrOverQuota: the publication would take its repository or its
	// tenant past a quota (forbidden, OCI DENIED; docs/quotas.md).
	ErrOverQuota = errors.New("over quota")
	// ErrObliterated: the digest was obliterated by an operator
	// (conflict; docs/obliteration.md): no upload, mount or publication
	// of it succeeds until the mark is lifted. Also the refusal of the
	// flow's Open, Close and Mount.
	ErrObliterated = errors.New("the digest is obliterated")
	// ErrNoEnqueuer: replication targets exist but the caller passed no
	// ReplicationEnqueuer (internal: a wiring bug).
	ErrNoEnqueuer = errors.New("replication targets exist but no replication enqueuer is configured")
)

// Stage is what a close's claim staged at its key: the placement's
// generation after the stage, which only this close's verification or
// failure may follow (FailStagedPlacement: a close's mismatch fails its
// own stage, never a row another upload re-staged or verified since,
// issue 26), or AlreadyVerified: the key was verified already and the
// close stages nothing (it still writes the bytes to prove them, S9).
type Stage struct {
	Generation int64
	// Epoch is the placement epoch the stage holds: the close verifies
	// under it (0 for a new row; a failed or revoked row's own epoch when
	// taken over).
	Epoch           int64
	AlreadyVerified bool
}

// OpenUsage is what one principal holds open: pending, unexpired upload
// sessions and the bytes its chunked ones staged.
type OpenUsage struct {
	Sessions    int64
	StagedBytes int64
}

// ReplicationEnqueuer inserts replication work inside the publishing
// transaction, so that metadata never commits without its replication
// record. jobs.Replication implements it with River's InsertManyTx.
type ReplicationEnqueuer interface {
	// EnqueueReplicationTx inserts one job per target datacenter in tx.
	// An error rolls the publication back.
	EnqueueReplicationTx(ctx context.Context, tx pgx.Tx, r Replication) error
}

// Replication is the work one publication hands to replication.
type Replication struct {
	OperationID      string
	Digest           blobplane.Digest
	Size             int64
	SourceDatacenter string // the ingress datacenter, which holds a verified placement
	Targets          []string
}

// FinalizeRequest asks to publish the intent OperationID.
type FinalizeRequest struct {
	OperationID string
	// Digest and Size are the content being published; they must equal the
	// intent's recorded digest and size.
	Digest blobplane.Digest
	Size   int64
	// The authority fence: the caller holds Partition (the one owning the
	// repository's slot) as Node at Epoch.
	Partition string
	Node      string
	Epoch     uint64
	// Targets is the fallback replication targets: the replication policy
	// of the repository's longest matching prefix wins (migration 00019,
	// docs/replication.md); without one, Targets, and nil means every
	// registered datacenter other than the ingress.
	Targets []string
	// Verify, when set, is the verification of the placement that holds
	// the content, recorded by Finalize (see there) instead of by a
	// VerifyPlacement before it.
	Verify *Verification
	// Replication enqueues the jobs; required only when there are targets.
	Replication ReplicationEnqueuer
	// BeforeCommit, when set, is what must hold before anything Finalize
	// records can commit: the durability of the bytes Verify confirms (a
	// filesystem write's file and directory syncs,
	// backend.WriteRequest.DeferSync), which then overlaps the
	// transaction's first round trip. Finalize calls it once, before its
	// COMMIT or before the verification it records alone after a refusal;
	// its error aborts both and is returned.
	BeforeCommit func() error
	// Proven: the caller itself streamed this intent's bytes and hashed
	// them to Digest and Size (an upload's close; S9). Finalize then
	// records the intent's possession, in its transaction or, after a
	// refusal, alone (so a retried close or the finalize job can publish
	// later). Without it Finalize requires possession already recorded
	// (RecordPossession) or a mount. Only a caller that hashed the bytes
	// may set it: never from a claim, a request field or another node.
	Proven bool
}

// Outcome is the stored acknowledgement of a publication.
type Outcome struct {
	OperationID        string           `json:"operation_id"`
	Repository         string           `json:"repository"`
	Digest             blobplane.Digest `json:"digest"`
	Size               int64            `json:"size"`
	Partition          string           `json:"partition"`
	Epoch              uint64           `json:"epoch"`
	NewReference       bool             `json:"new_reference"`
	ReplicationTargets []string         `json:"replication_targets"`
	PublishedAt        time.Time        `json:"published_at"`
	// Position is the partition position the publication was applied at
	// (ZBP-5-R107) when this answer published it; not stored.
	Position string `json:"position,omitempty"`
}

// Verification is a backend's confirmation of a placement that Finalize
// records (FinalizeRequest.Verify), exactly as VerifyPlacement would.
type Verification struct {
	Key    placement.Key
	Digest blobplane.Digest // the digest the backend computed over the stored bytes
	Size   int64            // the size it confirmed
	Epoch  int64
	// Hashed: the caller's own write just hashed these bytes at Key (an
	// upload's close), so another claimant's pending size or mismatch on
	// the row does not fail it (verifyTx, issue 26).
	Hashed bool
}
