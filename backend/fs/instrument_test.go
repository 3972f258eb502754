package fs_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// Issue 31 point 6: an instrumented backend (what the api and worker use)
// is the backend it wraps — it passes the whole conformance suite — and
// measures each call by operation and outcome and the bytes moved.
func TestInstrumentedBackend(t *testing.T) {
	m := backend.NewMetrics()
	open := func(t *testing.T, dir string, policy backend.StorePolicy) backend.Backend {
		t.Helper()
		b, err := fs.Open(dir, policy)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return backend.Instrument("fs", b, m)
	}
	t.Run("conformance", func(t *testing.T) {
		backendtest.Run(t, backendtest.Harness{
			New: func(t *testing.T, policy backend.StorePolicy) backend.Backend { return open(t, t.TempDir(), policy) },
			Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
				return open(t, old.(interface{ Unwrap() backend.Backend }).Unwrap().(*fs.Backend).Dir(), backend.StoreAsSubmitted)
			},
		})
	})

	m = backend.NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors()...)
	b := open(t, t.TempDir(), backend.StoreAsSubmitted)
	ctx := context.Background()
	blob := backendtest.NewBlob(7, 1000)
	if _, err := b.Write(ctx, backend.WriteRequest{Digest: blob.Digest, Size: int64(len(blob.Content)), Body: bytes.NewReader(blob.Content)}); err != nil {
		t.Fatal(err)
	}
	obj, err := b.Read(ctx, blob.Digest, backend.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(obj.Body); !bytes.Equal(got, blob.Content) {
		t.Fatal("read back other bytes")
	}
	obj.Body.Close()
	if _, err := b.Stat(ctx, backendtest.NewBlob(8, 10).Digest); err == nil {
		t.Fatal("stat of a missing blob succeeded")
	}
	want := `
# HELP blobplane_backend_transferred_bytes_total Bytes written to (direction in: objects and staged chunks) and read from (out) each backend.
# TYPE blobplane_backend_transferred_bytes_total counter
blobplane_backend_transferred_bytes_total{backend="fs",direction="in"} 1000
blobplane_backend_transferred_bytes_total{backend="fs",direction="out"} 1000
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "blobplane_backend_transferred_bytes_total"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "blobplane_backend_operation_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			calls[l["backend"]+" "+l["operation"]+" "+l["outcome"]] = m.GetHistogram().GetSampleCount()
		}
	}
	for _, want := range []string{"fs write ok", "fs read ok", "fs stat not_found"} {
		if calls[want] != 1 {
			t.Errorf("%s: %d calls measured (%v)", want, calls[want], calls)
		}
	}
}
