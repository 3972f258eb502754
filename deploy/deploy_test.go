// Package deploy holds what a deployment of Blobplane loads besides the
// binaries: Prometheus alert rules and a Grafana dashboard. Its test is
// their CI check (issue 31).
package deploy

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var (
	// declared finds the metric names the code declares (as in
	// opsmetrics.TestMetricNamesEndWithTheirUnit).
	declared = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(blobplane_[a-z0-9_]+)"`)
	// used finds metric names in a PromQL expression.
	used = regexp.MustCompile(`\bblobplane_[a-z0-9_]+\b`)
)

// exposed is every metric a Blobplane binary declares, with a
// histogram's series.
func exposed(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range declared.FindAllStringSubmatch(string(b), -1) {
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				names[m[1]+suffix] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

type rules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert,omitempty"`
			Record string `yaml:"record,omitempty"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// The alert rules and the dashboard name only metrics the binaries
// expose, and cover what on-call is paged for: replication lag, read
// losses and corruptions, unowned slots, map rejections, sweep backlog,
// the 5xx rate.
func TestRulesAndDashboardUseExposedMetrics(t *testing.T) {
	t.Parallel()
	names := exposed(t)
	var r rules
	b, err := os.ReadFile(filepath.Join("prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]string{}
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			alerts[rule.Alert] = rule.Expr
			for _, m := range used.FindAllString(rule.Expr, -1) {
				if !names[m] {
					t.Errorf("alert %s uses %s, which no binary exposes", rule.Alert, m)
				}
			}
		}
	}
	for alert, metric := range map[string]string{
		"BlobplaneReplicationLag": "blobplane_oldest_unreplicated_copy_age_seconds", "BlobplaneReadLoss": "blobplane_read_losses_total",
		"BlobplaneReadCorruption": "blobplane_read_corruptions_total", "BlobplaneUnownedSlots": "blobplane_unowned_slots",
		"BlobplaneMapRejected": "blobplane_map_rejections_total", "BlobplaneSweepBacklog": "blobplane_sweep_oldest_overdue_seconds",
		"BlobplaneHigh5xxRate": "blobplane_http_requests_total", "BlobplanePartitionStateQuarantine": "blobplane_partition_state_quarantined_records",
		"BlobplanePartitionStateReplayDiffers": "blobplane_partition_state_replay_checks_total",
		"BlobplanePartitionArchiveUnreclaimed": "blobplane_partition_state_unreachable_objects",
		"BlobplanePartitionsWithoutStandby":    "blobplane_unhealthy_partitions", "BlobplaneStandbyDiversity": "blobplane_unhealthy_partitions",
		"BlobplaneStandbyStopped": "blobplane_partition_standby_stopped",
	} {
		if !strings.Contains(alerts[alert], metric) {
			t.Errorf("no alert %s on %s", alert, metric)
		}
	}
	var d dashboard
	b, err = os.ReadFile(filepath.Join("grafana", "blobplane.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Panels) < 10 {
		t.Fatalf("the dashboard has %d panels", len(d.Panels))
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			ms := used.FindAllString(tg.Expr, -1)
			if len(ms) == 0 {
				t.Errorf("panel %q queries no Blobplane metric: %s", p.Title, tg.Expr)
			}
			for _, m := range ms {
				if !names[m] {
					t.Errorf("panel %q uses %s, which no binary exposes", p.Title, m)
				}
			}
		}
	}
}

// promtool (Prometheus's own checker, built from the Go module proxy by
// scripts/tool.sh) accepts the alert rules, and every dashboard query
// parses as PromQL (checked as recording rules).
func TestPromtoolChecksRulesAndQueries(t *testing.T) {
	if testing.Short() {
		t.Skip("promtool is not built in -short runs")
	}
	t.Parallel()
	out, err := exec.Command("bash", filepath.Join("..", "scripts", "tool.sh"), "promtool").Output()
	if err != nil {
		t.Fatalf("scripts/tool.sh promtool: %v", err)
	}
	promtool := strings.TrimSpace(string(out))
	check := func(path string) {
		t.Helper()
		cmd := exec.Command(promtool, "check", "rules", path)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", path, err, out)
		}
	}
	check(filepath.Join("prometheus", "alerts.yml"))

	var d dashboard
	b, err := os.ReadFile(filepath.Join("grafana", "blobplane.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var r rules
	r.Groups = make([]struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert,omitempty"`
			Record string `yaml:"record,omitempty"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	}, 1)
	r.Groups[0].Name = "dashboard"
	for i, p := range d.Panels {
		for j, tg := range p.Targets {
			r.Groups[0].Rules = append(r.Groups[0].Rules, struct {
				Alert  string `yaml:"alert,omitempty"`
				Record string `yaml:"record,omitempty"`
				Expr   string `yaml:"expr"`
			}{Record: fmt.Sprintf("dashboard:panel%d_%d", i, j), Expr: tg.Expr})
		}
	}
	y, err := yaml.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(path, y, 0o600); err != nil {
		t.Fatal(err)
	}
	check(path)
}
