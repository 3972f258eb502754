package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/jobs"
	"github.com/blobplane/blobplane/store"
)

// settlePhase bounds the last shutdown phase: the keeper gives up what it
// still holds, the node row is marked down, the presence lock released.
const settlePhase = 5 * time.Second

// checkShutdownBudget refuses to boot when the shutdown phases cannot fit
// the platform's termination budget (ZBP-5 R85): drain (hand every
// partition off, R83) + listener (in-flight requests) + settle must fit
// BLOBPLANE_SHUTDOWN_BUDGET, and the handoffs of the partitions this node
// may hold — at most controller.DefaultSettings.MaxPerNode at a time,
// each bounded by BLOBPLANE_HANDOFF_DEADLINE — must fit the drain. If the
// phases overran, the last one (which records what was left) would never
// run, and the shutdown would look clean.
func checkShutdownBudget(cfg *config.Config, partitionsHere int) error {
	phases := cfg.DrainTimeout + cfg.ShutdownTimeout + settlePhase
	if phases > cfg.ShutdownBudget {
		return fmt.Errorf("shutdown phases do not fit the termination budget (ZBP-5 R85): BLOBPLANE_DRAIN_TIMEOUT %s + BLOBPLANE_SHUTDOWN_TIMEOUT %s + settle %s = %s > BLOBPLANE_SHUTDOWN_BUDGET %s; raise the budget (and the platform's grace period with it) or shorten the phases",
			cfg.DrainTimeout, cfg.ShutdownTimeout, settlePhase, phases, cfg.ShutdownBudget)
	}
	per := controller.DefaultSettings.MaxPerNode
	rounds := (partitionsHere + per - 1) / per
	if need := time.Duration(rounds) * cfg.HandoffDeadline; need > cfg.DrainTimeout {
		return fmt.Errorf("handing off %d partitions, %d at a time within BLOBPLANE_HANDOFF_DEADLINE %s each, needs up to %s > BLOBPLANE_DRAIN_TIMEOUT %s (ZBP-5 R83, R85): raise the drain timeout, shorten the deadline, or add api nodes",
			partitionsHere, per, cfg.HandoffDeadline, need, cfg.DrainTimeout)
	}
	return nil
}

// partitionsHere estimates how many partitions this node may hold at
// shutdown: those the published map names it primary of, or, for a node
// the map does not know yet, its even share over the api nodes up.
func partitionsHere(ctx context.Context, st *store.Store, nodeID string) (int, error) {
	m, err := st.LatestMap(ctx)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	named := 0
	for _, p := range m.Partitions {
		if p.Primary.Node == nodeID {
			named++
		}
	}
	if named > 0 {
		return named, nil
	}
	nodes, err := st.PlacementNodes(ctx)
	if err != nil {
		return 0, err
	}
	up := 1
	for _, n := range nodes {
		if n.Up && n.ID != nodeID {
			up++
		}
	}
	return (len(m.Partitions) + up - 1) / up, nil
}

