package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/blobplane/blobplane/store"
)

// Metrics holds the HTTP metrics and the registry /metrics serves.
type Metrics struct {
	Registry *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight prometheus.Gauge
	// authRefused counts authentication attempts refused unchecked by
	// the failure limiter, by limit: "address" or "token" (authlimit.go).
	authRefused *prometheus.CounterVec
	// overloaded counts requests refused by the node's capacity budget.
	overloaded prometheus.Counter
}

// NewMetrics builds a registry with Go and process collectors plus the HTTP
// request metrics. Every label is bounded by the code, never by a client:
// the chi route pattern (never the raw path), the method mapped to a fixed
// set (methodLabel), the status as the numeric code the handler wrote.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_http_requests_total",
			Help: "HTTP requests by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "blobplane_http_request_duration_seconds",
			Help:    "HTTP request duration by route pattern and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "method"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_http_requests_in_flight",
			Help: "HTTP requests being served.",
		}),
		authRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_auth_refused_total",
			Help: "Authentication attempts refused unchecked (429) after too many failures, by limit: address or token (id).",
		}, []string{"limit"}),
		overloaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_http_overloaded_total",
			Help: "Requests answered 503 at once because the node was over its capacity budget (BLOBPLANE_MAX_REQUESTS).",
		}),
	}
	reg.MustRegister(m.requests, m.duration, m.inflight, m.authRefused, m.overloaded)
	return m
}

func (m *Metrics) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m.inflight.Inc()
		defer m.inflight.Dec()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		route := routePattern(r)
		status := ww.Status()
		if status == 0 {
			status = http.StatusOK
		}
		method := methodLabel(r.Method)
		m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
		m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
	})
}

// methodLabel maps a request method to one of a fixed set of label values.
// The method is whatever token a client sends (up to the header limit) and
// is labelled before authentication, so a raw one would let anyone mint
// series without bound (issue 26 point 4).
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return method
	}
	return "OTHER"
}

func routePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if p := rc.RoutePattern(); p != "" {
			return p
		}
	}
	return "unmatched"
}

// RegisterCache exports the cache called name, read from stats at every
// scrape: blobplane_cache_hits_total, _misses_total and
// _invalidations_total, blobplane_cache_entries, and
// blobplane_cache_listening (1 while its LISTEN connection is up, so the
// cache serves; 0 while every request asks Postgres), all labelled
// cache=name.
func (m *Metrics) RegisterCache(name string, stats func() store.CacheStats) {
	labels := prometheus.Labels{"cache": name}
	counter := func(metric, help string, v func(store.CacheStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "blobplane_cache_" + metric, Help: help, ConstLabels: labels},
			func() float64 { return float64(v(stats())) })
	}
	gauge := func(metric, help string, v func(store.CacheStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "blobplane_cache_" + metric, Help: help, ConstLabels: labels},
			func() float64 { return v(stats()) })
	}
	m.Registry.MustRegister(
		counter("hits_total", "Answers served from the cache without a query.", func(s store.CacheStats) uint64 { return s.Hits }),
		counter("misses_total", "Lookups that asked Postgres while the cache was started.", func(s store.CacheStats) uint64 { return s.Misses }),
		counter("invalidations_total", "Times the cache was emptied (a NOTIFY, or a write through this process).", func(s store.CacheStats) uint64 { return s.Invalidations }),
		gauge("entries", "Entries cached now.", func(s store.CacheStats) float64 { return float64(s.Entries) }),
		gauge("listening", "1 while the cache's LISTEN connection is up and the cache serves; 0 while every lookup asks Postgres.", func(s store.CacheStats) float64 {
			if s.Listening {
				return 1
			}
			return 0
		}),
	)
}

// RegisterBatches exports the batching of one hot path's transactions
// (path "finalize": publications, "claim": upload claims; docs/uploads.md),
// read from stats at every scrape, labelled path=path:
// blobplane_batches_total (batches of two or more committed),
// blobplane_batched_calls_total (calls they committed) and
// blobplane_batch_fallbacks_total (calls whose batch did not commit, each
// then run alone). batched_calls / batches is the mean batch size.
func (m *Metrics) RegisterBatches(path string, stats func() store.BatchStats) {
	labels := prometheus.Labels{"path": path}
	counter := func(name, help string, v func(store.BatchStats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v(stats())) })
	}
	m.Registry.MustRegister(
		counter("blobplane_batches_total", "Batches of two or more calls committed in one transaction.",
			func(s store.BatchStats) int64 { return s.Batches }),
		counter("blobplane_batched_calls_total", "Calls committed in batches.",
			func(s store.BatchStats) int64 { return s.Batched }),
		counter("blobplane_batch_fallbacks_total", "Calls whose batch did not commit (a refusal or an error in it), then run alone.",
			func(s store.BatchStats) int64 { return s.Fallback }),
	)
}

// RegisterChainedCloses exports how many uploads closed as chained closes
// (store.ChainedClose: the claim and the publication's statements sent
// at once).
func (m *Metrics) RegisterChainedCloses(chained func() int64) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "blobplane_chained_closes_total",
		Help: "Upload closes whose claim and publication statements went to Postgres at once (store.ChainedClose)."},
		func() float64 { return float64(chained()) }))
}
