package controller

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Staged publication (ZBP-5 R120–R122). `controller publish --canary
// NODES` publishes the next map as a canary: only those nodes adopt it
// (store.LatestMapFor), and the clients they answer learn it from them.
// The controller waits for the canary nodes to serve from it, observes
// them for a window against the stated outcome — at most MaxErrorRatio
// 5xx answers per request and no map rejection — and promotes it to
// everyone, or withdraws it: a newer version with the previous content
// is published (versions never go back, R6) and every node, the canary
// ones included, adopts that. A map completing moves past their seal is
// never staged and supersedes a pending canary (R122).

// CanarySample is what a canary node reports at one instant.
type CanarySample struct {
	MapVersion uint64  // the map version it serves from
	Requests   float64 // requests answered (operational endpoints excluded)
	Errors     float64 // of which 5xx
	Rejections float64 // maps or deltas that failed verification
}

// CanaryObserver samples a node.
type CanaryObserver interface {
	Sample(ctx context.Context, node store.PlacementNode) (CanarySample, error)
}

// MetricsObserver samples a node by scraping its /metrics.
type MetricsObserver struct {
	HTTP *http.Client // nil: a client with a 5 s timeout
}

// Sample implements CanaryObserver.
func (o MetricsObserver) Sample(ctx context.Context, node store.PlacementNode) (CanarySample, error) {
	hc := o.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	base := node.Endpoint
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return CanarySample{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return CanarySample{}, blobplane.Wrap(blobplane.CodeUnavailable, err, "scrape %s", node.ID)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return CanarySample{}, blobplane.Errorf(blobplane.CodeUnavailable, "scrape %s: %s", node.ID, resp.Status)
	}
	return ParseCanarySample(io.LimitReader(resp.Body, 16<<20))
}

// ParseCanarySample reads a sample from an api node's metrics exposition.
func ParseCanarySample(r io.Reader) (CanarySample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return CanarySample{}, fmt.Errorf("parse metrics: %w", err)
	}
	var s CanarySample
	if f := fams["blobplane_map_version"]; f != nil && len(f.Metric) > 0 && f.Metric[0].Gauge != nil {
		s.MapVersion = uint64(f.Metric[0].Gauge.GetValue())
	}
	if f := fams["blobplane_http_requests_total"]; f != nil {
		for _, m := range f.Metric {
			route, status := label(m, "route"), label(m, "status")
			if route == "/metrics" || route == "/healthz" || route == "/readyz" {
				continue
			}
			s.Requests += m.GetCounter().GetValue()
			if strings.HasPrefix(status, "5") {
				s.Errors += m.GetCounter().GetValue()
			}
		}
	}
	if f := fams["blobplane_map_rejections_total"]; f != nil {
		for _, m := range f.Metric {
			s.Rejections += m.GetCounter().GetValue()
		}
	}
	return s, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// CanaryOptions stage a publication.
type CanaryOptions struct {
	Nodes         []string
	Window        time.Duration // observation after adoption (default 30 s)
	MaxErrorRatio float64       // the stated outcome (default 0.01)
	Observer      CanaryObserver
	Poll          time.Duration // sampling while waiting for adoption (default 250 ms)
	// AdoptWithin bounds the wait for every canary node to serve from the
	// version (default 30 s): one that does not is a failed canary.
	AdoptWithin time.Duration
}

func (c CanaryOptions) withDefaults() CanaryOptions {
	if c.Window <= 0 {
		c.Window = 30 * time.Second
	}
	if c.MaxErrorRatio <= 0 {
		c.MaxErrorRatio = 0.01
	}
	if c.Poll <= 0 {
		c.Poll = 250 * time.Millisecond
	}
	if c.AdoptWithin <= 0 {
		c.AdoptWithin = 30 * time.Second
	}
	if c.Observer == nil {
		c.Observer = MetricsObserver{}
	}
	return c
}

// CanaryResult is how a staged publication ended.
type CanaryResult struct {
	Version   uint64 // the canary version
	Promoted  bool
	Withdrawn uint64 // when withdrawn: the version that replaced it
	Decision  string
}

// PublishCanary computes the next map as Publish does and publishes it as
// a canary for c.Nodes, then watches it (WatchCanary).
func PublishCanary(ctx context.Context, st *store.Store, signer authority.Signer, opts PublishOptions, c CanaryOptions) (CanaryResult, error) {
	c = c.withDefaults()
	if _, err := canaryNodes(ctx, st, c.Nodes); err != nil {
		return CanaryResult{}, err
	}
	opts.Canary = &store.Canary{Nodes: c.Nodes, MaxErrorRatio: c.MaxErrorRatio, Window: c.Window}
	next, err := Publish(ctx, st, signer, opts)
	if err != nil {
		return CanaryResult{}, err
	}
	return WatchCanary(ctx, st, signer, next.Version, c)
}

