package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// MapChannel is the NOTIFY channel a map publication signals, with the new
// version as payload. The publishing transaction notifies (a trigger on
// partition_maps), so listeners hear of a version only once it is committed.
const MapChannel = "blobplane_map"

// Default lease timing for a FORCE that creates a record (the spec's
// example values); an existing record keeps its own.
const (
	DefaultLeaseTTL           = 15 * time.Second
	DefaultLeaseRenewInterval = 3 * time.Second
)

// SQLSTATEs raised by the leases_guard trigger (db/migrations/00002).
const (
	sqlstateEpochGuard = "BPE01" // epoch decrease, owner change without an increase, delete
	sqlstateSealed     = "BPS01" // un-seal or re-seal under the same epoch (R74)
)

// PublishSigningKey records the public half of a map-signing key with its
// validity window (R12), so verifiers can build their keyring from the
// database. The private key never reaches this method. A key id already
// published is a CodeConflict: a key's window is not edited in place,
// rotation publishes a new key.
func (s *Store) PublishSigningKey(ctx context.Context, k authority.TrustedKey) error {
	const op = "store.PublishSigningKey"
	if k.Alg == "" {
		k.Alg = authority.SignatureAlg
	}
	if _, err := authority.NewKeyring(k); err != nil {
		return err
	}
	err := s.q.InsertSigningKey(ctx, s.pool, dbsqlc.InsertSigningKeyParams{
		KeyID: k.KeyID, Alg: k.Alg, PublicKey: k.PublicKey,
		NotBefore: ts(k.NotBefore), NotAfter: ts(k.NotAfter),
	})
	return dbErr(op, err)
}

// SigningKeys returns every published key, expired ones included, ordered
// by not_before: pass them to authority.NewKeyring, whose verifier applies
// the windows.
func (s *Store) SigningKeys(ctx context.Context) ([]authority.TrustedKey, error) {
	rows, err := s.q.ListSigningKeys(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.SigningKeys", err)
	}
	out := make([]authority.TrustedKey, len(rows))
	for i, r := range rows {
		out[i] = authority.TrustedKey{
			KeyID: r.KeyID, Alg: r.Alg, PublicKey: r.PublicKey,
			NotBefore: r.NotBefore.Time.UTC(), NotAfter: r.NotAfter.Time.UTC(),
		}
	}
	return out, nil
}

// PublishMap stores a signed map and the signed deltas to it from earlier
// versions (nil ones are skipped), in one transaction that also
// notifies MapChannel (R9, R10). A version not greater than the latest
// published one is refused with CodeConflict chaining to
// authority.ErrVersionOrder (R6) — the database refuses it too, under a
// lock, whoever writes. Validation of the map (R5) and of successor rules is
// the controller's job before signing; PublishMap checks only that both
// documents are signed, that the map is valid, and that each delta
// produces this version from a distinct earlier one. The signing key must have been published.
func (s *Store) PublishMap(ctx context.Context, m *authority.Map, deltas ...*authority.Delta) error {
	return s.publishMap(ctx, "store.PublishMap", m, nil, deltas)
}

// Canary stages a map version (ZBP-5 R120, R121): only Nodes adopt it
// until it is promoted; MaxErrorRatio and Window are the stated outcome
// it is observed against.
type Canary struct {
	Nodes         []string
	MaxErrorRatio float64
	Window        time.Duration
}

// PublishCanary is PublishMap of a version only c.Nodes adopt (LatestMapFor)
// until DecideCanary promotes or withdraws it; everyone else's LatestMap
// skips it meanwhile.
func (s *Store) PublishCanary(ctx context.Context, m *authority.Map, c Canary, deltas ...*authority.Delta) error {
	if len(c.Nodes) == 0 || c.Window <= 0 || c.MaxErrorRatio < 0 || c.MaxErrorRatio > 1 {
		return blobplane.Errorf(blobplane.CodeInvalid, "store.PublishCanary: a canary needs nodes, a window and an error ratio in [0, 1]")
	}
	return s.publishMap(ctx, "store.PublishCanary", m, &c, deltas)
}

