//go:build unix

package soak_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The replication fault tests of issue 28 (docs/replication.md): three
// datacenters as real processes (replication_cluster_test.go), one of them
// on MinIO, on one private Postgres. Each test starts its own cluster and
// stops everything it started, failing or not.

func skipShortReplication(t *testing.T) {
	if testing.Short() {
		t.Skip("replication soak: starts Postgres, MinIO and three datacenters' apis and workers; skipped with -short")
	}
}

// TestReplicationReachesEveryDatacenter: a blob uploaded through eu-1 is
// copied by the workers of us-1 (filesystem) and ap-1 (MinIO) without
// anyone asking: the ledger shows a verified copy in each, at the blob's
// size, and each datacenter's api (which serves only its own datacenter's
// verified copies) returns the exact bytes.
func TestReplicationReachesEveryDatacenter(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repo := c.repoHomedAt(t, ctx, eu1)

	// Above the S3 backend's part size (16 MiB): ap-1's copy is a
	// multipart upload completed only once the content verified.
	b := newBlob(t, 24<<20)
	if err := c.upload(ctx, eu1, repo, b); err != nil {
		t.Fatal(err)
	}
	took := eventually(t, ctx, repBound, "verified copies of "+b.String()+" in us-1 and ap-1", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		for _, dc := range repDCs {
			if p, ok := ps[dc]; !ok || p.state != "verified" || p.size != b.size {
				return false, describe(ps)
			}
		}
		return true, ""
	})
	t.Logf("replication soak: %s verified in every datacenter %s after its upload", b, took.Round(time.Millisecond))
	for _, dc := range repDCs {
		if err := c.readBack(ctx, dc, repo, b); err != nil {
			t.Error(err)
		}
	}
	// The targets' workers counted the copies they made.
	for _, dc := range []string{us1, ap1} {
		m, err := c.scrape(ctx, dc)
		if err != nil {
			t.Fatal(err)
		}
		if n := m[`blobplane_replication_blobs_total{source="eu-1",target="`+dc+`"}`]; n != 1 {
			t.Errorf("replication soak: worker-%s counted %v copies from eu-1, want 1", dc, n)
		}
	}
}

