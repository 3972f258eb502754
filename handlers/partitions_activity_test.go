package handlers_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// ZBP-5 R138: a silent partition is told from an idle one. Of four
// partitions: one owned with nothing to publish says idle, with the time
// its home last proved itself alive; one with an upload accepted just now
// says working; one whose accepted upload has waited past StallAfter
// says stalled (and is counted for the alarm); one without a live lease
// says unowned, however much waits.
func TestPartitionsTellSilenceFromIdleness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := store.New(db.Pool, nil)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	key := authority.TrustedKey{KeyID: "activity", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	if err := st.PublishSigningKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	m, err := authority.EvenSplit{Version: 1, GeneratedAt: now, SlotBits: 12, Partitions: 4,
		Nodes: []authority.NodeAddr{{Node: "n_a", Endpoint: "10.0.0.1:7443"}},
		Class: "standard", Mode: authority.ModeDerived, State: authority.PrimaryServing, Epoch: 1}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := (authority.Signer{KeyID: key.KeyID, Key: priv}).SignMap(m); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishMap(ctx, m, nil); err != nil {
		t.Fatal(err)
	}
	ix, err := authority.NewIndex(m)
	if err != nil {
		t.Fatal(err)
	}
	// A repository in each partition.
	repoOf := map[string]string{}
	for i := 0; len(repoOf) < len(m.Partitions); i++ {
		name := fmt.Sprintf("team/r%d", i)
		res, err := ix.ResolveKey(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := repoOf[res.Partition.ID]; !ok {
			repoOf[res.Partition.ID] = name
		}
	}
	idle, working, stalled, unowned := m.Partitions[0].ID, m.Partitions[1].ID, m.Partitions[2].ID, m.Partitions[3].ID
	for _, id := range []string{idle, working, stalled} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, state, lease_ttl_ms, renew_interval_ms, expires_at)
			VALUES ($1, 1, 'n_a', '10.0.0.1:7443', 'SERVING', 8000, 1600, now() + interval '6 seconds')`, id); err != nil {
			t.Fatal(err)
		}
	}
	accept := func(partition string, ago time.Duration) {
		t.Helper()
		repo := repoOf[partition]
		if _, err := db.Pool.Exec(ctx, `INSERT INTO repositories (name) VALUES ($1) ON CONFLICT DO NOTHING`, repo); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO intents (repository, principal, ingress_datacenter, backend, staged_location, expires_at, possession, accepted_at)
			VALUES ($1, 'alice', 'eu-1', 'fs', 'staging/x', now() + interval '1 hour', 'uploaded', now() - make_interval(secs => $2))`, repo, ago.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	accept(working, time.Second)
	accept(stalled, 2*handlers.StallAfter)
	accept(stalled, time.Second)
	accept(unowned, 2*handlers.StallAfter)

	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{
		Authority: &handlers.Authority{NodeID: "n_a", Keeper: noKeeper{}, Maps: st, Reports: st},
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
	for id, want := range map[string]struct {
		activity string
		pending  int
	}{idle: {"idle", 0}, working: {"working", 1}, stalled: {"stalled", 2}, unowned: {"unowned", 1}} {
		p := got[id]
		if p.Activity != want.activity || p.PendingPublications != want.pending {
			t.Errorf("%s: activity %q with %d pending, want %q with %d", id, p.Activity, p.PendingPublications, want.activity, want.pending)
		}
		if (p.LiveAt != nil) != (want.activity != "unowned") {
			t.Errorf("%s: live_at %v: an owned partition states when its home was last alive", id, p.LiveAt)
		}
	}
	if p := got[stalled]; p.OldestPendingSeconds < handlers.StallAfter.Seconds() {
		t.Errorf("stalled partition's oldest wait %.0f s", p.OldestPendingSeconds)
	}
	metrics := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{"blobplane_stalled_partitions 1", "blobplane_pending_publications 4"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
