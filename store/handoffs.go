package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Moves of partitions between nodes (issue 30; ZBP-5 A.3, A.4, A.8):
// the handoffs the controller service starts and the keepers carry out,
// the plans it records, its freeze switch and its leader lock. The table
// and every state are described in db/migrations/00030_handoffs.sql and
// docs/authority.md "Moves".

// HandoffChannel is notified with the partition id whenever a handoff
// starts or changes state (trigger handoffs_notify).
const HandoffChannel = "blobplane_handoff"

func handoffFromRow(r dbsqlc.Handoff) authority.Handoff {
	h := authority.Handoff{
		ID: r.HandoffID, PlanID: r.PlanID.Int64, Partition: r.PartitionID, Kind: authority.HandoffKind(r.Kind),
		From: r.FromNode, FromEpoch: uint64(r.FromEpoch), To: r.ToNode, ToEndpoint: r.ToEndpoint,
		State: authority.HandoffState(r.State), Reason: r.Reason, Deadline: r.Deadline.Time, CreatedAt: r.CreatedAt.Time,
		UnavailableSince: r.UnavailableSince.Time, SealedAt: r.SealedAt.Time, ToEpoch: uint64(r.ToEpoch.Int64),
		ReadyAt: r.ReadyAt.Time, MapVersion: uint64(r.MapVersion.Int64), FinishedAt: r.FinishedAt.Time,
		AbortReason: r.AbortReason.String, GroupID: r.GroupID.Int64,
	}
	return h
}

// withChildren attaches the children of every split or merge among hs.
func (s *Store) withChildren(ctx context.Context, hs []authority.Handoff) ([]authority.Handoff, error) {
	var groups []int64
	for _, h := range hs {
		if h.GroupID != 0 {
			groups = append(groups, h.GroupID)
		}
	}
	if len(groups) == 0 {
		return hs, nil
	}
	rows, err := s.q.GroupChildren(ctx, s.pool, groups)
	if err != nil {
		return nil, dbErr("store.GroupChildren", err)
	}
	byGroup := map[int64][]authority.Child{}
	for _, r := range rows {
		c := authority.Child{ID: r.ChildID, Generation: uint64(r.Generation), Epoch: uint64(r.Epoch), Ready: r.ReadyAt.Valid}
		if err := json.Unmarshal(r.Slots, &c.Slots); err != nil {
			return nil, fmt.Errorf("store.GroupChildren: child %s slots: %w", r.ChildID, err)
		}
		if err := json.Unmarshal(r.Parents, &c.Parents); err != nil {
			return nil, fmt.Errorf("store.GroupChildren: child %s parents: %w", r.ChildID, err)
		}
		byGroup[r.GroupID] = append(byGroup[r.GroupID], c)
	}
	for i := range hs {
		hs[i].Children = byGroup[hs[i].GroupID]
	}
	return hs, nil
}

func handoffsFromRows(rows []dbsqlc.Handoff) []authority.Handoff {
	out := make([]authority.Handoff, len(rows))
	for i, r := range rows {
		out[i] = handoffFromRow(r)
	}
	return out
}

// CreateHandoff starts a move of h.Partition (state preparing) that must
// pass its seal within deadline (R82). A move already in flight for the
// partition is CodeConflict.
func (s *Store) CreateHandoff(ctx context.Context, h authority.Handoff, deadline time.Duration) (authority.Handoff, error) {
	const op = "store.CreateHandoff"
	if h.Kind != authority.KindHandoff && h.Kind != authority.KindRecover {
		return authority.Handoff{}, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: fmt.Sprintf("handoff kind %q", h.Kind)}
	}
	if h.FromEpoch > math.MaxInt64 || deadline <= 0 {
		return authority.Handoff{}, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "epoch or deadline out of range"}
	}
	since := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	if !h.UnavailableSince.IsZero() {
		since = ts(h.UnavailableSince)
	}
	row, err := s.q.CreateHandoff(ctx, s.pool, dbsqlc.CreateHandoffParams{
		PlanID: h.PlanID, PartitionID: h.Partition, Kind: string(h.Kind), FromNode: h.From, FromEpoch: int64(h.FromEpoch),
		ToNode: h.To, ToEndpoint: h.ToEndpoint, Reason: h.Reason, OutageSince: since, DeadlineMs: deadline.Milliseconds(),
	})
	if err != nil {
		return authority.Handoff{}, dbErr(op, err)
	}
	return handoffFromRow(row), nil
}

