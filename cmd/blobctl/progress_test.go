package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/client"
)

// On a terminal the bar is redrawn in place with bytes/s and ETA; off
// one, a plain line per tenth; with --json, nothing.
func TestProgressModes(t *testing.T) {
	t.Parallel()
	clock := time.Unix(0, 0)
	draw := func(mode string) string {
		var w bytes.Buffer
		p := &progress{w: &w, mode: mode, now: func() time.Time { return clock }}
		for i := int64(0); i <= 100; i++ {
			clock = clock.Add(200 * time.Millisecond)
			p.update(client.Progress{Phase: "upload", Done: i << 20, Total: 100 << 20})
		}
		p.finish()
		return w.String()
	}
	bar := draw("bar")
	if !strings.Contains(bar, "\rupload   [") || !strings.Contains(bar, "5.0 MiB/s") || !strings.Contains(bar, "ETA 10s") || !strings.HasSuffix(bar, "\n") {
		t.Fatalf("bar: %q", bar)
	}
	plain := draw("plain")
	lines := strings.Split(strings.TrimSpace(plain), "\n")
	if len(lines) != 11 || strings.Contains(plain, "\r") || !strings.Contains(lines[5], " 50%  50.0 MiB / 100.0 MiB  5.0 MiB/s  ETA 10s") {
		t.Fatalf("plain: %d lines\n%s", len(lines), plain)
	}
	if none := draw("none"); none != "" {
		t.Fatalf("none: %q", none)
	}

	s := &session{env: env{stderr: &bytes.Buffer{}}, globals: &globals{json: true}}
	if p, _ := s.newProgress(); p.mode != "none" {
		t.Fatalf("--json: progress mode %q", p.mode)
	}
	yes := true
	s = &session{env: env{stderr: &bytes.Buffer{}, tty: &yes}, globals: &globals{}}
	if p, _ := s.newProgress(); p.mode != "bar" {
		t.Fatalf("a terminal: progress mode %q", p.mode)
	}
	s = &session{env: env{stderr: &bytes.Buffer{}}, globals: &globals{}}
	if p, _ := s.newProgress(); p.mode != "plain" {
		t.Fatalf("not a terminal: progress mode %q", p.mode)
	}
}
