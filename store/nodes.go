package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Node is one registered Blobplane process.
type Node struct {
	ID          string
	Datacenter  string
	Role        string
	Endpoint    string
	Class       string
	Capacity    int
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	State       string
	// ReadsFormat is the cluster format level the node's running process
	// reads (0: it reported none: an older build, which reads level 1).
	// RegisterNode reports this build's, formats.Reads, whatever the
	// field holds.
	ReadsFormat int
}

func nodeFromRow(r dbsqlc.Node) Node {
	return Node{
		ID: r.NodeID, Datacenter: r.Datacenter, Role: r.Role, Endpoint: r.Endpoint,
		Class: r.Class, Capacity: int(r.Capacity), Version: r.Version,
		StartedAt: r.StartedAt.Time, HeartbeatAt: r.HeartbeatAt.Time, State: r.State,
		ReadsFormat: readsFormat(r),
	}
}

// readsFormat is the level r's running process reported (0: none, or an
// older binary registered since: it moved started_at and not the report).
func readsFormat(r dbsqlc.Node) int {
	if !r.ReadsFormat.Valid || !r.ReadsFormatStartedAt.Valid || !r.ReadsFormatStartedAt.Time.Equal(r.StartedAt.Time) {
		return 0
	}
	return int(r.ReadsFormat.Int16)
}

// RegisterNode inserts or refreshes this process's node row, marking it up
// with the database clock, and reports the format level this build reads
// (formats.Reads). Errors: conflict when this build does not read the
// cluster's format level (a rollback past finalize: the migration's
// trigger refuses the row).
func (s *Store) RegisterNode(ctx context.Context, n Node) (Node, error) {
	if n.Class == "" {
		n.Class = "standard"
	}
	row, err := s.q.UpsertNode(ctx, s.pool, dbsqlc.UpsertNodeParams{
		NodeID: n.ID, Datacenter: n.Datacenter, Role: n.Role, Endpoint: n.Endpoint,
		Class: n.Class, Capacity: int32(n.Capacity), Version: n.Version,
		ReadsFormat: pgtype.Int2{Int16: formats.Reads, Valid: true},
	})
	if err != nil {
		return Node{}, dbErr("register node", err)
	}
	return nodeFromRow(row), nil
}

// HeartbeatNode refreshes heartbeat_at; it returns a not-found error when the
// row is gone (the caller re-registers).
func (s *Store) HeartbeatNode(ctx context.Context, id string) error {
	n, err := s.q.HeartbeatNode(ctx, s.pool, id)
	if err != nil {
		return dbErr("heartbeat node", err)
	}
	if n == 0 {
		return dbErr("heartbeat node", errNoRows)
	}
	return nil
}

// MarkNodeDown records a clean stop.
func (s *Store) MarkNodeDown(ctx context.Context, id string) error {
	_, err := s.q.MarkNodeDown(ctx, s.pool, id)
	return dbErr("mark node down", err)
}

// PruneNodes marks down every node whose heartbeat is older than olderThan
// (database clock) and returns their ids.
func (s *Store) PruneNodes(ctx context.Context, olderThan time.Duration) ([]string, error) {
	ids, err := s.q.PruneNodes(ctx, s.pool, olderThan.Seconds())
	return ids, dbErr("prune nodes", err)
}

// ListNodes returns every registered node ordered by datacenter and id.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	rows, err := s.q.ListNodes(ctx, s.pool)
	if err != nil {
		return nil, dbErr("list nodes", err)
	}
	out := make([]Node, len(rows))
	for i, r := range rows {
		out[i] = nodeFromRow(r)
	}
	return out, nil
}

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
