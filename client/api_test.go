package client

import (
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1", time.Second, true},
		{" 30 ", 30 * time.Second, true},
		{"Sun, 06 Dec 2026 12:00:05 GMT", 5 * time.Second, true},
		{"Sun, 06 Dec 2026 11:00:00 GMT", 0, true}, // in the past: now
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999", 0, false},
	} {
		got, ok := parseRetryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %t; want %v, %t", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestRangeEnd(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0-0", 0, true}, {"0-1023", 1024, true}, {"bytes=0-9", 10, true},
		{"", 0, false}, {"1-5", 0, false}, {"0-", 0, false}, {"0--1", 0, false}, {"0-x", 0, false},
	} {
		got, err := rangeEnd(c.in)
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("rangeEnd(%q) = %d, %v; want %d, ok %t", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestContentRange(t *testing.T) {
	if s, n, err := contentRange("bytes 100-199/1000"); err != nil || s != 100 || n != 1000 {
		t.Fatalf("contentRange: %d %d %v", s, n, err)
	}
	for _, bad := range []string{"", "bytes 100-199", "100-199/1000", "bytes x-199/1000", "bytes 1-2/*", "bytes 1-2/-3", "bytes 5-9/5", "bytes 9-5/20"} {
		if _, _, err := contentRange(bad); err == nil {
			t.Errorf("contentRange(%q) accepted", bad)
		}
	}
}

// The parsers of server headers never panic, and what they accept is
// not negative.
func FuzzServerHeaders(f *testing.F) {
	for _, s := range []string{"0-0", "0-1023", "bytes 1-2/3", "5", "Sun, 06 Dec 2026 12:00:05 GMT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := rangeEnd(s); err == nil && n < 0 {
			t.Fatalf("rangeEnd(%q) = %d", s, n)
		}
		if a, n, err := contentRange(s); err == nil && (a < 0 || n < 0 || a >= n) {
			t.Fatalf("contentRange(%q) = %d, %d", s, a, n)
		}
		if d, ok := parseRetryAfter(s, time.Now()); ok && d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %v", s, d)
		}
	})
}