func (s *Store) publishMap(ctx context.Context, op string, m *authority.Map, canary *Canary, deltas []*authority.Delta) error {
	if m == nil {
		return blobplane.Errorf(blobplane.CodeInvalid, "%s: no map", op)
	}
	if m.Signature == nil {
		return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "map is unsigned", Err: authority.ErrUnsigned}
	}
	if m.Version > math.MaxInt64 {
		return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "map version out of range", Err: authority.ErrOutOfRange}
	}
	if err := authority.Validate(m); err != nil {
		return err
	}
	doc, err := json.Marshal(m)
	if err != nil {
		return err
	}
	inserts, err := deltaRows(op, m, deltas)
	if err != nil {
		return err
	}
	err = s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.q.LockMapPublication(ctx, tx); err != nil {
			return err
		}
		latest, err := s.q.LatestMapVersion(ctx, tx)
		if err != nil {
			return err
		}
		if uint64(latest) >= m.Version {
			return versionConflict(op, m.Version, uint64(latest))
		}
		n, err := s.q.InsertMap(ctx, tx, dbsqlc.InsertMapParams{
			Version: int64(m.Version), Document: string(doc), KeyID: m.Signature.KeyID, GeneratedAt: ts(m.GeneratedAt),
		})
		if err != nil {
			return err
		}
		if n != 1 {
			return versionConflict(op, m.Version, uint64(latest))
		}
		for _, d := range inserts {
			if err := s.q.InsertMapDelta(ctx, tx, d); err != nil {
				return err
			}
		}
		if canary != nil {
			return s.q.InsertMapCanary(ctx, tx, dbsqlc.InsertMapCanaryParams{Version: int64(m.Version), Nodes: canary.Nodes,
				MaxErrorRatio: canary.MaxErrorRatio, WindowMs: canary.Window.Milliseconds()})
		}
		return nil
	})
	var be *blobplane.Error
	if errors.As(err, &be) {
		return err
	}
	return dbErr(op, err)
}

// deltaRows checks that each delta (nil ones skipped) is signed and
// produces m from a base of its own, and returns them as rows.
func deltaRows(op string, m *authority.Map, deltas []*authority.Delta) ([]dbsqlc.InsertMapDeltaParams, error) {
	var inserts []dbsqlc.InsertMapDeltaParams
	bases := map[uint64]bool{}
	for _, delta := range deltas {
		if delta == nil {
			continue
		}
		switch {
		case delta.Signature == nil:
			return nil, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "delta is unsigned", Err: authority.ErrUnsigned}
		case delta.Version != m.Version || delta.BaseVersion >= m.Version || bases[delta.BaseVersion]:
			return nil, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op,
				Message: fmt.Sprintf("delta %d→%d does not produce map %d from a base of its own", delta.BaseVersion, delta.Version, m.Version), Err: authority.ErrWrongBase}
		}
		bases[delta.BaseVersion] = true
		doc, err := json.Marshal(delta)
		if err != nil {
			return nil, err
		}
		inserts = append(inserts, dbsqlc.InsertMapDeltaParams{
			BaseVersion: int64(delta.BaseVersion), Version: int64(delta.Version), Document: string(doc), KeyID: delta.Signature.KeyID,
		})
	}
	return inserts, nil
}

func versionConflict(op string, version, latest uint64) error {
	cause := fmt.Errorf("map version %d does not advance past the published %d: %w", version, latest, authority.ErrVersionOrder)
	return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: cause.Error(), Err: cause}
}

// LatestMap returns the newest published map, or CodeNotFound before the
// first publication. The map is parsed, not verified: verification is the
// reader's (R11).
func (s *Store) LatestMap(ctx context.Context) (*authority.Map, error) {
	doc, err := s.q.LatestMap(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.LatestMap", err)
	}
	return authority.ParseMap([]byte(doc))
}

// LatestMapFor is the newest map node adopts: LatestMap, or a canary
// naming node (R120).
func (s *Store) LatestMapFor(ctx context.Context, node string) (*authority.Map, error) {
	doc, err := s.q.LatestMapFor(ctx, s.pool, node)
	if err != nil {
		return nil, dbErr("store.LatestMapFor", err)
	}
	return authority.ParseMap([]byte(doc))
}

// MaxMapVersion is the highest version ever published, canaries included:
// the next one must exceed it (R6). 0 before the first.
func (s *Store) MaxMapVersion(ctx context.Context) (uint64, error) {
	v, err := s.q.LatestMapVersion(ctx, s.pool)
	return uint64(max(v, 0)), dbErr("store.MaxMapVersion", err)
}

