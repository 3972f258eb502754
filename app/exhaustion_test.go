package app_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// Issue 26 point 5, as the api serves with its configuration: a header
// past BLOBPLANE_MAX_HEADER_BYTES is refused before any handler runs, and
// a request body that stalls for BLOBPLANE_BODY_IDLE_TIMEOUT ends its
// request, answered, with the connection closed.
func TestAttackOversizedHeaderAndStalledBody(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := testConfig(t, d.URL)
	cfg.MaxHeaderBytes = 16 << 10
	cfg.BodyIdleTimeout = time.Second
	a, err := app.NewAPI(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, func() bool { c, _ := get(t, a.URL()+"/readyz"); return c == 200 })

	exchange := func(t *testing.T, request string, within time.Duration) (*http.Response, time.Duration) {
		t.Helper()
		conn, err := net.Dial("tcp", a.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		start := time.Now()
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(within))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer within %s: %v", within, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		elapsed := time.Since(start)
		if _, err := br.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the connection stays open")
		}
		return resp, elapsed
	}

	t.Run("header", func(t *testing.T) {
		resp, _ := exchange(t, fmt.Sprintf("GET /healthz HTTP/1.1\r\nHost: blobplane\r\nX-Pad: %s\r\n\r\n", strings.Repeat("a", 64<<10)), 10*time.Second)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("a 64 KiB header: %d, want 431", resp.StatusCode)
		}
	})

	t.Run("stalled body", func(t *testing.T) {
		admin, _, err := store.New(d.Pool, nil).CreateToken(ctx, "admin", []auth.Grant{{Pattern: auth.AllRepositories, Permission: auth.Admin}})
		if err != nil {
			t.Fatal(err)
		}
		resp, elapsed := exchange(t, "POST /v1/admin/repositories HTTP/1.1\r\nHost: blobplane\r\nAuthorization: Bearer "+admin+
			"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\": ", cfg.BodyIdleTimeout+10*time.Second)
		if resp.StatusCode < 400 || elapsed < cfg.BodyIdleTimeout {
			t.Fatalf("a stalled body: %d after %s, want an error after the idle timeout %s", resp.StatusCode, elapsed, cfg.BodyIdleTimeout)
		}
	})
}
