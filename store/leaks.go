package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// No leaked bytes (issue 29, L1; docs/sweeps.md): the ledger side of
// reclaiming what a crash leaves behind.
//
// A pending placement is evidence that a write is in flight, and owns its
// digest (no sweep deletes the bytes) for as long as it is pending. Its
// writer is an upload, whose intent claims the digest from before the
// stage until the intent is admitted or abandoned, or a replication
// transfer, which stages while its River job runs. A pending row with
// neither left (an api killed between writing the bytes and verifying the
// placement) would own the digest forever. SettleStalePlacements fails it
// instead: no timer decides, only the absence of every writer, re-checked
// under the digest's stage lock and fenced by the generation read, so a
// stage of a newer upload or transfer wins (S3, S6). Its bytes are then
// owned by nothing and the collector or the inventory reclaims them.
//
// The inventory's guard (sweep.Judge) reads and writes this database's
// side of each backend's ownership marker here (table backend_markers).

// StalePlacements lists up to limit pending placements, oldest first,
// that no writer can still verify (no pending intent claims the digest,
// no replicate job into the datacenter is unfinished), from an unlocked
// read: FailStalePlacements decides them again under the locks. Before
// the ledger exists there are none. Errors: invalid, unavailable.
func (s *Store) StalePlacements(ctx context.Context, limit int) ([]placement.Placement, error) {
	n, err := batch(limit)
	if err != nil {
		return nil, err
	}
	rows, err := s.q.StalePendingPlacements(ctx, s.pool, n)
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, dbErr("stale placements", err)
	}
	out := make([]placement.Placement, len(rows))
	for i, r := range rows {
		out[i] = placement.Placement{
			Key:   placement.Key{Digest: blobplane.Digest(r.Digest), Backend: r.Backend, Datacenter: r.Datacenter, Location: r.Location},
			State: placement.Pending, Generation: r.Generation,
		}
	}
	return out, nil
}

// FailStalePlacements decides the candidates of StalePlacements (their
// keys and generations), in transactions of a bounded batch: under the
// digests' stage locks, a row still pending at that generation whose
// writer is still gone becomes failed (source_unavailable) under a new
// epoch, and its digest is handed back to the collector when a verified
// copy is left somewhere (HandBackToCollector). A row staged, verified or
// failed since, or whose digest an intent claims again, is left alone.
// It returns the rows it failed. Errors: unavailable.
func (s *Store) FailStalePlacements(ctx context.Context, candidates []placement.Placement) ([]placement.Placement, error) {
	var out []placement.Placement
	for len(candidates) > 0 {
		n := min(len(candidates), collectTxBatch)
		failed, err := s.failStaleBatch(ctx, candidates[:n])
		out = append(out, failed...)
		if err != nil {
			return out, err
		}
		candidates = candidates[n:]
	}
	return out, nil
}

func (s *Store) failStaleBatch(ctx context.Context, cs []placement.Placement) ([]placement.Placement, error) {
	arg := dbsqlc.FailStalePlacementsParams{}
	for _, c := range cs {
		arg.Digests = append(arg.Digests, string(c.Key.Digest))
		arg.Backends = append(arg.Backends, c.Key.Backend)
		arg.Datacenters = append(arg.Datacenters, c.Key.Datacenter)
		arg.Locations = append(arg.Locations, c.Key.Location)
		arg.Generations = append(arg.Generations, c.Generation)
	}
	var out []placement.Placement
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out = nil
		ds := slices.Compact(slices.Sorted(slices.Values(arg.Digests)))
		if err := s.q.LockPlacementDigests(ctx, tx, dbsqlc.LockPlacementDigestsParams{LockClass: placementDigestLockClass, Digests: ds}); err != nil {
			return err
		}
		rows, err := s.q.FailStalePlacements(ctx, tx, arg)
		if err != nil || len(rows) == 0 {
			return err
		}
		failed := make([]string, 0, len(rows))
		for _, r := range rows {
			out = append(out, placementFromRow(r))
			failed = append(failed, r.Digest)
		}
		slices.Sort(failed)
		_, err = s.q.HandBackToCollector(ctx, tx, slices.Compact(failed))
		return err
	})
	if err != nil {
		return nil, placementErr("fail stale placements", err)
	}
	return out, nil
}