// DecideCanary promotes (everyone adopts it) or withdraws (nobody does)
// the canary version, recording why; false when it is no longer a canary.
func (s *Store) DecideCanary(ctx context.Context, version uint64, promote bool, decision string) (bool, error) {
	state := "withdrawn"
	if promote {
		state = "promoted"
	}
	n, err := s.q.DecideMapCanary(ctx, s.pool, dbsqlc.DecideMapCanaryParams{Version: int64(min(version, math.MaxInt64)), State: state, Decision: pgtype.Text{String: decision, Valid: true}})
	return n == 1, dbErr("store.DecideCanary", err)
}

// PendingCanaries returns the canary versions not decided yet.
func (s *Store) PendingCanaries(ctx context.Context) ([]uint64, error) {
	rows, err := s.q.PendingMapCanaries(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.PendingCanaries", err)
	}
	out := make([]uint64, len(rows))
	for i, r := range rows {
		out[i] = uint64(r.Version)
	}
	return out, nil
}

// SupersedeCanaries withdraws every pending canary below version, which a
// map completing moves past their seal replaced (R122: a canary never
// holds such a map back).
func (s *Store) SupersedeCanaries(ctx context.Context, version uint64, decision string) (int64, error) {
	n, err := s.q.SupersedeMapCanaries(ctx, s.pool, dbsqlc.SupersedeMapCanariesParams{Version: int64(min(version, math.MaxInt64)), Decision: pgtype.Text{String: decision, Valid: true}})
	return n, dbErr("store.SupersedeCanaries", err)
}

// MapVersion returns published version v (R9), or CodeNotFound.
func (s *Store) MapVersion(ctx context.Context, v uint64) (*authority.Map, error) {
	if v > math.MaxInt64 {
		return nil, dbErr("store.MapVersion", pgx.ErrNoRows)
	}
	doc, err := s.q.MapByVersion(ctx, s.pool, int64(v))
	if err != nil {
		return nil, dbErr("store.MapVersion", err)
	}
	return authority.ParseMap([]byte(doc))
}

// MapDelta returns the stored signed delta whose base is since (R9), or
// CodeNotFound when none was published from that version. When several
// were, the one reaching the newest version wins. Deltas are not composed:
// a composed delta would need the controller's signature (R10), so a client
// further behind applies successive deltas or fetches the full map.
func (s *Store) MapDelta(ctx context.Context, since uint64) (*authority.Delta, error) {
	if since > math.MaxInt64 {
		return nil, dbErr("store.MapDelta", pgx.ErrNoRows)
	}
	doc, err := s.q.MapDeltaFrom(ctx, s.pool, int64(since))
	if err != nil {
		return nil, dbErr("store.MapDelta", err)
	}
	return authority.ParseDelta([]byte(doc))
}

// LeaseFenceWrite is the payload of a FENCE write: what moves under the
// writer's epoch (R20, R22, R74). At least one field must be set.
type LeaseFenceWrite struct {
	CheckpointPointer *string
	State             *authority.PrimaryState
	SealedLSN         *uint64
}

// AcquireLease is ACQUIRE (R15): one conditional statement that creates the
// record at epoch 1 or claims an expired one (expires_at < now() on the
// database clock) at epoch + 1, sets state RESTORING and expires_at =
// now() + ttl. The returned record is the store's acknowledgement:
// ExpiresAt − TTL is the database time of the claim.
//
// A live lease — held by another node, or by node itself — is CodeConflict
// chaining to authority.ErrLeaseHeld, not retryable as such: re-read and
// acquire after expiry (or RENEW if it is yours; TakeBackLease when it was
// an earlier incarnation's). Of two racing claimants exactly one wins; the
// other gets that error.
func (s *Store) AcquireLease(ctx context.Context, partition, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error) {
	return s.claimLease(ctx, "store.AcquireLease", partition, node, endpoint, ttl, renew, false)
}

