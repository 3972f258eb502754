package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane/internal/procstat"
)

const smallSize = 4 << 10

// system is one column of the tables.
type system struct {
	name string
	t    target
	cpu  cpuMeter // nil: no server processes of its own (the raw pipeline)
}

// suite runs the workloads against systems that are already up.
type suite struct {
	o        options
	systems  []system
	bp       *blobplane // nil when Blobplane is not among the systems
	block    []byte     // the random block every blob is made of
	progress io.Writer

	preloaded  []blobRef
	preloadErr map[string]error
	digests    map[uint64]string // large blobs' digests by seed

	// The replication workloads' cluster (repcluster.go), started by
	// the first of them from Blobplane's binaries in bpBin with its data
	// under dir and stopped by cl; repErr if it failed to start.
	bpBin  string
	dir    string
	cl     *cleanups
	rep    *repCluster
	repErr error
	// The latest blobs stored in eu-1 and copied into us-1: what the raw
	// copies copy (replicate.go).
	lastLarge string
	lastSmall []string
}

// blobRef is a stored small blob: its digest and bytes.
type blobRef struct {
	digest  string
	content []byte
}

// tables runs every workload in turn, each one repetition after another
// and, within a repetition, each system after another in an order that
// rotates with the repetition (so no system always runs right after the
// same neighbour's writeback). It returns when done or when ctx ends.
func (s *suite) tables(ctx context.Context) []*Table {
	names := make([]string, len(s.systems))
	for i, sys := range s.systems {
		names[i] = sys.name
	}
	bpOnly := []string{sysBlobplane}
	type workload struct {
		title   string
		columns []string
		measure func(ctx context.Context, t *Table, sys system, rep int) error
	}
	all := map[string]workload{
		"large":    {"One " + formatSize(s.o.size) + " blob: upload, then download (GB/s)", names, s.large},
		"put4k-1":  {fmt.Sprintf("4 KiB uploads, 1 client, %s", s.o.duration), names, s.smallPuts(1, seedPut1)},
		"put4k-16": {fmt.Sprintf("4 KiB uploads, 16 clients, %s", s.o.duration), names, s.smallPuts(16, seedPut16)},
		"one4k-1":  {fmt.Sprintf("4 KiB single-request uploads (OCI POST ?digest= with the blob where supported), 1 client, %s", s.o.duration), names, s.onePuts(1, seedOne1)},
		"one4k-16": {fmt.Sprintf("4 KiB single-request uploads (OCI POST ?digest= with the blob where supported), 16 clients, %s", s.o.duration), names, s.onePuts(16, seedOne16)},
		"head-16":  {fmt.Sprintf("HEAD (existence), 16 clients, %s, over %d stored 4 KiB blobs", s.o.duration, s.o.preload), names, s.reads("HEAD/s", false)},
		"get4k-16": {fmt.Sprintf("4 KiB GET, 16 clients, %s, over the same blobs", s.o.duration), names, s.reads("GET/s", true)},
		"routing-16": {fmt.Sprintf("Routing query (GET /v1/blobs/<digest>/placements), 16 clients, %s — Blobplane only", s.o.duration),
			bpOnly, s.routing},
		"sweep": {fmt.Sprintf("Sweep of %d abandoned upload intents (`worker sweep --only reaper` passes of %d) — Blobplane only", s.o.intents, s.o.batch),
			bpOnly, s.sweep},
		"replicate-large": {fmt.Sprintf("Replication of one %s blob (--size, at most 256 MiB) from %s into %s: publication → verified copy, on the ledger's clock (GB/s); raw: its %s file hashed and written durably beside %s's root",
			formatSize(repLargeSize(s.o)), repSource, repTarget, repSource, repTarget), repColumns, s.replicateLarge},
		"replicate-4k": {fmt.Sprintf("Replication of %d 4 KiB blobs published in %s by %d clients: first publication → all verified in %s, on the ledger's clock (blobs/s); raw: the same count of %s files hashed and written durably, %d at a time",
			s.o.repBlobs, repSource, repClients, repTarget, repSource, repClients), repColumns, s.replicateSmall},
		"scrub": {fmt.Sprintf("Scrub: one `worker scrub` pass over %s's verified placements (what the replication workloads stored), GB/s; raw: sha256 of the same files, one after another", repSource),
			repColumns, s.scrub},
	}
	var out []*Table
	for _, id := range s.o.workloads {
		w := all[id]
		if (slices.Equal(w.columns, bpOnly) || slices.Equal(w.columns, repColumns)) && s.bp == nil {
			continue
		}
		if (id == "head-16" || id == "get4k-16" || id == "routing-16") && s.preloaded == nil {
			s.preload(ctx)
		}
		out = append(out, s.workload(ctx, id, w.title, w.columns, w.measure))
	}
	for _, t := range out {
		t.finish()
	}
	return out
}

