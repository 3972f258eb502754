package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bp "github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/procstat"
)

// The replication workloads (issue 28), each beside the raw pipeline's
// work on the same bytes in the same run:
//
//	replicate-large  one blob published in eu-1: publication → verified
//	                 copy in us-1, GB/s; raw: read its eu-1 object file,
//	                 sha256 while writing a file beside us-1's root, fsync,
//	                 rename, fsync the directory (writeDurable)
//	replicate-4k     a batch of 4 KiB blobs published in eu-1 by 16
//	                 clients: first publication → all verified in us-1,
//	                 blobs/s; raw: the same count of eu-1 files copied so,
//	                 16 at a time (as us-1's worker copies)
//	scrub            one `worker scrub` pass over eu-1's verified
//	                 placements, GB/s; raw: sha256 of the same files, one
//	                 after another (as the scrub reads them)
//
// The raw column needs no server of its own, so these tables have it
// whether or not --systems names raw; they run when it names blobplane.

// repWorkloads are the replication workloads, in allWorkloads.
var repWorkloads = []string{"replicate-large", "replicate-4k", "scrub"}

// repColumns are the replication tables' columns.
var repColumns = []string{sysRaw, sysBlobplane}

// repLargeCap caps the replicated blob: issue 28 asks for 256 MiB.
const repLargeCap = 256 << 20

// repClients upload the 4 KiB batch and make the raw copies: as many as
// us-1's worker copies at once (its replicate queue's default).
const repClients = 16

// repLargeSize is the replicated blob's size in a run of o.
func repLargeSize(o options) int64 { return min(o.size, repLargeCap) }

// cluster returns the two-datacenter cluster, starting it the first time.
// A cluster that failed to start fails every replication workload.
func (s *suite) cluster(ctx context.Context) (*repCluster, error) {
	if s.rep == nil && s.repErr == nil {
		s.logf("starting two datacenters (%s, %s: an api and a worker each) for the replication workloads", repSource, repTarget)
		s.rep, s.repErr = startRepCluster(ctx, s.bpBin, s.o.databaseURL, filepath.Join(s.dir, "replication"), s.cl)
		if s.repErr == nil {
			s.repErr = s.warmUp(ctx, s.rep)
		}
		if s.repErr != nil {
			s.repErr = fmt.Errorf("two-datacenter cluster: %w", s.repErr)
		}
	}
	return s.rep, s.repErr
}

// warmUp copies one small blob from eu-1 into us-1, untimed: the whole
// path works, and the first timed copy does not pay for River's start.
func (s *suite) warmUp(ctx context.Context, c *repCluster) error {
	b, d := smallBlob(s.block, smallSize, seedOf(seedRepWarm, 0, 0))
	if _, err := c.upload(ctx, d, bytes.NewReader(b), smallSize, true); err != nil {
		return err
	}
	return c.waitCopied(ctx, []string{d})
}

// replicateLarge times the copy of a new blob (raw: of the latest one).
func (s *suite) replicateLarge(ctx context.Context, t *Table, sys system, rep int) error {
	c, err := s.cluster(ctx)
	if err != nil {
		return err
	}
	size := repLargeSize(s.o)
	gb := float64(size) / 1e9
	if sys.name == sysRaw {
		d, err := s.largeSource(ctx, c)
		if err != nil {
			return err
		}
		cpu := s.cpuMeter(ctx, pidMeter(os.Getpid()))
		elapsed, err := rawCopies(ctx, c, []string{d}, 1)
		if err != nil {
			return err
		}
		t.add(sys.name, "GB/s", true, gb/elapsed.Seconds())
		t.add(sys.name, "seconds", false, elapsed.Seconds())
		s.addCPU(ctx, t, sys.name, cpu, gb, func(int) string { return "bench" })
		s.logf("%s rep %d %s: %.3f GB/s (%s)", t.ID, rep+1, sys.name, gb/elapsed.Seconds(), elapsed.Round(time.Millisecond))
		return nil
	}
	d, kept, err := s.publishLarge(ctx, c, seedOf(seedRepLarge, rep, 0))
	if err != nil {
		return err
	}
	cpu := s.cpuMeter(ctx, c.serverPIDs)
	if err := c.waitCopied(ctx, []string{d}); err != nil {
		return err
	}
	s.lastLarge = d
	ct, err := c.copyTimes(ctx, []string{d})
	if err != nil {
		return err
	}
	t.add(sys.name, "GB/s", true, gb/ct.FirstToAll)
	t.add(sys.name, "seconds", false, ct.FirstToAll)
	s.addCPU(ctx, t, sys.name, cpu, gb, c.procName)
	s.addKept(t, sys.name, kept)
	s.logf("%s rep %d %s: %.3f GB/s (%.3f s from publication to the verified copy)", t.ID, rep+1, sys.name, gb/ct.FirstToAll, ct.FirstToAll)
	return nil
}

// cpuSnapshot is the CPU times of a meter's processes at one moment
// (nil: not measured).
type cpuSnapshot struct {
	meter  cpuMeter
	before map[int]time.Duration
}

