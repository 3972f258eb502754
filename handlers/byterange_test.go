package handlers_test

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/handlers"
)

// refDigits parses 1*DIGIT (optionally after a '+', if allowSign) that fits
// in an int64. Numbers beyond int64 are rejected: the parser answers 416
// for them rather than clamping, a conservative reading kept here.
func refDigits(s string, allowSign bool) (int64, bool) {
	if allowSign {
		s = strings.TrimPrefix(s, "+")
	}
	if s == "" {
		return 0, false
	}
	var n int64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// refByteRange is the reference model of ParseByteRange: one
// "bytes=first-last", "bytes=first-" or "bytes=-suffix" range, satisfiable
// against size bytes, last clamped to the end, a suffix longer than the
// blob meaning the whole blob.
func refByteRange(s string, size int64, allowSign bool) (backend.Range, bool) {
	spec, ok := strings.CutPrefix(s, "bytes=")
	if !ok || size <= 0 {
		return backend.Range{}, false
	}
	a, b, ok := strings.Cut(spec, "-")
	if !ok {
		return backend.Range{}, false
	}
	var start, end int64
	if a == "" {
		n, ok := refDigits(b, allowSign)
		if !ok || n == 0 {
			return backend.Range{}, false
		}
		start, end = 0, size-1
		if n < size {
			start = size - n
		}
	} else {
		if start, ok = refDigits(a, allowSign); !ok {
			return backend.Range{}, false
		}
		end = size - 1
		if b != "" {
			last, ok := refDigits(b, allowSign)
			if !ok || last < start {
				return backend.Range{}, false
			}
			end = min(last, size-1)
		}
	}
	if start >= size {
		return backend.Range{}, false
	}
	return backend.Range{Offset: start, Length: end - start + 1}, true
}

// checkByteRange asserts ParseByteRange's contract for one input: an error
// carries CodeRangeInvalid; a range lies inside the blob and is not empty;
// the answer is the reference model's.
func checkByteRange(t *testing.T, s string, size int64) {
	t.Helper()
	r, err := handlers.ParseByteRange(s, size)
	if err != nil {
		if c := blobplane.ErrorCode(err); c != blobplane.CodeRangeInvalid {
			t.Fatalf("ParseByteRange(%q, %d): code %q, want %q (%v)", s, size, c, blobplane.CodeRangeInvalid, err)
		}
	} else if r.Offset < 0 || r.Length < 1 || r.Offset > size-r.Length {
		t.Fatalf("ParseByteRange(%q, %d) = %+v: outside the blob or empty", s, size, r)
	}
	want, ok := refByteRange(s, size, false)
	switch {
	case ok && err != nil:
		t.Fatalf("ParseByteRange(%q, %d) = %v; want %+v", s, size, err, want)
	case !ok && err == nil:
		t.Fatalf("ParseByteRange(%q, %d) = %+v; want an error", s, size, r)
	case ok && r != want:
		t.Fatalf("ParseByteRange(%q, %d) = %+v; want %+v", s, size, r, want)
	}
}

func TestParseByteRangeTable(t *testing.T) {
	t.Parallel()
	const maxI = math.MaxInt64
	ok := []struct {
		s      string
		size   int64
		off, n int64
	}{
		{"bytes=0-0", 10, 0, 1},
		{"bytes=0-9", 10, 0, 10},
		{"bytes=9-9", 10, 9, 1},
		{"bytes=3-5", 10, 3, 3},
		{"bytes=5-100", 10, 5, 5},
		{"bytes=0-9223372036854775807", 10, 0, 10},
		{"bytes=007-008", 10, 7, 2},
		{"bytes=0-", 10, 0, 10},
		{"bytes=9-", 10, 9, 1},
		{"bytes=-1", 10, 9, 1},
		{"bytes=-10", 10, 0, 10},
		{"bytes=-11", 10, 0, 10},
		{"bytes=-9223372036854775807", 10, 0, 10},
		{"bytes=0-0", 1, 0, 1},
		{"bytes=-1", 1, 0, 1},
		{"bytes=0-", maxI, 0, maxI},
		{"bytes=9223372036854775806-", maxI, maxI - 1, 1},
		{"bytes=-9223372036854775807", maxI, 0, maxI},
		{"bytes=1-9223372036854775807", maxI, 1, maxI - 1},
	}
	for _, c := range ok {
		want := backend.Range{Offset: c.off, Length: c.n}
		if m, good := refByteRange(c.s, c.size, false); !good || m != want {
			t.Fatalf("reference model: %q/%d = %+v %v, want %+v", c.s, c.size, m, good, want)
		}
		r, err := handlers.ParseByteRange(c.s, c.size)
		if err != nil || r != want {
			t.Errorf("ParseByteRange(%q, %d) = %+v, %v; want %+v", c.s, c.size, r, err, want)
		}
		checkByteRange(t, c.s, c.size)
	}
	bad := []struct {
		s    string
		size int64
	}{
		{"", 10},
		{"bytes=", 10},
		{"bytes=-", 10},
		{"bytes=5", 10},
		{"bytes=10-", 10},
		{"bytes=10-20", 10},
		{"bytes=3-2", 10},
		{"bytes=-0", 10},
		{"bytes=--3", 10},
		{"bytes=1--3", 10},
		{"bytes=1-2-3", 10},
		{"bytes=0-1,3-4", 10},
		{"bytes=0-1,", 10},
		{"bytes= 0-1", 10},
		{"bytes=0-1 ", 10},
		{"bytes=0x1-2", 10},
		{"bytes=a-b", 10},
		{"items=0-1", 10},
		{"bytes 0-1", 10},
		{"bytes=99999999999999999999-", 10},
		{"bytes=0-", 0},
		{"bytes=-1", 0},
		{"bytes=0-0", 0},
		{"bytes=0-", -1},
		{"bytes=-1", -1},
		{"bytes=-1", math.MinInt64},
		{"bytes=-9223372036854775807", math.MinInt64},
	}
	for _, c := range bad {
		if _, good := refByteRange(c.s, c.size, false); good {
			t.Fatalf("reference model accepts %q/%d", c.s, c.size)
		}
		if r, err := handlers.ParseByteRange(c.s, c.size); err == nil {
			t.Errorf("ParseByteRange(%q, %d) = %+v; want an error", c.s, c.size, r)
		} else if code := blobplane.ErrorCode(err); code != blobplane.CodeRangeInvalid {
			t.Errorf("ParseByteRange(%q, %d): code %q, want %q", c.s, c.size, code, blobplane.CodeRangeInvalid)
		}
		checkByteRange(t, c.s, c.size)
	}
}

// TestParseByteRangeSign pins the RFC 9110 grammar: numbers are digits
// only (the parser once took a sign through strconv.ParseInt; found by
// FuzzParseByteRange).
func TestParseByteRangeSign(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"bytes=+1-2", "bytes=-+3", "bytes=1-+5", "bytes=+0-"} {
		if r, err := handlers.ParseByteRange(s, 10); err == nil {
			t.Errorf("ParseByteRange(%q, 10) = %+v; want an error", s, r)
		}
	}
}

// FuzzParseByteRange: any string against any size.
func FuzzParseByteRange(f *testing.F) {
	for _, c := range []struct {
		s    string
		size int64
	}{
		{"bytes=0-0", 10}, {"bytes=2-", 10}, {"bytes=-3", 10}, {"bytes=5-100", 10},
		{"bytes=-11", 10}, {"bytes=10-", 10}, {"bytes=3-2", 10}, {"bytes=0-1,3-4", 10},
		{"bytes=-0", 10}, {"bytes=+1-2", 10}, {"bytes=0-", 0}, {"bytes=-1", math.MinInt64},
		{"bytes=0-9223372036854775807", math.MaxInt64}, {"items=0-1", 10},
	} {
		f.Add(c.s, c.size)
	}
	f.Fuzz(func(t *testing.T, s string, size int64) {
		checkByteRange(t, s, size)
	})
}

// FuzzParseByteRangeForms builds the three valid forms from numbers and
// checks the exact range, computed from the numbers rather than the text.
func FuzzParseByteRangeForms(f *testing.F) {
	f.Add(uint8(0), uint64(0), uint64(0), int64(10))
	f.Add(uint8(0), uint64(5), uint64(100), int64(10))
	f.Add(uint8(1), uint64(9), uint64(0), int64(10))
	f.Add(uint8(2), uint64(3), uint64(0), int64(10))
	f.Add(uint8(2), uint64(11), uint64(0), int64(10))
	f.Add(uint8(0), uint64(math.MaxInt64), uint64(math.MaxInt64), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, form uint8, a, b uint64, size int64) {
		// Numbers beyond int64 are out of scope here (see refDigits).
		a, b = a&math.MaxInt64, b&math.MaxInt64
		first, last := int64(a), int64(b)
		var s string
		var want backend.Range
		var ok bool
		switch form % 3 {
		case 0: // bytes=first-last
			s = "bytes=" + strconv.FormatInt(first, 10) + "-" + strconv.FormatInt(last, 10)
			if ok = size > 0 && first < size && last >= first; ok {
				want = backend.Range{Offset: first, Length: min(last, size-1) - first + 1}
			}
		case 1: // bytes=first-
			s = "bytes=" + strconv.FormatInt(first, 10) + "-"
			if ok = size > 0 && first < size; ok {
				want = backend.Range{Offset: first, Length: size - first}
			}
		case 2: // bytes=-suffix
			s = "bytes=-" + strconv.FormatInt(first, 10)
			if ok = size > 0 && first > 0; ok {
				n := min(first, size)
				want = backend.Range{Offset: size - n, Length: n}
			}
		}
		r, err := handlers.ParseByteRange(s, size)
		switch {
		case ok && (err != nil || r != want):
			t.Fatalf("ParseByteRange(%q, %d) = %+v, %v; want %+v", s, size, r, err, want)
		case !ok && err == nil:
			t.Fatalf("ParseByteRange(%q, %d) = %+v; want an error", s, size, r)
		}
		checkByteRange(t, s, size)
	})
}
