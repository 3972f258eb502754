package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/blobplane/blobplane/backend"
)

// The systems, in column order. Blobplane's ratios are to the others.
const (
	sysRaw          = "raw"
	sysBlobplane    = "blobplane"
	sysMinio        = "minio"
	sysDistribution = "distribution"
)

var allSystems = []string{sysRaw, sysBlobplane, sysMinio, sysDistribution}

// The workloads (tables), in the order they run.
var allWorkloads = []string{"large", "put4k-1", "put4k-16", "one4k-1", "one4k-16", "head-16", "get4k-16", "routing-16", "sweep",
	"replicate-large", "replicate-4k", "scrub"}

// options is one run's settings.
type options struct {
	quick    bool
	systems  []string      // a subset of allSystems, in their order
	out      string        // results directory
	duration time.Duration // of each timed load (4 KiB uploads, HEAD, GET, routing)
	reps     int           // repetitions of every workload
	size     int64         // bytes of the large blob
	intents  int           // abandoned intents per sweep
	batch    int           // BLOBPLANE_SWEEP_BATCH of each sweep pass
	preload  int           // 4 KiB blobs HEAD, GET and routing read
	repBlobs int           // 4 KiB blobs per replicate-4k batch
	// bpOptions are the options of Blobplane's filesystem backend, as
	// in BLOBPLANE_BACKENDS (e.g. "direct=8388608"); "" none.
	bpOptions string
	// workloads is a subset of allWorkloads, in their order.
	workloads []string
	// dropCaches: sync and drop the page cache before starting the
	// systems (machine.go).
	dropCaches bool

	databaseURL string // server the bench database is created on
	binDir      string // prebuilt api, worker, controller; empty builds them
	minioBin    string
	registryBin string
}

// Full and quick defaults.
var (
	fullDefaults  = options{duration: 20 * time.Second, reps: 3, size: 1 << 30, intents: 100_000, batch: 1000, preload: 256, repBlobs: 1000, out: "bench/results", workloads: allWorkloads, dropCaches: true}
	quickDefaults = options{duration: 1500 * time.Millisecond, reps: 1, size: 8 << 20, intents: 1_000, batch: 1000, preload: 64, repBlobs: 100, out: "bench/results", workloads: allWorkloads}
)

const usage = `usage: bench [flags]

Runs every workload against the raw pipeline, Blobplane, MinIO and the CNCF
Distribution registry in one run (the replication workloads: Blobplane in two
local datacenters beside raw copies) and writes the tables under --out
(<UTC time>.json/.md and latest.json/.md). Needs DATABASE_URL (a Postgres
server the bench may create a database on) for Blobplane; ` + "`make bench`" + ` sets
everything up.

`

// parseOptions reads flags, falling back to getenv for DATABASE_URL,
// BLOBPLANE_MINIO_BIN and BLOBPLANE_REGISTRY_BIN.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	fs, f := newFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return f.options(getenv)
}

// flagValues are the flags as given. A zero duration or count, or an
// empty string, means the mode's default (or the environment's).
type flagValues struct {
	quick                         bool
	systems, workloads, out       string
	duration                      time.Duration
	reps, intents, preload, batch int
	size, dropCaches, bpOptions   string
	dbURL, binDir                 string
	minioBin, registryBin         string
}

// newFlagSet declares bench's flags, writing help and errors to stderr.
func newFlagSet(stderr io.Writer) (*flag.FlagSet, *flagValues) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	f := &flagValues{}
	fs.BoolVar(&f.quick, "quick", false, "seconds, not minutes: "+describe(quickDefaults)+" (CI runs this)")
	fs.StringVar(&f.systems, "systems", strings.Join(allSystems, ","), "comma-separated subset of "+strings.Join(allSystems, ","))
	fs.StringVar(&f.out, "out", fullDefaults.out, "directory the results are written to")
	fs.DurationVar(&f.duration, "duration", 0, "length of each timed load (default "+fullDefaults.duration.String()+", --quick "+quickDefaults.duration.String()+")")
	fs.IntVar(&f.reps, "reps", 0, "repetitions of every workload (default "+strconv.Itoa(fullDefaults.reps)+", --quick "+strconv.Itoa(quickDefaults.reps)+")")
	fs.StringVar(&f.size, "size", "", "size of the large blob, bytes or with KiB/MiB/GiB (default 1GiB, --quick 8MiB); replicate-large copies one of this size, at most 256MiB")
	fs.IntVar(&f.intents, "intents", 0, "abandoned intents per sweep (default 100000, --quick 1000)")
	fs.IntVar(&f.batch, "sweep-batch", fullDefaults.batch, "BLOBPLANE_SWEEP_BATCH of each `worker sweep --only reaper` pass (the worker's default); passes run until every intent is reaped")
	fs.StringVar(&f.workloads, "workloads", strings.Join(allWorkloads, ","), "comma-separated subset of "+strings.Join(allWorkloads, ","))
	fs.IntVar(&f.preload, "preload", 0, "4 KiB blobs stored before HEAD, GET and routing (default 256, --quick 64)")
	fs.StringVar(&f.dropCaches, "drop-caches", "", "sync and drop the page cache before the systems start, so that no run inherits an earlier one's deleted files (Linux, root; default true, --quick false)")
	fs.StringVar(&f.bpOptions, "blobplane-backend-options", "", "options of Blobplane's filesystem backend, as after the '?' in BLOBPLANE_BACKENDS (docs/backends.md), e.g. direct=8388608 or sync=file (default none)")
	fs.StringVar(&f.dbURL, "database-url", "", "Postgres server for Blobplane's bench database ($DATABASE_URL)")
	fs.StringVar(&f.binDir, "bin", "", "directory with prebuilt api, worker and controller (default: go build them into a temp dir)")
	fs.StringVar(&f.minioBin, "minio-bin", "", "MinIO binary ($BLOBPLANE_MINIO_BIN; default: what scripts/minio.sh prints; it builds and caches it once)")
	fs.StringVar(&f.registryBin, "registry-bin", "", "Distribution registry binary ($BLOBPLANE_REGISTRY_BIN; default: what scripts/tool.sh registry prints; it builds and caches it once)")
	return fs, f
}

