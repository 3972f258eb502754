package backend

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/blobplane/blobplane"
)

// Metrics are the backend operation series of a process (issue 31):
// latency by backend, operation and outcome, and bytes moved.
type Metrics struct {
	ops   *prometheus.HistogramVec
	bytes *prometheus.CounterVec
}

// NewMetrics builds the series; register Collectors where the process
// serves /metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "blobplane_backend_operation_duration_seconds",
			Help:    "Backend calls by backend, operation (write, read, stat, delete, list, create_upload, append_upload, upload_size, promote_upload, abort_upload, read_marker, write_marker, list_residue, delete_residue) and outcome (ok, not_found, error). A read's time is to its first byte.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 120}},
			[]string{"backend", "operation", "outcome"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "blobplane_backend_transferred_bytes_total",
			Help: "Bytes written to (direction in: objects and staged chunks) and read from (out) each backend."}, []string{"backend", "direction"}),
	}
}

// Collectors are m's series.
func (m *Metrics) Collectors() []prometheus.Collector { return []prometheus.Collector{m.ops, m.bytes} }

// Instrument returns b measured into m under name, each call also a span
// when tracing is on (the global OpenTelemetry provider). It is a
// Backend like b: every optional capability is part of the interface.
func Instrument(name string, b Backend, m *Metrics) Backend {
	return &instrumented{Backend: b, name: name, m: m, tracer: otel.Tracer("github.com/blobplane/blobplane/backend")}
}

type instrumented struct {
	Backend
	name   string
	m      *Metrics
	tracer trace.Tracer
}

// Unwrap is the backend measured.
func (b *instrumented) Unwrap() Backend { return b.Backend }

// call starts op; done records its outcome.
func (b *instrumented) call(ctx context.Context, op string) (context.Context, func(error)) {
	start := time.Now()
	ctx, span := b.tracer.Start(ctx, "backend."+op, trace.WithAttributes(attribute.String("backend", b.name)))
	return ctx, func(err error) {
		outcome := "ok"
		switch {
		case errors.Is(err, ErrNotFound):
			outcome = "not_found"
		case err != nil:
			outcome = "error"
			span.RecordError(err)
			span.SetStatus(codes.Error, op+" failed")
		}
		b.m.ops.WithLabelValues(b.name, op, outcome).Observe(time.Since(start).Seconds())
		span.End()
	}
}

func (b *instrumented) in(n int64) {
	if n > 0 {
		b.m.bytes.WithLabelValues(b.name, "in").Add(float64(n))
	}
}

func (b *instrumented) Write(ctx context.Context, req WriteRequest) (Info, error) {
	ctx, done := b.call(ctx, "write")
	info, err := b.Backend.Write(ctx, req)
	done(err)
	if err == nil {
		b.in(info.Repr.PayloadSize)
	}
	return info, err
}

func (b *instrumented) Read(ctx context.Context, d blobplane.Digest, opts ReadOptions) (*Object, error) {
	ctx, done := b.call(ctx, "read")
	obj, err := b.Backend.Read(ctx, d, opts)
	done(err)
	if err == nil && obj != nil && obj.Body != nil {
		obj.Body = &countingBody{ReadCloser: obj.Body, add: b.m.bytes.WithLabelValues(b.name, "out")}
	}
	return obj, err
}

func (b *instrumented) Stat(ctx context.Context, d blobplane.Digest) (Info, error) {
	ctx, done := b.call(ctx, "stat")
	info, err := b.Backend.Stat(ctx, d)
	done(err)
	return info, err
}

func (b *instrumented) Delete(ctx context.Context, d blobplane.Digest) error {
	ctx, done := b.call(ctx, "delete")
	err := b.Backend.Delete(ctx, d)
	done(err)
	return err
}

func (b *instrumented) List(ctx context.Context, opts ListOptions) (Page, error) {
	ctx, done := b.call(ctx, "list")
	p, err := b.Backend.List(ctx, opts)
	done(err)
	return p, err
}

func (b *instrumented) CreateUpload(ctx context.Context) (string, error) {
	ctx, done := b.call(ctx, "create_upload")
	id, err := b.Backend.CreateUpload(ctx)
	done(err)
	return id, err
}

func (b *instrumented) AppendUpload(ctx context.Context, id string, offset int64, r io.Reader) (int64, error) {
	ctx, done := b.call(ctx, "append_upload")
	n, err := b.Backend.AppendUpload(ctx, id, offset, r)
	done(err)
	if err == nil {
		b.in(n - offset)
	}
	return n, err
}

func (b *instrumented) UploadSize(ctx context.Context, id string) (int64, error) {
	ctx, done := b.call(ctx, "upload_size")
	n, err := b.Backend.UploadSize(ctx, id)
	done(err)
	return n, err
}

func (b *instrumented) PromoteUpload(ctx context.Context, id string, req WriteRequest) (Info, error) {
	ctx, done := b.call(ctx, "promote_upload")
	info, err := b.Backend.PromoteUpload(ctx, id, req)
	done(err)
	return info, err
}

func (b *instrumented) AbortUpload(ctx context.Context, id string) error {
	ctx, done := b.call(ctx, "abort_upload")
	err := b.Backend.AbortUpload(ctx, id)
	done(err)
	return err
}

func (b *instrumented) ReadMarker(ctx context.Context) ([]byte, error) {
	ctx, done := b.call(ctx, "read_marker")
	data, err := b.Backend.ReadMarker(ctx)
	done(err)
	return data, err
}

func (b *instrumented) WriteMarker(ctx context.Context, data []byte) error {
	ctx, done := b.call(ctx, "write_marker")
	err := b.Backend.WriteMarker(ctx, data)
	done(err)
	return err
}

func (b *instrumented) ListResidue(ctx context.Context, fn func(r Residue, now time.Time) error) error {
	ctx, done := b.call(ctx, "list_residue")
	err := b.Backend.ListResidue(ctx, fn)
	done(err)
	return err
}

func (b *instrumented) DeleteResidue(ctx context.Context, r Residue) error {
	ctx, done := b.call(ctx, "delete_residue")
	err := b.Backend.DeleteResidue(ctx, r)
	done(err)
	return err
}

func (b *instrumented) PutArchived(ctx context.Context, name string, data []byte) error {
	ctx, done := b.call(ctx, "put_archived")
	err := b.Backend.PutArchived(ctx, name, data)
	done(err)
	return err
}

func (b *instrumented) GetArchived(ctx context.Context, name string) ([]byte, error) {
	ctx, done := b.call(ctx, "get_archived")
	data, err := b.Backend.GetArchived(ctx, name)
	done(err)
	return data, err
}

func (b *instrumented) DeleteArchived(ctx context.Context, name string) error {
	ctx, done := b.call(ctx, "delete_archived")
	err := b.Backend.DeleteArchived(ctx, name)
	done(err)
	return err
}

func (b *instrumented) ListArchived(ctx context.Context, prefix string) ([]string, error) {
	ctx, done := b.call(ctx, "list_archived")
	names, err := b.Backend.ListArchived(ctx, prefix)
	done(err)
	return names, err
}

// countingBody counts the bytes a read's body yields.
type countingBody struct {
	io.ReadCloser
	add prometheus.Counter
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if n > 0 {
		c.add.Add(float64(n))
	}
	return n, err
}

var _ Backend = (*instrumented)(nil)
