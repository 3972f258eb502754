package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/blobplane/blobplane/internal/tracing"
)

// traceRequests makes every request a server span when tracing is on
// (internal/tracing), continuing a caller's trace (W3C traceparent),
// named by its route pattern once routed — never the raw path, whose
// repository names are unbounded.
func traceRequests(next http.Handler) http.Handler {
	if !tracing.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracing.Tracer().Start(ctx, "HTTP "+methodLabel(r.Method), trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("request_id", middleware.GetReqID(r.Context()))))
		defer span.End()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		r = r.WithContext(ctx)
		next.ServeHTTP(ww, r)
		if route := routePattern(r); route != "" {
			span.SetName(r.Method + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", ww.Status()))
		if ww.Status() >= 500 {
			span.SetStatus(codes.Error, http.StatusText(ww.Status()))
		}
	})
}
