package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// The cluster's format level (ZBP-5 R44, R88; migration 00043, package
// formats): writers of a newer journal or checkpoint format consult it,
// and only RaiseFormatLevel moves it, up.

// ClusterFormat is the cluster's format level and what each registered
// node's running process reads.
type ClusterFormat struct {
	Level    int
	RaisedBy string
	RaisedAt time.Time
	Nodes    []formats.Node
}

// NodesBehindError is why RaiseFormatLevel refused: the live nodes that do
// not read the level asked for. It rides in a conflict *blobplane.Error.
type NodesBehindError struct {
	To    int
	Nodes []formats.Node
}

func (e *NodesBehindError) Error() string {
	names := make([]string, len(e.Nodes))
	for i, n := range e.Nodes {
		names[i] = fmt.Sprintf("%s (%s, reads level %d)", n.ID, n.Role, n.Reading())
	}
	return fmt.Sprintf("%d live node(s) do not read format level %d: %s; upgrade or stop them first", len(e.Nodes), e.To, strings.Join(names, ", "))
}

// FormatLevel is the cluster's format level. Errors: the database's.
func (s *Store) FormatLevel(ctx context.Context) (int, error) {
	row, err := s.q.ClusterFormat(ctx, s.pool)
	if err != nil {
		return 0, dbErr("cluster format level", err)
	}
	return int(row.Level), nil
}

// ClusterFormat is the level, who raised it when, and every node with
// the level its running process reads.
func (s *Store) ClusterFormat(ctx context.Context) (ClusterFormat, error) {
	var out ClusterFormat
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		row, err := s.q.ClusterFormat(ctx, tx)
		if err != nil {
			return err
		}
		out = ClusterFormat{Level: int(row.Level), RaisedBy: row.RaisedBy.String, RaisedAt: timeOf(row.RaisedAt)}
		out.Nodes, err = s.formatNodes(ctx, tx)
		return err
	})
	return out, dbErr("cluster format", err)
}

func (s *Store) formatNodes(ctx context.Context, db dbsqlc.DBTX) ([]formats.Node, error) {
	rows, err := s.q.FormatNodes(ctx, db)
	if err != nil {
		return nil, err
	}
	out := make([]formats.Node, len(rows))
	for i, r := range rows {
		out[i] = formats.Node{ID: r.NodeID, Role: r.Role, ReadsFormat: int(r.ReadsFormat), Up: r.State == "up",
			HeartbeatAge: time.Duration(r.HeartbeatAgeMs) * time.Millisecond}
	}
	return out, nil
}

// RaiseFormatLevel is finalize: it raises the cluster's format level to
// `to` on behalf of by, and returns the level before and after. Under the
// level row's lock (writers that consult the level wait for it), it
// refuses while any live node (formats.Node.Live: up, draining or not,
// with a fresh heartbeat) reads less than `to`; a level already at or
// above `to` is left as it is (idempotent; never lowered). Errors:
// invalid (a level this build does not know), conflict wrapping a
// *NodesBehindError.
func (s *Store) RaiseFormatLevel(ctx context.Context, to int, by string) (before, after int, err error) {
	if err := formats.Check(to); err != nil {
		return 0, 0, err
	}
	if by == "" {
		by = "admin"
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		level, err := s.q.ClusterFormatLevelForUpdate(ctx, tx)
		if err != nil {
			return err
		}
		before, after = int(level), int(level)
		if before >= to {
			return nil
		}
		nodes, err := s.formatNodes(ctx, tx)
		if err != nil {
			return err
		}
		if behind := formats.Behind(to, nodes); len(behind) > 0 {
			e := &NodesBehindError{To: to, Nodes: behind}
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: "raise format level", Message: e.Error(), Err: e}
		}
		if _, err := s.q.RaiseClusterFormat(ctx, tx, dbsqlc.RaiseClusterFormatParams{Level: int16(to), RaisedBy: by}); err != nil {
			return err
		}
		after = to
		return nil
	})
	if e := (*blobplane.Error)(nil); errors.As(err, &e) {
		return before, before, err
	}
	if err != nil {
		return 0, 0, dbErr("raise format level", err)
	}
	return before, after, nil
}

// requireFormatLevel, inside a writer's transaction, reads the level
// under a share lock held to the commit (a finalize in flight is waited
// for) and refuses with conflict, naming what, below level.
func (s *Store) requireFormatLevel(ctx context.Context, tx pgx.Tx, level int, what string) error {
	got, err := s.q.ClusterFormatLevelForShare(ctx, tx)
	if err != nil {
		return err
	}
	if int(got) < level {
		return blobplane.Errorf(blobplane.CodeConflict,
			"%s needs cluster format level %d, and the cluster is at level %d: once every node runs a release that reads level %d, finalize it (`api cluster finalize`, or POST /v1/admin/cluster/format {\"level\": %d})",
			what, level, got, level, level)
	}
	return nil
}
