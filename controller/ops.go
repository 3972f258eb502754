package controller

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Takeover is the operator's force-takeover (R26–R28): partition's lease
// at epoch + 1 for node (its registered endpoint unless endpoint is
// given), recording operator and reason. The node's keeper adopts it at
// once; a running controller then publishes a map naming it. Never
// called by automated placement (R28).
func Takeover(ctx context.Context, st *store.Store, partition, node, endpoint, operator, reason string) (authority.LeaseRecord, error) {
	if partition == "" || node == "" || operator == "" || reason == "" {
		return authority.LeaseRecord{}, blobplane.Errorf(blobplane.CodeInvalid,
			"a takeover needs a partition, a node, an operator and a reason (R28: a force-takeover records who and why)")
	}
	if endpoint == "" {
		nodes, err := st.ListNodes(ctx)
		if err != nil {
			return authority.LeaseRecord{}, err
		}
		for _, n := range nodes {
			if n.ID == node {
				endpoint = Endpoint(n.Endpoint)
			}
		}
		if endpoint == "" {
			return authority.LeaseRecord{}, blobplane.Errorf(blobplane.CodeInvalid, "node %q has no registered endpoint: pass --endpoint", node)
		}
	}
	return st.ForceLease(ctx, partition, node, endpoint, operator, reason)
}

// Apply runs one round as an operator (`controller apply`), applying
// every plan kind, and waits up to wait for the moves it started to be
// published or aborted. With no `controller run` active it takes the
// leader lock and rounds itself, and returns the plan of its first round;
// beside an active service it queues a request the service takes in its
// next round (R118: only the leader acts), and returns no plan — the
// moves tell what was done. Either way it returns the moves as they
// ended.
func Apply(ctx context.Context, svc *Service, ov Override, wait time.Duration) (Plan, []authority.Handoff, error) {
	all := map[string]bool{TriggerDrain: true, TriggerRecover: true, TriggerBalance: true}
	lock, err := svc.Store.TryControllerLock(ctx)
	if err != nil {
		return Plan{}, nil, err
	}
	if lock == nil {
		hs, err := applyThroughService(ctx, svc, ov, wait)
		return Plan{}, hs, err
	}
	defer lock.Release()
	svc = deliberate(svc)
	p, err := svc.Round(ctx, all, ov)
	if err != nil || len(p.Moves) == 0 {
		return p, nil, err
	}
	if err := carryForward(ctx, svc, true, all, wait, func() (bool, error) {
		active, err := svc.Store.ActiveHandoffs(ctx)
		return len(active) == 0, err
	}); err != nil {
		return p, nil, err
	}
	recent, err := svc.Store.RecentHandoffs(ctx, len(p.Moves)+8)
	return p, recent, err
}

// deliberate is svc for an operator's apply: balance's cooldown is
// hysteresis against drift in automatic rounds, not a limit on what an
// operator asks for.
func deliberate(svc *Service) *Service {
	d := *svc
	d.Settings = d.Settings.withDefaults()
	d.Settings.BalanceCooldown = time.Nanosecond
	return &d
}

// RequestApply queues an operator's request that the active controller
// service apply every plan kind (drain, recover, balance) in its next
// round (R118: only the leader acts), recorded as by; a non-empty
// overrideReason lets that plan move more than the movement cap (R119:
// an override records who and why). It returns the request's id, for
// store.ApplyRequestState. Nothing takes the request while no service
// runs.
func RequestApply(ctx context.Context, st *store.Store, by, overrideReason string) (int64, error) {
	return st.RequestApply(ctx, store.ApplyRequest{Kinds: []string{TriggerDrain, TriggerRecover, TriggerBalance}, By: by, OverrideReason: overrideReason})
}

