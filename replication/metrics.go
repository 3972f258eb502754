package replication

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane/placement"
)

// Metrics are the transfers' and the scrub's Prometheus metrics (issue
// 28). A nil *Metrics records nothing.
type Metrics struct {
	copies     *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	failures   *prometheus.CounterVec
	scrubBytes *prometheus.CounterVec
	findings   *prometheus.CounterVec
	lag        *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg (nil:
// unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		copies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_replication_blobs_total", Help: "Copies verified at their target, by source and target datacenter.",
		}, []string{"source", "target"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_replication_bytes_total", Help: "Content bytes copied into verified copies, by source and target datacenter.",
		}, []string{"source", "target"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_replication_failures_total", Help: "Failed copy attempts by target datacenter and reason (source_unavailable, digest_mismatch, backend_refused); each is retried.",
		}, []string{"target", "reason"}),
		scrubBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_scrub_bytes_total", Help: "Stored content bytes the scrub re-read and re-hashed, by datacenter.",
		}, []string{"datacenter"}),
		findings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_scrub_checks_total", Help: "Placements the scrub checked, by datacenter and finding (intact, digest_mismatch, missing), and those it could not (too_large: no pass can read them whole at BLOBPLANE_SCRUB_RATE).",
		}, []string{"datacenter", "finding"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "blobplane_scrub_oldest_check_age_seconds", Help: "Age of the least recently checked verified placement of a datacenter at the start of its last scrub pass; above BLOBPLANE_SCRUB_PERIOD the scrub is behind.",
		}, []string{"datacenter"}),
	}
	if reg != nil {
		reg.MustRegister(m.copies, m.bytes, m.failures, m.scrubBytes, m.findings, m.lag)
	}
	return m
}

func (m *Metrics) copied(source, target string, n int64) {
	if m != nil {
		m.copies.WithLabelValues(source, target).Inc()
		m.bytes.WithLabelValues(source, target).Add(float64(n))
	}
}

func (m *Metrics) failed(target string, reason placement.Reason) {
	if m != nil {
		m.failures.WithLabelValues(target, string(reason)).Inc()
	}
}

func (m *Metrics) scrubLag(datacenter string, age time.Duration) {
	if m != nil {
		m.lag.WithLabelValues(datacenter).Set(age.Seconds())
	}
}

func (m *Metrics) scrubbed(datacenter string, rep ScrubReport) {
	if m == nil {
		return
	}
	m.scrubBytes.WithLabelValues(datacenter).Add(float64(rep.Bytes))
	for finding, n := range map[string]int{"intact": rep.Intact, "digest_mismatch": rep.Mismatched, "missing": rep.Missing, "too_large": rep.TooLarge} {
		m.findings.WithLabelValues(datacenter, finding).Add(float64(n))
	}
}

// Backlog is the replication work waiting per target datacenter.
type Backlog struct {
	Datacenter string
	Jobs       int64
	OldestAge  time.Duration
}

// BacklogSource reads the backlog (jobs: the unfinished replicate jobs).
type BacklogSource func(ctx context.Context) ([]Backlog, error)

// BacklogCollector exports, at each scrape, every target datacenter's
// unfinished copies and the age of the oldest: how far behind its
// policy the datacenter is (the reconciler gives every missing copy a
// job, so the oldest job is the oldest missing copy).
type BacklogCollector struct {
	Read   BacklogSource
	Logger *slog.Logger
	depth  *prometheus.Desc
	oldest *prometheus.Desc
}

// NewBacklogCollector is a collector over read.
func NewBacklogCollector(read BacklogSource, logger *slog.Logger) *BacklogCollector {
	return &BacklogCollector{Read: read, Logger: logger,
		depth:  prometheus.NewDesc("blobplane_replication_queue_depth", "Unfinished copies into a datacenter (replicate jobs not yet completed, cancelled or discarded).", []string{"datacenter"}, nil),
		oldest: prometheus.NewDesc("blobplane_oldest_unreplicated_copy_age_seconds", "Age of the oldest unfinished copy into a datacenter (0: none): its replication lag.", []string{"datacenter"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.depth; ch <- c.oldest }

// Collect implements prometheus.Collector; a failed read exports nothing
// (and is logged) rather than zeros.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bl, err := c.Read(ctx)
	if err != nil {
		c.Logger.Warn("cannot read the replication backlog for metrics", "err", err)
		return
	}
	for _, b := range bl {
		ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(b.Jobs), b.Datacenter)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, b.OldestAge.Seconds(), b.Datacenter)
	}
}

// Copies, Bytes and Failures are the counters of one label set (tests
// and operators' tooling read them).
func (m *Metrics) Copies(source, target string) prometheus.Counter {
	return m.copies.WithLabelValues(source, target)
}

func (m *Metrics) Bytes(source, target string) prometheus.Counter {
	return m.bytes.WithLabelValues(source, target)
}

func (m *Metrics) Failures(target string, reason placement.Reason) prometheus.Counter {
	return m.failures.WithLabelValues(target, string(reason))
}

func (m *Metrics) Findings(datacenter, finding string) prometheus.Counter {
	return m.findings.WithLabelValues(datacenter, finding)
}

func (m *Metrics) ScrubLag(datacenter string) prometheus.Gauge {
	return m.lag.WithLabelValues(datacenter)
}
