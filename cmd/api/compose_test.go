package main_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/testbin"
)

// composeService is what this test reads of a docker-compose.yml service.
type composeService struct {
	Build       any               `yaml:"build"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

// Issue 31 point 9: there is no Docker engine here, so this runs what
// `docker compose up` runs — every Blobplane service of
// docker-compose.yml, its binary, command and environment, in the order
// its depends_on gives (a service another waits to complete runs to exit
// 0 first; the others keep running) — against a real Postgres in place of
// the postgres service, each named volume a directory of its own, the
// published ports on free loopback ports. It ends as compose would: the
// bootstrap token printed, a signing key and a map made, and an upload
// with that token answered 201 and read back.
func TestComposeSequence(t *testing.T) {
	base, token, volumeDir := composeUp(t)
	if _, err := os.Stat(filepath.Join(volumeDir("controller"), "controller", "signing-key.json")); err != nil {
		t.Fatalf("no signing key in the controller's volume: %v", err)
	}
	// What `oras blob push` sends: a monolithic POST, Basic auth with the
	// token; the first one creates team/app. Until the api holds its
	// partitions' leases under the published map it answers 202 or 503.
	content := []byte("composed")
	sum := sha256.Sum256(content)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPost, base+"/v2/team/app/blobs/uploads/?digest="+digest, bytes.NewReader(content))
		req.SetBasicAuth("x", token)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusCreated {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("upload into the composed system: %d %s", resp.StatusCode, body)
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("upload into the composed system: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // polling the api until it serves
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/v2/team/app/blobs/"+digest, nil)
	req.SetBasicAuth("x", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, content) {
		t.Fatalf("read back: %d %q", resp.StatusCode, got)
	}
}

// composeUp starts what docker-compose.yml starts (TestComposeSequence)
// and returns the api's base URL, the bootstrap token and where each
// named volume is.
func composeUp(t *testing.T) (base, token string, volumeDir func(string) string) {
	t.Helper()
	bins := testbin.Build(t)
	d := pgtest.New(t)
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	ours := map[string]composeService{}
	for name, s := range doc.Services {
		if s.Build != nil {
			ours[name] = s
		}
	}
	// Runs to completion: every service but the servers (api serve,
	// worker run, controller run); what another waits to see completed
	// must be one of those.
	oneShot := map[string]bool{}
	for name, s := range ours {
		oneShot[name] = len(s.Command) > 0 && s.Command[0] != "serve" && s.Command[0] != "run"
	}
	for name, s := range ours {
		for dep, c := range s.DependsOn {
			if c.Condition == "service_completed_successfully" && !oneShot[dep] {
				t.Errorf("service %s waits for %s to complete, which serves until stopped", name, dep)
			}
		}
	}
	port := freeLoopbackPort(t)
	volumes := map[string]string{}
	volumeDir = func(name string) string {
		if volumes[name] == "" {
			volumes[name] = t.TempDir()
		}
		return volumes[name]
	}
	env := func(s composeService) []string {
		out := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "BLOBPLANE_CONTROLLER_LISTEN=127.0.0.1:0"}
		for k, v := range s.Environment {
			switch {
			case k == "DATABASE_URL":
				v = d.URL
			case k == "BLOBPLANE_LISTEN":
				v = fmt.Sprintf("127.0.0.1:%d", port)
			case k == "BLOBPLANE_ADVERTISE_URL":
				v = fmt.Sprintf("http://127.0.0.1:%d", port)
			case strings.HasPrefix(v, "/"): // a path: under the volume mounted there
				for _, m := range s.Volumes {
					name, target, _ := strings.Cut(m, ":")
					if v == target || strings.HasPrefix(v, target+"/") {
						v = filepath.Join(volumeDir(name), strings.TrimPrefix(v, target))
					}
				}
			}
			out = append(out, k+"="+v)
		}
		return out
	}
	// depends_on order (postgres is pgtest's).
	var order []string
	done := map[string]bool{"postgres": true}
	for len(order) < len(ours) {
		progressed := false
		for _, name := range slices.Sorted(maps.Keys(ours)) {
			if done[name] {
				continue
			}
			ready := true
			for dep := range ours[name].DependsOn {
				ready = ready && done[dep]
			}
			if ready {
				order, done[name], progressed = append(order, name), true, true
			}
		}
		if !progressed {
			t.Fatalf("depends_on has a cycle or names an unknown service: %v", ours)
		}
	}
	for _, name := range order {
		s := ours[name]
		cmd := exec.Command(filepath.Join(bins, path.Base(s.Entrypoint[0])), s.Command...)
		cmd.Env = env(s)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if oneShot[name] {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
			cmd.Env, cmd.Stdout, cmd.Stderr = env(s), &stdout, &stderr
			err := cmd.Run()
			cancel()
			if err != nil {
				t.Fatalf("service %s (%v): %v\n%s", name, s.Command, err, stderr.String())
			}
			if name == "bootstrap" {
				token = strings.TrimSpace(stdout.String())
			}
			t.Logf("service %s completed: %s", name, strings.TrimSpace(stdout.String()+" "+lastLine(stderr.String())))
			continue
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			waited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(waited) }()
			select {
			case <-waited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-waited
			}
		})
		t.Logf("service %s started", name)
	}
	if !strings.HasPrefix(token, "bp_") {
		t.Fatalf("the bootstrap service printed %q, not a token", token)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", port), token, volumeDir
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
