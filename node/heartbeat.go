// Package node keeps this process's row in the nodes table alive: it
// registers at start, heartbeats on an interval, and marks itself down on a
// clean stop.
package node

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// HeartbeatInterval is how often a node refreshes its row.
const HeartbeatInterval = 15 * time.Second

// Heartbeater is a start/stop service owning one node row.
type Heartbeater struct {
	Store    *store.Store
	Logger   *slog.Logger
	Node     store.Node
	Interval time.Duration
	// Report, when set, is called on every heartbeat for what the node
	// believes (map version, primaries), recorded with the heartbeat.
	Report func() (mapVersion uint64, primaries []authority.PrimaryReport)
}

// Register writes the node row; call before serving.
func (h *Heartbeater) Register(ctx context.Context) error {
	_, err := h.Store.RegisterNode(ctx, h.Node)
	return err
}

func (h *Heartbeater) beat(ctx context.Context) error {
	if h.Report == nil {
		return h.Store.HeartbeatNode(ctx, h.Node.ID)
	}
	v, ps := h.Report()
	return h.Store.ReportNode(ctx, h.Node.ID, v, ps)
}

// Run heartbeats until ctx ends, then marks the node down.
func (h *Heartbeater) Run(ctx context.Context) {
	interval := h.Interval
	if interval <= 0 {
		interval = HeartbeatInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := h.Store.MarkNodeDown(stopCtx, h.Node.ID); err != nil {
				h.Logger.Warn("mark node down", "err", err)
			}
			return
		case <-t.C:
			err := h.beat(ctx)
			if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
				err = h.Register(ctx)
			}
			if err != nil && ctx.Err() == nil {
				h.Logger.Warn("node heartbeat", "err", err)
			}
		}
	}
}