// SettleStalePlacements is StalePlacements then FailStalePlacements:
// one pass of the collector's first step. Errors: invalid, unavailable.
func (s *Store) SettleStalePlacements(ctx context.Context, limit int) ([]placement.Placement, error) {
	cs, err := s.StalePlacements(ctx, limit)
	if err != nil || len(cs) == 0 {
		return nil, err
	}
	return s.FailStalePlacements(ctx, cs)
}

// HandBack makes digests the collector's when they have a verified
// placement and no blob state row (or a collected one): what the
// abandoning transaction does for the content of an abandoned upload
// (docs/sweeps.md, "the hand-back"), for bytes the inventory found
// verified with nothing to collect them (ClassUnowned). The collector
// then decides them like any unowned digest, under its locks. It returns
// the blob rows made or revived. Errors: unavailable.
func (s *Store) HandBack(ctx context.Context, ds []blobplane.Digest) (int64, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	if err := s.ensurePlacements(ctx); err != nil {
		return 0, err
	}
	in := make([]string, len(ds))
	for i, d := range ds {
		in[i] = string(d)
	}
	n, err := s.q.HandBackToCollector(ctx, s.pool, in)
	if err != nil {
		return 0, dbErr("hand back", err)
	}
	return n, nil
}

// BackendRecord is this database's side of one backend's ownership marker
// (table backend_markers) and what the guard needs besides.
type BackendRecord struct {
	// Cluster is this database's identity ("" until a first adoption
	// made it).
	Cluster string
	// Adopted: the database has claimed the backend. The fields below
	// are its record's.
	Adopted bool
	// Pass is the number of inventory passes that found the marker in
	// agreement (1: the adoption).
	Pass int64
	// MarkerWritten: the marker was confirmed written at Pass or later;
	// false while an adoption is half done.
	MarkerWritten bool
	// CappedPass is the pass that found more deletions due than the cap
	// and only reported them (0: none pending).
	CappedPass int64
	// HasPlacements: the ledger knows a placement on the backend in the
	// datacenter (a database that knows none looks empty).
	HasPlacements bool
}

// BackendRecord reads this database's record of the backend named
// backend in datacenter. Errors: unavailable.
func (s *Store) BackendRecord(ctx context.Context, datacenter, backend string) (BackendRecord, error) {
	const op = "backend record"
	var rec BackendRecord
	ids, err := s.q.GetClusterIdentity(ctx, s.pool)
	if err != nil {
		return rec, dbErr(op, err)
	}
	if len(ids) > 0 {
		rec.Cluster = ids[0].String()
	}
	rows, err := s.q.GetBackendMarker(ctx, s.pool, dbsqlc.GetBackendMarkerParams{Datacenter: datacenter, Backend: backend})
	if err != nil {
		return rec, dbErr(op, err)
	}
	if len(rows) > 0 {
		rec.fill(rows[0])
	}
	rec.HasPlacements, err = s.q.BackendHasPlacements(ctx, s.pool, dbsqlc.BackendHasPlacementsParams{Datacenter: datacenter, Backend: backend})
	if isUndefinedTable(err) {
		return rec, nil // no ledger yet: no placement
	}
	return rec, dbErr(op, err)
}

func (rec *BackendRecord) fill(r dbsqlc.BackendMarker) {
	rec.Adopted = true
	rec.Pass = r.Pass
	rec.MarkerWritten = r.MarkerWrittenAt.Valid
	rec.CappedPass = 0
	if r.CappedPass.Valid {
		rec.CappedPass = r.CappedPass.Int64
	}
}

// AdoptBackend claims the backend for this database (its first inventory
// pass found no marker and no record): the database's identity is made
// if it has none, and the record written at pass 1 with the marker not
// yet confirmed (the caller writes it, then ConfirmMarkerWritten). A
// concurrent adoption's record comes back unchanged. Errors: unavailable.
func (s *Store) AdoptBackend(ctx context.Context, datacenter, backend string) (BackendRecord, error) {
	return s.adopt(ctx, "adopt backend", func(tx pgx.Tx) (dbsqlc.BackendMarker, error) {
		return s.q.AdoptBackend(ctx, tx, dbsqlc.AdoptBackendParams{Datacenter: datacenter, Backend: backend})
	})
}