// workload runs measure for every repetition and every system named in
// columns, recording into a new table. A system that fails keeps its
// error and is not measured again in this table.
func (s *suite) workload(ctx context.Context, id, title string, columns []string, measure func(ctx context.Context, t *Table, sys system, rep int) error) *Table {
	t := &Table{ID: id, Title: title, Systems: columns}
	var picked []system
	for _, c := range columns {
		i := slices.IndexFunc(s.systems, func(sys system) bool { return sys.name == c })
		switch {
		case i >= 0:
			picked = append(picked, s.systems[i])
		case c == sysRaw:
			// The replication tables' raw column works on files in
			// this process: it needs no raw server.
			picked = append(picked, system{name: sysRaw})
		}
	}
	for rep := range s.o.reps {
		for i := range picked {
			sys := picked[(i+rep)%len(picked)]
			if ctx.Err() != nil {
				return t
			}
			if _, failed := t.Errors[sys.name]; failed {
				continue
			}
			if err := measure(ctx, t, sys, rep); err != nil {
				t.fail(sys.name, err)
				fmt.Fprintf(s.progress, "bench: %s %s rep %d: FAILED: %v\n", id, sys.name, rep+1, err)
			}
		}
	}
	return t
}

func (s *suite) logf(format string, args ...any) {
	fmt.Fprintf(s.progress, "bench: "+format+"\n", args...)
}

// large uploads one large blob (streamed, never held) and downloads it,
// timing each. The timed download only counts bytes; an untimed second
// download checks the digest, so hashing on the client does not cap
// what a server can deliver.
func (s *suite) large(ctx context.Context, t *Table, sys system, rep int) error {
	seed := seedOf(seedBig, rep, 0)
	digest, ok := s.digests[seed]
	if !ok {
		digest = patternDigest(s.block, s.o.size, seed)
		s.digests[seed] = digest
	}
	gb := float64(s.o.size) / 1e9

	start := time.Now()
	if err := sys.t.Put(ctx, digest, newPatternReader(s.block, s.o.size, seed), s.o.size); err != nil {
		return err
	}
	up := time.Since(start)

	start = time.Now()
	n, err := sys.t.Get(ctx, digest, io.Discard)
	down := time.Since(start)
	if err != nil {
		return err
	}
	if n != s.o.size {
		return fmt.Errorf("GET %s: %d bytes, want %d", digest, n, s.o.size)
	}
	h := sha256.New()
	if _, err := sys.t.Get(ctx, digest, h); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("GET %s: content hashes to %s", digest, got)
	}
	t.add(sys.name, "upload GB/s", true, gb/up.Seconds())
	t.add(sys.name, "download GB/s", true, gb/down.Seconds())
	s.logf("%s rep %d %s: upload %.3f GB/s, download %.3f GB/s", t.ID, rep+1, sys.name, gb/up.Seconds(), gb/down.Seconds())
	return nil
}

// smallPuts uploads a new distinct 4 KiB blob per op from clients
// clients for the run's duration.
func (s *suite) smallPuts(clients, tag int) func(ctx context.Context, t *Table, sys system, rep int) error {
	return func(ctx context.Context, t *Table, sys system, rep int) error {
		res, err := s.load(ctx, sys, clients, func(ctx context.Context, i int) error {
			b, d := smallBlob(s.block, smallSize, seedOf(tag, rep, i))
			return sys.t.Put(ctx, d, bytes.NewReader(b), smallSize)
		})
		if err != nil {
			return err
		}
		s.record(t, sys, rep, "uploads/s", res)
		return nil
	}
}

// onePuts is smallPuts through each system's single-request upload where
// it has one (onePut), with the blobs of its own seeds.
func (s *suite) onePuts(clients, tag int) func(ctx context.Context, t *Table, sys system, rep int) error {
	return func(ctx context.Context, t *Table, sys system, rep int) error {
		res, err := s.load(ctx, sys, clients, func(ctx context.Context, i int) error {
			b, d := smallBlob(s.block, smallSize, seedOf(tag, rep, i))
			if p, ok := sys.t.(onePut); ok {
				return p.PutOne(ctx, d, b)
			}
			return sys.t.Put(ctx, d, bytes.NewReader(b), smallSize)
		})
		if err != nil {
			return err
		}
		s.record(t, sys, rep, "uploads/s", res)
		return nil
	}
}

