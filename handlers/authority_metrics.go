package handlers

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// NodeReports is what the authority alarms read besides the map and the
// leases: node → map version in use, and every primary claim nodes report
// with their heartbeats.
type NodeReports interface {
	AuthorityReports(ctx context.Context) (map[string]uint64, []authority.PrimaryReport, error)
}

// authorityCollector computes the authority alarms at scrape time from
// Postgres (one bounded query each), so every api node exports the same
// cluster-wide view:
//   - blobplane_unowned_slots / _partitions: slots with no ready owner — no
//     live SERVING lease (R133; distinct from unhealthy);
//   - blobplane_duplicate_primaries: (partition, epoch) claimed as primary
//     by more than one node (R134, a correctness fault);
//   - blobplane_map_oldest_version_in_use and _age_seconds: the oldest map
//     version any api node, or any client seen here since the last scrape,
//     still routes with (R139).
type authorityCollector struct {
	a       *Authority
	reports NodeReports

	unownedSlots, unownedParts, duplicates, oldest, oldestAge, scrapeErrors *prometheus.Desc
	stalled, pending                                                        *prometheus.Desc
	unhealthy                                                               *prometheus.Desc
	failures                                                                atomic.Uint64
}

func newAuthorityCollector(a *Authority, reports NodeReports) *authorityCollector {
	return &authorityCollector{
		a: a, reports: reports,
		unownedSlots: prometheus.NewDesc("blobplane_unowned_slots", "Slots of the latest map whose partition has no live SERVING lease (ZBP-5 R133).", nil, nil),
		unownedParts: prometheus.NewDesc("blobplane_unowned_partitions", "Partitions of the latest map with no live SERVING lease (ZBP-5 R133).", nil, nil),
		duplicates:   prometheus.NewDesc("blobplane_duplicate_primaries", "Partition epochs claimed as primary by more than one node: a correctness fault (ZBP-5 R134).", nil, nil),
		oldest:       prometheus.NewDesc("blobplane_map_oldest_version_in_use", "Oldest partition map version an api node or a recently seen client routes with (ZBP-5 R139).", nil, nil),
		oldestAge:    prometheus.NewDesc("blobplane_map_oldest_version_in_use_age_seconds", "Age of the oldest map version in use, from its generation time (ZBP-5 R139).", nil, nil),
		scrapeErrors: prometheus.NewDesc("blobplane_authority_metrics_errors_total", "Scrapes whose authority metrics could not be computed.", nil, nil),
		stalled:      prometheus.NewDesc("blobplane_stalled_partitions", "Owned partitions whose oldest accepted upload has waited over a minute for its publication: the home stopped consuming (ZBP-5 R138; an idle partition has none waiting).", nil, nil),
		pending:      prometheus.NewDesc("blobplane_pending_publications", "Uploads accepted (202) and not yet published, all partitions.", nil, nil),
		unhealthy: prometheus.NewDesc("blobplane_unhealthy_partitions",
			"Partitions of the latest map not meeting their class's standby requirements, by reason: standbys (fewer synced standbys than the class requires, ZBP-5 R60), diversity (a standby in its primary's failure domain, R62).",
			[]string{"reason"}, nil),
	}
}

func (c *authorityCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.unownedSlots, c.unownedParts, c.duplicates, c.oldest, c.oldestAge, c.scrapeErrors, c.stalled, c.pending, c.unhealthy} {
		ch <- d
	}
}

func (c *authorityCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.collect(ctx, ch); err != nil {
		c.failures.Add(1)
		if c.a.Logger != nil {
			c.a.Logger.Warn("authority metrics", "err", err)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.scrapeErrors, prometheus.CounterValue, float64(c.failures.Load()))
}

func (c *authorityCollector) collect(ctx context.Context, ch chan<- prometheus.Metric) error {
	m, err := c.a.Maps.LatestMap(ctx)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		return nil // nothing published: nothing to own yet
	}
	if err != nil {
		return err
	}
	leases, err := c.a.Maps.LeaseStatuses(ctx)
	if err != nil {
		return err
	}
	live := map[string]authority.LeaseRecord{}
	for _, l := range leases {
		if l.Live { // the database's clock, not this node's (issue 26 point 11)
			live[l.Partition] = l.LeaseRecord
		}
	}
	parts, slots := authority.UnownedPartitions(m, func(p *authority.Partition) bool {
		l, ok := live[p.ID]
		return ok && l.State == authority.PrimaryServing && l.Epoch >= p.Epoch
	})
	ch <- prometheus.MustNewConstMetric(c.unownedSlots, prometheus.GaugeValue, float64(slots))
	ch <- prometheus.MustNewConstMetric(c.unownedParts, prometheus.GaugeValue, float64(len(parts)))

	pending, err := c.a.Maps.PendingPublications(ctx)
	if err != nil {
		return err
	}
	work, err := pendingByPartition(m, pending)
	if err != nil {
		return err
	}
	stalled, total := 0, 0
	for id, w := range work {
		total += w.Count
		l, ok := live[id]
		if activity(ok && l.State == authority.PrimaryServing, w) == "stalled" {
			stalled++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, float64(stalled))
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(total))
	if err := c.collectHealth(ctx, ch, m, leases); err != nil {
		return err
	}

	versions, claims, err := c.reports.AuthorityReports(ctx)
	if err != nil {
		return err
	}
	ch <- prometheus.MustNewConstMetric(c.duplicates, prometheus.GaugeValue, float64(len(authority.DuplicatePrimaries(claims))))
	if v := c.a.takeOldestClientVersion(); v > 0 {
		versions["clients@"+c.a.NodeID] = v
	}
	if v, _, ok := authority.OldestMapVersion(versions); ok {
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, float64(v))
		age := 0.0
		if v > 0 {
			if old, err := c.a.Maps.MapVersion(ctx, v); err == nil {
				age = time.Since(old.GeneratedAt).Seconds()
			}
		}
		ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, age)
	}
	return nil
}

// collectHealth exports how many partitions of m miss their class's
// standby requirements, by reason (R60, R62); both reasons always appear.
func (c *authorityCollector) collectHealth(ctx context.Context, ch chan<- prometheus.Metric, m *authority.Map, leases []store.LeaseStatus) error {
	sv, err := c.a.standbyView(ctx)
	if err != nil {
		return err
	}
	epochs := map[string]uint64{}
	for _, l := range leases {
		epochs[l.Partition] = l.Epoch
	}
	counts := map[string]int{"standbys": 0, "diversity": 0}
	for i := range m.Partitions {
		p := &m.Partitions[i]
		if h := sv.health(p, max(p.Epoch, epochs[p.ID])); !h.Healthy() {
			counts[h.Reason()]++
		}
	}
	for reason, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.unhealthy, prometheus.GaugeValue, float64(n), reason)
	}
	return nil
}
