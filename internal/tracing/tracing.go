// Package tracing is Blobplane's OpenTelemetry tracing (issue 31): off
// unless an OTLP endpoint is configured with the standard variables
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and
// the other OTEL_EXPORTER_OTLP_* settings the exporter reads), then every
// HTTP request, Postgres query and transaction and River job is a span
// exported over OTLP/HTTP, and every log line written in a span names its
// trace_id and span_id.
package tracing

import (
	"context"
	"log/slog"
	"net/http"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/blobplane/blobplane/internal/buildinfo"
)

// Enabled reports whether an OTLP endpoint is configured.
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the global tracer provider exporting to the configured
// endpoint, for service (the binary) on node; without an endpoint it does
// nothing. shutdown flushes what is buffered.
func Setup(ctx context.Context, service, node string) (shutdown func(context.Context) error, err error) {
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	res := sdkresource.NewSchemaless(attribute.String("service.name", "blobplane-"+service),
		attribute.String("service.version", buildinfo.Read().Version), attribute.String("service.instance.id", node))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

// Tracer is Blobplane's tracer.
func Tracer() trace.Tracer { return otel.Tracer("github.com/blobplane/blobplane") }

// LogHandler adds trace_id and span_id to every record logged in a
// recording span's context.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return l.Handler.Handle(ctx, r)
}

func (l logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(as)}
}
func (l logHandler) WithGroup(name string) slog.Handler { return logHandler{l.Handler.WithGroup(name)} }

// Transport is base (http.DefaultTransport when nil) carrying the
// caller's trace to the node it calls (W3C traceparent) when tracing is
// on: a forwarded finalization or a remote read continues the trace of
// the request or job that made it. Node-to-node signatures cover the
// method, URI and body, not this header.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if !Enabled() {
		return base
	}
	return propagating{base}
}

type propagating struct{ base http.RoundTripper }

func (p propagating) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not change its request
	otel.GetTextMapPropagator().Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	return p.base.RoundTrip(r)
}
