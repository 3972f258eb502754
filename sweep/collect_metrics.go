package sweep

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CollectMetrics are the collector's and the inventory's Prometheus
// metrics. A nil *CollectMetrics records nothing.
type CollectMetrics struct {
	collectedDigests prometheus.Counter
	reclaimedBytes   prometheus.Counter
	oldestOwed       prometheus.Gauge
	orphanObjects    prometheus.Gauge
	orphanBytes      prometheus.Gauge
	orphansDeleted   prometheus.Counter
	orphanBytesFreed prometheus.Counter
	classified       *prometheus.CounterVec
}

// NewCollectMetrics creates the metrics and registers them on reg (nil:
// unregistered).
func NewCollectMetrics(reg prometheus.Registerer) *CollectMetrics {
	m := &CollectMetrics{
		collectedDigests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_collected_digests_total", Help: "Digests the collector decided to reclaim (no reference, no claim).",
		}),
		reclaimedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_collected_bytes_reclaimed_total", Help: "Content bytes of placements whose bytes a collection deleted.",
		}),
		oldestOwed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_collect_oldest_owed_deletion_seconds", Help: "Age of the oldest collection decision whose byte deletion has not finished (0: none).",
		}),
		orphanObjects: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_inventory_orphan_objects", Help: "Objects the last inventory found that nothing in Postgres accounts for (before deleting them).",
		}),
		orphanBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_inventory_orphan_bytes", Help: "Stored bytes of the orphans the last inventory found.",
		}),
		orphansDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_inventory_orphans_deleted_total", Help: "Orphan objects the inventory deleted.",
		}),
		orphanBytesFreed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_inventory_orphan_bytes_reclaimed_total", Help: "Stored bytes of orphan objects the inventory deleted.",
		}),
		classified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_inventory_objects_classified_total", Help: "Objects the inventory classified, by class.",
		}, []string{"class"}),
	}
	if reg != nil {
		reg.MustRegister(m.collectedDigests, m.reclaimedBytes, m.oldestOwed, m.orphanObjects, m.orphanBytes,
			m.orphansDeleted, m.orphanBytesFreed, m.classified)
	}
	return m
}

func (m *CollectMetrics) collected(n int) {
	if m != nil {
		m.collectedDigests.Add(float64(n))
	}
}

func (m *CollectMetrics) reclaimed(bytes int64) {
	if m != nil {
		m.reclaimedBytes.Add(float64(bytes))
	}
}

func (m *CollectMetrics) owed(age time.Duration) {
	if m != nil {
		m.oldestOwed.Set(age.Seconds())
	}
}

func (m *CollectMetrics) inventory(r InventoryReport) {
	if m == nil {
		return
	}
	m.orphanObjects.Set(float64(r.Orphans))
	m.orphanBytes.Set(float64(r.OrphanBytes))
	m.orphansDeleted.Add(float64(r.OrphansDeleted))
	m.orphanBytesFreed.Add(float64(r.OrphanBytesDeleted))
	for class, n := range r.Classes {
		m.classified.WithLabelValues(string(class)).Add(float64(n))
	}
}