// WatchCanary waits for the canary nodes to serve from version, observes
// them for the window, and promotes or withdraws it (R121).
func WatchCanary(ctx context.Context, st *store.Store, signer authority.Signer, version uint64, c CanaryOptions) (CanaryResult, error) {
	c = c.withDefaults()
	res := CanaryResult{Version: version}
	nodes, err := canaryNodes(ctx, st, c.Nodes)
	if err != nil {
		return res, err
	}
	base, why, err := awaitAdoption(ctx, c, nodes, version)
	if err != nil {
		return res, err
	}
	if why == "" {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(c.Window):
		}
		why, err = judge(ctx, c, nodes, base)
		if err != nil {
			return res, err
		}
	}
	if why == "" {
		res.Promoted = true
		res.Decision = fmt.Sprintf("promoted: the canary nodes %v served from version %d for %s within the stated outcome", c.Nodes, version, c.Window)
		ok, err := st.DecideCanary(ctx, version, true, res.Decision)
		if err == nil && !ok {
			err = blobplane.Errorf(blobplane.CodeConflict, "canary %d was decided meanwhile (superseded by a newer map, R122)", version)
		}
		return res, err
	}
	res.Decision = "withdrawn: " + why
	w, err := withdraw(ctx, st, signer)
	if err != nil {
		return res, err
	}
	res.Withdrawn = w
	if _, err := st.DecideCanary(ctx, version, false, res.Decision); err != nil {
		return res, err
	}
	return res, nil
}

func canaryNodes(ctx context.Context, st *store.Store, ids []string) ([]store.PlacementNode, error) {
	all, err := st.PlacementNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []store.PlacementNode
	for _, id := range ids {
		for _, n := range all {
			if n.ID == id {
				if !n.Up || n.Draining {
					return nil, blobplane.Errorf(blobplane.CodeInvalid, "canary node %s is not an api node that is up and not draining", id)
				}
				out = append(out, n)
			}
		}
	}
	if len(out) != len(ids) {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "canary nodes %v: not all registered api nodes", ids)
	}
	return out, nil
}

// awaitAdoption samples the canary nodes until each serves from version
// (their baseline), or gives a reason to withdraw when one does not
// within the window.
func awaitAdoption(ctx context.Context, c CanaryOptions, nodes []store.PlacementNode, version uint64) ([]CanarySample, string, error) {
	deadline := time.Now().Add(c.AdoptWithin)
	for {
		base := make([]CanarySample, len(nodes))
		adopted := true
		for i, n := range nodes {
			s, err := c.Observer.Sample(ctx, n)
			if err != nil || s.MapVersion < version {
				adopted = false
				break
			}
			base[i] = s
		}
		if adopted {
			return base, "", nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Sprintf("the canary nodes %v did not serve from version %d within %s", c.Nodes, version, c.AdoptWithin), nil
		}
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(c.Poll):
		}
	}
}

// judge compares the canary nodes now with their baseline against the
// stated outcome; "" when it holds.
func judge(ctx context.Context, c CanaryOptions, nodes []store.PlacementNode, base []CanarySample) (string, error) {
	var req, errs, rej float64
	for i, n := range nodes {
		s, err := c.Observer.Sample(ctx, n)
		if err != nil {
			return fmt.Sprintf("canary node %s could not be observed: %v", n.ID, err), nil
		}
		req += s.Requests - base[i].Requests
		errs += s.Errors - base[i].Errors
		rej += s.Rejections - base[i].Rejections
	}
	switch {
	case rej > 0:
		return fmt.Sprintf("%.0f map rejections on the canary nodes", rej), nil
	case req > 0 && errs/req > c.MaxErrorRatio:
		return fmt.Sprintf("%.0f of %.0f answers were 5xx (%.2f%% > %.2f%%)", errs, req, 100*errs/req, 100*c.MaxErrorRatio), nil
	}
	return "", nil
}

// withdraw publishes, above every version, the map everyone serves from
// (the last promoted one), epochs raised to the leases': every node, the
// canary ones included, adopts it. It returns its version.
func withdraw(ctx context.Context, st *store.Store, signer authority.Signer) (uint64, error) {
	prev, err := st.LatestMap(ctx)
	if err != nil {
		return 0, err
	}
	leases, err := st.Leases(ctx)
	if err != nil {
		return 0, err
	}
	next := prev.Clone()
	next.Signature = nil
	next.Version = prev.Version + 1
	next.GeneratedAt = time.Now().UTC().Truncate(time.Millisecond)
	raiseEpochs(next, leases)
	// The same content under a version above the canary's (R6: versions
	// never go back).
	err = publishStaged(ctx, st, signer, prev, next, nil, false)
	return next.Version, err
}
