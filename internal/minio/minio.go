// Package minio starts a real MinIO server for tests, so S3 code is tested
// against an S3-compatible server rather than a mock.
//
// The binary comes from $BLOBPLANE_MINIO_BIN, else
// ${BLOBPLANE_TOOLS:-$HOME/.cache/blobplane/bin}/minio (what
// scripts/minio.sh builds). Without a binary, tests skip with the command
// that builds one, except when CI=true: S3 tests are never skipped in CI.
//
// A test package shares one server (started on first use) and stops it in
// TestMain through Main; each test gets its own bucket.
package minio

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/blobplane/blobplane/internal/childproc"
)

// Environment variables the helper reads.
const (
	EnvBin   = "BLOBPLANE_MINIO_BIN" // path to a minio binary
	EnvTools = "BLOBPLANE_TOOLS"     // directory scripts/minio.sh installs into
)

// BuildCommand is how to get a binary; printed when one is missing.
const BuildCommand = "scripts/minio.sh   # or: GOBIN=$HOME/.cache/blobplane/bin GOFLAGS=-buildvcs=false go install github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"

// Region is the region the test server answers for.
const Region = "us-east-1"

// Server is a running MinIO.
type Server struct {
	Endpoint  string // http://127.0.0.1:<port>
	AccessKey string
	SecretKey string

	cmd     *exec.Cmd
	dataDir string
	exited  chan struct{}
	log     *bytes.Buffer
	client  *s3.Client
	mu      sync.Mutex
	buckets int
}

// Binary finds the minio binary, or returns an error naming where it looked.
func Binary() (string, error) {
	if p := os.Getenv(EnvBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvBin, p, err)
		}
		return p, nil
	}
	dir := os.Getenv(EnvTools)
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no %s and no home directory: %w", EnvBin, err)
		}
		dir = filepath.Join(home, ".cache", "blobplane", "bin")
	}
	// scripts/tool.sh caches minio-<version>; the newest pinned build
	// sorts last (pseudo-versions carry their date). A plain "minio" is
	// an older cache layout.
	builds, _ := filepath.Glob(filepath.Join(dir, "minio-*"))
	if len(builds) > 0 {
		sort.Strings(builds)
		return builds[len(builds)-1], nil
	}
	p := filepath.Join(dir, "minio")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no minio binary: %s unset and no %s or minio-<version> in %s (scripts/minio.sh builds it)", EnvBin, "minio", dir)
	}
	return p, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts a MinIO server on free loopback ports with a fresh temp data
// directory and waits until it is live. Stop it with Stop.
func Start(ctx context.Context) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	// A free port can be taken between probing and binding; try again.
	for range 3 {
		s, err := start(ctx, bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(ctx context.Context, bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	consolePort, err := freePort()
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "blobplane-minio-")
	if err != nil {
		return nil, err
	}
	s := &Server{
		Endpoint:  fmt.Sprintf("http://127.0.0.1:%d", port),
		AccessKey: "blobplane",
		SecretKey: "blobplane-" + randHex(8),
		dataDir:   dataDir,
		exited:    make(chan struct{}),
		log:       &bytes.Buffer{},
	}
	s.cmd = exec.Command(bin, "server", "--quiet",
		"--address", fmt.Sprintf("127.0.0.1:%d", port),
		"--console-address", fmt.Sprintf("127.0.0.1:%d", consolePort),
		dataDir)
	s.cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_UPDATE=off",
		"MINIO_BROWSER=off",
	)
	s.cmd.Stdout = &syncWriter{w: s.log}
	s.cmd.Stderr = s.cmd.Stdout
	s.cmd.SysProcAttr = childproc.SysProcAttr() // dies with the test binary
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dataDir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		_ = s.Stop()
		return nil, err
	}
	s.client = s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
	})
	return s, nil
}

// waitReady polls the cluster health endpoint until it answers 200, the
// process exits, or the deadline passes. Not the liveness endpoint: that
// answers 200 as soon as the HTTP server is up, while S3 calls still fail
// with 503 XMinioServerNotInitialized until the object layer is; the
// cluster check answers 200 only once it is (for one drive: once the
// drive is usable).
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/minio/health/cluster", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("minio exited before it was ready:\n%s", s.logText())
		case <-ctx.Done():
			return fmt.Errorf("minio not ready at %s after %s:\n%s", s.Endpoint, timeout, s.logText())
		case <-tick.C:
		}
	}
}

func (s *Server) logText() string {
	w := s.cmd.Stdout.(*syncWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return s.log.String()
}

// Stop terminates the server and removes its data.
func (s *Server) Stop() error {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	return os.RemoveAll(s.dataDir)
}

// Bucket creates a new, empty bucket for one test.
func (s *Server) Bucket(tb testing.TB) string {
	tb.Helper()
	s.mu.Lock()
	s.buckets++
	name := fmt.Sprintf("t%d-%s", s.buckets, randHex(6))
	s.mu.Unlock()
	if _, err := s.client.CreateBucket(tb.Context(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		tb.Fatalf("create bucket %s: %v", name, err)
	}
	return name
}

// Spec returns a backend spec (BLOBPLANE_BACKENDS syntax, without the
// name=) for bucket on this server, with static credentials. extra is
// appended to the query (e.g. "store=zstd").
func (s *Server) Spec(bucket string, extra ...string) string {
	q := url.Values{}
	q.Set("endpoint", s.Endpoint)
	q.Set("region", Region)
	q.Set("path_style", "true")
	q.Set("access_key_id", s.AccessKey)
	q.Set("secret_access_key", s.SecretKey)
	spec := "s3://" + bucket + "?" + q.Encode()
	for _, e := range extra {
		spec += "&" + e
	}
	return spec
}

// DataDir is where the server keeps its data (for benchmarks comparing to
// raw disk throughput on the same disk).
func (s *Server) DataDir() string { return s.dataDir }

var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared returns the package's server, starting it on first use. Without a
// binary it skips the test, or fails it when CI=true.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.once.Do(func() {
		if _, err := Binary(); err != nil {
			shared.err = err
			return
		}
		shared.srv, shared.err = Start(context.Background())
	})
	if shared.err != nil {
		if _, binErr := Binary(); binErr != nil {
			if strings.EqualFold(os.Getenv("CI"), "true") {
				tb.Fatalf("CI=true and %v; S3 tests are never skipped in CI. Build it with: %s", shared.err, BuildCommand)
			}
			tb.Skipf("%v; build it with: %s", shared.err, BuildCommand)
		}
		tb.Fatalf("minio: %v", shared.err)
	}
	return shared.srv
}

// Main runs the package's tests and stops the shared server afterwards.
// Call it from TestMain: os.Exit(minio.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "minio: stop: %v\n", err)
		}
		shared.srv.client = nil
	}
	return code
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w.Len() > 1<<20 { // keep the tail bounded
		w.w.Reset()
	}
	return w.w.Write(p)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