// TestReplicationSurvivesWorkerKill: the us-1 worker is killed with
// SIGKILL while it copies a 512 MiB blob from eu-1. No object is visible
// at us-1's content address afterwards (a half-written copy never is, S2);
// restarted with the same node id, the worker takes its cut-off job back
// at once (jobs.TakeBackRunning), the retry takes the pending row over
// under a newer epoch, and the copy completes with the exact bytes.
//
// The link from eu-1 to the other datacenters is limited to 64 MiB/s
// while the kill is aimed, so that the copy lasts about 8 s on any
// machine (unthrottled on loopback it took 1.7 s on two cores, and less
// on a faster machine); it is lifted once the worker is dead.
func TestReplicationSurvivesWorkerKill(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repo := c.repoHomedAt(t, ctx, eu1)

	b := newBlob(t, 512<<20)
	c.links[eu1].setRate(64 << 20)
	if err := c.upload(ctx, eu1, repo, b); err != nil {
		t.Fatal(err)
	}

	// The transfer started: us-1's target row is staged pending, and the
	// worker's write has its temp file in the object's directory, with
	// some 64 MiB in it already (the source answered and bytes stream;
	// about a second into the copy at the link's rate).
	var first ledgerRow
	eventually(t, ctx, repBound, "us-1's copy of "+b.String()+" in flight", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		p, ok := ps[us1]
		if ok && p.state != "pending" {
			t.Fatalf("replication soak: us-1's copy is %s before the kill: the transfer was not slowed enough to be cut off", p)
		}
		first = p
		written := c.tempBytes(us1, b)
		return ok && written >= 64<<20, fmt.Sprintf("%s; us-1's temp files hold %d bytes", describe(ps), written)
	})
	if err := c.workers[us1].kill(); err != nil {
		t.Fatal(err)
	}
	c.links[eu1].setRate(0)
	t.Logf("replication soak: worker-us-1 killed with SIGKILL while its copy was pending at epoch %d; its write's temp file holds %d of %d bytes",
		first.epoch, c.tempBytes(us1, b), b.size)

	// Nothing at the content address; the ledger still says pending
	// under the first attempt's epoch; River still has the attempt as
	// running, by the dead worker.
	if _, err := os.Lstat(c.objectPath(us1, b)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("replication soak: after the kill, us-1's object path %s: %v (want it absent: no half object)", c.objectPath(us1, b), err)
	}
	ps, err := c.placements(ctx, b.digest)
	if err != nil {
		t.Fatal(err)
	}
	if p := ps[us1]; p.state != "pending" || p.epoch != first.epoch {
		t.Fatalf("replication soak: us-1's row after the kill is %s, want pending at epoch %d", p, first.epoch)
	}
	job, err := c.replicateJob(ctx, b.digest, us1)
	if err != nil {
		t.Fatal(err)
	}
	if job.state != "running" || job.attempt != 1 || !slices.Equal(job.attemptedBy, []string{"worker-us-1"}) {
		t.Fatalf("replication soak: after the kill, %s; want running, attempt 1, by worker-us-1", job)
	}

	// The same node id again: the job is taken back at start, not after
	// River's rescue delay.
	restarted := time.Now()
	if err := c.workers[us1].start(); err != nil {
		t.Fatal(err)
	}
	var done ledgerRow
	eventually(t, ctx, repBound, "us-1's copy of "+b.String()+" verified after the restart", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		done = ps[us1]
		return done.state == "verified", describe(ps)
	})
	t.Logf("replication soak: us-1's copy verified at epoch %d, %s after the worker's restart", done.epoch, time.Since(restarted).Round(time.Millisecond))
	if done.epoch <= first.epoch || done.size != b.size {
		t.Errorf("replication soak: us-1's copy verified as %s (%d bytes), want an epoch above the cut-off attempt's %d and %d bytes", done, done.size, first.epoch, b.size)
	}
	if n := c.workers[us1].logCount("took back the jobs a previous worker"); n != 1 {
		t.Errorf("replication soak: worker-us-1 logged taking back running jobs %d times, want once (at its restart)", n)
	}
	eventually(t, ctx, repBound, "us-1's replicate job completed", func() (bool, string) {
		job, err = c.replicateJob(ctx, b.digest, us1)
		if err != nil {
			return false, err.Error()
		}
		return job.state == "completed", job.String()
	})
	if job.attempt != 2 || len(job.errors) != 1 || !strings.Contains(job.errors[0], "taken back") {
		t.Errorf("replication soak: %s; want completed at attempt 2, after the one taken-back attempt", job)
	}

	// The bytes: us-1's stored object itself, and through us-1's api.
	n, got, err := c.storedCopy(ctx, us1, b)
	if err != nil || n != b.size || got != b.digest {
		t.Errorf("replication soak: us-1's stored copy: %d bytes hashing to %s (%v), want %s", n, got, err, b)
	}
	if err := c.readBack(ctx, us1, repo, b); err != nil {
		t.Error(err)
	}
	// The killed attempt's temp file stays behind until the inventory
	// sweep takes it; it was never visible at the content address.
	t.Logf("replication soak: temp files left in us-1's object directory: %v", c.tempFiles(us1, b))

	// ap-1's copy (unaffected) completes too, so that nothing is in
	// flight when the cluster stops.
	eventually(t, ctx, repBound, "ap-1's copy of "+b.String()+" verified", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		return ps[ap1].state == "verified", describe(ps)
	})
}