// CreateGroup starts a split or merge (A.5, A.6) in one transaction: one
// handoff per parent (kind split or merge, all from the one node holding
// the parents, to one target) and the children that replace them. It
// returns the group id. A move of any parent already in flight is
// CodeConflict and nothing is created.
func (s *Store) CreateGroup(ctx context.Context, parents []authority.Handoff, children []authority.Child, deadline time.Duration) (int64, error) {
	const op = "store.CreateGroup"
	if len(parents) == 0 || len(children) == 0 {
		return 0, &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: "a split or merge needs parents and children"}
	}
	var group int64
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		g, err := s.q.NextHandoffGroup(ctx, tx)
		if err != nil {
			return dbErr(op, err)
		}
		group = g
		for _, h := range parents {
			if !h.Kind.Grouped() || h.FromEpoch > math.MaxInt64 {
				return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: fmt.Sprintf("parent %s: kind %q", h.Partition, h.Kind)}
			}
			if _, err := s.q.CreateHandoff(ctx, tx, dbsqlc.CreateHandoffParams{
				PlanID: h.PlanID, GroupID: g, PartitionID: h.Partition, Kind: string(h.Kind), FromNode: h.From, FromEpoch: int64(h.FromEpoch),
				ToNode: h.To, ToEndpoint: h.ToEndpoint, Reason: h.Reason,
				OutageSince: pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, DeadlineMs: deadline.Milliseconds(),
			}); err != nil {
				return dbErr(op, err)
			}
		}
		for _, c := range children {
			slots, err := json.Marshal(c.Slots)
			if err != nil {
				return err
			}
			ps, err := json.Marshal(c.Parents)
			if err != nil {
				return err
			}
			if err := s.q.InsertHandoffChild(ctx, tx, dbsqlc.InsertHandoffChildParams{
				GroupID: g, ChildID: c.ID, Generation: int64(c.Generation), Epoch: int64(c.Epoch), Slots: slots, Parents: ps,
			}); err != nil {
				return dbErr(op, err)
			}
		}
		return nil
	})
	return group, err
}

// SealGroup is the seal of a split or merge (A.5 step 4, A.6, R74): every
// parent of group, all held by node, moves to sealed and its lease to
// SEALED under its epoch, in one transaction; if any parent is not
// synced, is past its deadline or is no longer held at its epoch, nothing
// changes (R75): CodeConflict or CodeStaleEpoch.
func (s *Store) SealGroup(ctx context.Context, group int64, node string) error {
	const op = "store.SealGroup"
	return s.InTx(ctx, func(tx pgx.Tx) error {
		want, err := s.q.CountGroupHandoffs(ctx, tx, group)
		if err != nil {
			return dbErr(op, err)
		}
		rows, err := s.q.SealGroupHandoffs(ctx, tx, dbsqlc.SealGroupHandoffsParams{GroupID: group, Node: node})
		if err != nil {
			return dbErr(op, err)
		}
		if int64(len(rows)) != want || want == 0 {
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op,
				Message: fmt.Sprintf("group %d: %d of %d parents synced from %s inside their deadline", group, len(rows), want, node)}
		}
		for _, r := range rows {
			if _, err := s.q.SealLeaseForHandoff(ctx, tx, dbsqlc.SealLeaseForHandoffParams{PartitionID: r.PartitionID, Node: node, Epoch: r.FromEpoch}); errors.Is(err, pgx.ErrNoRows) {
				return staleLease(op, r.PartitionID, node, uint64(r.FromEpoch))
			} else if err != nil {
				return leaseErr(op, err)
			}
		}
		return nil
	})
}

