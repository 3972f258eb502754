package read

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane/placement"
)

// Metrics are the read path's counters. A nil *Metrics records nothing.
type Metrics struct {
	corruptions *prometheus.CounterVec
	losses      *prometheus.CounterVec
	remotes     *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg (nil:
// unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		corruptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_read_corruptions_total",
			Help: "Reads that found a verified copy's bytes not proving its digest (other bytes, short, long, undecodable), by the copy's datacenter and backend; each copy is failed and repaired.",
		}, []string{"datacenter", "backend"}),
		losses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_read_losses_total",
			Help: "Reads that found a verified copy's object missing from its backend, by datacenter and backend; each copy is failed and repaired.",
		}, []string{"datacenter", "backend"}),
		remotes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_read_remote_total",
			Help: "Reads served from another datacenter's copy through one of its nodes, by that datacenter.",
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.corruptions, m.losses, m.remotes)
	}
	return m
}

func (m *Metrics) damaged(what string, p placement.Placement) {
	if m == nil {
		return
	}
	if what == "lost" {
		m.losses.WithLabelValues(p.Datacenter, p.Backend).Inc()
		return
	}
	m.corruptions.WithLabelValues(p.Datacenter, p.Backend).Inc()
}

func (m *Metrics) remote(dc string) {
	if m != nil {
		m.remotes.WithLabelValues(dc).Inc()
	}
}

// Corruptions, Losses and Remote are the counters of one label set.
func (m *Metrics) Corruptions(datacenter, backend string) prometheus.Counter {
	return m.corruptions.WithLabelValues(datacenter, backend)
}

func (m *Metrics) Losses(datacenter, backend string) prometheus.Counter {
	return m.losses.WithLabelValues(datacenter, backend)
}

func (m *Metrics) Remote(source string) prometheus.Counter {
	return m.remotes.WithLabelValues(source)
}
