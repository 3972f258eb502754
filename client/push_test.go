package client

import (
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
)

// A chunk answered 429 before the server read it is sent again, while
// the transport's goroutine may still be writing the first attempt's body
// (http.RoundTripper closes a body in its own time). The first attempt's
// body is detached once answered: under -race, its progress and sent
// count never race the second attempt's (CI saw that race in blobctl's
// TestRetryAfterIsHonoured). The server here holds the first PATCH
// unread until the second was read, then reads what is still sent of it:
// the old body, not detached, went on counting into the push's sent
// bytes while the push went on.
func TestARetriedChunkDetachesTheAnsweredBody(t *testing.T) {
	const size = 24 << 20 // more than loopback's socket buffers hold
	path := filepath.Join(t.TempDir(), "blob")
	data := make([]byte, size)
	_, _ = rand.Read(data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var patches atomic.Int32
	second := make(chan struct{})
	var held atomic.Int64 // the session's bytes
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodHead:
			w.WriteHeader(http.StatusNotFound)
		case http.MethodPost:
			w.Header().Set("Location", "/v2/team/app/blobs/uploads/s1")
			w.WriteHeader(http.StatusAccepted)
		case http.MethodPatch:
			switch patches.Add(1) {
			case 1:
				w.Header().Set("Retry-After", "0")
				w.Header().Set("Content-Length", "0") // the answer is whole while the handler holds on
				w.WriteHeader(http.StatusTooManyRequests)
				w.(http.Flusher).Flush()
				<-second                           // the body stays unread until the retry was read,
				_, _ = io.Copy(io.Discard, r.Body) // then whatever is still sent of it is
				return
			case 2:
				defer close(second)
			}
			n, _ := io.Copy(io.Discard, r.Body)
			w.Header().Set("Range", "0-"+strconv.FormatInt(held.Add(n)-1, 10))
			w.WriteHeader(http.StatusAccepted)
		case http.MethodPut:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close() // waits for the first PATCH's handler

	api := &API{Base: srv.URL}
	res, err := api.Push(context.Background(), "team/app", path, PushOptions{ChunkSize: size - 1})
	if err != nil {
		t.Fatalf("push through a 429 answered before its body was read: %v", err)
	}
	if patches.Load() != 3 || held.Load() != size {
		t.Fatalf("patches %d, the session holds %d bytes; want 3 patches and %d bytes", patches.Load(), held.Load(), size)
	}
	if res.Status != "published" || res.Sent < size {
		t.Fatalf("result %+v: want published, at least %d bytes sent", res, size)
	}
}