// ClaimChildLease is the target's claim of a split or merge child (A.5
// step 5): its lease created at its planned epoch, above every parent's,
// only once every parent of its group is sealed (R16, R74). CodeConflict
// (authority.ErrLeaseHeld) otherwise, or when the lease exists already
// (the caller then claims it as any lease).
func (s *Store) ClaimChildLease(ctx context.Context, child, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error) {
	const op = "store.ClaimChildLease"
	if err := checkClaim(op, child, node, endpoint, ttl, renew); err != nil {
		return authority.LeaseRecord{}, err
	}
	row, err := s.q.ClaimChildLease(ctx, s.pool, dbsqlc.ClaimChildLeaseParams{ChildID: child, Node: node, Endpoint: endpoint, TtlMs: ttl.Milliseconds(), RenewMs: renew.Milliseconds()})
	if errors.Is(err, pgx.ErrNoRows) {
		cause := fmt.Errorf("child %s: its parents are not all sealed, or its lease exists: %w", child, authority.ErrLeaseHeld)
		return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: cause.Error(), Err: cause}
	}
	if err != nil {
		return authority.LeaseRecord{}, leaseErr(op, err)
	}
	return leaseFromRow(row), nil
}

// MarkChildReady records that node serves child under its planned epoch;
// when every child of group serves, the group's parents turn ready (R79).
func (s *Store) MarkChildReady(ctx context.Context, group int64, child, node string) (groupReady bool, err error) {
	const op = "store.MarkChildReady"
	err = s.InTx(ctx, func(tx pgx.Tx) error {
		if _, err := s.q.MarkChildReady(ctx, tx, dbsqlc.MarkChildReadyParams{ChildID: child, Node: node}); err != nil {
			return dbErr(op, err)
		}
		n, err := s.q.MarkGroupReady(ctx, tx, group)
		groupReady = n > 0
		return dbErr(op, err)
	})
	return groupReady, err
}

// ActiveHandoffs returns every move in flight, oldest first.
func (s *Store) ActiveHandoffs(ctx context.Context) ([]authority.Handoff, error) {
	rows, err := s.q.ActiveHandoffs(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.ActiveHandoffs", err)
	}
	return s.withChildren(ctx, handoffsFromRows(rows))
}

// HandoffsFor returns the moves in flight from or to node.
func (s *Store) HandoffsFor(ctx context.Context, node string) ([]authority.Handoff, error) {
	rows, err := s.q.HandoffsForNode(ctx, s.pool, node)
	if err != nil {
		return nil, dbErr("store.HandoffsFor", err)
	}
	return s.withChildren(ctx, handoffsFromRows(rows))
}

// Handoff returns one move, or CodeNotFound.
func (s *Store) Handoff(ctx context.Context, id int64) (authority.Handoff, error) {
	row, err := s.q.GetHandoff(ctx, s.pool, id)
	if err != nil {
		return authority.Handoff{}, dbErr("store.Handoff", err)
	}
	hs, err := s.withChildren(ctx, []authority.Handoff{handoffFromRow(row)})
	if err != nil {
		return authority.Handoff{}, err
	}
	return hs[0], nil
}

// RecentHandoffs returns the newest n moves, newest first.
func (s *Store) RecentHandoffs(ctx context.Context, n int) ([]authority.Handoff, error) {
	rows, err := s.q.RecentHandoffs(ctx, s.pool, int32(min(max(n, 1), 10000)))
	if err != nil {
		return nil, dbErr("store.RecentHandoffs", err)
	}
	return s.withChildren(ctx, handoffsFromRows(rows))
}

// MarkHandoffSynced is the target's answer to a handoff in preparing
// (A.4 step 3): it will take the partition. False when the handoff is no
// longer preparing, targets another node, or its deadline passed.
func (s *Store) MarkHandoffSynced(ctx context.Context, id int64, node string) (bool, error) {
	n, err := s.q.MarkHandoffSynced(ctx, s.pool, dbsqlc.MarkHandoffSyncedParams{HandoffID: id, Node: node})
	return n == 1, dbErr("store.MarkHandoffSynced", err)
}

