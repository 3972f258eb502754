package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/db"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The placement ledger (../shared/spec/blob-placement.md).
//
// It is an optional persistence domain: Open and Migrate do not create it.
// The first placement write runs db.PlacementsSchema under a
// transaction-scoped advisory lock (concurrent first writers serialize and
// the loser finds the table present); the Store then remembers it in an
// atomic so the hot path never re-runs DDL. Reads before that find no table
// and answer "no placements" rather than an error.
//
// Every transition is one short transaction: lock the row (FOR UPDATE),
// decide the next state with the pure placement.Transition table, and write
// with the epoch fence and the generation read in the WHERE clause. The
// affected-row count decides the outcome: no row means a higher epoch holds
// the placement, reported as CodeStaleEpoch with nothing changed (DESIGN S3).

// placementsDDLLock is the advisory lock key (transaction-scoped) under
// which the ledger is created: "bp-place".
const placementsDDLLock int64 = 0x62702d706c616365

// placementDigestLockClass is the first key of the two-key advisory lock that
// serializes stages of one digest, so that the count-then-insert of the
// 64-placement bound is race-free: "plac".
const placementDigestLockClass int32 = 0x706c6163

// ErrPlacementLimit is returned (wrapped) by StagePlacement when the digest
// already holds placement.MaxPerDigest placements. Its code is conflict.
var ErrPlacementLimit = &blobplane.Error{
	Code:    blobplane.CodeConflict,
	Message: fmt.Sprintf("the digest already has %d placements, the most the ledger keeps per digest; re-stage or revoke an existing location instead", placement.MaxPerDigest),
}

