package upload

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
)

// The flow's ports: what it needs of the ledger (Store, Chain), of the
// lease keeper (HomeResolver) and of the other nodes (Forwarder,
// Enqueuer), declared here, where they are used. store.Store,
// handlers.KeeperHome and jobs' HomeFinalizer and FinalizeQueue implement
// them.

// Store is the Postgres side of an upload. store.Store implements it.
type Store interface {
	// DeleteReferenceAtHome removes repository's reference to d, fenced
	// by home's lease (ZBP-5 R19). Errors: stale_epoch when the lease
	// moved, not_found when there is no reference.
	DeleteReferenceAtHome(ctx context.Context, home Home, repository string, d blobplane.Digest) error
	// EnsureRepository creates repository for principal unless it exists
	// (a push creates its repository; the caller checked the principal
	// may write it) and says whether it did.
	EnsureRepository(ctx context.Context, repository, principal string) (created bool, err error)
	// CreateIntent records a pending intent. Errors: invalid, not_found
	// (no such repository).
	CreateIntent(ctx context.Context, n NewIntent) (Intent, error)
	// GetIntent errors: not_found.
	GetIntent(ctx context.Context, op string) (Intent, error)
	// ExtendIntent records progress per chunk. Errors: not_found, conflict
	// (ErrIntentClosed).
	ExtendIntent(ctx context.Context, op, stagedLocation string, received int64, ttl time.Duration) (Intent, error)
	// ClaimAndStage records the claimed digest and size on the intent and
	// stages the placement of k in one transaction, before any byte is
	// written at k. Errors: not_found, conflict, digest_mismatch,
	// stale_epoch. The Stage names the generation the close may fail
	// (FailStagedPlacement) and whether k was verified already.
	ClaimAndStage(ctx context.Context, op string, k placement.Key, size int64) (Stage, error)
	// ClaimSessionAndStage is ClaimAndStage of a pending session of
	// repository on k's backend that staged nothing, read and claimed in
	// one round trip; claimed false: nothing recorded, the session is
	// something else. Errors: those of ClaimAndStage's stage.
	ClaimSessionAndStage(ctx context.Context, op, repository string, k placement.Key, size int64) (in Intent, claimed bool, st Stage, err error)
	// OpenAndStage creates an intent declaring k's content (its claim)
	// and stages k, in one transaction: a single-request upload's first
	// step; staged false leaves the stage to ClaimAndStage. Errors: those
	// of CreateIntent.
	OpenAndStage(ctx context.Context, n NewIntent, k placement.Key) (in Intent, staged bool, err error)
	// ChainOpenAndStage and ChainClaimSessionAndStage send
	// OpenAndStage's (ClaimSessionAndStage's) statements and Finalize's
	// at once on one connection (ADR 0008); nil: not chained, the caller
	// runs them one after the other.
	ChainOpenAndStage(ctx context.Context, n NewIntent, k placement.Key, req FinalizeRequest) Chain
	ChainClaimSessionAndStage(ctx context.Context, op, repository string, k placement.Key, size int64, req FinalizeRequest) Chain
	// CreateMountIntent records a mount's intent, its possession the
	// mount from from (re-checked by Finalize at the home). Errors: those
	// of CreateIntent.
	CreateMountIntent(ctx context.Context, n NewIntent, from string) (Intent, error)
	// RecordPossession records that this close hashed op's bytes to d
	// (S9), with v's verification when set, so the home (forwarded or by
	// the finalize job) may publish it. Errors: not_found, conflict,
	// digest_mismatch (v's).
	RecordPossession(ctx context.Context, op string, d blobplane.Digest, size int64, v *Verification) error
	// AcceptIntent takes a proven pending intent out of the reaper's
	// reach before its 202, enqueue (when set) running in the same
	// transaction. Errors: not_found, conflict.
	AcceptIntent(ctx context.Context, op string, enqueue func(ctx context.Context, tx pgx.Tx) error) error
	// AbandonIntent cancels a pending intent. Errors: not_found, conflict.
	AbandonIntent(ctx context.Context, op string) (Intent, error)
	// Finalize publishes; see store.Store.Finalize for its refusals.
	Finalize(ctx context.Context, req FinalizeRequest) (Outcome, error)
	// Outcome errors: not_found.
	Outcome(ctx context.Context, op string) (Outcome, error)
	// OpenUsages is what the principals near a bound hold open (Bounds'
	// snapshot).
	OpenUsages(ctx context.Context, minSessions, minStaged int64) (map[string]OpenUsage, error)
	// ReferencedBlob answers existence from Postgres (or the store's
	// existence cache), never from a backend. Errors: not_found.
	ReferencedBlob(ctx context.Context, repository string, d blobplane.Digest) (int64, error)
	// Obliterated reports whether d is obliterated now. The claims
	// (CreateIntent, OpenAndStage, ClaimAndStage, ClaimSessionAndStage,
	// CreateMountIntent) refuse an obliterated digest in their own
	// statements, as a claim that recorded nothing; the flow asks this
	// only then, to say why (ErrObliterated). Errors: unavailable.
	Obliterated(ctx context.Context, d blobplane.Digest) (bool, error)
	// FailStagedPlacement fails only the stage a close made (its
	// generation, still pending): a close's mismatch never touches a row
	// another upload re-staged or verified (issue 26).
	FailStagedPlacement(ctx context.Context, k placement.Key, generation int64, reason placement.Reason) (bool, error)
}

