package handlers_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

var _ handlers.MapStore = (*store.Store)(nil)

// noKeeper is a node that holds no lease and has adopted no map: the
// observability endpoints under test read only the database.
type noKeeper struct{}

func (noKeeper) Map() *authority.VerifiedMap                   { return nil }
func (noKeeper) Lease(string) authority.LeaseState             { return authority.LeaseState{} }
func (noKeeper) Delta(uint64) *authority.Delta                 { return nil }
func (noKeeper) Admit(string, uint64) (context.Context, error) { return nil, context.Canceled }
func (noKeeper) Successor(string) *authority.Assignment        { return nil }

// Issue 26 point 11: /v1/partitions and blobplane_unowned_slots compared
// this node's clock with expiry times the database wrote from its own
// now(). A node whose clock runs behind called an expired lease owned, and
// hid an unowned partition from the alarm. Here the database's clock runs
// an hour ahead of the api's (its now() is overridden on the api's
// connections through search_path: pg_catalog listed last lets a function
// of the same name win), which is the same thing: a lease that expired 30
// minutes ago by the database expires in 30 minutes by the api's clock.
// It must be reported unowned; a lease live by the database stays owned.
func TestAttackPartitionsOwnershipOnLocalClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := store.New(db.Pool, nil)

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	key := authority.TrustedKey{KeyID: "clock-test", Alg: authority.SignatureAlg, PublicKey: pub,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	if err := st.PublishSigningKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	m, err := authority.EvenSplit{
		Version: 1, GeneratedAt: now, SlotBits: 12, Partitions: 4,
		Nodes: []authority.NodeAddr{{Node: "n_a", Endpoint: "10.0.0.1:7443"}},
		Class: "std", Mode: authority.ModeJournaled, State: authority.PrimaryServing, Epoch: 1,
	}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := (authority.Signer{KeyID: key.KeyID, Key: priv}).SignMap(m); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishMap(ctx, m, nil); err != nil {
		t.Fatal(err)
	}
	expired, live := m.Partitions[0].ID, m.Partitions[1].ID
	// Written on the real clock: the skewed database's now() is +1h.
	for id, expiry := range map[string]string{expired: "30 minutes", live: "2 hours"} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, state,
			lease_ttl_ms, renew_interval_ms, expires_at) VALUES ($1, 1, 'n_a', '10.0.0.1:7443', 'SERVING', 15000, 3000,
			pg_catalog.now() + $2::interval)`, id, expiry); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA skew;
		CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() + interval '1 hour' $$`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "skew, pg_catalog, public"
	skewed, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(skewed.Close)
	var ahead bool
	if err := skewed.QueryRow(ctx, "SELECT now() > pg_catalog.now() + interval '59 minutes'").Scan(&ahead); err != nil || !ahead {
		t.Fatalf("the skewed database clock is not ahead: %v %v", ahead, err)
	}
	api := store.New(skewed, nil)
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{
		Authority: &handlers.Authority{NodeID: "n_a", Keeper: noKeeper{}, Maps: api, Reports: api},
	}))
	t.Cleanup(srv.Close)

	var body struct {
		Partitions []handlers.PartitionStatus `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(fetch(t, srv.URL+"/v1/partitions")), &body); err != nil {
		t.Fatal(err)
	}
	got := map[string]handlers.PartitionStatus{}
	for _, p := range body.Partitions {
		got[p.ID] = p
	}
	if p := got[expired]; p.Owned || p.State != "UNOWNED" || p.LeaseExpiresAt == nil {
		t.Errorf("a lease expired by the database's clock: owned %v, state %s; want UNOWNED", p.Owned, p.State)
	}
	if p := got[live]; !p.Owned || p.State != "SERVING" {
		t.Errorf("a lease live by the database's clock: owned %v, state %s; want SERVING", p.Owned, p.State)
	}
	// Four partitions of 1024 slots; only one has a live lease.
	metrics := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{"blobplane_unowned_partitions 3", "blobplane_unowned_slots 3072"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v %s", url, resp.StatusCode, err, b)
	}
	return string(b)
}
