package partstate

import "github.com/prometheus/client_golang/prometheus"

// Test access to the standbys' and promotions' metrics.

func (m *Metrics) StandbyLag(partition string) prometheus.Gauge {
	return m.standbyLag.WithLabelValues(partition)
}

func (m *Metrics) StandbyStopped(partition string) prometheus.Gauge {
	return m.standbyStop.WithLabelValues(partition)
}

func (m *Metrics) Promotions() prometheus.Counter { return m.promotions }
