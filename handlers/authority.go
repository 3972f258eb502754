package handlers

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/store"
)

// Routing-contract headers (ZBP-5 R98): every request to a home-only
// endpoint carries the slot and the map version the client resolved.
const (
	HeaderSlot       = "Blobplane-Slot"
	HeaderSlotBits   = "Blobplane-Slot-Bits"
	HeaderMapVersion = "Blobplane-Map-Version"
	HeaderPartition  = "Blobplane-Partition"
	HeaderEpoch      = "Blobplane-Epoch"
	// HeaderRoutePartition and HeaderRouteEpoch attribute a routing
	// refusal (R132): the partition this node's map places the slot in
	// and its epoch there. Not HeaderPartition, which tells clients the
	// answer was served by the home (client.routingAnswer).
	HeaderRoutePartition = "Blobplane-Route-Partition"
	HeaderRouteEpoch     = "Blobplane-Route-Epoch"
)

// LeaseKeeper is this node's view of its leases and the current map
// (authority/keeper.Keeper).
type LeaseKeeper interface {
	Map() *authority.VerifiedMap
	Lease(partition string) authority.LeaseState
	Delta(base uint64) *authority.Delta
	Admit(partition string, epoch uint64) (context.Context, error)
	// Successor is where a partition this node is handing off goes, nil
	// when none (R77).
	Successor(partition string) *authority.Assignment
}

// MapStore serves the published maps and lease records for the
// observability endpoints.
type MapStore interface {
	LatestMap(ctx context.Context) (*authority.Map, error)
	MapVersion(ctx context.Context, v uint64) (*authority.Map, error)
	MapDelta(ctx context.Context, since uint64) (*authority.Delta, error)
	SigningKeys(ctx context.Context) ([]authority.TrustedKey, error)
	// LeaseStatuses returns every lease record, each judged live by the
	// database's clock, the one that wrote its expiry (issue 26 point 11).
	LeaseStatuses(ctx context.Context) ([]store.LeaseStatus, error)
	// PendingPublications returns the repositories with uploads accepted
	// and not yet published (R138).
	PendingPublications(ctx context.Context) ([]store.PendingPublication, error)
	// StandbyReports and ListNodes measure each partition's standbys
	// against its class (R60, R62).
	StandbyReports(ctx context.Context) ([]store.StandbyReport, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
}

// Authority bundles what the routing middleware and map endpoints need.
type Authority struct {
	NodeID string
	Logger *slog.Logger
	Keeper LeaseKeeper
	Maps   MapStore
	Retry  authority.RetryDelays
	// Reports feeds the R134/R139 alarms; nil leaves them out.
	Reports NodeReports

	routed   *prometheus.CounterVec
	rejected prometheus.Counter
	// handoffRefused counts requests refused because this node was
	// handing their partition off (R135).
	handoffRefused *prometheus.CounterVec
	// oldestClient is the lowest non-zero map version a client presented
	// since the last scrape (0: none).
	oldestClient atomic.Uint64
}

// MapRejected counts a map or delta that failed verification (a correctness
// fault, ZBP-5 R11, R12). Wire it as the keeper's OnReject.
func (a *Authority) MapRejected(authority.Rejection) {
	if a.rejected != nil {
		a.rejected.Inc()
	}
}

func (a *Authority) sawClientVersion(v uint64) {
	for {
		cur := a.oldestClient.Load()
		if v == 0 || (cur != 0 && cur <= v) || a.oldestClient.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (a *Authority) takeOldestClientVersion() uint64 { return a.oldestClient.Swap(0) }

// Home is a request's place in the authority runtime once the routing
// middleware admitted it: the partition and the epoch it runs under (R132).
type Home struct {
	Partition string
	Epoch     uint64
	// successor looks up where the partition goes if this node hands it
	// off mid-request (R77); nil outside the routing middleware.
	successor func() *authority.Assignment
}

type homeKey struct{}

// HomeOf returns the partition and epoch the routing middleware admitted r
// under, if any.
func HomeOf(ctx context.Context) (Home, bool) {
	h, ok := ctx.Value(homeKey{}).(Home)
	return h, ok
}

func (a *Authority) register(reg *prometheus.Registry) {
	a.routed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "blobplane_routing_decisions_total",
		Help: "Routing-contract answers by outcome (serve, NOT_READY, MOVED, MISROUTED, STALE_MAP). MISROUTED is a correctness fault (ZBP-5 R105).",
	}, []string{"outcome"})
	a.rejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "blobplane_map_rejections_total",
		Help: "Partition maps and deltas that failed signature or key-window verification: a correctness fault (ZBP-5 R11, R12).",
	})
	a.handoffRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "blobplane_handoff_refused_requests_total",
		Help: "Requests refused (NOT_READY, retryable, with the new assignment) because this node was handing their partition off, by partition: its increase over a handoff's window (the handoffs table) is that handoff's count (ZBP-5 R77, R135).",
	}, []string{"partition"})
	reg.MustRegister(a.routed, a.rejected, a.handoffRefused)
	if a.Reports != nil {
		reg.MustRegister(newAuthorityCollector(a, a.Reports))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "blobplane_map_version",
		Help: "Version of the verified partition map this node serves from (0 before the first).",
	}, func() float64 {
		if m := a.Keeper.Map(); m != nil {
			return float64(m.Version())
		}
		return 0
	}))
}