// SealForHandoff is the seal (A.4 step 4, R74): in one transaction the
// synced handoff moves to sealed and node's lease at epoch to SEALED. The
// lease write waits for every write fenced under the epoch (FOR KEY SHARE,
// migration 00029) and none lands after it. Nothing changes, and the
// outgoing primary keeps serving (R75), when the handoff is not synced or
// its deadline passed (CodeConflict) or node no longer holds the lease at
// epoch (CodeStaleEpoch).
func (s *Store) SealForHandoff(ctx context.Context, id int64, node string, epoch uint64) (authority.LeaseRecord, error) {
	const op = "store.SealForHandoff"
	if epoch > math.MaxInt64 {
		return authority.LeaseRecord{}, staleLease(op, "?", node, epoch)
	}
	var rec authority.LeaseRecord
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		partition, err := s.q.SealHandoff(ctx, tx, dbsqlc.SealHandoffParams{HandoffID: id, Node: node, Epoch: int64(epoch)})
		if errors.Is(err, pgx.ErrNoRows) {
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op,
				Message: fmt.Sprintf("handoff %d is not synced from %s at epoch %d, or its deadline passed", id, node, epoch)}
		}
		if err != nil {
			return dbErr(op, err)
		}
		row, err := s.q.SealLeaseForHandoff(ctx, tx, dbsqlc.SealLeaseForHandoffParams{PartitionID: partition, Node: node, Epoch: int64(epoch)})
		if errors.Is(err, pgx.ErrNoRows) {
			return staleLease(op, partition, node, epoch)
		}
		if err != nil {
			return leaseErr(op, err)
		}
		rec = leaseFromRow(row)
		return nil
	})
	return rec, err
}