// TestReplicationWaitsOutBackendOutage: with ap-1's MinIO down, the copy
// of a blob uploaded through eu-1 fails at ap-1 (the ledger row failed,
// backend_refused) and is retried; the ap-1 worker's metrics show the
// backlog (queue depth ≥ 1, oldest unreplicated copy's age > 0). MinIO
// back on the same address and data directory, the next retry (River's
// backoff, attempt⁴ s) verifies the copy with nobody re-running anything,
// and the backlog drains to 0.
func TestReplicationWaitsOutBackendOutage(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repo := c.repoHomedAt(t, ctx, eu1)

	if err := c.minio.kill(); err != nil {
		t.Fatal(err)
	}
	b := newBlob(t, 4<<20)
	if err := c.upload(ctx, eu1, repo, b); err != nil {
		t.Fatal(err)
	}
	// us-1 is unaffected.
	eventually(t, ctx, repBound, "us-1's copy of "+b.String()+" verified", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		return ps[us1].state == "verified", describe(ps)
	})
	// ap-1's copy failed twice: the first attempt, and its first retry
	// (due 1 s later). Waiting for the second failure makes the next
	// retry's time known (16 s after it), and proves the copy is retried.
	var job jobRow
	eventually(t, ctx, repBound, "ap-1's copy of "+b.String()+" failed and retried", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		p := ps[ap1]
		if p.state == "verified" {
			t.Fatalf("replication soak: ap-1's copy verified while its MinIO is down: %s", describe(ps))
		}
		if job, err = c.replicateJob(ctx, b.digest, ap1); err != nil {
			return false, err.Error()
		}
		return p.state == "failed" && job.state == "retryable" && len(job.errors) >= 2, describe(ps) + "; " + job.String()
	})
	ps, err := c.placements(ctx, b.digest)
	if err != nil {
		t.Fatal(err)
	}
	if r := ps[ap1].reason; r != "backend_refused" && r != "source_unavailable" {
		t.Errorf("replication soak: ap-1's row failed with reason %q, want backend_refused (or source_unavailable)", r)
	}
	t.Logf("replication soak: with MinIO down, ap-1's copy is %s; %s", ps[ap1], job)

	m, err := c.scrape(ctx, ap1)
	if err != nil {
		t.Fatal(err)
	}
	depth, age := m[`blobplane_replication_queue_depth{datacenter="ap-1"}`], m[`blobplane_oldest_unreplicated_copy_age_seconds{datacenter="ap-1"}`]
	if depth < 1 || age <= 0 {
		t.Errorf("replication soak: ap-1's worker exports queue depth %v and oldest copy age %v s during the outage, want ≥ 1 and > 0", depth, age)
	}
	if f := m[`blobplane_replication_failures_total{reason="`+ps[ap1].reason+`",target="ap-1"}`]; f < 2 {
		t.Errorf("replication soak: ap-1's worker counted %v failed attempts (%s), want ≥ 2", f, ps[ap1].reason)
	}
	t.Logf("replication soak: during the outage ap-1's queue depth is %v, its oldest unreplicated copy %.1f s old", depth, age)

	// MinIO back, same address and data: the bucket is there again.
	back := time.Now()
	if err := c.startMinIOProc(ctx); err != nil {
		t.Fatal(err)
	}
	// No operator action: the job's next retry is due at its scheduled
	// time (attempt⁴ s after the last failure: 16 s after the second,
	// which MinIO normally beats by far; 81 s after a third, should
	// MinIO have been slower than that), and River's scheduler makes it
	// available within seconds of that. The bound counts from that time.
	if job, err = c.replicateJob(ctx, b.digest, ap1); err != nil {
		t.Fatal(err)
	}
	bound := 30 * time.Second
	if job.state == "retryable" {
		bound += max(time.Until(job.scheduledAt), 0)
	}
	t.Logf("replication soak: MinIO serves again %s after its restart began; the copy's %s", time.Since(back).Round(time.Millisecond), job.String())
	if bound > 2*time.Minute {
		t.Fatalf("replication soak: the copy's next retry is %s away (%s): not what the test waits for", bound, job)
	}
	eventually(t, ctx, bound, "ap-1's copy of "+b.String()+" verified once MinIO is back", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		return ps[ap1].state == "verified", describe(ps)
	})
	ps, err = c.placements(ctx, b.digest)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replication soak: ap-1's copy %s, %s after MinIO came back", ps[ap1], time.Since(back).Round(time.Millisecond))
	if err := c.readBack(ctx, ap1, repo, b); err != nil {
		t.Error(err)
	}
	// The backlog drains: no unfinished copy into ap-1 is left, and the
	// series read 0 (every registered datacenter is exported, drained or
	// not).
	eventually(t, ctx, repBound, "ap-1's replication queue depth and lag back to 0", func() (bool, string) {
		m, err := c.scrape(ctx, ap1)
		if err != nil {
			return false, err.Error()
		}
		depth, ok := m[`blobplane_replication_queue_depth{datacenter="ap-1"}`]
		age, aok := m[`blobplane_oldest_unreplicated_copy_age_seconds{datacenter="ap-1"}`]
		return ok && aok && depth == 0 && age == 0, "depth " + metricDesc(ok, depth) + ", age " + metricDesc(aok, age)
	})
}