// RequireHome is chi middleware for repository-scoped endpoints that must
// run at the repository's home (A.1, A.2): it answers exactly per
// R99–R102 and, when serving, runs the handler under a context cancelled
// if the lease is lost mid-request (R24). key extracts the partition key
// (the repository name).
func (a *Authority) RequireHome(key func(*http.Request) string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, err := routingRequest(r, key(r))
			if err != nil {
				WriteError(w, r, a.Logger, err)
				return
			}
			a.sawClientVersion(req.MapVersion)
			srv := authority.Server{Self: a.NodeID, Map: a.Keeper.Map(), Leases: a.Keeper, Deltas: a.Keeper.Delta, Retry: a.Retry}
			d := srv.Decide(req)
			a.routed.WithLabelValues(d.Outcome.String()).Inc()
			if d.Outcome != authority.Serve {
				a.refuse(w, d)
				return
			}
			leaseCtx, err := a.Keeper.Admit(d.Partition, d.Epoch)
			if err != nil { // sealing for a handoff, or the deadline passed between decision and admission
				a.refuse(w, authority.Decision{Outcome: authority.NotReady, Partition: d.Partition, Epoch: d.Epoch, Envelope: &authority.Envelope{
					Code: authority.RouteNotReady, Slot: d.Slot, MapVersion: d.MapVersion, RetryAfterMS: ms(a.Retry.NotReady),
				}})
				return
			}
			ctx, cancel := context.WithCancelCause(r.Context())
			defer cancel(nil)
			stop := context.AfterFunc(leaseCtx, func() {
				cancel(blobplane.Errorf(blobplane.CodeUnavailable, "lease for partition %s lost mid-request", d.Partition))
			})
			defer stop()
			w.Header().Set(HeaderPartition, d.Partition)
			w.Header().Set(HeaderEpoch, strconv.FormatUint(d.Epoch, 10))
			ctx = context.WithValue(ctx, homeKey{}, Home{Partition: d.Partition, Epoch: d.Epoch,
				successor: func() *authority.Assignment { return a.Keeper.Successor(d.Partition) }})
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// routingRequest reads the routing headers. A client that sends none (a
// plain OCI client) is treated as holding no map: version 0, slot computed
// here — it can be served or redirected, never called misrouted.
func routingRequest(r *http.Request, key string) (authority.Request, error) {
	req := authority.Request{Key: key}
	if v := r.Header.Get(HeaderMapVersion); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return req, blobplane.Errorf(blobplane.CodeInvalid, "%s %q is not a map version", HeaderMapVersion, v)
		}
		req.MapVersion = n
	}
	if v := r.Header.Get(HeaderSlotBits); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 32 {
			return req, blobplane.Errorf(blobplane.CodeInvalid, "%s %q is not 1-32", HeaderSlotBits, v)
		}
		req.SlotBits = n
	}
	if v := r.Header.Get(HeaderSlot); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return req, blobplane.Errorf(blobplane.CodeInvalid, "%s %q is not a slot", HeaderSlot, v)
		}
		req.Slot = authority.Slot(n)
	} else {
		bits := req.SlotBits
		if bits == 0 {
			bits = authority.DefaultSlotBits
		}
		req.Slot, req.SlotBits = authority.SlotOf(key, bits), bits
	}
	return req, nil
}