// ClaimSealedLease is the target's ACQUIRE after the seal (A.4 step 7):
// the sealed lease at epoch + 1, at once, only for the node a sealed
// handoff names. CodeConflict chaining to authority.ErrLeaseHeld otherwise.
func (s *Store) ClaimSealedLease(ctx context.Context, id int64, partition, node, endpoint string, ttl, renew time.Duration) (authority.LeaseRecord, error) {
	const op = "store.ClaimSealedLease"
	if err := checkClaim(op, partition, node, endpoint, ttl, renew); err != nil {
		return authority.LeaseRecord{}, err
	}
	row, err := s.q.ClaimSealedLease(ctx, s.pool, dbsqlc.ClaimSealedLeaseParams{
		HandoffID: id, PartitionID: partition, Node: node, Endpoint: endpoint, TtlMs: ttl.Milliseconds(), RenewMs: renew.Milliseconds(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		cause := fmt.Errorf("no sealed handoff %d of %s to %s: %w", id, partition, node, authority.ErrLeaseHeld)
		return authority.LeaseRecord{}, &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: cause.Error(), Err: cause}
	}
	if err != nil {
		return authority.LeaseRecord{}, leaseErr(op, err)
	}
	return leaseFromRow(row), nil
}

// MarkHandoffReady records that node serves the handoff's partition under
// epoch (A.4 step 7, A.3 step 10): the controller may publish a map naming
// it (R79). False when the handoff is not waiting for it.
func (s *Store) MarkHandoffReady(ctx context.Context, id int64, node string, epoch uint64) (bool, error) {
	if epoch > math.MaxInt64 {
		return false, nil
	}
	n, err := s.q.MarkHandoffReady(ctx, s.pool, dbsqlc.MarkHandoffReadyParams{HandoffID: id, Node: node, ToEpoch: int64(epoch)})
	return n == 1, dbErr("store.MarkHandoffReady", err)
}

// PublishHandoffs records that map version names the targets of ids
// (ready, or sealed and completed by recovery) and returns them published,
// each with its outage (authority.Handoff.Unavailable).
func (s *Store) PublishHandoffs(ctx context.Context, ids []int64, version uint64) ([]authority.Handoff, error) {
	rows, err := s.q.PublishedHandoffs(ctx, s.pool, dbsqlc.PublishedHandoffsParams{HandoffIds: ids, MapVersion: int64(min(version, math.MaxInt64))})
	if err != nil {
		return nil, dbErr("store.PublishHandoffs", err)
	}
	return handoffsFromRows(rows), nil
}

// AbortHandoff abandons a move before its seal (R75, R82): false once it
// is sealed or finished (R76: it only goes forward).
func (s *Store) AbortHandoff(ctx context.Context, id int64, reason string) (bool, error) {
	n, err := s.q.AbortHandoff(ctx, s.pool, dbsqlc.AbortHandoffParams{HandoffID: id, AbortReason: reason})
	return n == 1, dbErr("store.AbortHandoff", err)
}

// PlanRecord is an applied plan as controller_plans keeps it (R117, R118).
type PlanRecord struct {
	Trigger        string
	Moves          any // marshalled to the moves column (a JSON array)
	MovedSlots     uint64
	TotalSlots     uint64
	OverrideBy     string
	OverrideReason string
	AppliedBy      string
}

// ApplyRequest is an operator's request that the running controller
// service apply plan kinds in its next round (`controller apply` beside
// `controller run`).
type ApplyRequest struct {
	ID             int64
	Kinds          []string
	By             string
	OverrideReason string
}

// RequestApply queues r for the service; it returns the request's id.
func (s *Store) RequestApply(ctx context.Context, r ApplyRequest) (int64, error) {
	id, err := s.q.RequestApply(ctx, s.pool, dbsqlc.RequestApplyParams{Kinds: r.Kinds, RequestedBy: r.By, OverrideReason: r.OverrideReason})
	return id, dbErr("store.RequestApply", err)
}

// TakeApplyRequests marks every pending request taken and returns them:
// the leader's round applies them.
func (s *Store) TakeApplyRequests(ctx context.Context) ([]ApplyRequest, error) {
	rows, err := s.q.TakeApplyRequests(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.TakeApplyRequests", err)
	}
	out := make([]ApplyRequest, len(rows))
	for i, r := range rows {
		out[i] = ApplyRequest{ID: r.RequestID, Kinds: r.Kinds, By: r.RequestedBy, OverrideReason: r.OverrideReason}
	}
	return out, nil
}

// SetApplyRequestsPlan records the plan the round that took ids recorded.
func (s *Store) SetApplyRequestsPlan(ctx context.Context, ids []int64, plan int64) error {
	return dbErr("store.SetApplyRequestsPlan", s.q.SetApplyRequestPlan(ctx, s.pool, dbsqlc.SetApplyRequestPlanParams{PlanID: pgtype.Int8{Int64: plan, Valid: plan != 0}, Ids: ids}))
}

// ApplyRequestState says whether request id was taken, and the plan its
// round recorded (0: none).
func (s *Store) ApplyRequestState(ctx context.Context, id int64) (taken bool, plan int64, err error) {
	r, err := s.q.GetApplyRequest(ctx, s.pool, id)
	if err != nil {
		return false, 0, dbErr("store.ApplyRequestState", err)
	}
	return r.Taken, r.PlanID, nil
}

// RecordPlan stores an applied plan and returns its id.
func (s *Store) RecordPlan(ctx context.Context, p PlanRecord) (int64, error) {
	doc, err := json.Marshal(p.Moves)
	if err != nil {
		return 0, err
	}
	arg := dbsqlc.InsertControllerPlanParams{
		Trigger: p.Trigger, Moves: doc, MovedSlots: int64(min(p.MovedSlots, math.MaxInt64)), TotalSlots: int64(min(p.TotalSlots, math.MaxInt64)), AppliedBy: p.AppliedBy,
	}
	if p.OverrideBy != "" || p.OverrideReason != "" {
		arg.OverrideBy = pgtype.Text{String: p.OverrideBy, Valid: true}
		arg.OverrideReason = pgtype.Text{String: p.OverrideReason, Valid: true}
	}
	id, err := s.q.InsertControllerPlan(ctx, s.pool, arg)
	return id, dbErr("store.RecordPlan", err)
}

// FreezeState is the controller's global freeze (R123).
type FreezeState struct {
	By     string    `json:"by"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// Freeze halts new movement (R123) until Unfreeze; by and reason are
// required and recorded.
func (s *Store) Freeze(ctx context.Context, by, reason string) error {
	if by == "" || reason == "" {
		return &blobplane.Error{Code: blobplane.CodeInvalid, Op: "store.Freeze", Message: "a freeze needs an operator and a reason"}
	}
	return dbErr("store.Freeze", s.q.Freeze(ctx, s.pool, dbsqlc.FreezeParams{FrozenBy: by, Reason: reason}))
}

// Unfreeze lifts the freeze; false when there was none.
func (s *Store) Unfreeze(ctx context.Context) (bool, error) {
	n, err := s.q.Unfreeze(ctx, s.pool)
	return n > 0, dbErr("store.Unfreeze", err)
}

// Frozen returns the freeze, or nil when movement is allowed.
func (s *Store) Frozen(ctx context.Context) (*FreezeState, error) {
	rows, err := s.q.GetFreeze(ctx, s.pool)
	if err != nil || len(rows) == 0 {
		return nil, dbErr("store.Frozen", err)
	}
	return &FreezeState{By: rows[0].FrozenBy, Reason: rows[0].Reason, At: rows[0].FrozenAt.Time}, nil
}

// MarkNodeDraining records that node received its termination signal
// (R83): the controller hands its partitions off and places nothing new
// there. Registering again clears it.
func (s *Store) MarkNodeDraining(ctx context.Context, node string) error {
	n, err := s.q.MarkNodeDraining(ctx, s.pool, node)
	if err == nil && n == 0 {
		err = errNoRows
	}
	return dbErr("store.MarkNodeDraining", err)
}

// ForcedLeasesFor returns the live leases an operator forced onto node
// (R26), for its keeper to adopt at once.
func (s *Store) ForcedLeasesFor(ctx context.Context, node string) ([]authority.LeaseRecord, error) {
	rows, err := s.q.ForcedLeasesFor(ctx, s.pool, node)
	if err != nil {
		return nil, dbErr("store.ForcedLeasesFor", err)
	}
	out := make([]authority.LeaseRecord, len(rows))
	for i, r := range rows {
		out[i] = leaseFromRow(r)
	}
	return out, nil
}

// PlacementNode is an api node as the controller sees it, judged on the
// database clock.
type PlacementNode struct {
	ID, Datacenter, Endpoint, Class string
	Capacity                        int
	Up                              bool // state = 'up'
	Draining                        bool
	HeartbeatAge                    time.Duration
}

// PlacementNodes returns every registered api node.
func (s *Store) PlacementNodes(ctx context.Context) ([]PlacementNode, error) {
	rows, err := s.q.PlacementNodes(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.PlacementNodes", err)
	}
	out := make([]PlacementNode, len(rows))
	for i, r := range rows {
		out[i] = PlacementNode{
			ID: r.NodeID, Datacenter: r.Datacenter, Endpoint: r.Endpoint, Class: r.Class, Capacity: int(r.Capacity),
			Up: r.State == "up", Draining: r.Draining, HeartbeatAge: time.Duration(r.HeartbeatAgeMs) * time.Millisecond,
		}
	}
	return out, nil
}

// controllerLockKey is the session advisory lock the active controller
// holds (pg_advisory_lock(bigint); below 2^31 so pg_locks shows it as
// classid 0, objid key, objsubid 1).
const controllerLockKey = 0x626c6f62 // "blob"

// ControllerLock is the leader lock of the controller service: one
// controller acts at a time, standbys wait for it.
type ControllerLock struct {
	conn *pgxpool.Conn
}

// TryControllerLock takes the leader lock without waiting; nil when
// another controller holds it.
func (s *Store) TryControllerLock(ctx context.Context) (*ControllerLock, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, dbErr("store.TryControllerLock", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(controllerLockKey)).Scan(&ok); err != nil {
		conn.Release()
		return nil, dbErr("store.TryControllerLock", err)
	}
	if !ok {
		conn.Release()
		return nil, nil
	}
	return &ControllerLock{conn: conn}, nil
}

// Check proves the lock is still held: its session is alive (a session
// lock dies with its connection, and then another controller may hold
// it). The caller stops acting on an error.
func (l *ControllerLock) Check(ctx context.Context) error {
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND granted
		AND pid = pg_backend_pid() AND classid = 0 AND objid = $1::bigint::oid AND objsubid = 1)`, int64(controllerLockKey)).Scan(&held)
	if err != nil {
		return dbErr("store.ControllerLock.Check", err)
	}
	if !held {
		return &blobplane.Error{Code: blobplane.CodeConflict, Op: "store.ControllerLock.Check", Message: "the controller lock is no longer held"}
	}
	return nil
}