// load is runLoad for the run's duration against sys, with the CPU its
// servers used meanwhile (when it has a meter and it answers).
func (s *suite) load(ctx context.Context, sys system, clients int, op func(ctx context.Context, i int) error) (loadResult, error) {
	var before map[int]time.Duration
	if sys.cpu != nil {
		if pids, err := sys.cpu(ctx); err == nil {
			before = procstat.Times(pids)
		} else {
			s.logf("%s: server CPU not measured: %v", sys.name, err)
		}
	}
	res, err := runLoad(ctx, clients, s.o.duration, op)
	if err != nil || before == nil {
		return res, err
	}
	if pids, err := sys.cpu(ctx); err == nil {
		res.ServerCPU, res.HasCPU = procstat.Used(before, procstat.Times(pids)), true
	}
	return res, nil
}

// record adds a load's ops/s (the headline), p50/p99 latency and the
// servers' CPU per op.
func (s *suite) record(t *Table, sys system, rep int, figure string, res loadResult) {
	p50, p99 := percentile(res.Latencies, 50), percentile(res.Latencies, 99)
	t.add(sys.name, figure, true, res.OpsPerSec())
	t.add(sys.name, "p50 ms", false, ms(p50))
	t.add(sys.name, "p99 ms", false, ms(p99))
	cpu := ""
	if res.HasCPU && res.Ops > 0 {
		perOp := ms(res.ServerCPU) / float64(res.Ops)
		t.add(sys.name, cpuFigure, false, perOp)
		cpu = fmt.Sprintf(", server CPU %.3f ms/op", perOp)
	}
	s.logf("%s rep %d %s: %.0f %s (%d ops), p50 %.2f ms, p99 %.2f ms%s", t.ID, rep+1, sys.name, res.OpsPerSec(), figure, res.Ops, ms(p50), ms(p99), cpu)
}

// cpuFigure is the row of the servers' CPU time per op (cpu.go).
const cpuFigure = "server CPU ms/op"

// preload stores the blobs HEAD, GET and routing read: the same blobs in
// every system, 8 at a time, untimed.
func (s *suite) preload(ctx context.Context) {
	s.preloaded = make([]blobRef, s.o.preload)
	for i := range s.preloaded {
		b, d := smallBlob(s.block, smallSize, seedOf(seedPreload, 0, i))
		s.preloaded[i] = blobRef{digest: d, content: b}
	}
	s.preloadErr = map[string]error{}
	for _, sys := range s.systems {
		var next atomic.Int64
		var once sync.Once
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= len(s.preloaded) {
						return
					}
					b := s.preloaded[i]
					if err := sys.t.Put(ctx, b.digest, bytes.NewReader(b.content), smallSize); err != nil {
						once.Do(func() { s.preloadErr[sys.name] = fmt.Errorf("preload: %w", err) })
						next.Store(int64(len(s.preloaded)))
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

// reads is HEAD (get false) or GET of the preloaded blobs, 16 clients;
// a GET checks the bytes.
func (s *suite) reads(figure string, get bool) func(ctx context.Context, t *Table, sys system, rep int) error {
	return func(ctx context.Context, t *Table, sys system, rep int) error {
		if err := s.preloadErr[sys.name]; err != nil {
			return err
		}
		res, err := s.load(ctx, sys, 16, func(ctx context.Context, i int) error {
			b := s.preloaded[i%len(s.preloaded)]
			if !get {
				return sys.t.Head(ctx, b.digest, smallSize)
			}
			var buf bytes.Buffer
			buf.Grow(smallSize)
			if _, err := sys.t.Get(ctx, b.digest, &buf); err != nil {
				return err
			}
			if !bytes.Equal(buf.Bytes(), b.content) {
				return fmt.Errorf("GET %s: %d bytes that differ from what was stored", b.digest, buf.Len())
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.record(t, sys, rep, figure, res)
		return nil
	}
}

// routing asks Blobplane where the preloaded blobs are, 16 clients.
func (s *suite) routing(ctx context.Context, t *Table, sys system, rep int) error {
	if err := s.preloadErr[sys.name]; err != nil {
		return err
	}
	res, err := s.load(ctx, sys, 16, func(ctx context.Context, i int) error {
		return s.bp.Route(ctx, s.preloaded[i%len(s.preloaded)].digest)
	})
	if err != nil {
		return err
	}
	s.record(t, sys, rep, "queries/s", res)
	return nil
}

// sweep times the sweep passes over the run's number of abandoned
// intents.
func (s *suite) sweep(ctx context.Context, t *Table, sys system, rep int) error {
	res, err := s.bp.Sweep(ctx, s.o.intents, s.o.batch, rep)
	if err != nil {
		return err
	}
	rate := float64(res.Intents) / res.Elapsed.Seconds()
	t.add(sys.name, "intents/s", true, rate)
	t.add(sys.name, "seconds", false, res.Elapsed.Seconds())
	s.logf("%s rep %d %s: %d intents in %d passes, %s: %.0f intents/s", t.ID, rep+1, sys.name, res.Intents, res.Passes, res.Elapsed.Round(time.Millisecond), rate)
	return nil
}
