package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/internal/cli"
)

// progress draws a transfer's progress on stderr: a bar redrawn in
// place (with bytes/s and ETA) on a terminal, a plain line at every
// tenth otherwise, nothing with --json or --progress none.
type progress struct {
	w    io.Writer
	mode string // bar, plain or none
	now  func() time.Time

	mu      sync.Mutex
	phase   string
	start   time.Time
	drawn   time.Time
	tenth   int64 // plain: the last tenth printed
	lastLen int
}

// newProgress picks the mode: --progress, else none for --json, else a
// bar when stderr is a terminal and plain lines when it is not.
func (s *session) newProgress() (*progress, error) {
	mode := s.progress
	switch {
	case mode == "" || mode == "auto":
		mode = "plain"
		if s.json {
			mode = "none"
		} else if s.isTerminal() {
			mode = "bar"
		}
	case mode != "bar" && mode != "plain" && mode != "none":
		return nil, cli.Usagef("--progress %q: want auto, bar, plain or none", mode)
	}
	return &progress{w: s.stderr, mode: mode, now: time.Now}, nil
}

// isTerminal reports whether stderr is a terminal (a character device).
func (s *session) isTerminal() bool {
	if s.tty != nil {
		return *s.tty
	}
	f, ok := s.stderr.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// update is client.Progress's callback.
func (p *progress) update(u client.Progress) {
	if p.mode == "none" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if u.Phase != p.phase {
		p.endLine()
		p.phase, p.start, p.tenth, p.drawn = u.Phase, now, -1, time.Time{}
	}
	done := u.Total >= 0 && u.Done >= u.Total
	switch p.mode {
	case "bar":
		if !done && now.Sub(p.drawn) < 100*time.Millisecond {
			return
		}
		p.drawn = now
		line := p.line(u, now)
		fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", max(0, p.lastLen-len(line))))
		p.lastLen = len(line)
	case "plain":
		tenth := int64(0)
		if u.Total > 0 {
			tenth = u.Done * 10 / u.Total
		}
		if tenth == p.tenth && !done {
			return
		}
		if done && p.tenth == 10 {
			return
		}
		p.tenth = tenth
		fmt.Fprintln(p.w, p.line(u, now))
	}
}

// finish ends the bar's line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLine()
}

func (p *progress) endLine() {
	if p.mode == "bar" && p.lastLen > 0 {
		fmt.Fprintln(p.w)
		p.lastLen = 0
	}
}

// line is "upload  [=====>    ]  45%  12.0 MiB / 26.7 MiB  5.1 MiB/s  ETA 3s".
func (p *progress) line(u client.Progress, now time.Time) string {
	elapsed := now.Sub(p.start).Seconds()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(u.Done) / elapsed
	}
	if u.Total < 0 {
		return fmt.Sprintf("%-8s %s  %s/s", u.Phase, size(u.Done), size(int64(rate)))
	}
	pct := 100.0
	if u.Total > 0 {
		pct = float64(u.Done) * 100 / float64(u.Total)
	}
	eta := "--"
	if u.Done >= u.Total {
		eta = "0s"
	} else if rate > 0 {
		eta = time.Duration(float64(u.Total-u.Done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	s := fmt.Sprintf("%-8s %3.0f%%  %s / %s  %s/s  ETA %s", u.Phase, pct, size(u.Done), size(u.Total), size(int64(rate)), eta)
	if p.mode == "bar" {
		const width = 24
		n := int(pct * width / 100)
		bar := strings.Repeat("=", n)
		if n < width {
			bar += ">" + strings.Repeat(" ", width-n-1)
		}
		s = fmt.Sprintf("%-8s [%s] %s", u.Phase, bar, s[9:])
	}
	return s
}

// size is n in binary units: "812 B", "12.0 MiB".
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