// Release gives the lock up (closing the session so nothing lingers).
func (l *ControllerLock) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(controllerLockKey))
	if err != nil {
		// Unknown state: close the session, which releases the lock.
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
}

// ControllerRunning reports whether a controller service holds the leader
// lock: a draining api waits for its handoffs only when one does.
func (s *Store) ControllerRunning(ctx context.Context) (bool, error) {
	var held bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND granted
		AND classid = 0 AND objid = $1::bigint::oid AND objsubid = 1)`, int64(controllerLockKey)).Scan(&held)
	return held, dbErr("store.ControllerRunning", err)
}

// presenceClass is the first key of every node's presence lock
// (pg_advisory_lock(int, int): pg_locks shows classid = presenceClass,
// objid = the node's key, objsubid = 2).
const presenceClass = 0x62706e64 // "bpnd"

// Presence is an api node's session advisory lock on its own id, held for
// as long as the process lives and reaches Postgres. The controller reads
// it to tell a dead node (the lock went with its connections) from a live
// one whose lease merely lapsed: a killed node's partitions are recovered
// as soon as their leases expire, a live node gets a grace period to claim
// them back (docs/authority.md "Moves").
type Presence struct {
	conn *pgxpool.Conn
}

// HoldPresence takes node's presence lock on a connection of its own;
// CodeConflict when another live session holds it (two processes sharing
// a node id).
func (s *Store) HoldPresence(ctx context.Context, node string) (*Presence, error) {
	const op = "store.HoldPresence"
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, dbErr(op, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int4, (hashtext($2) & 2147483647)::int4)", int32(presenceClass), node).Scan(&ok); err != nil {
		conn.Release()
		return nil, dbErr(op, err)
	}
	if !ok {
		conn.Release()
		return nil, &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: fmt.Sprintf("another live process holds node id %s", node)}
	}
	return &Presence{conn: conn}, nil
}

// Check proves the presence session is alive.
func (p *Presence) Check(ctx context.Context) error {
	_, err := p.conn.Exec(ctx, "SELECT 1")
	return dbErr("store.Presence.Check", err)
}

// Release drops the lock by closing its session: the node is gone.
func (p *Presence) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.conn.Conn().Close(ctx)
	p.conn.Release()
}

// NodePresence is whether each registered api node holds its presence
// lock, with the database's clock at the same instant.
type NodePresence struct {
	Present map[string]bool
	Now     time.Time
}

// PresentNodes reads every api node's presence.
func (s *Store) PresentNodes(ctx context.Context) (NodePresence, error) {
	rows, err := s.pool.Query(ctx, `SELECT n.node_id,
		EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.granted AND l.classid = $1::bigint::oid
		        AND l.objid = (hashtext(n.node_id) & 2147483647)::bigint::oid AND l.objsubid = 2),
		now()
		FROM nodes n WHERE n.role = 'api'`, int64(presenceClass))
	if err != nil {
		return NodePresence{}, dbErr("store.PresentNodes", err)
	}
	defer rows.Close()
	out := NodePresence{Present: map[string]bool{}}
	for rows.Next() {
		var id string
		var present bool
		if err := rows.Scan(&id, &present, &out.Now); err != nil {
			return NodePresence{}, dbErr("store.PresentNodes", err)
		}
		out.Present[id] = present
	}
	if err := rows.Err(); err != nil {
		return NodePresence{}, dbErr("store.PresentNodes", err)
	}
	if out.Now.IsZero() {
		if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&out.Now); err != nil {
			return NodePresence{}, dbErr("store.PresentNodes", err)
		}
	}
	return out, nil
}

// TerminateNodeSessions ends every Postgres session of node (by its
// application_name, NodeApplicationName) and returns how many. The
// controller calls it before it recovers the partitions of a node that is
// connected but stopped renewing (paused, wedged): a transaction such a
// node left open holds its lease rows (FOR KEY SHARE) and would hold the
// recovery up until Postgres's idle_in_transaction_session_timeout. Ending
// it rolls back what it had not committed, which its clients never saw
// acknowledged; its epoch is fenced by the recovery either way (R20).
func (s *Store) TerminateNodeSessions(ctx context.Context, node string) (int, error) {
	prefix := NodeApplicationName(node, "")
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		  AND (application_name = $1 OR left(application_name, length($1) + 1) = $1 || '/')`, prefix).Scan(&n)
	return n, dbErr("store.TerminateNodeSessions", err)
}

