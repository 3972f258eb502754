package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/blobplane/blobplane/internal/tracing"
)

// Issue 31: a call from one node to another carries the caller's trace
// (traceparent) when tracing is on, and nothing when it is off.
func TestTransportCarriesTheTrace(t *testing.T) {
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Get("traceparent") }))
	t.Cleanup(srv.Close)
	call := func(ctx context.Context) string {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := (&http.Client{Transport: tracing.Transport(nil)}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got
	}
	if tp := call(context.Background()); tp != "" {
		t.Fatalf("tracing off, yet traceparent %q", tp)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // never reached: nothing is flushed
	shutdown, err := tracing.Setup(context.Background(), "api", "n")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()); otel.SetTracerProvider(noop.NewTracerProvider()) })
	ctx, span := tracing.Tracer().Start(context.Background(), "forward")
	defer span.End()
	tp := call(ctx)
	if !strings.Contains(tp, span.SpanContext().TraceID().String()) {
		t.Fatalf("traceparent %q does not carry trace %s", tp, span.SpanContext().TraceID())
	}
}