// refuse answers a routing refusal, attributed to the partition and epoch
// this node's map gives the slot (R132); a NOT_READY while this node
// hands the partition off carries the new assignment (R77: retry there,
// or here once the map names it).
func (a *Authority) refuse(w http.ResponseWriter, d authority.Decision) {
	if d.Partition != "" {
		w.Header().Set(HeaderRoutePartition, d.Partition)
		w.Header().Set(HeaderRouteEpoch, strconv.FormatUint(d.Epoch, 10))
		if d.Outcome == authority.NotReady && d.Envelope.Assignment == nil {
			if next := a.Keeper.Successor(d.Partition); next != nil {
				if a.handoffRefused != nil {
					a.handoffRefused.WithLabelValues(d.Partition).Inc()
				}
				env := *d.Envelope
				env.Assignment = next
				d.Envelope = &env
			}
		}
	}
	writeEnvelope(w, d)
}

func writeEnvelope(w http.ResponseWriter, d authority.Decision) {
	status := http.StatusServiceUnavailable // NOT_READY, STALE_MAP: retry after the delay
	switch d.Outcome {
	case authority.Moved, authority.Misrouted:
		status = authority.StatusMoved // 421: this server cannot answer for the slot
	}
	if d.Envelope.RetryAfterMS != nil {
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, (*d.Envelope.RetryAfterMS+999)/1000), 10))
	}
	WriteJSON(w, status, d.Envelope)
}

func ms(d time.Duration) *int64 { v := d.Milliseconds(); return &v }

// routes mounts the map and partition endpoints (R9, R131) and the home
// probe.
func (a *Authority) routes(r chi.Router, deps Deps) {
	// GET /v1/home/<repository>: answered only by the repository's home
	// (through the routing contract); says which partition and epoch it
	// serves the repository under.
	r.With(a.RequireHome(func(r *http.Request) string { return chi.URLParam(r, "*") })).
		Get("/v1/home/*", func(w http.ResponseWriter, r *http.Request) {
			h, _ := HomeOf(r.Context())
			WriteJSON(w, http.StatusOK, map[string]any{"repository": chi.URLParam(r, "*"), "node_id": a.NodeID, "partition": h.Partition, "epoch": h.Epoch})
		})
	r.Get("/v1/map", func(w http.ResponseWriter, r *http.Request) {
		var m *authority.Map
		var err error
		if v := r.URL.Query().Get("version"); v != "" {
			n, perr := strconv.ParseUint(v, 10, 64)
			if perr != nil {
				WriteError(w, r, deps.Logger, blobplane.Errorf(blobplane.CodeInvalid, "version %q is not a map version", v))
				return
			}
			m, err = a.Maps.MapVersion(r.Context(), n)
		} else {
			m, err = a.Maps.LatestMap(r.Context())
		}
		if err != nil {
			WriteError(w, r, deps.Logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, m)
	})
	r.Get("/v1/map/delta", func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query().Get("since")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			WriteError(w, r, deps.Logger, blobplane.Errorf(blobplane.CodeInvalid, "since=%q is not a map version", v))
			return
		}
		d, err := a.Maps.MapDelta(r.Context(), n)
		if err != nil {
			WriteError(w, r, deps.Logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, d)
	})
	r.Get("/v1/map/keys", func(w http.ResponseWriter, r *http.Request) {
		keys, err := a.Maps.SigningKeys(r.Context())
		if err != nil {
			WriteError(w, r, deps.Logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]any{"keys": keys})
	})
	r.Get("/v1/partitions", func(w http.ResponseWriter, r *http.Request) {
		out, err := a.partitions(r.Context())
		if err != nil {
			WriteError(w, r, deps.Logger, err)
			return
		}
		WriteJSON(w, http.StatusOK, out)
	})
}