// SetNodeDraining marks an api node draining (the controller hands its
// partitions off and places nothing there: a retirement the controller
// chose, R125) or not any more. CodeNotFound for an unknown api node.
func (s *Store) SetNodeDraining(ctx context.Context, node string, draining bool) error {
	n, err := s.q.SetNodeDraining(ctx, s.pool, dbsqlc.SetNodeDrainingParams{NodeID: node, Draining: draining})
	if err == nil && n == 0 {
		err = errNoRows
	}
	return dbErr("store.SetNodeDraining", err)
}

// Schedule is a calendar-scheduled plan (ZBP-5 R127, R128).
type Schedule struct {
	Name       string
	Cron       string
	Action     string
	Args       json.RawMessage
	Lead       time.Duration
	By         string
	Reason     string
	NextRun    time.Time
	LastRun    time.Time
	LastResult string
}

func scheduleFromRow(r dbsqlc.ControllerSchedule) Schedule {
	return Schedule{Name: r.Name, Cron: r.Cron, Action: r.Action, Args: json.RawMessage(r.Args), Lead: time.Duration(r.LeadMs) * time.Millisecond,
		By: r.CreatedBy, Reason: r.Reason, NextRun: r.NextRunAt.Time, LastRun: r.LastRunAt.Time, LastResult: r.LastResult.String}
}