// applyThroughService queues an apply request for the active service and
// waits for it to be taken and for the moves of its plan to end.
func applyThroughService(ctx context.Context, svc *Service, ov Override, wait time.Duration) ([]authority.Handoff, error) {
	by := cmp.Or(ov.By, svc.AppliedBy, "an operator")
	id, err := RequestApply(ctx, svc.Store, by, ov.Reason)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	tick := svc.Settings.withDefaults().Tick / 5
	for {
		taken, plan, err := svc.Store.ApplyRequestState(ctx, id)
		if err != nil {
			return nil, err
		}
		if taken && plan == 0 {
			return nil, nil // the round had nothing to start
		}
		if taken {
			hs, err := svc.Store.RecentHandoffs(ctx, 256)
			if err != nil {
				return nil, err
			}
			var mine []authority.Handoff
			done := true
			for _, h := range hs {
				if h.PlanID == plan {
					mine = append(mine, h)
					done = done && !h.Active()
				}
			}
			if done || time.Now().After(deadline) {
				return mine, nil
			}
		} else if time.Now().After(deadline) {
			return nil, blobplane.Errorf(blobplane.CodeUnavailable, "request %d was not taken within %s: is `controller run` stuck? (see controller status)", id, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(tick):
		}
	}
}

// Status writes the map and leases (Show), the freeze, and the moves in
// flight and recently finished.
func Status(ctx context.Context, st *store.Store, w io.Writer, now time.Time) error {
	if err := Show(ctx, st, w, now); err != nil {
		return err
	}
	f, err := st.Frozen(ctx)
	if err != nil {
		return err
	}
	running, err := st.ControllerRunning(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(w)
	if running {
		fmt.Fprintln(w, "controller service: active")
	} else {
		fmt.Fprintln(w, "controller service: not running (nothing moves by itself: `controller run`)")
	}
	if f != nil {
		fmt.Fprintf(w, "FROZEN by %s since %s: %s\n", f.By, f.At.UTC().Format(time.RFC3339), f.Reason)
	}
	hs, err := st.RecentHandoffs(ctx, 20)
	if err != nil {
		return err
	}
	if len(hs) == 0 {
		fmt.Fprintln(w, "no moves yet")
		return nil
	}
	fmt.Fprintln(w, "\nrecent moves (newest first):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPARTITION\tKIND\tFROM\tTO\tSTATE\tEPOCH\tUNAVAILABLE\tREASON")
	for _, h := range hs {
		un := "-"
		if d := h.Unavailable(); h.State == authority.HandoffPublished {
			un = d.Round(time.Millisecond).String()
		}
		reason := h.Reason
		if h.AbortReason != "" {
			reason += " (aborted: " + h.AbortReason + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d→%d\t%s\t%s\n", h.ID, h.Partition, h.Kind, h.From, h.To, h.State, h.FromEpoch, h.ToEpoch, un, reason)
	}
	return tw.Flush()
}

// Finish carries a split or merge forward until its group is published or
// aborted, or wait passes: rounds of its own when no `controller run` is
// active (holding the leader lock meanwhile), else waiting for the
// service's. It returns the group's handoffs as they ended.
func Finish(ctx context.Context, svc *Service, group int64, wait time.Duration) ([]authority.Handoff, error) {
	var mine []authority.Handoff
	err := carryForward(ctx, svc, false, map[string]bool{}, wait, func() (bool, error) {
		hs, err := svc.Store.RecentHandoffs(ctx, 64)
		mine = mine[:0]
		done := true
		for _, h := range hs {
			if h.GroupID == group {
				mine = append(mine, h)
				done = done && !h.Active()
			}
		}
		return done, err
	})
	return mine, err
}

// FinishRetire carries a retirement forward until node holds nothing
// (Retired) or wait passes: rounds of its own when no `controller run` is
// active, else waiting for the service's.
func FinishRetire(ctx context.Context, svc *Service, node string, wait time.Duration) (bool, error) {
	var done bool
	err := carryForward(ctx, svc, false, map[string]bool{TriggerDrain: true, TriggerRecover: true}, wait, func() (bool, error) {
		var err error
		done, err = Retired(ctx, svc.Store, node)
		return done, err
	})
	return done, err
}

// carryForward runs rounds (applying the kinds in apply) until done
// reports true or wait passes: rounds of its own when no `controller run`
// is active — holding the leader lock meanwhile, or already holding it
// (locked) — else waiting for the service's.
func carryForward(ctx context.Context, svc *Service, locked bool, apply map[string]bool, wait time.Duration, done func() (bool, error)) error {
	if !locked {
		lock, err := svc.Store.TryControllerLock(ctx)
		if err != nil {
			return err
		}
		if lock != nil {
			defer lock.Release()
			locked = true
		}
	}
	if apply == nil {
		apply = map[string]bool{}
	}
	svc.Settings = svc.Settings.withDefaults()
	deadline := time.Now().Add(wait)
	for {
		if locked {
			if _, err := svc.Round(ctx, apply, Override{}); err != nil {
				return err
			}
		}
		ok, err := done()
		if err != nil || ok || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(svc.Settings.Tick / 5):
		}
	}
}
