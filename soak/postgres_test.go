//go:build unix

package soak_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/internal/childproc"
)

// pgCluster is the soak's own Postgres: a cluster initialised in a temp
// dir from the installed binaries and served by a postmaster that is this
// test's child. The shared test server (DATABASE_URL) is never touched:
// other packages' tests run on it in parallel, and this one crashes its
// server on purpose.
type pgCluster struct {
	bindir string
	dir    string // owned by the server's user; removed at cleanup
	port   int
	cred   *syscall.Credential // nil unless the test runs as root
	logf   *os.File

	cmd     *exec.Cmd
	exited  chan struct{}
	crashes int
}

// findPGBindir finds initdb and postgres the way scripts/pg.sh does:
// pg_config's bindir, then the newest /usr/lib/postgresql/*/bin, then the
// usual prefixes. "" when there are none.
func findPGBindir() string {
	ok := func(d string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if st, err := os.Stat(filepath.Join(d, b)); err != nil || st.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); ok(d) {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range append(dirs, "/usr/local/pgsql/bin", "/opt/homebrew/bin", "/usr/local/bin", "/usr/bin") {
		if ok(d) {
			return d
		}
	}
	return ""
}

func pgMajor(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

// startPostgres initialises and starts a private cluster, with a
// `blobplane` database, stopped and removed when the test ends (even when
// it fails). It skips the test when no server binaries are installed
// (DATABASE_URL alone, e.g. a Docker Postgres, cannot be crash-restarted
// privately).
func startPostgres(t *testing.T) *pgCluster {
	t.Helper()
	bindir := findPGBindir()
	if bindir == "" {
		t.Skip("soak: no Postgres server binaries (initdb, postgres) installed; `make test` installs them (scripts/pg.sh)")
	}
	c := &pgCluster{bindir: bindir}
	if os.Geteuid() == 0 {
		// Postgres refuses to run as root; scripts/pg.sh runs it as
		// `postgres`, and so do we.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("soak: running as root and there is no postgres user to run the server as (scripts/pg.sh creates one)")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir(): its parents are private to this user, and the
	// server's user must reach the data directory.
	dir, err := os.MkdirTemp("", "blobplane-soak-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) }) // runs after stop (cleanups run last-in first-out)
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	if c.logf, err = os.OpenFile(filepath.Join(t.TempDir(), "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.logf.Close() })

	initdb := exec.Command(filepath.Join(bindir, "initdb"), "-D", c.data(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("soak: initdb: %v\n%s", err, out)
	}
	if err := os.Mkdir(c.sockets(), 0o700); err != nil {
		t.Fatal(err)
	}
	if c.cred != nil {
		if err := os.Chown(c.sockets(), int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	if c.port, err = stablePort(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	if err := c.start(); err != nil {
		t.Fatalf("soak: %v", err)
	}
	conn, err := pgx.Connect(context.Background(), c.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE blobplane"); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *pgCluster) data() string    { return filepath.Join(c.dir, "data") }
func (c *pgCluster) sockets() string { return filepath.Join(c.dir, "run") }

// url is the connection URL of database db.
func (c *pgCluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// URL is Blobplane's DATABASE_URL.
func (c *pgCluster) URL() string { return c.url("blobplane") }

// start runs the postmaster as this process's child (killed by the kernel
// if the test process dies: no server outlives a crashed run) and waits
// until it accepts connections. After a crash it replays the WAL first.
func (c *pgCluster) start() error {
	var last error
	for attempt := range 5 {
		if attempt > 0 {
			// A backend of the crashed server may still hold the old
			// shared memory for a moment.
			time.Sleep(200 * time.Millisecond)
		}
		cmd := exec.Command(filepath.Join(c.bindir, "postgres"), "-D", c.data(), "-p", strconv.Itoa(c.port), "-k", c.sockets(),
			"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "shared_buffers=64MB",
			// Synchronous commits stay on (the default): only a commit
			// that acknowledges something is synchronous in Blobplane,
			// and an immediate shutdown must keep exactly those.
			"-c", "log_min_messages=warning")
		cmd.Stdout, cmd.Stderr = c.logf, c.logf
		cmd.SysProcAttr = childproc.SysProcAttr()
		cmd.SysProcAttr.Credential = c.cred
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start postgres: %w", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		c.cmd, c.exited = cmd, exited
		if last = c.waitReady(exited); last == nil {
			return nil
		}
	}
	return last
}

func (c *pgCluster) waitReady(exited chan struct{}) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.url("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited before accepting connections (%v); see its log", c.cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 60s: %v", err)
		}
	}
}

// crashRestart is `pg_ctl restart -m immediate`: SIGQUIT to the
// postmaster (every backend quits at once, nothing is flushed, shared
// memory is abandoned), then a new postmaster, which runs crash recovery
// before it accepts connections.
func (c *pgCluster) crashRestart() error {
	c.crashes++
	if err := c.signalAndWait(syscall.SIGQUIT, 30*time.Second); err != nil {
		return err
	}
	return c.start()
}

func (c *pgCluster) signalAndWait(sig syscall.Signal, within time.Duration) error {
	if c.cmd == nil {
		return nil
	}
	select {
	case <-c.exited:
		return nil
	default:
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-c.exited:
		return nil
	case <-time.After(within):
		return fmt.Errorf("postgres did not exit within %s of %v", within, sig)
	}
}

// stop shuts the server down fast (SIGINT), or kills it.
func (c *pgCluster) stop() {
	if err := c.signalAndWait(syscall.SIGINT, 30*time.Second); err != nil {
		_ = c.signalAndWait(syscall.SIGKILL, 10*time.Second)
	}
}

// stablePort returns a loopback port, free a moment ago, for a server
// that the soak restarts on the same port (the map names an api's
// address; Postgres keeps its own): below the kernel's ephemeral range, so
// that no port a process asks the kernel for (bind to port 0) can take it
// while its server is down, and outside scripts/pg.sh's range.
func stablePort() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 21000 {
				low = n
			}
		}
	}
	for range 100 {
		port := 20000 + mrand.IntN(low-20000)
		if port >= 15432 && port <= 15531 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port below the ephemeral range")
}
