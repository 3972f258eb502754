package handlers_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// statementCounter counts the statements a pool sends (BEGIN and COMMIT
// included) and the round trips they take: a statement on its own is one,
// a pipelined batch of them is one.
type statementCounter struct{ statements, roundTrips atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	c.roundTrips.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *statementCounter) reset() {
	c.statements.Store(0)
	c.roundTrips.Store(0)
}

// The database work of the hot paths, counted: a 4 KiB upload as OCI
// clients send it (POST, then PUT with the whole body), a single-request
// upload (POST ?digest= with the body) and a warm HEAD, with the api's
// caches warm. docs/performance.md explains each statement. Reported as
// statements/op and round-trips/op (a benchmark, not a test that pins
// them: issue 27), e.g.
//
//	go test -run '^$' -bench OCIHotPathStatements -benchtime 200x ./handlers
//
// At this writing: POST+PUT 13 statements in 4 round trips (CreateIntent;
// ClaimSessionAndStage, one implicit transaction; Finalize, one round trip
// and COMMIT; each transaction first sets its generic plans), the
// single-request POST 11 in 3 (OpenAndStage, then Finalize), a warm HEAD
// none. The per-principal bounds' snapshot (one aggregate a second,
// handlers/bounds.go) is left out: its period is set past the run.
func BenchmarkOCIHotPathStatements(b *testing.B) {
	ctx := context.Background()
	d := pgtest.New(b)
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		b.Fatal(err)
	}
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	st := store.New(pool, nil)
	stop := st.StartCaches(ctx, store.CacheOptions{Auth: &store.AuthCacheOptions{}, Existence: &store.ExistenceCacheOptions{}})
	b.Cleanup(stop)
	if err := st.CreateRepository(ctx, "team/app"); err != nil {
		b.Fatal(err)
	}
	lease, err := st.AcquireLease(ctx, "p-0001", "node-a", "node-a:7443", time.Minute, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	be, err := fs.Open(b.TempDir(), backend.StoreAsSubmitted)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	home := &staticHome{lease: upload.Home{Partition: "p-0001", Node: "node-a", Epoch: lease.Epoch}}
	home.home.Store(true)
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, OCI: &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1", Home: home, MaxBlobSize: 1 << 20, IntentTTL: time.Hour, UsagePeriod: 24 * time.Hour}}}))
	b.Cleanup(srv.Close)
	gs, err := auth.ParseGrants([]string{"team/*:write"})
	if err != nil {
		b.Fatal(err)
	}
	cred, _, err := st.CreateToken(ctx, "alice", gs)
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !st.AuthCacheStats().Listening || !st.ExistenceCacheStats().Listening {
		if time.Now().After(deadline) {
			b.Fatal("the cache listener did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	send := func(method, url string, body []byte, want int) *http.Response {
		req, err := http.NewRequest(method, url, strings.NewReader(string(body)))
		if err != nil {
			b.Fatal(err)
		}
		req.SetBasicAuth("oras", cred)
		resp, err := srv.Client().Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("%s %s: %d, want %d", method, url, resp.StatusCode, want)
		}
		return resp
	}
	blob := func() ([]byte, string) {
		p := make([]byte, 4096)
		rand.Read(p)
		sum := sha256.Sum256(p)
		return p, "sha256:" + hex.EncodeToString(sum[:])
	}
	upload := func() string {
		p, d := blob()
		loc := send("POST", srv.URL+"/v2/team/app/blobs/uploads/", nil, http.StatusAccepted).Header.Get("Location")
		send("PUT", srv.URL+loc+"?digest="+d, p, http.StatusCreated)
		return d
	}
	single := func() {
		p, d := blob()
		send("POST", srv.URL+"/v2/team/app/blobs/uploads/?digest="+d, p, http.StatusCreated)
	}
	warm := upload() // the token, the placement ledger, prepared statements
	single()
	send("HEAD", srv.URL+"/v2/team/app/blobs/"+warm, nil, http.StatusOK) // fills the existence cache
	for _, path := range []struct {
		name string
		op   func()
	}{
		{"post+put", func() { upload() }},
		{"single-post", single},
		{"warm-head", func() { send("HEAD", srv.URL+"/v2/team/app/blobs/"+warm, nil, http.StatusOK) }},
	} {
		b.Run(path.name, func(b *testing.B) {
			counter.reset()
			chained := st.ChainedCloses()
			for range b.N {
				path.op()
			}
			b.ReportMetric(float64(counter.statements.Load())/float64(b.N), "statements/op")
			b.ReportMetric(float64(st.ChainedCloses()-chained)/float64(b.N), "chained-closes/op")
			b.ReportMetric(float64(counter.roundTrips.Load())/float64(b.N), "round-trips/op")
		})
	}
}
