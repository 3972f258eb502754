package store_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

var mapT0 = time.Date(2026, 8, 21, 9, 0, 0, 0, time.UTC)

type mapFixture struct {
	s      *store.Store
	signer authority.Signer
	key    authority.TrustedKey
}

// setupMaps returns a store with one published signing key.
func setupMaps(t *testing.T) mapFixture {
	t.Helper()
	s, _ := setupLeases(t)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key := authority.TrustedKey{KeyID: "map-test", Alg: authority.SignatureAlg, PublicKey: pub,
		NotBefore: mapT0.Add(-time.Hour), NotAfter: mapT0.Add(24 * 365 * time.Hour)}
	if err := s.PublishSigningKey(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	return mapFixture{s: s, signer: authority.Signer{KeyID: key.KeyID, Key: priv}, key: key}
}

// first builds and signs version 1.
func (f mapFixture) first(t *testing.T) *authority.Map {
	t.Helper()
	m, err := authority.EvenSplit{
		Version: 1, GeneratedAt: mapT0, SlotBits: 12, Partitions: 4,
		Nodes: []authority.NodeAddr{{Node: "n_a", Endpoint: "10.0.0.1:7443"}, {Node: "n_b", Endpoint: "10.0.0.2:7443"}},
		Class: "std", Mode: authority.ModeJournaled, State: authority.PrimaryServing, Epoch: 1,
	}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.signer.SignMap(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// next derives version prev+1 with one endpoint moved, signed, and the
// signed delta to it.
func (f mapFixture) next(t *testing.T, prev *authority.Map) (*authority.Map, *authority.Delta) {
	t.Helper()
	m := prev.Clone()
	m.Version++
	m.GeneratedAt = prev.GeneratedAt.Add(time.Minute)
	m.Partitions[0].Primary.Endpoint = "10.0.9.9:7443"
	m.Partitions[0].Epoch++
	if err := f.signer.SignMap(m); err != nil {
		t.Fatal(err)
	}
	d, err := authority.Diff(prev, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.signer.SignDelta(d); err != nil {
		t.Fatal(err)
	}
	return m, d
}

func TestMapPublishVersionsAndDeltas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupMaps(t)
	s := f.s
	if _, err := s.LatestMap(ctx); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("latest before any publication: %v", err)
	}

	m1 := f.first(t)
	if err := s.PublishMap(ctx, m1, nil); err != nil {
		t.Fatal(err)
	}
	m2, d12 := f.next(t, m1)
	if err := s.PublishMap(ctx, m2, d12); err != nil {
		t.Fatal(err)
	}
	m3, d23 := f.next(t, m2)
	if err := s.PublishMap(ctx, m3, d23); err != nil {
		t.Fatal(err)
	}

	// R6: a version at or below the latest is refused, and nothing changes.
	for _, v := range []uint64{3, 2, 1} {
		old := m3.Clone()
		old.Version = v
		if err := f.signer.SignMap(old); err != nil {
			t.Fatal(err)
		}
		err := s.PublishMap(ctx, old, nil)
		if !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) || !errors.Is(err, authority.ErrVersionOrder) {
			t.Fatalf("republish version %d: %v", v, err)
		}
	}
	// Unsigned documents never reach the table (R10).
	unsigned := m3.Clone()
	unsigned.Version, unsigned.Signature = 4, nil
	if err := s.PublishMap(ctx, unsigned, nil); !errors.Is(err, authority.ErrUnsigned) {
		t.Fatalf("unsigned: %v", err)
	}

	// The latest is version 3 and verifies with the published keys (R11).
	keys, err := s.SigningKeys(ctx)
	if err != nil || len(keys) != 1 || !keys[0].PublicKey.Equal(f.key.PublicKey) || !keys[0].NotBefore.Equal(f.key.NotBefore) {
		t.Fatalf("keys %+v %v", keys, err)
	}
	kr, err := authority.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	v := authority.NewVerifier(kr, nil)
	latest, err := s.LatestMap(ctx)
	if err != nil || latest.Version != 3 || !authority.SameContent(latest, m3) {
		t.Fatalf("latest %+v %v", latest, err)
	}
	vm3, err := v.VerifyMap(latest, mapT0)
	if err != nil {
		t.Fatal(err)
	}

	// R9: every version stays addressable, and a client at an old version
	// is answered with the signed delta from its base.
	for _, want := range []*authority.Map{m1, m2, m3} {
		got, err := s.MapVersion(ctx, want.Version)
		if err != nil || !authority.SameContent(got, want) || got.Signature.Value != want.Signature.Value {
			t.Fatalf("version %d: %+v %v", want.Version, got, err)
		}
	}
	if _, err := s.MapVersion(ctx, 9); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("unknown version: %v", err)
	}
	vm1, err := v.VerifyMap(m1, mapT0)
	if err != nil {
		t.Fatal(err)
	}
	cur := vm1
	for base := uint64(1); base < 3; base++ {
		d, err := s.MapDelta(ctx, base)
		if err != nil || d.BaseVersion != base || d.Version != base+1 {
			t.Fatalf("delta from %d: %+v %v", base, d, err)
		}
		if cur, err = v.ApplyDelta(cur, d, mapT0); err != nil {
			t.Fatalf("apply delta from %d: %v", base, err)
		}
	}
	if !authority.SameContent(cur.Map(), vm3.Map()) {
		t.Fatal("deltas from version 1 do not reach version 3")
	}
	if _, err := s.MapDelta(ctx, 3); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("delta from the latest: %v", err)
	}
}

