package handlers

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane"
)

// DefaultBodyIdleTimeout is Deps.BodyIdleTimeout's default.
const DefaultBodyIdleTimeout = time.Minute

// idleDeadlines returns middleware that gives every Read of a request body
// and every Write of a response its own deadline, idle from the moment it
// starts (issue 26 point 5). A client that stops sending its body, or stops
// reading its answer, would otherwise hold the connection, the handler's
// goroutine and what the handler holds (a staged upload, a pooled buffer,
// a database connection) for as long as it liked. The server has no
// ReadTimeout or WriteTimeout, which would cut a large upload or download
// that keeps moving: a transfer may last any time while it moves, and fails
// once it stalls for idle.
//
// It must be the outermost middleware, so every writer the others wrap
// around it reaches the connection through it.
func idleDeadlines(idle time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			iw := &idleWriter{ResponseWriter: w, rc: rc, idle: idle, http1: r.ProtoMajor == 1}
			if r.Body != nil && r.Body != http.NoBody {
				iw.body = &idleBody{ReadCloser: r.Body, rc: rc, idle: idle}
				r.Body = iw.body
			}
			next.ServeHTTP(iw, r)
			iw.startResponse() // a handler that wrote nothing
			// After the handler the server flushes what is buffered, then
			// reads what the handler left of the body (up to 256 KiB, in
			// Body.Close): both get an idle window, or a client that
			// stalls a body the handler refused unread (a 401) holds the
			// connection for ever. A body read in part keeps the
			// deadline of its last read.
			now := time.Now()
			_ = rc.SetWriteDeadline(now.Add(idle))
			if iw.http1 && iw.body != nil && !iw.body.started.Load() {
				_ = rc.SetReadDeadline(now.Add(idle))
			}
		})
	}
}

// idleBody renews the connection's read deadline before each Read of the
// request body.
type idleBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	idle    time.Duration
	started atomic.Bool // a Read began
	done    atomic.Bool // the body ended: deadlines are no longer ours to set
}

// unfinished reports whether b is a body not read to its end (false for
// none).
func (b *idleBody) unfinished() bool { return b != nil && !b.done.Load() }

func (b *idleBody) Read(p []byte) (int, error) {
	if b.done.Load() {
		return b.ReadCloser.Read(p)
	}
	now := time.Now()
	_ = b.rc.SetReadDeadline(now.Add(b.idle)) // ErrNotSupported: no deadline to set
	if !b.started.Swap(true) {
		// The first Read writes "100 Continue" when the client waits
		// for it: a write, which must not meet a stale deadline.
		_ = b.rc.SetWriteDeadline(now.Add(b.idle))
	}
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		// Past the end the server reads the connection in the
		// background to notice a client that goes away, and cancels
		// the request on any error of that read: it must not inherit
		// this deadline, which would cancel a handler still at work
		// (a finalization) once idle passed.
		b.done.Store(true)
		_ = b.rc.SetReadDeadline(time.Time{})
	case isTimeout(err):
		// The deadline stays: the server's read of what is left of the
		// body, after the handler, meets it at once instead of waiting
		// for the client once more.
		err = blobplane.Wrap(blobplane.CodeUnavailable, err, "the request body stalled: nothing arrived for %s", b.idle)
	}
	return n, err
}

// idleWriter renews the connection's write deadline before each Write (and
// Flush) of the response. It hides the underlying writer's ReadFrom, so an
// io.Copy into it writes in bounded chunks, each with its own deadline,
// rather than handing a whole file to sendfile(2) under one.
type idleWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	idle    time.Duration
	http1   bool
	body    *idleBody // nil without a body
	started bool      // the response's header was written
}

// writeChunk bounds what one deadline covers: a single Write of a large
// slice is sent in pieces, each of which must move within idle.
const writeChunk = 256 << 10

// startResponse runs once, as the header is about to be written. On
// HTTP/1, net/http reads and discards what the handler left of the body
// before it sends the header, to reuse the connection; a body the handler
// did not read to its end instead marks the answer "Connection: close",
// so that read never happens: a client that stalls such a body cannot
// hold the answer back, and none of the server's reads (its background
// read, begun at the end of the body) inherits a deadline set here.
func (w *idleWriter) startResponse() {
	if w.started {
		return
	}
	w.started = true
	if w.http1 && w.body.unfinished() {
		w.Header().Set("Connection", "close")
	}
}

func (w *idleWriter) WriteHeader(code int) {
	if code >= 200 {
		w.startResponse()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *idleWriter) Write(p []byte) (written int, err error) {
	w.startResponse()
	for first := true; first || len(p) > 0; first = false { // once for an empty p: it still sends the header
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
		n, err := w.ResponseWriter.Write(p[:min(len(p), writeChunk)])
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (w *idleWriter) Flush() {
	w.startResponse()
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	_ = w.rc.Flush()
}

func (w *idleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.rc.Hijack() }

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var (
	_ http.Flusher  = (*idleWriter)(nil)
	_ http.Hijacker = (*idleWriter)(nil)
)

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