// cpuMeter takes a snapshot of meter's processes now.
func (s *suite) cpuMeter(ctx context.Context, meter cpuMeter) cpuSnapshot {
	pids, err := meter(ctx)
	if err != nil {
		s.logf("CPU not measured: %v", err)
		return cpuSnapshot{}
	}
	return cpuSnapshot{meter: meter, before: procstat.Times(pids)}
}

// addCPU records the CPU seconds per GB the snapshot's processes used
// since it was taken, when it was, and logs them by process (named by
// name).
func (s *suite) addCPU(ctx context.Context, t *Table, system string, snap cpuSnapshot, gb float64, name func(pid int) string) {
	if snap.before == nil {
		return
	}
	pids, err := snap.meter(ctx)
	if err != nil {
		return
	}
	after := procstat.Times(pids)
	t.add(system, "CPU s per GB", false, procstat.Used(snap.before, after).Seconds()/gb)
	by := map[string]time.Duration{}
	for pid, d := range after {
		by[name(pid)] += d - snap.before[pid]
	}
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", n, by[n].Seconds()/gb))
	}
	s.logf("%s %s: CPU s per GB by process: %s", t.ID, system, strings.Join(parts, ", "))
}

// largeSource is a large blob stored in eu-1 and already copied into
// us-1 (so nothing copies behind a raw measurement): the latest the
// workload replicated, else one uploaded now.
func (s *suite) largeSource(ctx context.Context, c *repCluster) (string, error) {
	if s.lastLarge != "" {
		return s.lastLarge, nil
	}
	d, _, err := s.publishLarge(ctx, c, seedOf(seedRepSource, 0, 0))
	if err != nil {
		return "", err
	}
	if err := c.waitCopied(ctx, []string{d}); err != nil {
		return "", err
	}
	s.lastLarge = d
	return d, nil
}

// publishLarge uploads the replicated blob of seed to eu-1 (POST, then
// PUT of the body) and returns its digest and how many uploads were kept
// (0 or 1).
func (s *suite) publishLarge(ctx context.Context, c *repCluster, seed uint64) (string, int, error) {
	size := repLargeSize(s.o)
	d := patternDigest(s.block, size, seed)
	kept, err := c.upload(ctx, d, newPatternReader(s.block, size, seed), size, false)
	if kept {
		return d, 1, err
	}
	return d, 0, err
}

// addKept records how many of a measurement's uploads eu-1's api kept
// for a finalize job (202) instead of publishing them at once.
func (s *suite) addKept(t *Table, system string, kept int) {
	t.add(system, keptFigure, false, float64(kept))
	if kept > 0 {
		s.logf("%s %s: eu-1's api kept %d upload(s) for a finalize job (202) instead of publishing them: its lease lapsed (see its log); they are measured from their later publication", t.ID, system, kept)
	}
}

// keptFigure is the row of uploads published late, by a finalize job.
const keptFigure = "uploads kept (202)"

// replicateSmall times the copies of a new batch of 4 KiB blobs (raw: of
// the latest batch).
func (s *suite) replicateSmall(ctx context.Context, t *Table, sys system, rep int) error {
	c, err := s.cluster(ctx)
	if err != nil {
		return err
	}
	n := float64(s.o.repBlobs)
	if sys.name == sysRaw {
		ds, err := s.smallSources(ctx, c)
		if err != nil {
			return err
		}
		elapsed, err := rawCopies(ctx, c, ds, repClients)
		if err != nil {
			return err
		}
		t.add(sys.name, "blobs/s", true, n/elapsed.Seconds())
		t.add(sys.name, "s to all copied", false, elapsed.Seconds())
		s.logf("%s rep %d %s: %.0f blobs/s (%s)", t.ID, rep+1, sys.name, n/elapsed.Seconds(), elapsed.Round(time.Millisecond))
		return nil
	}
	ds, kept, err := s.publishSmall(ctx, c, seedRepSmall, rep)
	if err != nil {
		return err
	}
	if err := c.waitCopied(ctx, ds); err != nil {
		return err
	}
	s.lastSmall = ds
	ct, err := c.copyTimes(ctx, ds)
	if err != nil {
		return err
	}
	t.add(sys.name, "blobs/s", true, n/ct.FirstToAll)
	t.add(sys.name, "s to all copied", false, ct.FirstToAll)
	t.add(sys.name, "s publishing", false, ct.Publishing)
	t.add(sys.name, "s after the last publication", false, ct.LastToAll)
	t.add(sys.name, "lag p50 ms", false, ct.LagP50*1000)
	t.add(sys.name, "lag p99 ms", false, ct.LagP99*1000)
	s.addKept(t, sys.name, kept)
	s.logf("%s rep %d %s: %.0f blobs/s; published in %.3f s, all verified %.3f s after the last; lag p50 %.0f ms, p99 %.0f ms",
		t.ID, rep+1, sys.name, n/ct.FirstToAll, ct.Publishing, ct.LastToAll, ct.LagP50*1000, ct.LagP99*1000)
	return nil
}

