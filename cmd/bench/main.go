// Command bench measures Blobplane side by side with the physical limit of
// this machine (the raw pipeline), MinIO and the CNCF Distribution
// registry, in one run, on the same data, and prints Blobplane's ratio to
// each (issue 8), and Blobplane's replication between two local
// datacenters and its scrub beside raw copies of the same bytes (issue
// 28, replicate.go). `make bench` runs it; docs/performance.md explains
// the tables.
//
//	bench [--quick] [--systems raw,blobplane,minio,distribution] [--out DIR]
//	      [--duration 20s] [--reps 3] [--size 1GiB] [--intents 100000]
//
// Every server it starts listens on 127.0.0.1 only and is stopped at the
// end, also on an error or Ctrl-C; temp dirs and the bench database are
// removed. Figures are reported, never asserted.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/blobplane/blobplane/internal/cli"
)

func main() {
	os.Exit(mainCode(os.Args[1:], os.Stdout, os.Stderr))
}

func mainCode(args []string, stdout, stderr io.Writer) int {
	if slices.Contains(args, "--version") || slices.Contains(args, "-version") {
		fmt.Fprintln(stdout, cli.Version("bench"))
		return 0
	}
	o, err := parseOptions(args, os.Getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

// run sets up the systems, runs the suite, prints the Markdown tables to
// stdout and writes the report under o.out. A system failing a workload
// still leaves a report (with the failure in it), and run then fails.
func run(ctx context.Context, o options, stdout, stderr io.Writer) (err error) {
	rep, stopAll, err := bench(ctx, o, stderr)
	if rep == nil {
		return err
	}
	// The report first: stopping the servers and removing their data (many
	// GB of small files) can take minutes on a disk that discards.
	defer func() {
		fmt.Fprintln(stderr, "bench: stopping the systems and removing their data")
		err = errors.Join(err, stopAll())
	}()
	fmt.Fprint(stdout, rep.Markdown())
	paths, werr := rep.write(o.out)
	if werr != nil {
		return errors.Join(err, fmt.Errorf("write results: %w", werr))
	}
	slices.Sort(paths)
	fmt.Fprintf(stderr, "bench: wrote %s\n", strings.Join(paths, ", "))
	var failed []string
	for _, t := range rep.Tables {
		for _, sys := range t.Systems {
			if _, ok := t.Errors[sys]; ok {
				failed = append(failed, t.ID+"/"+sys)
			}
		}
	}
	if len(failed) > 0 {
		err = errors.Join(err, fmt.Errorf("%d workload(s) failed: %s", len(failed), strings.Join(failed, ", ")))
	}
	return err
}

// bench starts every system and runs the suite. The report is nil only
// when nothing was measured, and then everything is already stopped;
// otherwise the caller stops everything with stopAll once the report is
// written.
func bench(ctx context.Context, o options, progress io.Writer) (rep *Report, stopAll func() error, err error) {
	var cl cleanups
	defer func() {
		if rep == nil {
			err = errors.Join(err, cl.run())
		}
	}()

	tmp, err := os.MkdirTemp("", "blobplane-bench-")
	if err != nil {
		return nil, nil, err
	}
	cl.add(func() error { return os.RemoveAll(tmp) })

	// Find or build every binary before starting anything.
	bins, err := findBinaries(ctx, o, tmp, progress)
	if err != nil {
		return nil, nil, err
	}

	r := newReport(ctx, o, progress)
	s := &suite{o: o, progress: progress, block: make([]byte, 4<<20), digests: map[uint64]string{},
		bpBin: bins[sysBlobplane], dir: tmp, cl: &cl}
	_, _ = rand.Read(s.block)
	for _, name := range o.systems {
		dir := filepath.Join(tmp, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, err
		}
		fmt.Fprintf(progress, "bench: starting %s\n", name)
		t, cpu, err := s.start(ctx, name, bins[name], dir, &cl)
		if err != nil {
			return nil, nil, err
		}
		s.systems = append(s.systems, system{name: name, t: t, cpu: cpu})
	}

	r.Tables = s.tables(ctx)
	r.Finished = time.Now()
	r.Machine.LoadEnd = loadAvg()
	r.Interrupted = ctx.Err() != nil
	return r, cl.run, ctx.Err()
}

// findBinaries returns the binary (for Blobplane, the directory of
// binaries) of each system of o that runs one, building Blobplane's into
// tmp when o names none.
func findBinaries(ctx context.Context, o options, tmp string, progress io.Writer) (map[string]string, error) {
	bins := map[string]string{}
	for _, sys := range o.systems {
		var err error
		switch sys {
		case sysBlobplane:
			bins[sys] = o.binDir
			if bins[sys] == "" {
				bins[sys] = filepath.Join(tmp, "bin")
				fmt.Fprintln(progress, "bench: building api, worker and controller")
				err = buildBlobplane(ctx, bins[sys])
			}
		case sysMinio:
			bins[sys], err = findTool(ctx, o.minioBin, "BLOBPLANE_MINIO_BIN", "MinIO", "--minio-bin", []string{"scripts/minio.sh"}, progress)
		case sysDistribution:
			bins[sys], err = findTool(ctx, o.registryBin, "BLOBPLANE_REGISTRY_BIN", "Distribution registry", "--registry-bin", []string{"scripts/tool.sh", "registry"}, progress)
		}
		if err != nil {
			return nil, err
		}
	}
	return bins, nil
}

// newReport begins the report of a run with o: its settings and the
// machine, whose page cache it drops first when o says so.
func newReport(ctx context.Context, o options, progress io.Writer) *Report {
	r := &Report{Started: time.Now(), Mode: "full", Systems: o.systems}
	if o.quick {
		r.Mode = "quick"
	}
	r.Machine = describeMachine(ctx, o.databaseURL)
	r.Machine.PageCache = dropPageCache(dropCachesPath, o.dropCaches)
	fmt.Fprintf(progress, "bench: page cache %s\n", r.Machine.PageCache)
	r.Settings = Settings{Reps: o.reps, DurationS: o.duration.Seconds(), LargeBytes: o.size, SmallBytes: smallSize, Preload: o.preload, Intents: o.intents, SweepBatch: o.batch, BlobplaneBackendOptions: o.bpOptions,
		ReplicationBlobs: o.repBlobs, ReplicationBytes: repLargeSize(o)}
	return r
}

// start starts the system name from bin with its data in dir, and returns
// the target the suite drives and the meter of its servers' CPU (nil for
// the raw pipeline). What it starts is stopped by cl.
func (s *suite) start(ctx context.Context, name, bin, dir string, cl *cleanups) (target, cpuMeter, error) {
	switch name {
	case sysRaw:
		srv, err := startRaw(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("raw pipeline: %w", err)
		}
		cl.add(srv.Close)
		c := &rawClient{base: srv.URL(), hc: newHTTPClient()}
		cl.add(func() error { c.hc.CloseIdleConnections(); return nil })
		return c, nil, nil
	case sysBlobplane:
		dbURL, drop, err := createDatabase(ctx, s.o.databaseURL)
		if err != nil {
			return nil, nil, err
		}
		cl.add(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return drop(ctx)
		})
		if s.bp, err = startBlobplane(ctx, bin, dbURL, dir, s.o.bpOptions, cl); err != nil {
			return nil, nil, fmt.Errorf("blobplane: %w", err)
		}
		return s.bp, s.bp.serverPIDs, nil
	case sysMinio:
		m, err := startMinio(ctx, bin, dir, cl)
		if err != nil {
			return nil, nil, err
		}
		return m, pidMeter(m.pid), nil
	case sysDistribution:
		c, pid, err := startRegistry(ctx, bin, dir, cl)
		if err != nil {
			return nil, nil, fmt.Errorf("distribution: %w", err)
		}
		return c, pidMeter(pid), nil
	}
	return nil, nil, nil
}

// findTool returns the peer binary: the flag (or its environment
// variable) if set, else what the build script prints (it builds and
// caches the binary once; later runs get the cached one at once).
func findTool(ctx context.Context, path, env, what, flagName string, script []string, progress io.Writer) (string, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("%s binary %s (from %s or %s): %w", what, path, flagName, env, err)
		}
		return path, nil
	}
	hint := fmt.Sprintf("build it with %s and set %s to the path it prints, pass %s, or leave it out with --systems", strings.Join(script, " "), env, flagName)
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", fmt.Errorf("no %s binary and %v; %s", what, err, hint)
	}
	fmt.Fprintf(progress, "bench: %s unset: running %s (cached after the first build, which takes minutes)\n", env, strings.Join(script, " "))
	cmd := exec.CommandContext(ctx, filepath.Join(root, script[0]), script[1:]...)
	cmd.Dir = root
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w; %s", strings.Join(script, " "), err, hint)
	}
	return strings.TrimSpace(string(out)), nil
}

// moduleRoot is the directory of the go.mod the bench runs in.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the Blobplane module (go env GOMOD)")
	}
	return filepath.Dir(mod), nil
}

// cleanups runs what was set up, undone in reverse order.
type cleanups struct {
	mu  sync.Mutex
	fns []func() error
}

func (c *cleanups) add(f func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, f)
}

// run calls every function, last added first, and joins their errors.
func (c *cleanups) run() error {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	var errs []error
	for _, f := range slices.Backward(fns) {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}
