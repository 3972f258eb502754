package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuick runs the quick suite against every system so the harness
// cannot rot (issue 8: CI runs it, and never fails on a figure). It
// asserts only that the harness worked: every table and column present,
// every headline figure measured and nonzero, the files written.
//
// It needs DATABASE_URL, BLOBPLANE_MINIO_BIN and BLOBPLANE_REGISTRY_BIN,
// which scripts/test.sh (`make test`) sets. Without them it skips, or
// leaves the missing peer out, with a message; with CI=true they are
// required. BLOBPLANE_BENCH_BIN may name prebuilt api, worker and
// controller binaries (default: go build them).
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the quick suite starts four servers")
	}
	ci := strings.EqualFold(os.Getenv("CI"), "true")
	missing := func(format string, args ...any) {
		t.Helper()
		if ci {
			t.Fatalf("CI=true: "+format, args...)
		}
		t.Logf(format, args...)
	}
	o := quickDefaults
	o.quick = true
	o.duration = 400 * time.Millisecond
	o.size = 4 << 20
	o.intents = 500
	o.batch = 200 // three passes
	o.preload = 32
	o.repBlobs = 50
	o.out = filepath.Join(t.TempDir(), "results")
	o.binDir = os.Getenv("BLOBPLANE_BENCH_BIN")
	o.databaseURL = os.Getenv("DATABASE_URL")
	o.minioBin = os.Getenv("BLOBPLANE_MINIO_BIN")
	o.registryBin = os.Getenv("BLOBPLANE_REGISTRY_BIN")
	if o.databaseURL == "" {
		missing("DATABASE_URL is unset: skipping the quick suite (run `make test`, or eval \"$(scripts/pg.sh env)\")")
		t.SkipNow()
	}
	o.systems = []string{sysRaw, sysBlobplane}
	if o.minioBin != "" {
		o.systems = append(o.systems, sysMinio)
	} else {
		missing("BLOBPLANE_MINIO_BIN is unset: leaving MinIO out (build it with scripts/minio.sh)")
	}
	if o.registryBin != "" {
		o.systems = append(o.systems, sysDistribution)
	} else {
		missing("BLOBPLANE_REGISTRY_BIN is unset: leaving the Distribution registry out (build it with scripts/tool.sh registry)")
	}

	var stdout, progress bytes.Buffer
	start := time.Now()
	err := run(t.Context(), o, &stdout, &progress)
	t.Logf("quick suite over %v took %s", o.systems, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}

	js, err := os.ReadFile(filepath.Join(o.out, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatalf("latest.json: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(o.out, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(md, stdout.Bytes()) {
		t.Error("latest.md is not what was printed")
	}
	stamped, _ := filepath.Glob(filepath.Join(o.out, "*-quick.*"))
	if len(stamped) != 2 {
		t.Errorf("timestamped results %v, want a .json and a .md", stamped)
	}
	if rep.Mode != "quick" || rep.Machine.CPUs == 0 || rep.Machine.GoVersion == "" || !strings.HasPrefix(rep.Machine.Postgres, "PostgreSQL") {
		t.Errorf("report header: mode %q, machine %+v", rep.Mode, rep.Machine)
	}

	want := map[string][]string{
		"large": o.systems, "put4k-1": o.systems, "put4k-16": o.systems, "one4k-1": o.systems, "one4k-16": o.systems,
		"head-16": o.systems, "get4k-16": o.systems,
		"routing-16": {sysBlobplane}, "sweep": {sysBlobplane},
		"replicate-large": repColumns, "replicate-4k": repColumns, "scrub": repColumns,
	}
	for _, tb := range rep.Tables {
		systems, ok := want[tb.ID]
		if !ok {
			t.Errorf("unexpected table %s", tb.ID)
			continue
		}
		delete(want, tb.ID)
		if strings.Join(tb.Systems, ",") != strings.Join(systems, ",") {
			t.Errorf("%s: columns %v, want %v", tb.ID, tb.Systems, systems)
		}
		if len(tb.Errors) > 0 {
			t.Errorf("%s: errors %v", tb.ID, tb.Errors)
		}
		headlines := 0
		for _, r := range tb.Rows {
			if !r.Headline {
				continue
			}
			headlines++
			for _, sys := range systems {
				if s := r.Summary[sys]; s.N != o.reps || s.Min <= 0 {
					t.Errorf("%s %s %s: %+v, want %d nonzero samples", tb.ID, r.Figure, sys, s, o.reps)
				}
				if _, ok := r.Ratio[sys]; !ok {
					t.Errorf("%s %s: no Blobplane ratio to %s", tb.ID, r.Figure, sys)
				}
			}
		}
		if headlines == 0 {
			t.Errorf("%s: no headline figure", tb.ID)
		}
		// Every timed load measures its servers' CPU (Linux: /proc); the
		// raw pipeline has no server of its own.
		if timed := tb.ID != "large" && tb.ID != "sweep" && !slices.Contains(repWorkloads, tb.ID); timed && runtime.GOOS == "linux" {
			var cpu *Row
			for _, r := range tb.Rows {
				if r.Figure == cpuFigure {
					cpu = r
				}
			}
			for _, sys := range systems {
				if sys == sysRaw {
					continue
				}
				if cpu == nil {
					t.Errorf("%s: no %q row", tb.ID, cpuFigure)
				} else if s := cpu.Summary[sys]; s.N != o.reps || s.Min <= 0 {
					t.Errorf("%s %s %s: %+v, want %d nonzero samples", tb.ID, cpuFigure, sys, s, o.reps)
				}
			}
		}
		if !strings.Contains(string(md), "### "+tb.Title) {
			t.Errorf("latest.md lacks the table %q", tb.Title)
		}
	}
	for id := range want {
		t.Errorf("no table %s", id)
	}
}
