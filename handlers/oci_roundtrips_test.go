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

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
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
// clients send it (POST, then PUT with the whole body) and a HEAD, with
// the api's caches warm. docs/performance.md explains each statement;
// this test keeps the count from growing unnoticed (performance is
// measured by the benchmarks, not here: these are counts, not times).
func TestOCIHotPathStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := store.New(pool, nil)
	stop := st.StartCaches(ctx, store.CacheOptions{Auth: &store.AuthCacheOptions{}, Existence: &store.ExistenceCacheOptions{}})
	t.Cleanup(stop)
	if err := st.CreateRepository(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	lease, err := st.AcquireLease(ctx, "p-0001", "node-a", "node-a:7443", time.Minute, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	be, err := fs.Open(t.TempDir(), backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	home := &staticHome{lease: handlers.HomeLease{Partition: "p-0001", Node: "node-a", Epoch: lease.Epoch}}
	home.home.Store(true)
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, OCI: &handlers.OCI{
		Store: st, Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1",
		Home: home, MaxBlobSize: 1 << 20, IntentTTL: time.Hour,
	}}))
	t.Cleanup(srv.Close)
	cred := token(t, st, "alice", "team/*:write")
	deadline := time.Now().Add(30 * time.Second)
	for !st.AuthCacheStats().Listening || !st.ExistenceCacheStats().Listening {
		if time.Now().After(deadline) {
			t.Fatal("the cache listener did not come up")
		}
		time.Sleep(10 * time.Millisecond)
	}

	send := func(method, url string, body []byte, want int) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("oras", cred)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d, want %d", method, url, resp.StatusCode, want)
		}
		return resp
	}
	upload := func() string {
		t.Helper()
		blob := make([]byte, 4096)
		rand.Read(blob)
		sum := sha256.Sum256(blob)
		d := "sha256:" + hex.EncodeToString(sum[:])
		loc := send("POST", srv.URL+"/v2/team/app/blobs/uploads/", nil, http.StatusAccepted).Header.Get("Location")
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		send("PUT", srv.URL+loc+sep+"digest="+d, blob, http.StatusCreated)
		return d
	}
	upload() // warm: the token, the placement ledger, prepared statements

	counter.reset()
	chained := st.ChainedCloses()
	d1 := upload()
	// POST: CreateIntent. PUT: ClaimSessionAndStage (the session's read
	// and its claim in one round trip, one implicit transaction: its
	// setting, claim+stage lock, stage); Finalize (one round trip: BEGIN,
	// FinalizeContext, VerifyPendingPlacement, EnsureBlobUnderLease,
	// Publish; then COMMIT). Each of the three transactions first sets
	// its generic plans (store's genericPlans). The token comes from the
	// cache.
	if n, rt := counter.statements.Load(), counter.roundTrips.Load(); n != 13 || rt != 4 {
		t.Errorf("a 4 KiB POST+PUT sent %d statements in %d round trips, want 13 in 4", n, rt)
	}
	if n := st.ChainedCloses() - chained; n != 1 {
		t.Errorf("%d chained closes, want the PUT's", n)
	}
	// The single-request upload (POST ?digest= with the body):
	// OpenAndStage (one round trip: the generic plans' setting, the
	// intent with its claim, the stage lock, the stage), then Finalize as
	// above.
	counter.reset()
	blob := make([]byte, 4096)
	rand.Read(blob)
	sum := sha256.Sum256(blob)
	send("POST", srv.URL+"/v2/team/app/blobs/uploads/?digest=sha256:"+hex.EncodeToString(sum[:]), blob, http.StatusCreated)
	if n, rt := counter.statements.Load(), counter.roundTrips.Load(); n != 11 || rt != 3 {
		t.Errorf("a 4 KiB single-request POST sent %d statements in %d round trips, want 11 in 3", n, rt)
	}
	if n := st.ChainedCloses() - chained; n != 2 {
		t.Errorf("%d chained closes, want the PUT's and the single-request upload's", n)
	}

	send("HEAD", srv.URL+"/v2/team/app/blobs/"+d1, nil, http.StatusOK) // fills the existence cache
	counter.reset()
	send("HEAD", srv.URL+"/v2/team/app/blobs/"+d1, nil, http.StatusOK)
	if n := counter.statements.Load(); n != 0 {
		t.Errorf("a warm HEAD sent %d statements, want 0", n)
	}
}