// PutSchedule adds or replaces a schedule.
func (s *Store) PutSchedule(ctx context.Context, sc Schedule) error {
	args := []byte(sc.Args)
	if len(args) == 0 {
		args = []byte("{}")
	}
	return dbErr("store.PutSchedule", s.q.UpsertSchedule(ctx, s.pool, dbsqlc.UpsertScheduleParams{
		Name: sc.Name, Cron: sc.Cron, Action: sc.Action, Args: args, LeadMs: sc.Lead.Milliseconds(),
		CreatedBy: sc.By, Reason: sc.Reason, NextRunAt: ts(sc.NextRun),
	}))
}

// Schedules returns every schedule, the next to run first.
func (s *Store) Schedules(ctx context.Context) ([]Schedule, error) {
	rows, err := s.q.ListSchedules(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.Schedules", err)
	}
	out := make([]Schedule, len(rows))
	for i, r := range rows {
		out[i] = scheduleFromRow(r)
	}
	return out, nil
}

// DeleteSchedule removes a schedule; false when there was none.
func (s *Store) DeleteSchedule(ctx context.Context, name string) (bool, error) {
	n, err := s.q.DeleteSchedule(ctx, s.pool, name)
	return n == 1, dbErr("store.DeleteSchedule", err)
}

// DueSchedules returns the schedules whose next run is due (database clock).
func (s *Store) DueSchedules(ctx context.Context) ([]Schedule, error) {
	rows, err := s.q.DueSchedules(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.DueSchedules", err)
	}
	out := make([]Schedule, len(rows))
	for i, r := range rows {
		out[i] = scheduleFromRow(r)
	}
	return out, nil
}

// RecordScheduleRun records a run of sc (due at sc.NextRun) and its next;
// false when another run recorded it first.
func (s *Store) RecordScheduleRun(ctx context.Context, sc Schedule, result string, next time.Time) (bool, error) {
	n, err := s.q.RecordScheduleRun(ctx, s.pool, dbsqlc.RecordScheduleRunParams{
		Name: sc.Name, Due: ts(sc.NextRun), LastResult: pgtype.Text{String: result, Valid: true}, NextRunAt: ts(next)})
	return n == 1, dbErr("store.RecordScheduleRun", err)
}

// MeasuredMoves returns how many moves of kind were published in the last
// 30 days and the p99 of their durations, started to published (R128).
func (s *Store) MeasuredMoves(ctx context.Context, kind authority.HandoffKind) (int64, time.Duration, error) {
	r, err := s.q.MeasuredMoveSeconds(ctx, s.pool, string(kind))
	if err != nil {
		return 0, 0, dbErr("store.MeasuredMoves", err)
	}
	return r.N, time.Duration(r.P99 * float64(time.Second)), nil
}