// TakeBackLease is ACQUIRE for a node that has just started (issue 27): as
// AcquireLease, and it also claims a live lease whose owner is node — left
// by an earlier process with the same node id — at epoch + 1, without
// waiting for its expiry. The new epoch fences whatever that incarnation
// still has in flight (R15, R20, R27). A sealed or quarantined record is
// not taken back (R74, R59), nor, of course, a live lease of another node:
// both are CodeConflict chaining to authority.ErrLeaseHeld.
//
// Only a node that does not hold partition in this process may call it
// (the keeper: for a partition it has not held since it started); a
// holder RENEWs. Two live processes sharing a node id (a misconfiguration)
// each take the lease once at their start, and the one that loses it then
// waits like any other node: no flapping.
func (s *Store) TakeBackLease(ctx context.Context, partition, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error) {
	return s.claimLease(ctx, "store.TakeBackLease", partition, node, endpoint, ttl, renew, true)
}

// claimLease is the ACQUIRE statement, with or without the take-back of
// node's own live lease.
func (s *Store) claimLease(ctx context.Context, op, partition, node, endpoint string, ttl, renew time.Duration, takeBack bool) (authority.LeaseRecord, error) {
	if err := checkClaim(op, partition, node, endpoint, ttl, renew); err != nil {
		return authority.LeaseRecord{}, err
	}
	row, err := s.q.AcquireLease(ctx, s.pool, dbsqlc.AcquireLeaseParams{
		PartitionID: partition, Node: node, Endpoint: endpoint, TtlMs: ttl.Milliseconds(), RenewMs: renew.Milliseconds(), TakeBack: takeBack,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		cause := fmt.Errorf("lease on %s is held and not expired: %w", partition, authority.ErrLeaseHeld)
		return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: cause.Error(), Err: cause}
	}
	if err != nil {
		return authority.LeaseRecord{}, leaseErr(op, err)
	}
	return leaseFromRow(row), nil
}

// RenewLease is RENEW (R14, R20): expires_at = now() + ttl, only while node
// holds the record at epoch. Anything else — a higher epoch, another owner,
// no record — is CodeStaleEpoch chaining to authority.ErrStaleEpoch: the
// lease is lost, and the caller must stop serving and discard state (R24).
func (s *Store) RenewLease(ctx context.Context, partition, node string, epoch uint64) (authority.LeaseRecord, error) {
	const op = "store.RenewLease"
	if epoch > math.MaxInt64 {
		return authority.LeaseRecord{}, staleLease(op, partition, node, epoch)
	}
	row, err := s.q.RenewLease(ctx, s.pool, dbsqlc.RenewLeaseParams{PartitionID: partition, Node: node, Epoch: int64(epoch)})
	if errors.Is(err, pgx.ErrNoRows) {
		return authority.LeaseRecord{}, staleLease(op, partition, node, epoch)
	}
	if err != nil {
		return authority.LeaseRecord{}, leaseErr(op, err)
	}
	return leaseFromRow(row), nil
}

// FenceLease is the fence with nothing to move: one conditional write that
// succeeds only while node holds partition at epoch (R20), ordered against
// racing claims by the row lock. Otherwise CodeStaleEpoch chaining to
// authority.ErrStaleEpoch. Expiry is not tested, as in the spec's FENCE:
// until someone claims a higher epoch the holder's writes still land.
func (s *Store) FenceLease(ctx context.Context, partition, node string, epoch uint64) error {
	const op = "store.FenceLease"
	if epoch > math.MaxInt64 {
		return staleLease(op, partition, node, epoch)
	}
	n, err := s.q.FenceLease(ctx, s.pool, dbsqlc.FenceLeaseParams{PartitionID: partition, Node: node, Epoch: int64(epoch)})
	if err != nil {
		return leaseErr(op, err)
	}
	if n != 1 {
		return staleLease(op, partition, node, epoch)
	}
	return nil
}

