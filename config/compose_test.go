package config

import (
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Docker cannot run here, so this test keeps docker-compose.yml honest: every
// Blobplane service runs a real binary with a real subcommand, and every
// environment variable it sets is one that binary reads.
func TestComposeFileMatchesBinaries(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Build       any               `yaml:"build"`
			Image       string            `yaml:"image"`
			Entrypoint  []string          `yaml:"entrypoint"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	seen := map[string]bool{}
	for name, svc := range doc.Services {
		if svc.Build == nil {
			continue // a third-party image such as postgres
		}
		if len(svc.Entrypoint) != 1 {
			t.Errorf("service %s: entrypoint must name one binary, got %v", name, svc.Entrypoint)
			continue
		}
		bin := path.Base(svc.Entrypoint[0])
		cmds, ok := Commands[bin]
		if !ok {
			t.Errorf("service %s: %s is not a Blobplane binary", name, bin)
			continue
		}
		seen[bin] = true
		if len(svc.Command) > 0 && !slices.Contains(cmds, svc.Command[0]) {
			t.Errorf("service %s: %s has no command %q (has %v)", name, bin, svc.Command[0], cmds)
		}
		for k, v := range svc.Environment {
			var s *Setting
			for i := range Settings {
				if Settings[i].Env == k {
					s = &Settings[i]
				}
			}
			if s == nil || !slices.Contains(s.For, bin) {
				t.Errorf("service %s: %s does not read %s", name, bin, k)
				continue
			}
			// The value must also pass the binary's validation.
			if err := s.set(&Config{}, v); err != nil {
				t.Errorf("service %s: %s=%q is refused: %v", name, k, v, err)
			}
		}
	}
	for _, bin := range []string{API, Worker, Controller} {
		if !seen[bin] {
			t.Errorf("docker-compose.yml runs no %s", bin)
		}
	}
	// Issue 31: the binaries run as the image's non-root user, and a
	// named volume starts as a copy of the image's directory at its mount
	// point: the Dockerfile must create each one owned by that user.
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for name, svc := range doc.Services {
		if svc.Build == nil {
			continue
		}
		for _, v := range svc.Volumes {
			_, target, _ := strings.Cut(v, ":")
			if !strings.Contains(string(df), "--chown=65532:65532 /volumes"+target+" "+target+"\n") {
				t.Errorf("service %s mounts a volume at %s, which the Dockerfile does not create owned by nonroot (65532)", name, target)
			}
		}
	}
	if !strings.Contains(string(df), "USER nonroot") {
		t.Error("the image does not run as nonroot")
	}
}
