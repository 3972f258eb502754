package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/blobplane/blobplane/internal/childproc"
)

// proc is one server the bench started as a subprocess. Its output is kept
// (the last 64 KiB) for error messages.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	out    *tail
}

// startProc starts bin with args and env (on top of a cleaned copy of the
// bench's own environment, see childEnv).
func startProc(name, bin string, args, env []string) (*proc, error) {
	p := &proc{name: name, exited: make(chan struct{}), out: &tail{}}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = childEnv(env)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = childproc.SysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

// stop sends SIGTERM, waits up to 15 s, then kills.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// failed wraps err with the process's recent output.
func (p *proc) failed(err error) error {
	return fmt.Errorf("%s: %w\n--- %s output (tail) ---\n%s", p.name, err, p.name, p.out.String())
}

// waitReady polls url until it answers 200, the process exits, or timeout
// passes.
func (p *proc) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return p.failed(fmt.Errorf("exited before %s answered 200 (%v)", url, p.cmd.ProcessState))
		case <-ctx.Done():
			return p.failed(fmt.Errorf("%s did not answer 200 within %s", url, timeout))
		case <-tick.C:
		}
	}
}

// runTool runs a one-shot command (a Blobplane admin command, a build
// script) and returns its stdout; the error carries stderr.
func runTool(ctx context.Context, bin string, args, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = childproc.SysProcAttr()
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// childEnv is the bench's environment without anything that configures
// Blobplane (BLOBPLANE_*, DATABASE_URL) or MinIO (MINIO_*), so a setting
// exported in the shell cannot change what is measured, plus extra.
func childEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BLOBPLANE_") || strings.HasPrefix(k, "MINIO_") || strings.HasPrefix(k, "REGISTRY_") || k == "DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// freePort returns a loopback port that was free a moment ago. A server
// that then fails to bind it is started again on another (see retryPort).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// retryPort calls start with a fresh free port, up to three times: a port
// can be taken between probing and binding.
func retryPort[T any](start func(port int) (T, error)) (T, error) {
	var errs []error
	for range 3 {
		var zero T
		port, err := freePort()
		if err != nil {
			return zero, err
		}
		v, err := start(port)
		if err == nil {
			return v, nil
		}
		errs = append(errs, err)
	}
	var zero T
	return zero, errors.Join(errs...)
}

// tail keeps the last 64 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 64<<10; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