// PartitionStatus is one row of GET /v1/partitions (R131: the fields
// available today).
type PartitionStatus struct {
	ID             string      `json:"id"`
	Generation     uint64      `json:"generation"`
	Class          string      `json:"class"`
	Slots          [][2]uint64 `json:"slots"`
	MapEpoch       uint64      `json:"map_epoch"`
	MapNode        string      `json:"map_node"`
	Epoch          uint64      `json:"epoch"`
	State          string      `json:"state"`
	Node           string      `json:"node"`
	Endpoint       string      `json:"endpoint"`
	LeaseExpiresAt *time.Time  `json:"lease_expires_at"`
	Owned          bool        `json:"owned"`
	// R138: what the partition is doing, stated positively. Activity is
	// "idle" (owned, nothing to consume), "working" (uploads accepted and
	// waiting for publication, the oldest under StallAfter), "stalled"
	// (the oldest past it: the home stopped consuming) or "unowned".
	Activity             string  `json:"activity"`
	PendingPublications  int     `json:"pending_publications"`
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// LiveAt is the home's last lease renewal (database clock): its
	// statement that it is alive, idle or not.
	LiveAt *time.Time `json:"live_at"`
	// Standbys are the map's standbys with what each last reported
	// (R64); Health measures them against the partition's class (R60,
	// R62): Healthy is false below its count of synced standbys or with
	// one in its primary's failure domain.
	Standbys []StandbyStatus         `json:"standbys"`
	Health   partstate.StandbyHealth `json:"health"`
	Healthy  bool                    `json:"healthy"`
}

// StandbyStatus is one standby of a GET /v1/partitions row: its last
// report (none: Reported false).
type StandbyStatus struct {
	Node       string `json:"node"`
	Reported   bool   `json:"reported"`
	Synced     bool   `json:"synced"`
	Epoch      uint64 `json:"epoch,omitempty"`
	AppliedLSN uint64 `json:"applied_lsn"`
	LagRecords uint64 `json:"lag_records"`
	// ReportedSecondsAgo and CaughtUpSecondsAgo (-1: never) by the
	// database's clock.
	ReportedSecondsAgo float64 `json:"reported_seconds_ago"`
	CaughtUpSecondsAgo float64 `json:"caught_up_seconds_ago"`
}

// standbyView is what measuring standbys reads: every standby's last
// report and each node's datacenter.
type standbyView struct {
	reports    map[string][]store.StandbyReport // by partition
	datacenter map[string]string
}

func (a *Authority) standbyView(ctx context.Context) (standbyView, error) {
	reports, err := a.Maps.StandbyReports(ctx)
	if err != nil {
		return standbyView{}, err
	}
	nodes, err := a.Maps.ListNodes(ctx)
	if err != nil {
		return standbyView{}, err
	}
	v := standbyView{reports: map[string][]store.StandbyReport{}, datacenter: map[string]string{}}
	for _, r := range reports {
		v.reports[r.Partition] = append(v.reports[r.Partition], r)
	}
	for _, n := range nodes {
		v.datacenter[n.ID] = n.Datacenter
	}
	return v, nil
}

// health measures p, whose primary holds epoch (R60, R62); a class this
// release does not know is reported as such, never healthy.
func (v standbyView) health(p *authority.Partition, epoch uint64) partstate.StandbyHealth {
	c, ok := partstate.ClassNamed(p.Class)
	if !ok {
		return partstate.StandbyHealth{Problem: "class " + p.Class + " is not one this release knows"}
	}
	return partstate.CheckStandbys(c, p, epoch, v.reports[p.ID], func(n string) string { return v.datacenter[n] })
}

