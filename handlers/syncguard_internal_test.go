package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/blobplane/blobplane/store"
)

// fakeGuard answers as told: the HTTP side of the guard, over real HTTP
// (store's tests hold the guard's own decisions).
type fakeGuard struct{ admit, ack error }

func (g fakeGuard) Admit() error                                    { return g.admit }
func (g fakeGuard) Ticket() store.Ticket                            { return store.Ticket{} }
func (g fakeGuard) Acknowledge(context.Context, store.Ticket) error { return g.ack }

// A write is refused at once without a synchronous standby; a success the
// guard withholds becomes the retryable refusal, without the success's
// headers; reads pass.
func TestGuardWritesOverHTTP(t *testing.T) {
	t.Parallel()
	h := &ociHandler{logger: slog.New(slog.DiscardHandler)}
	fail := func(w http.ResponseWriter, r *http.Request, err error) { h.fail(w, r, err, ociUnavailable) }
	ran := 0
	published := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		w.Header().Set("Location", "/v2/team/app/blobs/sha256:abc")
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusCreated)
	})
	for _, c := range []struct {
		name   string
		g      fakeGuard
		method string
		status int
		ran    int
	}{
		{"synchronous", fakeGuard{}, http.MethodPut, http.StatusCreated, 1},
		{"no standby: refused before the handler", fakeGuard{admit: store.ErrNotSynchronous}, http.MethodPut, http.StatusServiceUnavailable, 0},
		{"standby lost during the write: withheld", fakeGuard{ack: store.ErrOutcomeUnknown}, http.MethodPut, http.StatusServiceUnavailable, 1},
		{"reads pass", fakeGuard{admit: store.ErrNotSynchronous, ack: store.ErrOutcomeUnknown}, http.MethodGet, http.StatusCreated, 1},
	} {
		ran = 0
		srv := httptest.NewServer(guardWrites(c.g, fail)(published))
		req, _ := http.NewRequest(c.method, srv.URL+"/v2/team/app/blobs/uploads/x?digest=sha256:abc", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != c.status || ran != c.ran {
			t.Errorf("%s: %d (handler ran %d), want %d (%d)", c.name, resp.StatusCode, ran, c.status, c.ran)
			continue
		}
		if c.status != http.StatusServiceUnavailable {
			continue
		}
		var body struct {
			Errors []struct{ Code, Message string } `json:"errors"`
		}
		if json.Unmarshal(b, &body) != nil || len(body.Errors) != 1 || body.Errors[0].Code != ociUnavailable ||
			resp.Header.Get("Retry-After") == "" || resp.Header.Get("Location") != "" {
			t.Errorf("%s: %v %s", c.name, resp.Header, b)
		}
	}
}

// Work cancelled inside the node while its client still waits (a lease
// fenced during a database failover) is a retryable 503, never a 500
// (found by soak.TestHAFailoverLosesNothing).
func TestInternalCancellationIsRetryable(t *testing.T) {
	t.Parallel()
	h := &ociHandler{logger: slog.New(slog.DiscardHandler)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, fmt.Errorf("finalize: %w", context.Canceled), ociUploadInvalid)
	}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v2/team/app/blobs/uploads/", "application/octet-stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("an internal cancellation: %d %v, want 503 with Retry-After", resp.StatusCode, resp.Header)
	}
}
