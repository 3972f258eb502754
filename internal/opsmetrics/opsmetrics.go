// Package opsmetrics exports what on-call needs beside the request
// metrics (issue 31): the Postgres pool of each process, River's queues
// and its jobs' latency by kind.
package opsmetrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
)

// poolCollector exports pgxpool statistics of named pools at scrape time.
type poolCollector struct {
	pools                                                       map[string]*pgxpool.Pool
	conns, maxConns, acquires, acquireWait, emptyAcq, cancelled *prometheus.Desc
}

// Pools returns a collector of the pools by name ("main", "leases").
func Pools(pools map[string]*pgxpool.Pool) prometheus.Collector {
	l := []string{"pool"}
	return &poolCollector{pools: pools,
		conns:       prometheus.NewDesc("blobplane_db_pool_connections", "Postgres connections of the pool by state: acquired (in use), idle, constructing.", []string{"pool", "state"}, nil),
		maxConns:    prometheus.NewDesc("blobplane_db_pool_max_connections", "The pool's connection limit.", l, nil),
		acquires:    prometheus.NewDesc("blobplane_db_pool_acquires_total", "Connections acquired from the pool.", l, nil),
		acquireWait: prometheus.NewDesc("blobplane_db_pool_acquire_wait_seconds_total", "Time spent acquiring connections (a rising rate against acquires: the pool is too small or Postgres slow).", l, nil),
		emptyAcq:    prometheus.NewDesc("blobplane_db_pool_empty_acquires_total", "Acquires that found no idle connection and had to wait or connect.", l, nil),
		cancelled:   prometheus.NewDesc("blobplane_db_pool_cancelled_acquires_total", "Acquires abandoned because their context ended.", l, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.maxConns, c.acquires, c.acquireWait, c.emptyAcq, c.cancelled} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, p := range c.pools {
		s := p.Stat()
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.AcquiredConns()), name, "acquired")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.IdleConns()), name, "idle")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.ConstructingConns()), name, "constructing")
		ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(s.MaxConns()), name)
		ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(c.acquireWait, prometheus.CounterValue, s.AcquireDuration().Seconds(), name)
		ch <- prometheus.MustNewConstMetric(c.emptyAcq, prometheus.CounterValue, float64(s.EmptyAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(c.cancelled, prometheus.CounterValue, float64(s.CanceledAcquireCount()), name)
	}
}

// queueCollector exports River's jobs by queue and state at scrape time,
// from one grouped query on river_job.
type queueCollector struct {
	pool         *pgxpool.Pool
	jobs, errors *prometheus.Desc
	failures     atomic.Int64 // scrapes may run at once
}

// Queues returns a collector of River's queue depth: jobs by queue and
// state, for the states that are work not yet done (available, running,
// retryable, scheduled).
func Queues(pool *pgxpool.Pool) prometheus.Collector {
	return &queueCollector{pool: pool,
		jobs:   prometheus.NewDesc("blobplane_river_jobs", "River jobs not yet finished, by queue and state (available: waiting for a worker; retryable: failed, to retry; scheduled: for later; running).", []string{"queue", "state"}, nil),
		errors: prometheus.NewDesc("blobplane_river_jobs_scrape_errors_total", "Scrapes whose River queue depth could not be read.", nil, nil),
	}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.jobs; ch <- c.errors }

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.pool.Query(ctx, `SELECT queue, state::text, count(*) FROM river_job
		WHERE state IN ('available', 'running', 'retryable', 'scheduled') GROUP BY 1, 2`)
	if err == nil {
		for rows.Next() {
			var queue, state string
			var n int64
			if err = rows.Scan(&queue, &state, &n); err != nil {
				break
			}
			ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(n), queue, state)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		c.failures.Add(1)
	}
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.failures.Load()))
}

// JobLatency observes every job River finishes in this process: how long
// it ran and how long it waited, by kind and outcome.
type JobLatency struct {
	run, wait *prometheus.HistogramVec
}

// NewJobLatency registers the job latency histograms on reg.
func NewJobLatency(reg prometheus.Registerer) *JobLatency {
	buckets := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}
	j := &JobLatency{
		run: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "blobplane_river_job_run_duration_seconds",
			Help: "Time River jobs ran, by kind and outcome (completed, failed, cancelled, snoozed).", Buckets: buckets}, []string{"kind", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "blobplane_river_job_queue_wait_seconds",
			Help: "Time River jobs waited available before a worker started them, by kind.", Buckets: buckets}, []string{"kind"}),
	}
	reg.MustRegister(j.run, j.wait)
	return j
}

// Follow observes the events of client until ctx ends.
func (j *JobLatency) Follow(ctx context.Context, events <-chan *river.Event) {
	outcomes := map[river.EventKind]string{river.EventKindJobCompleted: "completed", river.EventKindJobFailed: "failed",
		river.EventKindJobCancelled: "cancelled", river.EventKindJobSnoozed: "snoozed"}
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-events:
			if !ok {
				return
			}
			if e.Job == nil || e.JobStats == nil {
				continue
			}
			j.run.WithLabelValues(e.Job.Kind, outcomes[e.Kind]).Observe(e.JobStats.RunDuration.Seconds())
			j.wait.WithLabelValues(e.Job.Kind).Observe(e.JobStats.QueueWaitDuration.Seconds())
		}
	}
}

// EventKinds are the events JobLatency follows.
var EventKinds = []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled, river.EventKindJobSnoozed}