// ensurePlacements creates the ledger on the first write of this Store.
func (s *Store) ensurePlacements(ctx context.Context) error {
	if s.placementsReady.Load() {
		return nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, placementsDDLLock); err != nil {
			return err
		}
		var present bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('placements') IS NOT NULL AND to_regclass('placement_summary') IS NOT NULL`).Scan(&present); err != nil {
			return err
		}
		if present {
			return nil
		}
		// No arguments: pgx sends the file with the simple protocol, which
		// runs all of its statements in this transaction.
		_, err := tx.Exec(ctx, db.PlacementsSchema)
		return err
	})
	if err != nil {
		return dbErr("create placement ledger", err)
	}
	s.placementsReady.Store(true)
	return nil
}

// StagePlacement records that a transfer into k has started: a new pending
// row, or a re-stage (retry) of a failed or revoked one, expecting size bytes,
// under epoch. Errors (blobplane codes): invalid for a malformed key, size or
// epoch; conflict when the row is verified, or wrapping ErrPlacementLimit
// when a new row would exceed placement.MaxPerDigest; stale_epoch when the
// row is held under a higher epoch.
func (s *Store) StagePlacement(ctx context.Context, k placement.Key, size, epoch int64) (placement.Placement, error) {
	const op = "stage placement"
	if err := checkTransition(k, epoch); err != nil {
		return placement.Placement{}, err
	}
	if size < 0 {
		return placement.Placement{}, blobplane.Errorf(blobplane.CodeInvalid, "size %d: must be >= 0", size)
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return placement.Placement{}, err
	}
	var out placement.Placement
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = s.stageTx(ctx, tx, k, size, epoch)
		return err
	})
	if err != nil {
		return placement.Placement{}, placementErr(op, err)
	}
	return out, nil
}

// stageTx is StagePlacement's transaction body, in tx. A refused
// transition (a verified row: conflict) changes nothing and leaves tx
// usable.
func (s *Store) stageTx(ctx context.Context, tx pgx.Tx, k placement.Key, size, epoch int64) (placement.Placement, error) {
	// Spec: "A stage that would exceed the bound is refused". Stages of
	// one digest take turns so that counting and inserting is atomic.
	if err := s.q.LockPlacementDigest(ctx, tx, dbsqlc.LockPlacementDigestParams{LockClass: placementDigestLockClass, Digest: string(k.Digest)}); err != nil {
		return placement.Placement{}, err
	}
	return s.stageLockedTx(ctx, tx, k, size, epoch)
}

// stageLockedTx is stageTx under the digest's stage lock, which the
// caller took in an earlier statement of tx: the common stage (a key with
// no row yet) is one insert; a re-stage locks the row and transitions it.
func (s *Store) stageLockedTx(ctx context.Context, tx pgx.Tx, k placement.Key, size, epoch int64) (placement.Placement, error) {
	row, err := s.q.InsertPlacementIfAbsent(ctx, tx, insertPlacementArgs(k, size, epoch, pgtype.UUID{}))
	if !errors.Is(err, pgx.ErrNoRows) {
		return placementFromRow(row), err
	}
	return s.restageLockedTx(ctx, tx, k, size, epoch)
}

// insertPlacementArgs are InsertPlacementIfAbsent's arguments; a valid
// claimedBy makes the insert conditional on that intent's claim.
func insertPlacementArgs(k placement.Key, size, epoch int64, claimedBy pgtype.UUID) dbsqlc.InsertPlacementIfAbsentParams {
	return dbsqlc.InsertPlacementIfAbsentParams{
		Digest: string(k.Digest), Backend: k.Backend, Datacenter: k.Datacenter, Location: k.Location,
		SizeBytes: size, Epoch: epoch, MaxPerDigest: placement.MaxPerDigest, ClaimedBy: claimedBy,
	}
}

// restageLockedTx is the rest of stageLockedTx when InsertPlacementIfAbsent
// inserted nothing: k has a row, which it locks and transitions, or the
// digest is at its bound (ErrPlacementLimit).
func (s *Store) restageLockedTx(ctx context.Context, tx pgx.Tx, k placement.Key, size, epoch int64) (placement.Placement, error) {
	cur, err := s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k)))
	if errors.Is(err, pgx.ErrNoRows) { // no row, and none inserted: the digest is at the bound
		return placement.Placement{}, fmt.Errorf("stage placement %s: %w", keyString(k), ErrPlacementLimit)
	}
	if err != nil {
		return placement.Placement{}, err
	}
	if placement.State(cur.State) == placement.Pending {
		// A re-stage of a pending row keeps the size its stage recorded
		// (issue 26): another claimant must not change what the first
		// one's verification expects. Its own close still verifies by
		// its hashed bytes (verifyTx).
		size = cur.SizeBytes
	}
	return s.advance(ctx, tx, "stage placement", cur, placement.Stage, epoch, update{size: size})
}

// VerifyPlacement records the backend's confirmation of k: the digest and
// size it computed over the stored bytes. The placement becomes verified
// only when both equal the key's digest and the size recorded at stage;
// otherwise it becomes failed with digest_mismatch (DESIGN S2: a mismatch can
// never become verified) and VerifyPlacement returns that recorded row
// together with a digest_mismatch error. Other errors: invalid, not_found
// (nothing staged), conflict (the row is failed or revoked: re-stage first),
// stale_epoch.
func (s *Store) VerifyPlacement(ctx context.Context, k placement.Key, confirmed blobplane.Digest, confirmedSize, epoch int64) (placement.Placement, error) {
	const op = "verify placement"
	if err := checkTransition(k, epoch); err != nil {
		return placement.Placement{}, err
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return placement.Placement{}, err
	}
	var out placement.Placement
	var mismatch error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = s.verifyTx(ctx, tx, k, confirmed, confirmedSize, epoch, false)
		if err != nil && blobplane.ErrorCode(err) == blobplane.CodeMismatch && out.State == placement.Failed {
			mismatch, err = err, nil // recorded: commit the failed row, then report it
		}
		return err
	})
	if err != nil {
		return placement.Placement{}, placementErr(op, err)
	}
	return out, mismatch
}

// verifyTx is VerifyPlacement's transaction body, in tx. A mismatch comes
// back as the recorded failed row with a digest_mismatch error: the
// transaction holds the failure, and committing it records it.
//
// hashed: the caller's own write hashed confirmedSize bytes to
// confirmed at k just now (an upload's close, Verification.Hashed); a row
// that another claimant's stage holds with another size, or that another
// close failed with digest_mismatch, is then re-staged with this size and
// verified (reverifyForeignStage).
func (s *Store) verifyTx(ctx context.Context, tx pgx.Tx, k placement.Key, confirmed blobplane.Digest, confirmedSize, epoch int64, hashed bool) (placement.Placement, error) {
	const op = "verify placement"
	if err := checkTransition(k, epoch); err != nil {
		return placement.Placement{}, err
	}
	if confirmed == k.Digest {
		// The common case, pending -> verified, in one statement.
		row, err := s.q.VerifyPendingPlacement(ctx, tx, dbsqlc.VerifyPendingPlacementParams{
			Digest: string(k.Digest), Backend: k.Backend, Datacenter: k.Datacenter, Location: k.Location,
			SizeBytes: confirmedSize, Epoch: epoch,
		})
		if err == nil {
			return placementFromRow(row), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return placement.Placement{}, err
		}
	}
	if hashed && confirmed == k.Digest && confirmedSize >= 0 {
		if p, done, err := s.reverifyForeignStage(ctx, tx, k, confirmedSize, epoch); done || err != nil {
			return p, err
		}
	}
	var ev placement.Event
	out, err := s.transitionTx(ctx, tx, op, k, func(cur dbsqlc.Placement) (placement.Event, update) {
		ev = placement.ClassifyVerify(k.Digest, cur.SizeBytes, confirmed, confirmedSize)
		return ev, update{size: cur.SizeBytes, reason: placement.DigestMismatch}
	}, epoch)
	if err != nil {
		return placement.Placement{}, err
	}
	if ev == placement.VerifyMismatch {
		return out, &blobplane.Error{Code: blobplane.CodeMismatch, Op: op, Message: fmt.Sprintf(
			"placement %s: backend confirmed %s with %d bytes, want %s with %d bytes; recorded as failed/digest_mismatch",
			keyString(k), confirmed, confirmedSize, k.Digest, out.Size)}
	}
	return out, nil
}

// FailPlacement records a classified failure of k. On a verified placement
// this is what a detected loss does (reason source_unavailable): the row
// stops serving, and only this row: every other location is its own row.
// Errors: invalid, not_found, conflict (revoked), stale_epoch.
func (s *Store) FailPlacement(ctx context.Context, k placement.Key, reason placement.Reason, epoch int64) (placement.Placement, error) {
	const op = "fail placement"
	if err := checkTransition(k, epoch); err != nil {
		return placement.Placement{}, err
	}
	if !reason.Valid() {
		return placement.Placement{}, blobplane.Errorf(blobplane.CodeInvalid, "failure reason %q: must be one of %v", reason, placement.Reasons)
	}
	return s.transition(ctx, op, k, func(cur dbsqlc.Placement) (placement.Event, update) {
		return placement.Fail, update{size: cur.SizeBytes, reason: reason}
	}, epoch)
}

// reverifyForeignStage is verifyTx's answer, for a close whose own
// bytes hashed to k's digest with size bytes and now are k's object (a
// verified write replaces the object at its key; a mismatched one leaves
// nothing there, S2), when another claimant holds k's row: pending with
// another size (a re-stage keeps the size its first stage recorded), or
// failed with digest_mismatch by another close that re-staged it. The row
// is re-staged with this close's size and verified against that stage,
// in tx: a tenant's wrong claim or garbage never costs another's correct
// upload (issue 26). done is false when the row is anything else.
func (s *Store) reverifyForeignStage(ctx context.Context, tx pgx.Tx, k placement.Key, size, epoch int64) (p placement.Placement, done bool, err error) {
	const op = "verify placement"
	cur, err := s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k)))
	foreignPending := placement.State(cur.State) == placement.Pending && cur.SizeBytes != size
	mismatched := placement.State(cur.State) == placement.Failed && placement.Reason(cur.Reason.String) == placement.DigestMismatch
	if err != nil || !(foreignPending || mismatched) {
		return placement.Placement{}, false, nil // the general path explains it
	}
	if _, err := s.advance(ctx, tx, op, cur, placement.Stage, epoch, update{size: size}); err != nil {
		return placement.Placement{}, true, err
	}
	if cur, err = s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k))); err != nil {
		return placement.Placement{}, true, err
	}
	p, err = s.advance(ctx, tx, op, cur, placement.VerifyMatch, epoch, update{size: size})
	return p, true, err
}

// FailStagedPlacement records that a close's bytes for its stage of k
// (generation, from store.Stage) did not hash to k's digest: that stage,
// still pending, becomes failed with reason. A row another upload
// re-staged or verified since is left alone (issue 26: a tenant's failed
// upload never changes another's placement); changed reports whether the
// row was failed. Errors: invalid.
func (s *Store) FailStagedPlacement(ctx context.Context, k placement.Key, generation int64, reason placement.Reason) (changed bool, err error) {
	const op = "fail staged placement"
	if err := checkTransition(k, 0); err != nil {
		return false, err
	}
	if !reason.Valid() {
		return false, blobplane.Errorf(blobplane.CodeInvalid, "failure reason %q: must be one of %v", reason, placement.Reasons)
	}
	_, err = s.q.FailStagedPlacement(ctx, s.pool, dbsqlc.FailStagedPlacementParams{
		Digest: string(k.Digest), Backend: k.Backend, Datacenter: k.Datacenter, Location: k.Location,
		Generation: generation, Reason: string(reason),
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows), isUndefinedTable(err):
		return false, nil
	case err != nil:
		return false, dbErr(op, err)
	}
	return true, nil
}

// RevokePlacement withdraws k from serving. Errors: invalid, not_found,
// stale_epoch.
func (s *Store) RevokePlacement(ctx context.Context, k placement.Key, reason placement.RevokeReason, epoch int64) (placement.Placement, error) {
	const op = "revoke placement"
	if err := checkTransition(k, epoch); err != nil {
		return placement.Placement{}, err
	}
	if !reason.Valid() {
		return placement.Placement{}, blobplane.Errorf(blobplane.CodeInvalid, "revoke reason %q: must be one of %v", reason, placement.RevokeReasons)
	}
	return s.transition(ctx, op, k, func(cur dbsqlc.Placement) (placement.Event, update) {
		return placement.Revoke, update{size: cur.SizeBytes, revokeReason: reason}
	}, epoch)
}

// update carries the columns a transition may set besides state and epoch.
type update struct {
	size         int64
	reason       placement.Reason       // used when the next state is failed
	revokeReason placement.RevokeReason // used when the next state is revoked
}

// transition runs one non-stage transition in a short transaction.
func (s *Store) transition(ctx context.Context, op string, k placement.Key, decide func(cur dbsqlc.Placement) (placement.Event, update), epoch int64) (placement.Placement, error) {
	if err := s.ensurePlacements(ctx); err != nil {
		return placement.Placement{}, err
	}
	var out placement.Placement
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = s.transitionTx(ctx, tx, op, k, decide, epoch)
		return err
	})
	if err != nil {
		return placement.Placement{}, placementErr(op, err)
	}
	return out, nil
}

// transitionTx is transition's body, in tx: lock k's row, decide, advance.
func (s *Store) transitionTx(ctx context.Context, tx pgx.Tx, op string, k placement.Key, decide func(cur dbsqlc.Placement) (placement.Event, update), epoch int64) (placement.Placement, error) {
	cur, err := s.q.GetPlacementForUpdate(ctx, tx, dbsqlc.GetPlacementForUpdateParams(keyArgs(k)))
	if errors.Is(err, pgx.ErrNoRows) {
		return placement.Placement{}, blobplane.Errorf(blobplane.CodeNotFound, "placement %s: not staged", keyString(k))
	}
	if err != nil {
		return placement.Placement{}, err
	}
	ev, u := decide(cur)
	return s.advance(ctx, tx, op, cur, ev, epoch, u)
}

// advance applies ev to the locked row cur under epoch.
func (s *Store) advance(ctx context.Context, tx pgx.Tx, op string, cur dbsqlc.Placement, ev placement.Event, epoch int64, u update) (placement.Placement, error) {
	k := placement.Key{Digest: blobplane.Digest(cur.Digest), Backend: cur.Backend, Datacenter: cur.Datacenter, Location: cur.Location}
	next, err := placement.Transition(placement.State(cur.State), ev)
	if err != nil {
		if cur.Epoch > epoch {
			// A stale worker learns that it lost ownership, whatever it asked.
			return placement.Placement{}, staleErr(op, k, epoch, cur.Epoch)
		}
		var e *blobplane.Error
		if errors.As(err, &e) {
			return placement.Placement{}, &blobplane.Error{Code: e.Code, Op: op, Message: fmt.Sprintf("placement %s: %s", keyString(k), e.Message)}
		}
		return placement.Placement{}, err
	}
	arg := dbsqlc.UpdatePlacementParams{
		State: string(next), SizeBytes: u.size, Epoch: epoch, Generation: cur.Generation,
		Digest: cur.Digest, Backend: cur.Backend, Datacenter: cur.Datacenter, Location: cur.Location,
	}
	switch next {
	case placement.Failed:
		arg.Reason = pgtype.Text{String: string(u.reason), Valid: true}
	case placement.Revoked:
		arg.RevokeReason = pgtype.Text{String: string(u.revokeReason), Valid: true}
	}
	row, err := s.q.UpdatePlacement(ctx, tx, arg)
	if errors.Is(err, pgx.ErrNoRows) {
		// Zero rows affected: the fence (epoch <= $epoch) refused the write.
		// S3: rejected, nothing changed, generation untouched.
		return placement.Placement{}, staleErr(op, k, epoch, cur.Epoch)
	}
	if err != nil {
		return placement.Placement{}, err
	}
	return placementFromRow(row), nil
}

// Placement returns the row of k. Errors: invalid, not_found (also before
// the ledger exists).
func (s *Store) Placement(ctx context.Context, k placement.Key) (placement.Placement, error) {
	const op = "get placement"
	if err := k.Validate(); err != nil {
		return placement.Placement{}, err
	}
	row, err := s.q.GetPlacement(ctx, s.pool, dbsqlc.GetPlacementParams(keyArgs(k)))
	if err != nil {
		if isUndefinedTable(err) {
			err = pgx.ErrNoRows
		}
		return placement.Placement{}, dbErr(op, err)
	}
	return placementFromRow(row), nil
}

// PlacementIfChanged returns the row of k only if its generation differs
// from since (DESIGN S3: "readers can ask for a row only if its generation
// moved"); changed is false, with a zero Placement, when it did not.
// Errors: invalid, not_found.
func (s *Store) PlacementIfChanged(ctx context.Context, k placement.Key, since int64) (p placement.Placement, changed bool, err error) {
	const op = "get placement if changed"
	if err := k.Validate(); err != nil {
		return placement.Placement{}, false, err
	}
	row, err := s.q.GetPlacementIfChanged(ctx, s.pool, dbsqlc.GetPlacementIfChangedParams{
		Digest: string(k.Digest), Backend: k.Backend, Datacenter: k.Datacenter, Location: k.Location, SinceGeneration: since,
	})
	switch {
	case err == nil:
		return placementFromRow(row), true, nil
	case errors.Is(err, pgx.ErrNoRows):
		// Unchanged, or absent: tell them apart.
		if _, err := s.Placement(ctx, k); err != nil {
			return placement.Placement{}, false, err
		}
		return placement.Placement{}, false, nil
	case isUndefinedTable(err):
		return placement.Placement{}, false, dbErr(op, pgx.ErrNoRows)
	default:
		return placement.Placement{}, false, dbErr(op, err)
	}
}

// Placements returns every placement of d (at most placement.MaxPerDigest),
// ordered by datacenter, backend, location. Before the ledger exists it
// returns none. Errors: unavailable, internal.
func (s *Store) Placements(ctx context.Context, d blobplane.Digest) ([]placement.Placement, error) {
	rows, err := s.q.ListPlacements(ctx, s.pool, string(d))
	if err != nil {
		if isUndefinedTable(err) {
			// Spec: "reads before that write return no placements".
			return []placement.Placement{}, nil
		}
		return nil, dbErr("list placements", err)
	}
	out := make([]placement.Placement, len(rows))
	for i, r := range rows {
		out[i] = placementFromRow(r)
	}
	return out, nil
}

// PlacementRouting answers the routing query: d's placements split into
// routing categories for a reader in datacenter, from one primary-key range
// scan. An unknown digest is Known false, not an error. Errors: invalid (a
// non-canonical digest or a bad datacenter label), unavailable, internal.
func (s *Store) PlacementRouting(ctx context.Context, d blobplane.Digest, datacenter string) (placement.Routing, error) {
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return placement.Routing{}, err
	}
	if !placement.ValidDatacenter(datacenter) {
		return placement.Routing{}, blobplane.Errorf(blobplane.CodeInvalid, "datacenter %q: must be 1-63 lowercase letters, digits or dashes", datacenter)
	}
	rows, err := s.Placements(ctx, d)
	if err != nil {
		return placement.Routing{}, err
	}
	return placement.Route(d, datacenter, rows), nil
}

// ReadScope is the set of repositories a caller may read, in the form a
// query can test (issue 26 point 3): All, or a repository named in Exact,
// or one whose name starts with a prefix in Prefixes.
type ReadScope struct {
	All      bool     // a global admin or a node: every digest, referenced or not
	Exact    []string // repositories named by a grant
	Prefixes []string // "team/" for the grant "team/*", "" for "*"
}

// ReadScopeOf is the scope grants give to read: the repositories
// auth.Covers admits for each grant that implies read (every valid one).
// An invalid grant covers nothing, as in auth.Covers. The "*" grant covers
// every repository, hence every referenced digest, but not All: a digest no
// repository references yet (an upload in flight) stays hidden from it.
func ReadScopeOf(grants []auth.Grant) ReadScope {
	sc := ReadScope{Exact: []string{}, Prefixes: []string{}}
	for _, g := range grants {
		if g.Check() != nil || !g.Permission.Implies(auth.Read) {
			continue
		}
		// A valid pattern ending in "*" is "*" (prefix "") or "team/*"
		// (prefix "team/", a component boundary, as in auth.Covers).
		if prefix, wild := strings.CutSuffix(g.Pattern, "*"); wild {
			sc.Prefixes = append(sc.Prefixes, prefix)
		} else {
			sc.Exact = append(sc.Exact, g.Pattern)
		}
	}
	return sc
}

// PlacementRoutingFor is PlacementRouting as a caller with scope sees it
// (issue 26 point 3): d's placements when the scope is All or some
// repository in scope references d, and otherwise exactly the answer for a
// digest without placements (Known false), so that naming a digest tells
// a caller nothing about content it cannot read. One statement. Errors:
// invalid (a non-canonical digest or a bad datacenter label), unavailable,
// internal.
func (s *Store) PlacementRoutingFor(ctx context.Context, d blobplane.Digest, datacenter string, scope ReadScope) (placement.Routing, error) {
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return placement.Routing{}, err
	}
	if !placement.ValidDatacenter(datacenter) {
		return placement.Routing{}, blobplane.Errorf(blobplane.CodeInvalid, "datacenter %q: must be 1-63 lowercase letters, digits or dashes", datacenter)
	}
	if scope.All {
		return s.PlacementRouting(ctx, d, datacenter)
	}
	// A digest found visible to this scope stays so until a reference is
	// deleted or a blob leaves live, which empties the existence cache
	// (RefsChannel): then the routing query is the plain one, without the
	// scope's reference lookup (docs/performance.md, issue 26).
	cache := s.existenceCache.Load()
	key := scope.cacheKey()
	_, visible, ticket := cache.lookup(key, d)
	if visible && !isFresh(ctx) {
		return s.PlacementRouting(ctx, d, datacenter)
	}
	exact, prefixes := scope.Exact, scope.Prefixes
	if exact == nil {
		exact = []string{}
	}
	if prefixes == nil {
		prefixes = []string{}
	}
	rows, err := s.q.ListReadablePlacements(ctx, s.pool, dbsqlc.ListReadablePlacementsParams{
		Digest: string(d), Exact: exact, Prefixes: prefixes,
	})
	if err != nil && !isUndefinedTable(err) { // no ledger yet: no placements (PlacementRouting)
		return placement.Routing{}, dbErr("list readable placements", err)
	}
	ps := make([]placement.Placement, len(rows))
	for i, r := range rows {
		ps[i] = placementFromRow(r)
	}
	if len(ps) > 0 { // rows only when visible (no rows: invisible, or no placements)
		cache.insert(ticket, key, d, 0)
	}
	return placement.Route(d, datacenter, ps), nil
}

// cacheKey names the scope in the existence cache, where it stands in for
// a repository: "\x01" starts no repository name, and NUL is in none.
func (sc ReadScope) cacheKey() string {
	return "\x01" + strings.Join(sc.Exact, "\x00") + "\x01" + strings.Join(sc.Prefixes, "\x00")
}

func checkTransition(k placement.Key, epoch int64) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if epoch < 0 {
		return blobplane.Errorf(blobplane.CodeInvalid, "epoch %d: must be >= 0", epoch)
	}
	return nil
}

func staleErr(op string, k placement.Key, epoch, held int64) error {
	return &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Message: fmt.Sprintf(
		"placement %s: epoch %d is stale, the placement is held at epoch %d; nothing changed", keyString(k), epoch, held)}
}

// placementErr keeps errors that already carry a blobplane code and maps
// driver errors at the boundary.
func placementErr(op string, err error) error {
	var e *blobplane.Error
	if errors.As(err, &e) {
		return err
	}
	return dbErr(op, err)
}

func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

type keyParams struct {
	Digest     string
	Backend    string
	Datacenter string
	Location   string
}

func keyArgs(k placement.Key) keyParams {
	return keyParams{Digest: string(k.Digest), Backend: k.Backend, Datacenter: k.Datacenter, Location: k.Location}
}

func keyString(k placement.Key) string {
	return fmt.Sprintf("%s@%s/%s/%s", k.Digest, k.Datacenter, k.Backend, k.Location)
}

func placementFromRow(r dbsqlc.Placement) placement.Placement {
	p := placement.Placement{
		Key:          rowKey(r),
		State:        placement.State(r.State),
		Reason:       placement.Reason(r.Reason.String),
		RevokeReason: placement.RevokeReason(r.RevokeReason.String),
		Size:         r.SizeBytes,
		Epoch:        r.Epoch,
		Generation:   r.Generation,
		CreatedAt:    r.CreatedAt.Time,
		UpdatedAt:    r.UpdatedAt.Time,
	}
	if r.VerifiedAt.Valid {
		p.VerifiedAt = r.VerifiedAt.Time
	}
	return p
}
