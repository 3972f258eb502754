package sweep

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane/backend"
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
	// issue 29, "No leaked bytes"
	residueDeleted        *prometheus.CounterVec // kind
	residueBytesReclaimed *prometheus.CounterVec // kind
	refusedPasses         *prometheus.CounterVec // reason
	heldObjects           prometheus.Gauge
	handedBack            prometheus.Counter
	stalePlacements       prometheus.Counter
	// issue 32, lost copies
	unrecorded    prometheus.Gauge
	rediscovered  prometheus.Counter
	rediscoverBad prometheus.Counter
}

// NewCollectMetrics creates the metrics and registers them on reg (nil:
// unregistered).
func NewCollectMetrics(reg prometheus.Registerer) *CollectMetrics {
	m := &CollectMetrics{
		collectedDigests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_collected_digests_total", Help: "Digests the collector decided to reclaim (no reference, no claim).",
		}),
		reclaimedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_collect_reclaimed_bytes_total", Help: "Content bytes of placements whose bytes a collection deleted.",
		}),
		oldestOwed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_collect_oldest_owed_deletion_seconds", Help: "How long past the collection delete delay (BLOBPLANE_COLLECT_DELETE_DELAY) the oldest collection decision whose byte deletion has not finished is (0: none overdue).",
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
			Name: "blobplane_inventory_orphan_reclaimed_bytes_total", Help: "Stored bytes of orphan objects the inventory deleted.",
		}),
		classified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_inventory_objects_classified_total", Help: "Objects the inventory classified, by class.",
		}, []string{"class"}),
		residueDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_inventory_reclaimed_total", Help: "Residue the inventory deleted, by kind: tmp (temp files or objects of unfinished writes), staged (staged uploads no intent owns), multipart (incomplete S3 multipart uploads). Orphan objects are counted by blobplane_inventory_orphans_deleted_total.",
		}, []string{"kind"}),
		residueBytesReclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_inventory_reclaimed_bytes_total", Help: "Stored bytes of the residue the inventory deleted, by kind, as listed (a multipart upload's parts are not summed).",
		}, []string{"kind"}),
		refusedPasses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobplane_inventory_refused_passes_total", Help: "Inventory passes over a backend that deleted nothing because its ownership marker does not vouch for this database, by reason: marker_foreign, marker_missing, marker_unreadable, database_behind, database_empty.",
		}, []string{"reason"}),
		heldObjects: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_inventory_held_objects", Help: "Orphans and residue past the minimum age that the last inventory pass did not delete because of the per-pass cap (all of them on the pass that only reported them).",
		}),
		handedBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_inventory_handed_back_total", Help: "Verified copies no blob row collected (an upload abandoned after its verification) that the inventory handed back to the collector.",
		}),
		unrecorded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "blobplane_inventory_unrecorded_objects", Help: "Referenced objects the last inventory found with no placement of them on their backend in the ledger: copies the database lost (restored to an earlier point).",
		}),
		rediscovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_inventory_rediscovered_total", Help: "Copies the database had lost that the inventory re-hashed and recorded as verified placements.",
		}),
		rediscoverBad: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_inventory_rediscover_mismatches_total", Help: "Unrecorded referenced objects whose bytes did not hash to their digest: not recorded, left in place.",
		}),
		stalePlacements: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobplane_collect_stale_placements_total", Help: "Pending placements whose writer was gone (no pending intent claims the digest, no replicate job into the datacenter is unfinished) that the collector failed, so their bytes can be reclaimed.",
		}),
	}
	for _, r := range Refusals {
		m.refusedPasses.WithLabelValues(string(r))
	}
	for _, k := range backend.ResidueKinds {
		m.residueDeleted.WithLabelValues(string(k))
		m.residueBytesReclaimed.WithLabelValues(string(k))
	}
	if reg != nil {
		reg.MustRegister(m.collectedDigests, m.reclaimedBytes, m.oldestOwed, m.orphanObjects, m.orphanBytes,
			m.orphansDeleted, m.orphanBytesFreed, m.classified,
			m.residueDeleted, m.residueBytesReclaimed, m.refusedPasses, m.heldObjects, m.handedBack, m.stalePlacements,
			m.unrecorded, m.rediscovered, m.rediscoverBad)
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
	if !r.DryRun {
		m.heldObjects.Set(float64(r.Held))
		m.handedBack.Add(float64(r.HandedBack))
		m.unrecorded.Set(float64(r.Unrecorded))
		m.rediscovered.Add(float64(r.Rediscovered))
		m.rediscoverBad.Add(float64(r.RediscoverMismatched))
	}
}

func (m *CollectMetrics) residueReclaimed(r backend.Residue) {
	if m != nil {
		m.residueDeleted.WithLabelValues(string(r.Kind)).Inc()
		m.residueBytesReclaimed.WithLabelValues(string(r.Kind)).Add(float64(r.Size))
	}
}

func (m *CollectMetrics) refused(dryRun bool, r Refusal) {
	if m != nil && !dryRun {
		m.refusedPasses.WithLabelValues(string(r)).Inc()
	}
}

func (m *CollectMetrics) staleFailed(n int) {
	if m != nil {
		m.stalePlacements.Add(float64(n))
	}
}