// Chain is a chained close in flight (store.ChainedClose, ADR 0008): the
// claim's statements and the publication's, sent at once. Its methods are
// called in turn, never concurrently.
type Chain interface {
	// Claim answers as Store.OpenAndStage would; ClaimSession as
	// Store.ClaimSessionAndStage would. Unless the claim staged its key,
	// the chain is over (released).
	Claim() (in Intent, staged bool, err error)
	ClaimSession() (in Intent, claimed bool, st Stage, err error)
	// Finalize answers as Store.Finalize would.
	Finalize(ctx context.Context, req FinalizeRequest) (Outcome, error)
	// Release gives the connection back and rolls back what did not
	// commit; it may be called more than once.
	Release()
}

// Home is this node's authority over a repository, when it has it.
type Home struct {
	Partition string
	Node      string
	Epoch     uint64
	// Ctx ends when the lease is lost; publication runs under it.
	Ctx context.Context
}

// HomeResolver says whether this node is the repository's home right now.
type HomeResolver interface {
	// Home returns this node's lease over repo's partition, or ok false
	// when another node (or nobody) is the home.
	Home(repo string) (Home, bool)
}

// Quotas admits publications against repository quotas at the home
// (partstate.Homes, issue 33).
type Quotas interface {
	// Admit reserves room for one blob d of size bytes in repo, to be
	// published under home; done(published) ends the reservation once
	// the publication committed (published) or failed. Errors: forbidden
	// naming the quota; unavailable while the home's state restores.
	Admit(ctx context.Context, home Home, repo string, d blobplane.Digest, size int64) (done func(published bool), err error)
	// Check is Admit without the reservation: an upload of declared size
	// refused before its bytes are read. Errors: as Admit's.
	Check(ctx context.Context, home Home, repo string, d blobplane.Digest, size int64) error
	// Position is the token of home's partition position once everything
	// committed there before the call is applied (ZBP-5-R107: a mutating
	// response carries it), "" when the partition holds no state.
	// Errors: unavailable (restoring, or the lease moved), ctx's.
	Position(ctx context.Context, home Home) (string, error)
}

// Forwarder hands the finalization of a closed upload to its
// repository's home (jobs.HomeFinalizer: the routing client and the
// internal endpoint).
type Forwarder interface {
	// ForwardFinalize returns the outcome the home stored, or a
	// *blobplane.Error: the home's refusal with its code, or unavailable
	// when the home could not be reached.
	ForwardFinalize(ctx context.Context, repo, op string) (Outcome, error)
	// ForwardDeleteReference asks the home to remove repo's reference to
	// d, and returns the position the home applied it at ("" when it did
	// not say); errors as ForwardFinalize's (not_found: no reference).
	ForwardDeleteReference(ctx context.Context, repo string, d blobplane.Digest) (string, error)
}

// Enqueuer durably schedules a finalization for later (jobs.FinalizeQueue:
// a River job unique by operation id).
type Enqueuer interface {
	// EnqueueFinalizeTx inserts the job in tx, the transaction that
	// accepts the upload (Store.AcceptIntent, issue 27): an upload
	// answered 202 always has its job.
	EnqueueFinalizeTx(ctx context.Context, tx pgx.Tx, repo, op string) error
}