// smallSources is a batch of 4 KiB blobs stored in eu-1 and already
// copied into us-1: the latest the workload replicated, else a batch
// uploaded now.
func (s *suite) smallSources(ctx context.Context, c *repCluster) ([]string, error) {
	if s.lastSmall != nil {
		return s.lastSmall, nil
	}
	ds, _, err := s.publishSmall(ctx, c, seedRepSource, 1)
	if err != nil {
		return nil, err
	}
	if err := c.waitCopied(ctx, ds); err != nil {
		return nil, err
	}
	s.lastSmall = ds
	return ds, nil
}

// publishSmall uploads the run's count of new 4 KiB blobs (seeds of tag
// and rep) to eu-1, repClients at a time, each in one request, and
// returns their digests and how many of them were kept.
func (s *suite) publishSmall(ctx context.Context, c *repCluster, tag, rep int) ([]string, int, error) {
	ds := make([]string, s.o.repBlobs)
	var kept atomic.Int64
	err := forEach(ctx, len(ds), repClients, func(ctx context.Context, i int) error {
		b, d := smallBlob(s.block, smallSize, seedOf(tag, rep, i))
		ds[i] = d
		k, err := c.upload(ctx, d, bytes.NewReader(b), smallSize, true)
		if k {
			kept.Add(1)
		}
		return err
	})
	return ds, int(kept.Load()), err
}

// scrub times a `worker scrub` pass over eu-1 (raw: sha256 of the same
// files). eu-1 holds whatever the replication workloads stored, and at
// least one large blob.
func (s *suite) scrub(ctx context.Context, t *Table, sys system, rep int) error {
	c, err := s.cluster(ctx)
	if err != nil {
		return err
	}
	if _, err := s.largeSource(ctx, c); err != nil {
		return err
	}
	var placements int
	var bytes int64
	var elapsed time.Duration
	if sys.name == sysRaw {
		srcs, err := c.verifiedSources(ctx)
		if err != nil {
			return err
		}
		if elapsed, err = rawHashes(ctx, c, srcs); err != nil {
			return err
		}
		placements = len(srcs)
		for _, f := range srcs {
			bytes += f.Size
		}
	} else {
		sum, err := c.scrub(ctx, repSource)
		if err != nil {
			return err
		}
		placements, bytes, elapsed = sum.Checked, sum.Bytes, time.Duration(sum.Seconds*float64(time.Second))
	}
	gb := float64(bytes) / 1e9
	t.add(sys.name, "GB/s", true, gb/elapsed.Seconds())
	t.add(sys.name, "GB", false, gb)
	t.add(sys.name, "placements", false, float64(placements))
	t.add(sys.name, "placements/s", false, float64(placements)/elapsed.Seconds())
	t.add(sys.name, "seconds", false, elapsed.Seconds())
	s.logf("%s rep %d %s: %d placements, %.3f GB in %s: %.3f GB/s", t.ID, rep+1, sys.name, placements, gb, elapsed.Round(time.Millisecond), gb/elapsed.Seconds())
	return nil
}

// rawCopies copies the eu-1 object files of digests with the raw
// pipeline (writeDurable: sha256 while writing a temp file beside us-1's
// root, fsync, check, rename, fsync the directory), workers at a time,
// and returns the time that took. The copies are removed afterwards,
// untimed.
func rawCopies(ctx context.Context, c *repCluster, digests []string, workers int) (time.Duration, error) {
	defer func() {
		_ = os.RemoveAll(c.rawDir)
		_ = os.MkdirAll(c.rawDir, 0o755)
	}()
	start := time.Now()
	err := forEach(ctx, len(digests), workers, func(_ context.Context, i int) error {
		d := digests[i]
		f, err := openPayload(c.sourcePath(d))
		if err != nil {
			return err
		}
		defer f.Close()
		return writeDurable(c.rawDir, filepath.Join(c.rawDir, strings.TrimPrefix(d, "sha256:")), d, f)
	})
	return time.Since(start), err
}

// rawHashes hashes the eu-1 object files of srcs one after another and
// returns the time that took; a file whose bytes are not its digest's is
// an error.
func rawHashes(ctx context.Context, c *repCluster, srcs []sourceFile) (time.Duration, error) {
	buf := make([]byte, 256<<10)
	start := time.Now()
	for _, src := range srcs {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		f, err := openPayload(c.sourcePath(src.Digest))
		if err != nil {
			return 0, err
		}
		h := sha256.New()
		_, err = io.CopyBuffer(h, f, buf)
		f.Close()
		if err != nil {
			return 0, err
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != src.Digest {
			return 0, fmt.Errorf("%s hashes to %s", c.sourcePath(src.Digest), got)
		}
	}
	return time.Since(start), nil
}

// openPayload opens a filesystem backend's object file at its payload,
// past the representation header (ADR 0001).
func openPayload(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(fs.HeaderSize, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// objectPath is where the filesystem backend keeps digest's object,
// relative to its root.
func objectPath(digest string) string { return fs.ObjectPath(bp.Digest(digest)) }

// forEach calls fn for 0..n-1 from workers goroutines; the first error
// stops them all and is returned, as is ctx ending.
func forEach(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
