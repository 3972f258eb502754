package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/testbin"
)

// dataDirEnv keeps the binaries' local state (generated cluster secret,
// filesystem backend) beside them in the test's temp dir, never in the
// source tree; a test's own BLOBPLANE_DATA_DIR comes later and wins.
func dataDirEnv(bin string) string {
	return "BLOBPLANE_DATA_DIR=" + filepath.Join(filepath.Dir(bin), "data")
}

func run(bin string, env []string, args ...string) (int, string, string) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), dataDirEnv(bin)}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

func TestBinaries(t *testing.T) {
	bins := testbin.Build(t)
	api, worker := filepath.Join(bins, "api"), filepath.Join(bins, "worker")
	d := pgtest.New(t)

	t.Run("bad configuration is one line naming the setting", func(t *testing.T) {
		cases := []struct {
			bin  string
			env  []string
			args []string
			want string
			code int
		}{
			{api, []string{"DATABASE_URL=postgres://u@h:notaport/db"}, nil, "DATABASE_URL", 2},
			{api, []string{"DATABASE_URL=" + d.URL, "BLOBPLANE_LISTEN=not-an-address"}, nil, "BLOBPLANE_LISTEN", 2},
			{worker, nil, nil, "DATABASE_URL", 2},
			{api, []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db"}, nil, "DATABASE_URL", 1},
			{api, []string{"DATABASE_URL=" + d.URL}, []string{"frobnicate"}, "unknown command", 2},
		}
		for _, tc := range cases {
			code, _, stderr := run(tc.bin, tc.env, tc.args...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != tc.code || len(lines) != 1 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "goroutine") {
				t.Errorf("%s %v %v: exit %d, stderr %q; want exit %d and one line naming %s", filepath.Base(tc.bin), tc.env, tc.args, code, stderr, tc.code, tc.want)
			}
		}
	})

	t.Run("help lists settings", func(t *testing.T) {
		for _, b := range []string{api, worker, filepath.Join(bins, "controller")} {
			code, stdout, _ := run(b, nil, "--help")
			if code != 0 || !strings.Contains(stdout, "DATABASE_URL") || !strings.Contains(stdout, "BLOBPLANE_DATACENTER") {
				t.Errorf("%s --help: exit %d\n%s", b, code, stdout)
			}
		}
	})

	t.Run("a command's --help explains it and touches nothing", func(t *testing.T) {
		// An unreachable database: help must not try to connect.
		env := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db"}
		code, stdout, stderr := run(api, env, "migrate", "--help")
		if code != 0 || !strings.Contains(stdout, "usage: api migrate") || stderr != "" {
			t.Errorf("api migrate --help: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		if code, _, stderr := run(api, env, "migrate", "now"); code != 2 || !strings.Contains(stderr, "takes no arguments") {
			t.Errorf("api migrate now: exit %d, stderr %q", code, stderr)
		}
	})

	t.Run("every declared command is accepted", func(t *testing.T) {
		// Against an unreachable database each command gets as far as
		// connecting: the failure names the database, not the command.
		for bin, cmds := range config.Commands {
			for _, c := range cmds {
				_, _, stderr := run(filepath.Join(bins, bin), []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db"}, c)
				// Admin commands without their subcommand answer their usage.
				if strings.Contains(stderr, "unknown command") || (!strings.Contains(stderr, "DATABASE_URL") && !strings.Contains(stderr, "usage: ")) {
					t.Errorf("%s %s: %q", bin, c, stderr)
				}
			}
		}
	})

	t.Run("lease force needs an operator and a reason", func(t *testing.T) {
		env := []string{"DATABASE_URL=" + d.URL}
		base := []string{"lease", "force", "--partition", "p_cli", "--node", "n_1", "--endpoint", "127.0.0.1:7443"}
		if code, _, stderr := run(api, env, append(base, "--operator", "alice")...); code != 1 || !strings.Contains(stderr, "--reason") {
			t.Fatalf("without --reason: exit %d %q", code, stderr)
		}
		code, stdout, stderr := run(api, env, append(base, "--operator", "alice", "--reason", "n_0 is gone")...)
		if code != 0 || !strings.Contains(stdout, `"taken_by": "alice"`) || !strings.Contains(stdout, `"epoch": 1`) {
			t.Fatalf("lease force: exit %d %q %q", code, stdout, stderr)
		}
	})

	t.Run("migrate is idempotent", func(t *testing.T) {
		for range 2 {
			code, stdout, stderr := run(api, []string{"DATABASE_URL=" + d.URL}, "migrate")
			if code != 0 || !strings.Contains(stdout, "goose 0, river 0") {
				t.Fatalf("migrate on a current database: exit %d %q %q", code, stdout, stderr)
			}
		}
	})

	t.Run("SIGTERM stops api and worker cleanly", func(t *testing.T) {
		env := []string{"DATABASE_URL=" + d.URL, "BLOBPLANE_LISTEN=127.0.0.1:0", "BLOBPLANE_CRON=node_prune=@every 1s"}
		a := start(t, api, env)
		addr := a.waitLog(t, "api listening", "url")
		w := start(t, worker, env)
		w.waitLog(t, "worker started", "")
		for _, p := range []*proc{a, w} {
			p.cmd.Process.Signal(syscall.SIGTERM)
			if err := p.wait(20 * time.Second); err != nil {
				t.Fatalf("%s after SIGTERM: %v", p.cmd.Path, err)
			}
		}
		if c, err := net.Dial("tcp", strings.TrimPrefix(addr, "http://")); err == nil {
			c.Close()
			t.Fatal("listener still open after the api exited")
		}
	})
}

type proc struct {
	cmd  *exec.Cmd
	logs chan map[string]any
	done chan error
}

func start(t *testing.T, bin string, env []string) *proc {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), dataDirEnv(bin)}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: make(chan map[string]any, 1000), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				select {
				case p.logs <- m:
				default:
				}
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return p
}

func (p *proc) waitLog(t *testing.T, msg, field string) string {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m := <-p.logs:
			if m["msg"] == msg {
				s, _ := m[field].(string)
				return s
			}
		case <-deadline:
			t.Fatalf("%s never logged %q", p.cmd.Path, msg)
		}
	}
}

func (p *proc) wait(d time.Duration) error {
	select {
	case err := <-p.done:
		return err
	case <-time.After(d):
		return os.ErrDeadlineExceeded
	}
}