// ReadoptBackend is an operator's adoption of a backend the guard refuses
// (after checking it belongs here: a replaced disk or bucket, a database
// restored on purpose): the record is made or reset with its pass past
// markerPass (the pass the backend's marker names, 0 for none) and the
// marker not yet confirmed. Errors: unavailable.
func (s *Store) ReadoptBackend(ctx context.Context, datacenter, backend string, markerPass int64) (BackendRecord, error) {
	return s.adopt(ctx, "re-adopt backend", func(tx pgx.Tx) (dbsqlc.BackendMarker, error) {
		return s.q.ReadoptBackend(ctx, tx, dbsqlc.ReadoptBackendParams{Datacenter: datacenter, Backend: backend, Pass: max(markerPass, 0) + 1})
	})
}

func (s *Store) adopt(ctx context.Context, op string, write func(pgx.Tx) (dbsqlc.BackendMarker, error)) (BackendRecord, error) {
	var rec BackendRecord
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		id, err := s.q.EnsureClusterIdentity(ctx, tx)
		if err != nil {
			return err
		}
		row, err := write(tx)
		if err != nil {
			return err
		}
		rec = BackendRecord{Cluster: id.String()}
		rec.fill(row)
		return nil
	})
	if err != nil {
		return BackendRecord{}, dbErr(op, err)
	}
	return rec, nil
}

// ConfirmMarkerWritten records that the marker naming pass (or a later
// one) was written on the backend, finishing an adoption. Errors:
// not_found (no record at that pass or later), unavailable.
func (s *Store) ConfirmMarkerWritten(ctx context.Context, datacenter, backend string, pass int64) error {
	n, err := s.q.ConfirmMarkerWritten(ctx, s.pool, dbsqlc.ConfirmMarkerWrittenParams{Datacenter: datacenter, Backend: backend, Pass: pass})
	if err == nil && n == 0 {
		err = pgx.ErrNoRows
	}
	return dbErr("confirm marker written", err)
}

// ErrMarkerAhead is returned (wrapped, code conflict) by
// AdvanceInventoryPass when the backend's marker names a pass the
// database has not reached, or its record was never confirmed: the
// database was restored from before that pass.
var ErrMarkerAhead = errors.New("the backend's marker is ahead of this database's record")

// AdvanceInventoryPass advances the backend's record past markerPass (the
// pass its marker names), for a pass that found the marker in agreement;
// the caller then rewrites the marker with the record's new pass. The
// record comes back without Cluster and HasPlacements (the caller read
// them with BackendRecord). Errors: conflict wrapping ErrMarkerAhead,
// unavailable.
func (s *Store) AdvanceInventoryPass(ctx context.Context, datacenter, backend string, markerPass int64) (BackendRecord, error) {
	const op = "advance inventory pass"
	row, err := s.q.AdvanceInventoryPass(ctx, s.pool, dbsqlc.AdvanceInventoryPassParams{Datacenter: datacenter, Backend: backend, MarkerPass: markerPass})
	if errors.Is(err, pgx.ErrNoRows) {
		return BackendRecord{}, &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: fmt.Sprintf("%s/%s: marker at pass %d", datacenter, backend, markerPass), Err: ErrMarkerAhead}
	}
	if err != nil {
		return BackendRecord{}, dbErr(op, err)
	}
	var rec BackendRecord
	rec.fill(row)
	return rec, nil
}

// SetInventoryCapped records that pass found more deletions due on the
// backend than the cap and only reported them (0 clears it: a pass found
// no more than the cap). Errors: unavailable.
func (s *Store) SetInventoryCapped(ctx context.Context, datacenter, backend string, pass int64) error {
	err := s.q.SetInventoryCapped(ctx, s.pool, dbsqlc.SetInventoryCappedParams{
		Datacenter: datacenter, Backend: backend, CappedPass: pgtype.Int8{Int64: pass, Valid: pass > 0},
	})
	return dbErr("set inventory capped", err)
}

// OwnedStagedUploads returns which of the staged upload ids an intent of
// the backend in datacenter still owns: a pending intent's, or an
// abandoned one's whose staged bytes the reaper still has to delete. The
// others no intent will ever delete. Errors: unavailable.
func (s *Store) OwnedStagedUploads(ctx context.Context, datacenter, backend string, ids []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.q.OwnedStagedUploads(ctx, s.pool, dbsqlc.OwnedStagedUploadsParams{Datacenter: datacenter, Backend: backend, Ids: ids})
	if err != nil {
		return nil, dbErr("owned staged uploads", err)
	}
	for _, id := range rows {
		out[id] = true
	}
	return out, nil
}