// The table itself refuses a version that does not advance and any edit
// or removal of a published map or delta, whoever writes (R6, R9).
func TestMapTableRefusesRegressionAndEdits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupMaps(t)
	m1 := f.first(t)
	m2, d := f.next(t, m1)
	if err := f.s.PublishMap(ctx, m1, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.s.PublishMap(ctx, m2, d); err != nil {
		t.Fatal(err)
	}
	pool := f.s.Pool()
	for _, stmt := range []string{
		`INSERT INTO partition_maps (version, document, key_id, generated_at) VALUES (1, '{"map_version": 1}', 'map-test', now())`,
		`INSERT INTO partition_maps (version, document, key_id, generated_at)
		 SELECT 0 + 1, document, key_id, generated_at FROM partition_maps WHERE version = 1`,
	} {
		if _, err := pool.Exec(ctx, stmt); sqlstate(err) != "23505" {
			t.Errorf("%s: %v, want unique_violation", stmt, err)
		}
	}
	for _, stmt := range []string{
		`UPDATE partition_maps SET document = document WHERE version = 1`,
		`DELETE FROM partition_maps WHERE version = 2`,
		`UPDATE map_deltas SET document = document`,
		`DELETE FROM map_deltas`,
	} {
		if _, err := pool.Exec(ctx, stmt); sqlstate(err) != "23000" {
			t.Errorf("%s: %v, want integrity_constraint_violation", stmt, err)
		}
	}
	// A map signed by an unpublished key is refused (the FK).
	m3, _ := f.next(t, m2)
	m3.Signature.KeyID = "unknown"
	if err := f.s.PublishMap(ctx, m3, nil); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
		t.Fatalf("unknown key: %v", err)
	}
	// A duplicate key id is a conflict; a malformed key is invalid.
	if err := f.s.PublishSigningKey(ctx, f.key); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
		t.Fatalf("duplicate key: %v", err)
	}
	bad := f.key
	bad.KeyID, bad.PublicKey = "short", bad.PublicKey[:8]
	if err := f.s.PublishSigningKey(ctx, bad); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid}) {
		t.Fatalf("short key: %v", err)
	}
}

// PublishMap notifies MapChannel with each published version once its
// transaction commits, and a refused publication notifies nothing
// (notifications arrive in commit order: a barrier sent after the refusal
// is the next one heard).
func TestMapNotifications(t *testing.T) {
	t.Parallel()
	f := setupMaps(t)
	ctx := context.Background()
	conn, err := f.s.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+store.MapChannel); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(wctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}
	m1 := f.first(t)
	m2, d := f.next(t, m1)
	for _, c := range []struct {
		m *authority.Map
		d *authority.Delta
	}{{m1, nil}, {m2, d}} {
		if err := f.s.PublishMap(ctx, c.m, c.d); err != nil {
			t.Fatal(err)
		}
		if got, want := next(), fmt.Sprint(c.m.Version); got != want {
			t.Fatalf("notified %q, want %q", got, want)
		}
	}
	if err := f.s.PublishMap(ctx, m1, nil); err == nil {
		t.Fatal("republishing version 1 was accepted")
	}
	if _, err := f.s.Pool().Exec(ctx, "SELECT pg_notify($1, 'barrier')", store.MapChannel); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "barrier" {
		t.Fatalf("notified %q after a refused publication", got)
	}
}

// The cache listener calls MapPublished once it listens (a publication
// may have landed before), then on each publication.
func TestMapPublishedWakes(t *testing.T) {
	t.Parallel()
	f := setupMaps(t)
	calls := make(chan struct{}, 16)
	stop := f.s.StartCaches(context.Background(), store.CacheOptions{MapPublished: func() { calls <- struct{}{} }})
	t.Cleanup(stop)
	wait := func(what string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(30 * time.Second):
			t.Fatalf("no MapPublished call for %s", what)
		}
	}
	wait("the listener coming up")
	if err := f.s.PublishMap(context.Background(), f.first(t), nil); err != nil {
		t.Fatal(err)
	}
	wait("version 1")
}
