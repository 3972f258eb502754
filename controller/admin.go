package controller

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Admin is the controller's operator commands as the api's admin API
// serves them (handlers.ClusterAdmin): a force-takeover, the dry-run
// plan, and apply requests for the running service. It never signs or
// publishes a map and never rounds itself: the api holds no signing key,
// and only the leader acts (R109, R118).
type Admin struct {
	Store *store.Store
	// Settings are what the dry-run plan is computed with (SettingsFrom).
	Settings Settings
}

var notFound = &blobplane.Error{Code: blobplane.CodeNotFound}

// Takeover is Takeover for a partition the cluster knows: one in the
// latest map or with a lease record. Errors: not_found for any other (a
// mistyped id must not create a lease of its own); Takeover's otherwise.
func (a *Admin) Takeover(ctx context.Context, partition, node, endpoint, operator, reason string) (authority.LeaseRecord, error) {
	if partition != "" {
		known, err := a.known(ctx, partition)
		if err != nil {
			return authority.LeaseRecord{}, err
		}
		if !known {
			return authority.LeaseRecord{}, blobplane.Errorf(blobplane.CodeNotFound, "no partition %q: it is in no published map and has no lease", partition)
		}
	}
	return Takeover(ctx, a.Store, partition, node, endpoint, operator, reason)
}

// known reports whether partition has a lease record or is in the
// latest map.
func (a *Admin) known(ctx context.Context, partition string) (bool, error) {
	_, err := a.Store.Lease(ctx, partition)
	if err == nil || !errors.Is(err, notFound) {
		return err == nil, err
	}
	m, err := a.Store.LatestMap(ctx)
	if errors.Is(err, notFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, p := range m.Partitions {
		if p.ID == partition {
			return true, nil
		}
	}
	return false, nil
}

// PlanJSON is the plan a round would compute now (DryRun), as `controller
// plan --json` prints it. It changes nothing.
func (a *Admin) PlanJSON(ctx context.Context) (json.RawMessage, error) {
	p, err := (&Service{Store: a.Store, Settings: a.Settings}).DryRun(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// RequestApply queues an apply request (RequestApply) for the running
// service. Errors: unavailable when no service holds the leader lock:
// nothing would take the request, and a service started later would
// apply a plan nobody is waiting for.
func (a *Admin) RequestApply(ctx context.Context, by, overrideReason string) (int64, error) {
	running, err := a.Store.ControllerRunning(ctx)
	if err != nil {
		return 0, err
	}
	if !running {
		// Not retryable (no Retry-After): waiting a second brings no
		// controller; an operator has to start one.
		return 0, &blobplane.Error{Code: blobplane.CodeUnavailable,
			Message: "no controller service is running to take an apply request: start `controller run`, or run `controller apply`, which rounds by itself"}
	}
	return RequestApply(ctx, a.Store, by, overrideReason)
}

// ApplyRequestState says whether apply request id was taken by a round,
// and the plan that round recorded (0: it started nothing). Errors:
// not_found for an unknown id.
func (a *Admin) ApplyRequestState(ctx context.Context, id int64) (taken bool, plan int64, err error) {
	taken, plan, err = a.Store.ApplyRequestState(ctx, id)
	if errors.Is(err, notFound) {
		return false, 0, blobplane.Errorf(blobplane.CodeNotFound, "no apply request %d", id)
	}
	return taken, plan, err
}
