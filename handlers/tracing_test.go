package handlers_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/tracing"
	"github.com/blobplane/blobplane/store"
)

// otlpReceiver is an OTLP/HTTP trace endpoint that keeps what it is sent.
type otlpReceiver struct {
	mu    sync.Mutex
	spans map[string][]string // trace id → span names
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				id := hex.EncodeToString(s.TraceId)
				o.spans[id] = append(o.spans[id], s.Name)
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(nil)
}

// Issue 31 point 6: with an OTLP endpoint configured (the standard
// OTEL_EXPORTER_OTLP_ENDPOINT), a request is a span named by its route,
// the Postgres queries it ran are spans of its trace, and its access log
// line names that trace.
func TestTracesExportedAndNamedInTheLogs(t *testing.T) {
	rcv := &otlpReceiver{spans: map[string][]string{}}
	collector := httptest.NewServer(rcv)
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	shutdown, err := tracing.Setup(context.Background(), "api", "node-t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	db := pgtest.New(t)
	st, err := store.OpenAs(context.Background(), db.URL, nil, store.Timeouts{}, "tracing-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	// A published map, so /v1/partitions reads leases too.
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	key := authority.TrustedKey{KeyID: "trace-test", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	if err := st.PublishSigningKey(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: now, SlotBits: 12, Partitions: 2,
		Nodes: []authority.NodeAddr{{Node: "n", Endpoint: "10.0.0.1:1"}}, Class: "standard", Mode: authority.ModeDerived, State: authority.PrimaryServing, Epoch: 1}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := (authority.Signer{KeyID: key.KeyID, Key: priv}).SignMap(m); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishMap(context.Background(), m, nil); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Logger: slog.New(tracing.LogHandler(slog.NewJSONHandler(&logs, nil))),
		Authority: &handlers.Authority{NodeID: "n", Keeper: noKeeper{}, Maps: st, Reports: st}}))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/v1/partitions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/partitions: %d", resp.StatusCode)
	}
	if err := shutdown(context.Background()); err != nil { // flushes
		t.Fatal(err)
	}

	var traceID string
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil && l["msg"] == "http" && l["path"] == "/v1/partitions" {
			traceID, _ = l["trace_id"].(string)
		}
	}
	if len(traceID) != 32 {
		t.Fatalf("the access log line names no trace:\n%s", logs.String())
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	names := rcv.spans[traceID]
	server, queries := false, 0
	for _, n := range names {
		server = server || n == "GET /v1/partitions"
		if strings.HasPrefix(n, "query") || strings.Contains(strings.ToLower(n), "select") {
			queries++
		}
	}
	t.Logf("trace %s: %v", traceID, names)
	if !server || queries == 0 {
		t.Fatalf("trace %s exported %v: want the request's span and its queries' spans", traceID, names)
	}
}