// holdPresence keeps this node's presence lock (store.HoldPresence) while
// ctx lives: the controller recovers a dead node's partitions as soon as
// their leases expire, a present node's only after a grace. A lost
// session is re-opened.
func (a *API) holdPresence(ctx context.Context) {
	var p *store.Presence
	defer func() {
		if p != nil {
			p.Release()
		}
	}()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	warned := false
	for {
		if p != nil {
			if err := p.Check(ctx); err != nil && ctx.Err() == nil {
				a.logger.Warn("presence lock session lost; taking it again", "err", err)
				p.Release()
				p = nil
			}
		}
		if p == nil {
			var err error
			p, err = a.leases.HoldPresence(ctx, a.cfg.NodeID)
			if err != nil && ctx.Err() == nil && !warned {
				warned = true
				a.logger.Warn("presence lock not held (another live process with this node id?); retrying", "node_id", a.cfg.NodeID, "err", err)
			}
			if err == nil {
				warned = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drain is the first shutdown phase (ZBP-5 R83, R84): announce the drain,
// then, while the listener still serves, wait for the running controller
// to hand every partition off and publish a map that no longer names this
// node, up to BLOBPLANE_DRAIN_TIMEOUT. Without a controller the keeper
// releases the leases in the next phase and the partitions wait for one.
func (a *API) drain(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.DrainTimeout)
	defer cancel()
	if err := a.store.MarkNodeDraining(dctx, a.cfg.NodeID); err != nil {
		a.logger.Warn("drain: mark node draining", "err", err)
		return
	}
	leases, named := a.keeper.Holding()
	if leases+named == 0 {
		return
	}
	if why := a.cannotHandOff(dctx); why != "" {
		a.logger.Warn("drain: nothing can take the partitions ("+why+"); they are released and wait for a node and `controller run`",
			"leases", leases)
		return
	}
	start := time.Now()
	a.logger.Info("drain: handing partitions off", "leases", leases, "named_in_map", named, "timeout", a.cfg.DrainTimeout)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for i := 1; ; i++ {
		l, n := a.keeper.Holding()
		if l+n == 0 {
			a.logger.Info("drain: every partition handed off", "took", time.Since(start))
			return
		}
		if i%25 == 0 { // every half second: the fleet may be stopping with us
			if why := a.cannotHandOff(dctx); why != "" {
				a.logger.Warn("drain: stopped waiting ("+why+"); the rest are released", "leases", l, "named_in_map", n, "took", time.Since(start))
				return
			}
		}
		select {
		case <-dctx.Done():
			a.logger.Warn("drain: timeout; the rest are released", "leases", l, "named_in_map", n, "took", time.Since(start))
			return
		case <-t.C:
		}
	}
}

// checkShutdown fills the shutdown settings left zero with their defaults
// and checks them against the partitions this node may hold (R85).
func (a *API) checkShutdown(ctx context.Context) error {
	cfg := a.cfg
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 20 * time.Second
	}
	if cfg.ShutdownBudget <= 0 {
		cfg.ShutdownBudget = 60 * time.Second
	}
	if cfg.HandoffDeadline <= 0 {
		cfg.HandoffDeadline = 5 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	n, err := partitionsHere(ctx, a.store, cfg.NodeID)
	if err != nil {
		return err
	}
	return checkShutdownBudget(cfg, n)
}

// wakeFinalizations retries the finalize jobs in backoff whenever a map
// is published (jobs.WakeFinalizations), until ctx ends.
func wakeFinalizations(ctx context.Context, st *store.Store, client *river.Client[pgx.Tx], logger *slog.Logger) {
	maps := make(chan struct{}, 1)
	stop := st.StartCaches(ctx, store.CacheOptions{MapPublished: func() {
		select {
		case maps <- struct{}{}:
		default:
		}
	}})
	defer stop()
	for {
		// Also at each start of the listener: a publication may have
		// landed while it was not listening (or this worker was down).
		select {
		case <-ctx.Done():
			return
		case <-maps:
		}
		n, err := jobs.WakeFinalizations(ctx, client)
		if err != nil && ctx.Err() == nil {
			logger.Warn("wake finalize jobs after a map publication", "err", err)
		}
		if n > 0 {
			logger.Info("a map was published: finalize jobs in backoff retried now", "jobs", n)
		}
	}
}

// cannotHandOff says why no handoff off this node can happen now ("" when
// one can): no controller service is running, or no other api node is up,
// fresh and not draining (the whole fleet stopping, `make run`'s Ctrl-C).
func (a *API) cannotHandOff(ctx context.Context) string {
	running, err := a.store.ControllerRunning(ctx)
	if err != nil {
		return "cannot read the controller lock: " + err.Error()
	}
	if !running {
		return "no controller service is running"
	}
	nodes, err := a.store.PlacementNodes(ctx)
	if err != nil {
		return "cannot read the nodes: " + err.Error()
	}
	for _, n := range nodes {
		if n.ID != a.cfg.NodeID && n.Up && !n.Draining && n.HeartbeatAge < controller.DefaultSettings.NodeDeadAfter {
			return ""
		}
	}
	return "no other api node is up and not draining"
}