func metricDesc(exported bool, v float64) string {
	if !exported {
		return "not exported"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// describe renders a digest's placements by datacenter.
func describe(ps map[string]ledgerRow) string {
	if len(ps) == 0 {
		return "no placement"
	}
	var parts []string
	for _, dc := range repDCs {
		if p, ok := ps[dc]; ok {
			parts = append(parts, dc+": "+p.String())
		} else {
			parts = append(parts, dc+": none")
		}
	}
	return strings.Join(parts, ", ")
}

// TestReplicationPolicyChangeConverges: a repository whose policy keeps
// its blobs in eu-1 only publishes without a copy anywhere else (no
// replicate job at all); once its policy adds ap-1, the reconciler asks
// for the copy and ap-1's worker makes it, with nobody re-running
// anything, while us-1, still outside the policy, gets none.
func TestReplicationPolicyChangeConverges(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repo := c.repoHomedAt(t, ctx, eu1)
	c.setPolicy(t, ctx, repo, `{"datacenters": ["eu-1"]}`)

	b := newBlob(t, 1<<20)
	if err := c.upload(ctx, eu1, repo, b); err != nil {
		t.Fatal(err)
	}
	jobs := func(target string) int {
		var n int
		if err := c.db.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'replicate' AND args->>'digest' = $1 AND args->>'target_datacenter' = $2`, b.digest, target).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := jobs(us1) + jobs(ap1); n != 0 {
		t.Fatalf("replicate jobs for a blob the policy keeps in eu-1: %d", n)
	}

	c.setPolicy(t, ctx, repo, `{"datacenters": ["ap-1", "eu-1"], "min_verified_copies": 2}`)
	took := eventually(t, ctx, repBound, "a verified copy of "+b.String()+" in ap-1 after the policy added it", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		p, ok := ps[ap1]
		return ok && p.state == "verified" && p.size == b.size, describe(ps)
	})
	t.Logf("replication soak: the policy change reached ap-1 %s after it was set", took.Round(time.Millisecond))
	if err := c.readBack(ctx, ap1, repo, b); err != nil {
		t.Error(err)
	}
	if n := jobs(us1); n != 0 {
		t.Errorf("replicate jobs into us-1, outside the policy: %d", n)
	}
}

// verifiedIn waits until b has a verified copy, at its size, in each of
// dcs, and returns how long that took.
func (c *repCluster) verifiedIn(t *testing.T, ctx context.Context, b blob, dcs ...string) time.Duration {
	t.Helper()
	return eventually(t, ctx, repBound, "verified copies of "+b.String()+" in "+strings.Join(dcs, ", "), func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		for _, dc := range dcs {
			if p, ok := ps[dc]; !ok || p.state != "verified" || p.size != b.size {
				return false, describe(ps)
			}
		}
		return true, ""
	})
}

// TestDatacenterJoinsARunningCluster: ap-1 is not running when a blob is
// published through eu-1, so the default policy (every registered
// datacenter) copies it into us-1 only. Then ap-1's api and worker start:
// without anyone re-running anything, the reconciler (every 2 s here)
// sees the new datacenter and its worker copies the blob in; a blob
// published through ap-1 reaches the other two.
func TestDatacenterJoinsARunningCluster(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepClusterWith(t, repOpts{late: []string{ap1}})
	repo := c.repoHomedAt(t, ctx, eu1)

	before := newBlob(t, 4<<20)
	if err := c.upload(ctx, eu1, repo, before); err != nil {
		t.Fatal(err)
	}
	c.verifiedIn(t, ctx, before, eu1, us1)
	if ps, err := c.placements(ctx, before.digest); err != nil || len(ps) != 2 {
		t.Fatalf("before ap-1 joined: %s, %v; want copies in eu-1 and us-1 only", describe(ps), err)
	}

	joined := time.Now()
	c.join(t, ctx, ap1)
	took := c.verifiedIn(t, ctx, before, ap1)
	t.Logf("replication soak: ap-1 held a verified copy of the earlier blob %s after it joined (%s after its worker served)",
		time.Since(joined).Round(time.Millisecond), took.Round(time.Millisecond))
	if err := c.readBack(ctx, ap1, repo, before); err != nil {
		t.Error(err)
	}

	after := newBlob(t, 1<<20)
	if err := c.upload(ctx, ap1, repo, after); err != nil {
		t.Fatal(err)
	}
	c.verifiedIn(t, ctx, after, eu1, us1, ap1)
	for _, dc := range []string{eu1, us1} {
		if err := c.readBack(ctx, dc, repo, after); err != nil {
			t.Error(err)
		}
	}
}

// TestScrubRepairsAcrossProcesses: the scrub runs every 2 s with a
// one-minute coverage period. A byte flipped in us-1's copy and eu-1's
// copy deleted, behind Blobplane's back: each datacenter's scrub finds
// its bad copy (counted by finding), fails it under a new epoch, and the
// repair copies the blob back from a verified copy elsewhere; both files
// then hold the exact bytes and both rows are verified under an epoch
// two above the one they had (failed, then restaged).
func TestScrubRepairsAcrossProcesses(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepClusterWith(t, repOpts{workerEnv: []string{"BLOBPLANE_SCRUB_CRON=@every 2s", "BLOBPLANE_SCRUB_PERIOD=1m"}})
	repo := c.repoHomedAt(t, ctx, eu1)
	b := newBlob(t, 4<<20)
	if err := c.upload(ctx, eu1, repo, b); err != nil {
		t.Fatal(err)
	}
	c.verifiedIn(t, ctx, b, repDCs...)
	was, err := c.placements(ctx, b.digest)
	if err != nil {
		t.Fatal(err)
	}

	flip := c.objectPath(us1, b)
	content, err := os.ReadFile(flip)
	if err != nil {
		t.Fatal(err)
	}
	content[len(content)/2] ^= 0x40
	// Through a new file renamed over the object: the object file is
	// read-only, and a rename is what a bad disk cannot do, but the
	// scrub only sees the bytes.
	if err := os.WriteFile(flip+".soak", content, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(flip+".soak", flip); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(c.objectPath(eu1, b)); err != nil {
		t.Fatal(err)
	}

	took := eventually(t, ctx, repBound, "eu-1's and us-1's copies of "+b.String()+" repaired", func() (bool, string) {
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			return false, err.Error()
		}
		for _, dc := range []string{eu1, us1} {
			if p := ps[dc]; p.state != "verified" || p.epoch < was[dc].epoch+2 {
				return false, describe(ps)
			}
		}
		return true, ""
	})
	t.Logf("replication soak: both bad copies found and repaired %s after the damage", took.Round(time.Millisecond))
	for _, dc := range []string{eu1, us1} {
		n, got, err := c.storedCopy(ctx, dc, b)
		if err != nil || n != b.size || got != b.digest {
			t.Errorf("%s's stored copy after the repair: %d bytes hashing to %s (%v)", dc, n, got, err)
		}
	}
	for dc, finding := range map[string]string{us1: "digest_mismatch", eu1: "missing"} {
		m, err := c.scrape(ctx, dc)
		if err != nil {
			t.Fatal(err)
		}
		if n := m[`blobplane_scrub_checks_total{datacenter="`+dc+`",finding="`+finding+`"}`]; n < 1 {
			t.Errorf("worker-%s counted %v %s findings, want 1 or more", dc, n, finding)
		}
	}
}