func (v standbyView) statuses(p *authority.Partition, epoch uint64) []StandbyStatus {
	out := make([]StandbyStatus, 0, len(p.Standbys))
	for _, s := range p.Standbys {
		st := StandbyStatus{Node: s.Node, CaughtUpSecondsAgo: -1}
		for _, r := range v.reports[p.ID] {
			if r.Node == s.Node {
				st = StandbyStatus{Node: s.Node, Reported: true, Synced: r.Synced(epoch), Epoch: r.Epoch, AppliedLSN: r.AppliedLSN, LagRecords: r.Lag(),
					ReportedSecondsAgo: r.ReportedAgo.Seconds(), CaughtUpSecondsAgo: r.CaughtUpAgo.Seconds()}
				if r.CaughtUpAgo < 0 {
					st.CaughtUpSecondsAgo = -1
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// StallAfter is how long an accepted upload may wait for its publication
// before its partition is called stalled (R138): well past the finalize
// job's retries (every 2 s, ten times) and a failover (the lease TTL).
const StallAfter = time.Minute

// pendingByPartition sums pending publications per partition of m.
func pendingByPartition(m *authority.Map, pending []store.PendingPublication) (map[string]store.PendingPublication, error) {
	ix, err := authority.NewIndex(m)
	if err != nil {
		return nil, err
	}
	out := map[string]store.PendingPublication{}
	for _, p := range pending {
		res, err := ix.ResolveKey(p.Repository)
		if err != nil {
			continue
		}
		agg := out[res.Partition.ID]
		agg.Count += p.Count
		agg.OldestAge = max(agg.OldestAge, p.OldestAge)
		out[res.Partition.ID] = agg
	}
	return out, nil
}

// activity is R138's statement for a partition.
func activity(owned bool, p store.PendingPublication) string {
	switch {
	case !owned:
		return "unowned"
	case p.Count == 0:
		return "idle"
	case p.OldestAge >= StallAfter:
		return "stalled"
	}
	return "working"
}

func (a *Authority) partitions(ctx context.Context) (map[string]any, error) {
	m, err := a.Maps.LatestMap(ctx)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		return map[string]any{"map_version": 0, "partitions": []PartitionStatus{}}, nil
	}
	if err != nil {
		return nil, err
	}
	leases, err := a.Maps.LeaseStatuses(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string]store.LeaseStatus{}
	for _, l := range leases {
		byID[l.Partition] = l
	}
	pending, err := a.Maps.PendingPublications(ctx)
	if err != nil {
		return nil, err
	}
	work, err := pendingByPartition(m, pending)
	if err != nil {
		return nil, err
	}
	sv, err := a.standbyView(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]PartitionStatus, 0, len(m.Partitions))
	for i := range m.Partitions {
		p := &m.Partitions[i]
		ps := PartitionStatus{ID: p.ID, Generation: p.Generation, Class: string(p.Class), MapEpoch: p.Epoch, MapNode: p.Primary.Node, State: "UNOWNED"}
		for _, s := range p.Slots {
			ps.Slots = append(ps.Slots, [2]uint64{uint64(s.Low), uint64(s.High)})
		}
		if l, ok := byID[p.ID]; ok {
			ps.Epoch, ps.Node, ps.Endpoint = l.Epoch, l.OwnerNode, l.OwnerEndpoint
			exp := l.ExpiresAt
			ps.LeaseExpiresAt = &exp
			ps.Owned = l.Live // the database's clock, not this node's (issue 26 point 11)
			ps.State = string(l.State)
			if !ps.Owned {
				ps.State = "UNOWNED" // R133: unowned is its own condition
			} else {
				live := l.ExpiresAt.Add(-l.TTL)
				ps.LiveAt = &live
			}
		}
		w := work[p.ID]
		ps.PendingPublications, ps.OldestPendingSeconds = w.Count, w.OldestAge.Seconds()
		ps.Activity = activity(ps.Owned && ps.State == string(authority.PrimaryServing), w)
		// A map's epoch may lag the lease store's (R16): the primary's
		// is the higher.
		epoch := max(p.Epoch, byID[p.ID].Epoch)
		ps.Standbys, ps.Health = sv.statuses(p, epoch), sv.health(p, epoch)
		ps.Healthy = ps.Health.Healthy()
		rows = append(rows, ps)
	}
	return map[string]any{"map_version": m.Version, "partitions": rows}, nil
}
