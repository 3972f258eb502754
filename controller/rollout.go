package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/blobplane/blobplane"
)

// RolloutRequest is a rollout (R80): nodes restarted one at a time, each
// only after a live handoff emptied it.
type RolloutRequest struct {
	Nodes []string
	// DrainWait bounds each node's drain; RestartWait how long the
	// platform (or the operator) has to stop it and start it again.
	DrainWait, RestartWait time.Duration
}

// RolloutEvent is one step of a rollout, for the operator.
type RolloutEvent struct {
	Node, Step string // "draining", "drained", "restarted", "balanced"
}

// Rollout is a rollout as a sequence of handoffs with bounded concurrency
// — one node at a time — never a fleet restart or a platform's own order
// (R80); a rollback is the same sequence run with the older binary (R88).
// For each node in turn: it is marked draining and its partitions are
// handed off live (Retire, FinishRetire: rounds of its own when no
// `controller run` is active); then it is safe to restart — event
// "drained" says so — and Rollout waits for the node to come back: a
// booting api registers again (a later start time, no longer draining)
// and holds its presence lock. Once every node is back, one
// round applies balance so the restarted nodes take their share again
// (R115). It stops at the first node that does not drain or return in
// time, leaving the rest untouched.
func Rollout(ctx context.Context, svc *Service, r RolloutRequest, event func(RolloutEvent)) error {
	if len(r.Nodes) == 0 {
		return blobplane.Errorf(blobplane.CodeInvalid, "a rollout needs the nodes to restart, in order")
	}
	seen := map[string]bool{}
	for _, n := range r.Nodes {
		if seen[n] {
			return blobplane.Errorf(blobplane.CodeInvalid, "node %s is listed twice", n)
		}
		seen[n] = true
	}
	if r.DrainWait <= 0 {
		r.DrainWait = 2 * time.Minute
	}
	if r.RestartWait <= 0 {
		r.RestartWait = 10 * time.Minute
	}
	for _, node := range r.Nodes {
		if _, err := svc.Retire(ctx, node); err != nil {
			return fmt.Errorf("rollout at %s: %w", node, err)
		}
		event(RolloutEvent{Node: node, Step: "draining"})
		done, err := FinishRetire(ctx, svc, node, r.DrainWait)
		if err != nil {
			return fmt.Errorf("rollout at %s: %w", node, err)
		}
		if !done {
			return blobplane.Errorf(blobplane.CodeUnavailable, "rollout stopped: %s still holds partitions after %s (see controller status); it stays draining, `controller undrain --node %s` takes it back", node, r.DrainWait, node)
		}
		before, err := startedAt(ctx, svc, node)
		if err != nil {
			return err
		}
		event(RolloutEvent{Node: node, Step: "drained"})
		if err := awaitRestart(ctx, svc, node, before, r.RestartWait); err != nil {
			return err
		}
		event(RolloutEvent{Node: node, Step: "restarted"})
	}
	// The closing balance is an operator's apply: deliberate, so past
	// the cooldown (the rollout moved nearly every partition just now),
	// by this process or, beside a running service, by it.
	if _, _, err := Apply(ctx, svc, Override{}, r.DrainWait); err != nil {
		return err
	}
	event(RolloutEvent{Step: "balanced"})
	return nil
}

// startedAt is node's registration time (database clock): a booting api
// registers again, so a later one is a restart.
func startedAt(ctx context.Context, svc *Service, node string) (time.Time, error) {
	nodes, err := svc.Store.ListNodes(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for _, n := range nodes {
		if n.ID == node {
			return n.StartedAt, nil
		}
	}
	return time.Time{}, blobplane.Errorf(blobplane.CodeNotFound, "no node %s", node)
}

// awaitRestart waits for node to have been started again after before
// (registered anew, which clears draining) and to be present.
func awaitRestart(ctx context.Context, svc *Service, node string, before time.Time, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		started, err := startedAt(ctx, svc, node)
		if err != nil {
			return err
		}
		o, err := svc.Observe(ctx)
		if err != nil {
			return err
		}
		if started.After(before) && o.Present[node] && !o.Nodes[node].Draining {
			return nil
		}
		if time.Now().After(deadline) {
			return blobplane.Errorf(blobplane.CodeUnavailable, "rollout stopped: %s was not restarted within %s (it holds nothing and stays draining until it registers again: restart it, or `controller undrain --node %s`)", node, wait, node)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(svc.Settings.withDefaults().Tick / 5):
		}
	}
}
