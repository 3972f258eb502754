package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

func TestNodeLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	n, err := s.RegisterNode(ctx, store.Node{ID: "api-1", Datacenter: "eu-1", Role: "api", Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if n.State != "up" || n.Class != "standard" || n.HeartbeatAt.IsZero() {
		t.Fatalf("registered %+v", n)
	}
	if err := s.HeartbeatNode(ctx, "api-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.HeartbeatNode(ctx, "ghost"); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("heartbeat of an unknown node: %v, want not_found", err)
	}
	// A fresh heartbeat is not pruned; a stale one is (database clock).
	if ids, err := s.PruneNodes(ctx, time.Hour); err != nil || len(ids) != 0 {
		t.Fatalf("pruned %v (%v)", ids, err)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE nodes SET heartbeat_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	ids, err := s.PruneNodes(ctx, time.Hour)
	if err != nil || len(ids) != 1 || ids[0] != "api-1" {
		t.Fatalf("pruned %v (%v)", ids, err)
	}
	// Bad identifiers are refused by the table itself, not only by Go.
	_, err = s.RegisterNode(ctx, store.Node{ID: "bad id", Datacenter: "eu-1", Role: "api"})
	if !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid}) {
		t.Fatalf("bad node id: %v", err)
	}
	all, err := s.ListNodes(ctx)
	if err != nil || len(all) != 1 || all[0].State != "down" {
		t.Fatalf("list: %+v (%v)", all, err)
	}
}
