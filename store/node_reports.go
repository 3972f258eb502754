package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// NodeReport is what an up api node last reported believing: the map
// version it serves from and the partitions it holds as primary.
type NodeReport struct {
	Node       string
	MapVersion uint64
	Primaries  []authority.PrimaryReport
}

type primaryJSON struct {
	Partition string `json:"partition"`
	Epoch     uint64 `json:"epoch"`
}

// ReportNode is a heartbeat that also records the node's map version and
// the partitions it believes it is primary for (R134, R139). Not found when
// the node row is gone (the caller re-registers).
func (s *Store) ReportNode(ctx context.Context, id string, mapVersion uint64, primaries []authority.PrimaryReport) error {
	ps := make([]primaryJSON, 0, len(primaries))
	for _, p := range primaries {
		ps = append(ps, primaryJSON{Partition: p.Partition, Epoch: p.Epoch})
	}
	doc, err := json.Marshal(ps)
	if err != nil {
		return err
	}
	n, err := s.q.ReportNode(ctx, s.pool, dbsqlc.ReportNodeParams{NodeID: id, MapVersion: int64(mapVersion), Primaries: doc})
	if err != nil {
		return dbErr("report node", err)
	}
	if n == 0 {
		return dbErr("report node", errNoRows)
	}
	return nil
}

// NodeReports returns the last report of every up api node.
func (s *Store) NodeReports(ctx context.Context) ([]NodeReport, error) {
	rows, err := s.q.NodeReports(ctx, s.pool)
	if err != nil {
		return nil, dbErr("node reports", err)
	}
	out := make([]NodeReport, 0, len(rows))
	for _, r := range rows {
		var ps []primaryJSON
		if err := json.Unmarshal(r.Primaries, &ps); err != nil {
			return nil, fmt.Errorf("node reports: node %s: %w", r.NodeID, err)
		}
		rep := NodeReport{Node: r.NodeID, MapVersion: uint64(r.MapVersion)}
		for _, p := range ps {
			rep.Primaries = append(rep.Primaries, authority.PrimaryReport{Node: r.NodeID, Partition: p.Partition, Epoch: p.Epoch})
		}
		out = append(out, rep)
	}
	return out, nil
}

// AuthorityReports flattens NodeReports for the authority alarms: node →
// map version in use, and every primary claim.
func (s *Store) AuthorityReports(ctx context.Context) (map[string]uint64, []authority.PrimaryReport, error) {
	reps, err := s.NodeReports(ctx)
	if err != nil {
		return nil, nil, err
	}
	versions := make(map[string]uint64, len(reps))
	var claims []authority.PrimaryReport
	for _, r := range reps {
		versions[r.Node] = r.MapVersion
		claims = append(claims, r.Primaries...)
	}
	return versions, claims, nil
}
