package store

import (
	"context"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The scrub's records (issue 28, migration 00021): which verified
// placements of a datacenter to re-read next, and what each check found.

// ScrubCandidate is a verified placement due for a check.
type ScrubCandidate struct {
	Key         placement.Key
	Size        int64
	Epoch       int64
	LastChecked time.Time // its last check, else its verification
}

// ScrubCandidates lists up to limit verified placements of datacenter,
// never checked first, then the longest ago, after the first skip of
// them. No ledger yet: none.
func (s *Store) ScrubCandidates(ctx context.Context, datacenter string, skip, limit int) ([]ScrubCandidate, error) {
	rows, err := s.q.ScrubCandidates(ctx, s.pool, dbsqlc.ScrubCandidatesParams{Datacenter: datacenter, Skip: int32(skip), MaxRows: int32(limit)})
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, dbErr("scrub candidates", err)
	}
	out := make([]ScrubCandidate, len(rows))
	for i, r := range rows {
		out[i] = ScrubCandidate{
			Key:  placement.Key{Digest: blobplane.Digest(r.Digest), Backend: r.Backend, Datacenter: r.Datacenter, Location: r.Location},
			Size: r.SizeBytes, Epoch: r.Epoch, LastChecked: r.LastChecked.Time,
		}
	}
	return out, nil
}

// Check outcomes a scrub records.
const (
	CheckIntact   = "intact"
	CheckMismatch = "digest_mismatch"
	CheckMissing  = "missing"
)

// RecordPlacementChecks records that each of ks (no key twice) was
// checked now, with outcome, in one statement.
func (s *Store) RecordPlacementChecks(ctx context.Context, ks []placement.Key, outcome string) error {
	if len(ks) == 0 {
		return nil
	}
	arg := dbsqlc.RecordPlacementChecksParams{Outcome: outcome}
	for _, k := range ks {
		arg.Digests = append(arg.Digests, string(k.Digest))
		arg.Backends = append(arg.Backends, k.Backend)
		arg.Datacenters = append(arg.Datacenters, k.Datacenter)
		arg.Locations = append(arg.Locations, k.Location)
	}
	return dbErr("record placement checks", s.q.RecordPlacementChecks(ctx, s.pool, arg))
}

// ScrubLoad is what one datacenter's scrub has to cover.
type ScrubLoad struct {
	Now        time.Time // the database's clock, which check times are on
	TotalBytes int64     // of its verified placements
	DueBytes   int64     // of those last checked (or verified) before Now + dueIn
	OldestAge  time.Duration
}

// ScrubLoad reads datacenter's scrub load; due counts the placements last
// checked before now + dueIn (negative: in the past). No ledger yet:
// nothing to cover.
func (s *Store) ScrubLoad(ctx context.Context, datacenter string, dueIn time.Duration) (ScrubLoad, error) {
	r, err := s.q.ScrubLoad(ctx, s.pool, dbsqlc.ScrubLoadParams{Datacenter: datacenter, DueInSeconds: dueIn.Seconds()})
	if isUndefinedTable(err) {
		return ScrubLoad{}, nil
	}
	if err != nil {
		return ScrubLoad{}, dbErr("scrub load", err)
	}
	return ScrubLoad{Now: r.DbNow.Time, TotalBytes: r.TotalBytes, DueBytes: r.DueBytes, OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second))}, nil
}
