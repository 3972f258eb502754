//go:build unix

package soak_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/childproc"
)

// baseEnv is the environment every child starts from: none of the test's
// own settings (make test exports the shared server's DATABASE_URL, which
// the soak must never touch), only what a binary needs to run.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
}

// runTool runs a one-shot command and returns its stdout.
func runTool(bin string, env []string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(baseEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = childproc.SysProcAttr()
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// proc is one long-running server (an api or a worker) that the soak
// starts, kills and starts again with the same environment, so the same
// node id, datacenter, listen address and backend. Its output of every
// incarnation goes to one log file, kept for the failure report.
type proc struct {
	name string
	bin  string
	args []string // the command line after bin (none for api and worker)
	env  []string
	logf *os.File

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	starts   int
	sigkills int
}

func newProc(t *testing.T, name, bin string, env []string) *proc {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), name+".log"), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, bin: bin, env: append(baseEnv(), env...), logf: f}
	t.Cleanup(func() {
		p.stop()
		f.Close()
	})
	return p
}

// start starts a new incarnation. The previous one must have exited.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return fmt.Errorf("%s: still running", p.name)
		}
	}
	p.starts++
	fmt.Fprintf(p.logf, "--- soak: start #%d at %s ---\n", p.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = p.logf, p.logf
	cmd.SysProcAttr = childproc.SysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	return nil
}

// kill is kill -9: no shutdown path runs, no lease is released.
func (p *proc) kill() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.sigkills++
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-exited:
		fmt.Fprintf(p.logf, "--- soak: SIGKILL at %s ---\n", time.Now().Format(time.RFC3339Nano))
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s survived SIGKILL for 10s", p.name)
	}
}

// stop is the clean stop (SIGTERM), then SIGKILL after 20 s.
func (p *proc) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// running reports whether the current incarnation is alive.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// logCount counts the lines of every incarnation's output that hold
// substr.
func (p *proc) logCount(substr string) int {
	f, err := os.Open(p.logf.Name())
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			n++
		}
	}
	return n
}

// logLines is up to n lines of every incarnation's output that hold
// substr.
func (p *proc) logLines(substr string, n int) []string {
	f, err := os.Open(p.logf.Name())
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var lines []string
	for sc.Scan() && len(lines) < n {
		if strings.Contains(sc.Text(), substr) {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// tail is the last n bytes of the process's log.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logf.Name())
	if err != nil {
		return err.Error()
	}
	// The access log of answered requests says nothing a failure needs,
	// and a test polling /metrics fills any tail with it.
	var kept []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if bytes.Contains(line, []byte(`"level":"INFO","msg":"http"`)) {
			continue
		}
		kept = append(kept, line...)
	}
	return string(kept[max(0, len(kept)-n):])
}

// count is how many lines of p's log, across its starts, contain every
// one of subs.
func (p *proc) count(subs ...string) int {
	b, err := os.ReadFile(p.logf.Name())
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range bytes.Split(b, []byte("\n")) {
		all := true
		for _, sub := range subs {
			all = all && bytes.Contains(line, []byte(sub))
		}
		if all {
			n++
		}
	}
	return n
}

// waitHTTP polls url until it answers 200 (with the bearer token, when
// set), p exits, or within passes.
func waitHTTP(ctx context.Context, p *proc, hc *http.Client, url, token string, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		} else {
			last = err.Error()
		}
		if p != nil && !p.running() {
			return fmt.Errorf("%s exited before %s answered 200", p.name, url)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %s (last: %s)", url, within, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}