// FenceLeaseWrite is FENCE with a payload: moves the checkpoint pointer
// (R22), the primary state (R23) and/or the sealed LSN (R74) in one
// conditional write under node's epoch. Errors: CodeStaleEpoch
// (authority.ErrStaleEpoch) when node does not hold the record at epoch;
// CodeConflict (authority.ErrSealed) when the record is sealed under this
// epoch and the write would un-seal or re-seal it; CodeInvalid for an empty
// or malformed payload.
func (s *Store) FenceLeaseWrite(ctx context.Context, partition, node string, epoch uint64, w LeaseFenceWrite) (authority.LeaseRecord, error) {
	const op = "store.FenceLeaseWrite"
	if w.CheckpointPointer == nil && w.State == nil && w.SealedLSN == nil {
		return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "FENCE without a pointer, state or sealed LSN", Err: authority.ErrMissingField}
	}
	p := dbsqlc.FenceLeaseWriteParams{PartitionID: partition, Node: node, Epoch: int64(epoch)}
	if w.CheckpointPointer != nil {
		p.CheckpointPointer = pgtype.Text{String: *w.CheckpointPointer, Valid: true}
	}
	if w.State != nil {
		if st := *w.State; !st.Known() || st == authority.PrimaryUnassigned {
			return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: fmt.Sprintf("lease state %q", st), Err: authority.ErrUnknownState}
		}
		p.State = pgtype.Text{String: string(*w.State), Valid: true}
	}
	if w.SealedLSN != nil {
		if *w.SealedLSN > math.MaxInt64 {
			return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "sealed LSN out of range", Err: authority.ErrOutOfRange}
		}
		p.SealedLsn = pgtype.Int8{Int64: int64(*w.SealedLSN), Valid: true}
	}
	if epoch > math.MaxInt64 {
		return authority.LeaseRecord{}, staleLease(op, partition, node, epoch)
	}
	row, err := s.q.FenceLeaseWrite(ctx, s.pool, p)
	if errors.Is(err, pgx.ErrNoRows) {
		return authority.LeaseRecord{}, staleLease(op, partition, node, epoch)
	}
	if err != nil {
		return authority.LeaseRecord{}, leaseErr(op, err)
	}
	return leaseFromRow(row), nil
}

// ForceLease is FORCE, the operator's break-glass (R26–R28): ACQUIRE without
// the expiry test, so it takes a live lease at epoch + 1 in the same
// conditional write and fences the displaced owner exactly as an ordinary
// claim would (R27), recording operator, reason and the database time in
// taken_by / taken_reason / taken_at. Operator and reason are required
// (CodeInvalid otherwise). An existing record keeps its TTL and renewal
// interval; a new one gets DefaultLeaseTTL and DefaultLeaseRenewInterval.
// Only the admin command `api lease force` calls this; automated placement
// must never (R28).
func (s *Store) ForceLease(ctx context.Context, partition, node, endpoint, operator, reason string) (authority.LeaseRecord, error) {
	const op = "store.ForceLease"
	if err := checkClaim(op, partition, node, endpoint, DefaultLeaseTTL, DefaultLeaseRenewInterval); err != nil {
		return authority.LeaseRecord{}, err
	}
	if operator == "" || reason == "" {
		return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op,
			Message: "a force-takeover needs an operator and a reason (R28)", Err: authority.ErrMissingField}
	}
	row, err := s.q.ForceLease(ctx, s.pool, dbsqlc.ForceLeaseParams{
		PartitionID: partition, Node: node, Endpoint: endpoint, Operator: operator, Reason: reason,
		TtlMs: DefaultLeaseTTL.Milliseconds(), RenewMs: DefaultLeaseRenewInterval.Milliseconds(),
	})
	if err != nil {
		return authority.LeaseRecord{}, leaseErr(op, err)
	}
	// Wake the keepers: the forced owner adopts the lease at once (R26).
	if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", HandoffChannel, partition); err != nil {
		s.logger.Warn("notify a force-takeover; keepers see it at their next tick", "partition", partition, "err", err)
	}
	return leaseFromRow(row), nil
}

// Lease returns partition's lease record, or CodeNotFound.
func (s *Store) Lease(ctx context.Context, partition string) (authority.LeaseRecord, error) {
	row, err := s.q.GetLease(ctx, s.pool, partition)
	if err != nil {
		return authority.LeaseRecord{}, dbErr("store.Lease", err)
	}
	return leaseFromRow(row), nil
}

// Leases returns every lease record ordered by partition.
func (s *Store) Leases(ctx context.Context) ([]authority.LeaseRecord, error) {
	rows, err := s.q.ListLeases(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.Leases", err)
	}
	out := make([]authority.LeaseRecord, len(rows))
	for i, r := range rows {
		out[i] = leaseFromRow(r)
	}
	return out, nil
}

// ReleaseLease gives up node's lease on partition at epoch by expiring it
// now (database clock), so a successor need not wait out the TTL. Releasing
// a lease that already moved on, or already expired, changes nothing and is
// not an error: the caller is leaving either way.
func (s *Store) ReleaseLease(ctx context.Context, partition, node string, epoch uint64) error {
	if epoch > math.MaxInt64 {
		return nil
	}
	_, err := s.q.ReleaseLease(ctx, s.pool, dbsqlc.ReleaseLeaseParams{PartitionID: partition, Node: node, Epoch: int64(epoch)})
	return leaseErr("store.ReleaseLease", err)
}

