package store

import (
	"context"
	"time"

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
}

func nodeFromRow(r dbsqlc.Node) Node {
	return Node{
		ID: r.NodeID, Datacenter: r.Datacenter, Role: r.Role, Endpoint: r.Endpoint,
		Class: r.Class, Capacity: int(r.Capacity), Version: r.Version,
		StartedAt: r.StartedAt.Time, HeartbeatAt: r.HeartbeatAt.Time, State: r.State,
	}
}

// RegisterNode inserts or refreshes this process's node row, marking it up
// with the database clock.
func (s *Store) RegisterNode(ctx context.Context, n Node) (Node, error) {
	if n.Class == "" {
		n.Class = "standard"
	}
	row, err := s.q.UpsertNode(ctx, s.pool, dbsqlc.UpsertNodeParams{
		NodeID: n.ID, Datacenter: n.Datacenter, Role: n.Role, Endpoint: n.Endpoint,
		Class: n.Class, Capacity: int32(n.Capacity), Version: n.Version,
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
