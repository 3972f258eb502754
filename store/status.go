package store

import (
	"context"
	"time"
)

// PlacementHealth is a datacenter's placements by state.
type PlacementHealth struct {
	Datacenter                         string
	Verified, Pending, Failed, Revoked int64
}

// SweepBacklog is what the sweeps still owe.
type SweepBacklog struct {
	ExpiredUploads  int64
	ExpiredOldest   time.Duration
	StagedUndeleted int64
	OwedDeletions   int64
	OwedOldest      time.Duration
}

// PlacementHealthByDatacenter returns every datacenter's placements by
// state (the status page).
func (s *Store) PlacementHealthByDatacenter(ctx context.Context) ([]PlacementHealth, error) {
	rows, err := s.q.StatusPlacementHealth(ctx, s.pool)
	if isUndefinedTable(err) {
		return nil, nil // the ledger is made by the first placement write: none yet
	}
	if err != nil {
		return nil, dbErr("store.PlacementHealthByDatacenter", err)
	}
	var out []PlacementHealth
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].Datacenter != r.Datacenter {
			out = append(out, PlacementHealth{Datacenter: r.Datacenter})
		}
		h := &out[len(out)-1]
		switch r.State {
		case "verified":
			h.Verified = r.Placements
		case "pending":
			h.Pending = r.Placements
		case "failed":
			h.Failed = r.Placements
		case "revoked":
			h.Revoked = r.Placements
		}
	}
	return out, nil
}

// SweepBacklogNow returns what the sweeps owe now.
func (s *Store) SweepBacklogNow(ctx context.Context) (SweepBacklog, error) {
	r, err := s.q.StatusSweepBacklog(ctx, s.pool)
	if err != nil {
		return SweepBacklog{}, dbErr("store.SweepBacklogNow", err)
	}
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)).Round(time.Second) }
	return SweepBacklog{ExpiredUploads: r.ExpiredUploads, ExpiredOldest: sec(r.ExpiredOldestSeconds), StagedUndeleted: r.StagedUndeleted,
		OwedDeletions: r.OwedDeletions, OwedOldest: sec(r.OwedOldestSeconds)}, nil
}