// SetLeaseState records the primary state of node's lease at epoch (R23:
// RESTORING on claim, SERVING once ready) — FENCE with a state payload.
// CodeStaleEpoch when the lease moved on.
func (s *Store) SetLeaseState(ctx context.Context, partition, node string, epoch uint64, state authority.PrimaryState) error {
	_, err := s.FenceLeaseWrite(ctx, partition, node, epoch, LeaseFenceWrite{State: &state})
	return err
}

// LeaseStatus is a lease record with whether it is live by the database's
// clock.
type LeaseStatus struct {
	authority.LeaseRecord
	// Live is expires_at > now() evaluated by Postgres, the clock that
	// wrote the expiry (issue 26 point 11): never compare ExpiresAt with
	// a local clock.
	Live bool
}

// LeaseStatuses returns every lease record ordered by partition, each
// judged live or expired by the database's clock in the same statement.
func (s *Store) LeaseStatuses(ctx context.Context) ([]LeaseStatus, error) {
	rows, err := s.q.ListLeasesOnDatabaseClock(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.LeaseStatuses", err)
	}
	out := make([]LeaseStatus, len(rows))
	for i, r := range rows {
		out[i] = LeaseStatus{LeaseRecord: leaseFromRow(r.Lease), Live: r.Live}
	}
	return out, nil
}

func checkClaim(op, partition, node, endpoint string, ttl, renew time.Duration) error {
	switch {
	case partition == "" || node == "" || endpoint == "":
		return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "partition, node and endpoint are required", Err: authority.ErrMissingField}
	case ttl.Milliseconds() <= 0 || renew.Milliseconds() <= 0 || renew.Milliseconds() >= ttl.Milliseconds():
		// R14: a lease has an expiry and a renewal interval shorter than it.
		return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op,
			Message: fmt.Sprintf("lease ttl %v and renew interval %v: need 1ms <= renew < ttl", ttl, renew), Err: authority.ErrLeaseTiming}
	}
	return nil
}

func staleLease(op, partition, node string, epoch uint64) error {
	cause := fmt.Errorf("%s does not hold %s at epoch %d: %w", node, partition, epoch, authority.ErrStaleEpoch)
	return &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Message: cause.Error(), Err: cause}
}

// leaseErr maps the leases_guard trigger's refusals before the generic
// mapping: an epoch regression is a stale write (R16, R20), a re-seal a
// conflict (R74).
func leaseErr(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		// The trigger's text stays in Err, for logs (issue 26 point 10).
		case sqlstateEpochGuard:
			return &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Message: "the lease record refused the write: " + authority.ErrStaleEpoch.Error(), Err: fmt.Errorf("%w: %w", authority.ErrStaleEpoch, err)}
		case sqlstateSealed:
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: "the lease record refused the write: " + authority.ErrSealed.Error(), Err: fmt.Errorf("%w: %w", authority.ErrSealed, err)}
		}
	}
	return dbErr(op, err)
}

func leaseFromRow(r dbsqlc.Lease) authority.LeaseRecord {
	rec := authority.LeaseRecord{
		Partition: r.PartitionID, Epoch: uint64(r.Epoch), OwnerNode: r.OwnerNode, OwnerEndpoint: r.OwnerEndpoint,
		State:             authority.PrimaryState(r.State),
		TTL:               time.Duration(r.LeaseTtlMs) * time.Millisecond,
		RenewInterval:     time.Duration(r.RenewIntervalMs) * time.Millisecond,
		ExpiresAt:         r.ExpiresAt.Time.UTC(),
		CheckpointPointer: r.CheckpointPointer.String,
		TakenBy:           r.TakenBy.String,
		TakenReason:       r.TakenReason.String,
	}
	if r.SealedLsn.Valid {
		lsn := uint64(r.SealedLsn.Int64)
		rec.SealedLSN = &lsn
	}
	if r.TakenAt.Valid {
		at := r.TakenAt.Time.UTC()
		rec.TakenAt = &at
	}
	return rec
}

func ts(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }
