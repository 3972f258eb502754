package upload

import (
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// clientBody is a request body that remembers whether reading it failed:
// the client cut it short of its Content-Length, stalled past the idle
// deadline or went away. That is the client's fault (invalid), not a
// backend's unavailability (found by FuzzOCIHandlers).
type clientBody struct {
	r   io.Reader
	err error
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

// blame is err, a write's error, as the client's when reading the body
// failed first.
func (b *clientBody) blame(err error) error {
	if err == nil || b.err == nil || errors.Is(err, backend.ErrMismatch) {
		return err
	}
	return blobplane.Wrap(blobplane.CodeInvalid, b.err, "the request body could not be read whole (%v); send the blob again", b.err)
}

// limitReader fails once more than left bytes were asked of it.
type limitReader struct {
	r        io.Reader
	left     int64
	exceeded bool
}

var errTooLarge = errors.New("request body exceeds the maximum blob size")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more tells a body at the limit from one past it.
		var one [1]byte
		n, err := l.r.Read(one[:])
		if n > 0 {
			l.exceeded = true
			return 0, errTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func tooLarge(max int64) error {
	return blobplane.Errorf(blobplane.CodeTooLarge, "blob exceeds the maximum size of %d bytes", max)
}

// TruncateID is s cut to 40 bytes for a message: an id a client sent is
// echoed, never at any length.
func TruncateID(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// ParseContentRange parses an OCI chunk's Content-Range, "<start>-<end>"
// (inclusive; a "bytes " prefix is tolerated).
func ParseContentRange(s string) (start, end int64, err error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "bytes ")
	a, b, ok := strings.Cut(s, "-")
	bad := blobplane.Errorf(blobplane.CodeRangeInvalid, "Content-Range %q: want <start>-<end>", TruncateID(s))
	if !ok || a == "" || b == "" || strings.ContainsAny(a+b, "+- ") {
		return 0, 0, bad
	}
	start, err1 := strconv.ParseInt(a, 10, 64)
	end, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return 0, 0, bad
	}
	return start, end, nil
}
