package opsmetrics_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// metricName finds the metric names the code declares: Name: "..." in
// the options of a metric, and the first argument of prometheus.NewDesc.
var metricName = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(blobplane_[a-z0-9_]+)"`)

// Issue 31 point 6: units last in every name — blobplane_..._bytes_total,
// never ..._bytes_reclaimed_total (Prometheus naming: the unit, then
// _total for a counter). A name that carries a unit ends with it, or
// with it and _total.
func TestMetricNamesEndWithTheirUnit(t *testing.T) {
	root := filepath.Join("..", "..")
	seen := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(b), -1) {
			name := m[1]
			seen++
			for _, unit := range []string{"seconds", "bytes"} {
				i := strings.Index(name, "_"+unit+"_")
				if i < 0 {
					continue
				}
				if rest := name[i+len(unit)+2:]; rest != "total" {
					t.Errorf("%s: %s: the unit %s must come last (then _total for a counter)", path, name, unit)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 50 {
		t.Fatalf("found only %d metric names: the scan is broken", seen)
	}
}
