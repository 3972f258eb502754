package handlers

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/blobplane/blobplane"
)

// The node's capacity budget over real HTTP, held deterministically: one
// request is inside the handler (it said so) when the next arrives; that
// one is refused at once with 503, Retry-After and the API's error shape
// (OCI's under /v2/), the health endpoints still answer, and once the
// first ends the budget admits again.
func TestCapacityBudgetSheds(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	shed := prometheus.NewCounter(prometheus.CounterOpts{Name: "shed"})
	h := capacity(1, shed)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusOK)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	released := false
	defer func() { // before srv.Close, which waits for the held request
		if !released {
			close(release)
		}
	}()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	held := make(chan int, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/hold")
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	<-entered
	resp, body := get("/v1/anything")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, `"unavailable"`) {
		t.Fatalf("over the budget: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, body = get("/v2/team/app/blobs/sha256:00")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"UNAVAILABLE"`) {
		t.Fatalf("over the budget under /v2/: %d %s", resp.StatusCode, body)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if resp, _ := get(p); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s refused while over the budget: %d", p, resp.StatusCode)
		}
	}
	close(release)
	released = true
	if code := <-held; code != http.StatusOK {
		t.Fatalf("the held request: %d", code)
	}
	if resp, _ := get("/v1/anything"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the held request ended: %d", resp.StatusCode)
	}
	if n := testutil.ToFloat64(shed); n != 2 {
		t.Fatalf("shed counted %v, want 2", n)
	}
}

// A request cancelled with a reason (its home's lease lost mid-request,
// ZBP-5 R24) answers that reason, retryable, not an internal error.
func TestCancelledWithACauseAnswersTheCause(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(blobplane.Errorf(blobplane.CodeUnavailable, "lease for partition p lost mid-request"))
	r := httptest.NewRequest(http.MethodPost, "/internal/v1/finalize/x", nil).WithContext(ctx)
	w := httptest.NewRecorder()
	WriteError(w, r, slog.New(slog.DiscardHandler), fmt.Errorf("finalize: %w", context.Canceled))
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "lost mid-request") {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
}
