package controller_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

func setup(t testing.TB) (*store.Store, controller.KeyFile) {
	t.Helper()
	s := pgtest.NewStore(t)
	path := filepath.Join(t.TempDir(), "controller", "signing-key.json")
	k, err := controller.Keygen(context.Background(), s, path, "", time.Now().Add(-time.Minute), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return s, k
}

func register(t testing.TB, s *store.Store, id, endpoint string) {
	t.Helper()
	if _, err := s.RegisterNode(context.Background(), store.Node{ID: id, Datacenter: "eu-1", Role: "api", Endpoint: endpoint}); err != nil {
		t.Fatal(err)
	}
}

func TestKeygenWritesPrivateFileAndPublishesPublicKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	path := filepath.Join(t.TempDir(), "keys", "k.json")
	k, err := controller.Keygen(ctx, s, path, "map-test-1", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v, want mode 0600", fi, err)
	}
	loaded, err := controller.LoadKey("", path)
	if err != nil || loaded.KeyID != "map-test-1" || !loaded.PrivateKey.Equal(k.PrivateKey) {
		t.Fatalf("reloaded %+v %v", loaded.KeyID, err)
	}
	data, _ := os.ReadFile(path)
	if inline, err := controller.LoadKey(string(data), "/nonexistent"); err != nil || inline.KeyID != k.KeyID {
		t.Fatalf("inline key: %v", err)
	}
	keys, err := s.SigningKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].KeyID != "map-test-1" || !keys[0].PublicKey.Equal(k.Trusted().PublicKey) {
		t.Fatalf("published %+v %v", keys, err)
	}
	// Never overwrite a key.
	if _, err := controller.Keygen(ctx, s, path, "map-test-2", time.Now(), time.Hour); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
		t.Fatalf("second keygen to the same path: %v", err)
	}
	if _, err := controller.LoadKey("", filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("missing key: %v", err)
	}
}

func TestPublishRefusesWithoutNodes(t *testing.T) {
	t.Parallel()
	s, k := setup(t)
	register(t, s, "w-1", "") // workers and endpoint-less nodes do not count
	_, err := controller.Publish(context.Background(), s, k.Signer(), controller.PublishOptions{Partitions: 4})
	if !errors.Is(err, controller.ErrNoNodes) || !strings.Contains(blobplane.ErrorMessage(err), "api node") {
		t.Fatalf("publish without nodes: %v", err)
	}
	if _, err := s.LatestMap(context.Background()); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		t.Fatalf("a map was published: %v", err)
	}
}

func TestPublishFirstAndNextMaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, k := setup(t)
	register(t, s, "api-a", "http://127.0.0.1:8081")
	register(t, s, "api-b", "http://127.0.0.1:8082")

	m1, err := controller.Publish(ctx, s, k.Signer(), controller.PublishOptions{Partitions: 4, SlotBits: 8})
	if err != nil {
		t.Fatal(err)
	}
	if m1.Version != 1 || len(m1.Partitions) != 4 || m1.SlotBits != 8 {
		t.Fatalf("first map %+v", m1)
	}
	// Verifiable with the keys in Postgres alone (R8, R11).
	keys, err := s.SigningKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := authority.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	v := authority.NewVerifier(kr, nil)
	latest, err := s.LatestMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vm1, err := v.VerifyMap(latest, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	primaries := map[string]int{}
	for _, p := range m1.Partitions {
		primaries[p.Primary.Node]++
		if !strings.HasPrefix(p.Primary.Endpoint, "127.0.0.1:808") {
			t.Fatalf("endpoint %q", p.Primary.Endpoint)
		}
	}
	if primaries["api-a"] != 2 || primaries["api-b"] != 2 {
		t.Fatalf("round robin: %v", primaries)
	}

	// Nothing changed: no version is spent.
	if _, err := controller.Publish(ctx, s, k.Signer(), controller.PublishOptions{}); !errors.Is(err, controller.ErrNothingChanged) {
		t.Fatalf("unchanged publish: %v", err)
	}
	// Changing the count is a split or merge: refused.
	if _, err := controller.Publish(ctx, s, k.Signer(), controller.PublishOptions{Partitions: 8}); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid}) {
		t.Fatalf("count change: %v", err)
	}

	// api-b goes down and a lease was taken at epoch 3 on one partition:
	// the next map moves api-b's partitions to api-a, keeps ids and ranges,
	// and never shows an epoch below the lease store's (R13, R16).
	if err := s.MarkNodeDown(ctx, "api-b"); err != nil {
		t.Fatal(err)
	}
	pid := m1.Partitions[0].ID
	for range 3 {
		if _, err := s.ForceLease(ctx, pid, "api-a", "127.0.0.1:8081", "test", "epoch fixture"); err != nil {
			t.Fatal(err)
		}
	}
	m2, err := controller.Publish(ctx, s, k.Signer(), controller.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m2.Version != 2 || len(m2.Partitions) != 4 {
		t.Fatalf("second map %+v", m2)
	}
	for i, p := range m2.Partitions {
		if p.ID != m1.Partitions[i].ID || p.Slots[0] != m1.Partitions[i].Slots[0] || p.Primary.Node != "api-a" {
			t.Fatalf("partition %d: %+v (was %+v)", i, p, m1.Partitions[i])
		}
	}
	if m2.Partition(pid).Epoch != 3 {
		t.Fatalf("epoch %d, want the lease's 3", m2.Partition(pid).Epoch)
	}
	// A client at version 1 catches up with the stored, signed delta (R9).
	d, err := s.MapDelta(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	vm2, err := v.ApplyDelta(vm1, d, time.Now())
	if err != nil || !authority.SameContent(vm2.Map(), m2) {
		t.Fatalf("delta: %v", err)
	}

	var out bytes.Buffer
	if err := controller.Show(ctx, s, &out, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"map version 2", pid, "api-a", "127.0.0.1:8081", "STANDBYS", "LEASE EXPIRES", k.KeyID} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("show lacks %q:\n%s", want, out.String())
		}
	}
}

func TestShowBeforeAnyMap(t *testing.T) {
	t.Parallel()
	s := pgtest.NewStore(t)
	var out bytes.Buffer
	if err := controller.Show(context.Background(), s, &out, time.Now()); err != nil || !strings.Contains(out.String(), "no partition map") {
		t.Fatalf("%q %v", out.String(), err)
	}
}

func TestEndpoint(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://10.0.0.1:8080": "10.0.0.1:8080",
		"https://api.example":  "api.example:443",
		"10.0.0.2:7443":        "10.0.0.2:7443",
		"":                     "",
		"http://":              "",
	} {
		if got := controller.Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// ZBP-5 R103, R9: a client several versions behind is brought up to date
// by the one signed delta a MOVED answer carries: each publication stores
// a delta from every one of the last DeltaHistory versions.
func TestPublishStoresDeltasFromRecentVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, k := setup(t)
	register(t, s, "api-a", "http://127.0.0.1:8081")
	m1, err := controller.Publish(ctx, s, k.Signer(), controller.PublishOptions{Partitions: 2, SlotBits: 8})
	if err != nil {
		t.Fatal(err)
	}
	pid := m1.Partitions[0].ID
	latest := m1
	for range 3 { // each takeover raises an epoch: a new version
		if _, err := s.ForceLease(ctx, pid, "api-a", "127.0.0.1:8081", "test", "epoch fixture"); err != nil {
			t.Fatal(err)
		}
		if latest, err = controller.Publish(ctx, s, k.Signer(), controller.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if latest.Version != 4 {
		t.Fatalf("version %d, want 4", latest.Version)
	}
	keys, err := s.SigningKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := authority.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	v := authority.NewVerifier(kr, nil)
	for base := uint64(1); base < 4; base++ {
		old, err := s.MapVersion(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		vm, err := v.VerifyMap(old, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		d, err := s.MapDelta(ctx, base)
		if err != nil || d.Version != 4 {
			t.Fatalf("delta from %d: %+v, %v; want one to version 4", base, d, err)
		}
		got, err := v.ApplyDelta(vm, d, time.Now()) // the signature too (R11)
		if err != nil || !authority.SameContent(got.Map(), latest) {
			t.Fatalf("delta from %d does not produce version 4: %v", base, err)
		}
	}
}