// options lays f over the defaults of its mode (full or quick) and checks
// the result.
func (f *flagValues) options(getenv func(string) string) (options, error) {
	o := fullDefaults
	if f.quick {
		o = quickDefaults
	}
	o.quick = f.quick
	o.out = f.out
	// Environment defaults are read here, not given to the flags, so
	// --help never prints a DATABASE_URL's password.
	o.databaseURL = cmp.Or(f.dbURL, getenv("DATABASE_URL"))
	o.minioBin = cmp.Or(f.minioBin, getenv("BLOBPLANE_MINIO_BIN"))
	o.registryBin = cmp.Or(f.registryBin, getenv("BLOBPLANE_REGISTRY_BIN"))
	o.binDir = f.binDir
	var err error
	if o.systems, err = parseList("--systems", f.systems, allSystems); err != nil {
		return options{}, err
	}
	if o.workloads, err = parseList("--workloads", f.workloads, allWorkloads); err != nil {
		return options{}, err
	}
	if err := f.checkCounts(); err != nil {
		return options{}, err
	}
	if f.bpOptions != "" {
		if _, err := backend.ParseSpec("bench=filesystem:/bench?" + f.bpOptions); err != nil {
			return options{}, fmt.Errorf("--blobplane-backend-options: %w", err)
		}
		o.bpOptions = f.bpOptions
	}
	f.setCounts(&o)
	if f.dropCaches != "" {
		if o.dropCaches, err = strconv.ParseBool(f.dropCaches); err != nil {
			return options{}, fmt.Errorf("--drop-caches %q: want true or false", f.dropCaches)
		}
	}
	if f.size != "" {
		if o.size, err = parseSize(f.size); err != nil {
			return options{}, fmt.Errorf("--size: %w", err)
		}
	}
	if slices.Contains(o.systems, sysBlobplane) && o.databaseURL == "" {
		return options{}, errors.New("blobplane needs a Postgres server: set DATABASE_URL (eval \"$(scripts/pg.sh env)\") or pass --database-url, or leave blobplane out of --systems")
	}
	return o, nil
}

// checkCounts refuses durations and counts out of range.
func (f *flagValues) checkCounts() error {
	if f.duration < 0 || f.reps < 0 || f.intents < 0 || f.preload < 0 {
		return errors.New("--duration, --reps, --intents and --preload must not be negative")
	}
	if f.batch < 1 || f.batch > 1_000_000 {
		return errors.New("--sweep-batch must be from 1 to 1000000 (what BLOBPLANE_SWEEP_BATCH accepts)")
	}
	return nil
}

// setCounts sets the durations and counts given in o; a zero one keeps
// the mode's default.
func (f *flagValues) setCounts(o *options) {
	o.batch = f.batch
	if f.duration > 0 {
		o.duration = f.duration
	}
	if f.reps > 0 {
		o.reps = f.reps
	}
	if f.intents > 0 {
		o.intents = f.intents
	}
	if f.preload > 0 {
		o.preload = f.preload
	}
}

func describe(o options) string {
	return fmt.Sprintf("%s loads, %d repetition(s), a %s blob, %d intents", o.duration, o.reps, formatSize(o.size), o.intents)
}

// parseList parses a comma-separated subset of all (--systems,
// --workloads) into all's order, refusing unknown names and an empty
// list.
func parseList(flagName, s string, all []string) ([]string, error) {
	var picked []string
	for name := range strings.SplitSeq(s, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		if !slices.Contains(all, name) {
			return nil, fmt.Errorf("%s: unknown name %q (want %s)", flagName, name, strings.Join(all, ","))
		}
		picked = append(picked, name)
	}
	var out []string
	for _, name := range all {
		if slices.Contains(picked, name) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: name at least one", flagName)
	}
	return out, nil
}

// parseSize parses bytes, optionally with a KiB, MiB or GiB suffix.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	num := strings.TrimSpace(s)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q: want a positive number of bytes, optionally with KiB, MiB or GiB", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n * mult, nil
}

// formatSize is parseSize's inverse for whole units.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + " " + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + " B"
}
