package client

import (
	"context"
	"crypto/ed25519"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
)

type noKeys struct{ calls int }

func (n *noKeys) LatestMap(context.Context) (*authority.Map, error) {
	n.calls++
	return nil, blobplane.Errorf(blobplane.CodeNotFound, "no map")
}

func (n *noKeys) SigningKeys(context.Context) ([]authority.TrustedKey, error) {
	n.calls++
	return nil, nil
}

// With a MapSource and nothing published yet, a call fails as unavailable
// without sending anything, and the next call asks the source again (no
// empty keyring is cached).
func TestMapSourceWithoutKeysIsUnavailable(t *testing.T) {
	t.Parallel()
	src := &noKeys{}
	c := New(Config{Maps: src})
	for range 2 {
		_, err := c.Do(context.Background(), "team/app", func(context.Context, string) (*http.Request, error) {
			t.Fatal("sent a request without a verified map")
			return nil, nil
		})
		if blobplane.ErrorCode(err) != blobplane.CodeUnavailable {
			t.Fatalf("Do before any key: %v, want unavailable", err)
		}
	}
	if src.calls != 2 {
		t.Fatalf("asked the source %d times, want once per call", src.calls)
	}
}

// blockingKeys is a MapSource with one signed map whose first
// SigningKeys call announces itself on entered and waits for release.
type blockingKeys struct {
	key     authority.TrustedKey
	m       *authority.Map
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func newBlockingKeys(t *testing.T) *blockingKeys {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	m, err := authority.EvenSplit{
		Version: 1, GeneratedAt: now, Partitions: 1, State: authority.PrimaryServing, Epoch: 1, Class: "standard", Mode: authority.ModeDerived,
		Nodes: []authority.NodeAddr{{Node: "node-a", Endpoint: "127.0.0.1:1"}},
	}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := (authority.Signer{KeyID: "k1", Key: priv}).SignMap(m); err != nil {
		t.Fatal(err)
	}
	return &blockingKeys{
		key: authority.TrustedKey{KeyID: "k1", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)},
		m:   m, entered: make(chan struct{}, 2), release: make(chan struct{}),
	}
}

func (b *blockingKeys) LatestMap(context.Context) (*authority.Map, error) { return b.m, nil }

func (b *blockingKeys) SigningKeys(ctx context.Context) ([]authority.TrustedKey, error) {
	b.calls.Add(1)
	b.entered <- struct{}{}
	<-b.release
	return []authority.TrustedKey{b.key}, nil
}

// Two first calls at once fetch the signing keys once and share one
// verified map: the second waits for the first's fetch instead of making
// its own (the worker's concurrent finalize jobs once raced on this).
// Held deterministically: the first is inside SigningKeys when the
// second is about to wait, and only then is the first released.
func TestConcurrentFirstCallsFetchTheKeysOnce(t *testing.T) {
	t.Parallel()
	src := newBlockingKeys(t)
	c := New(Config{Maps: src})
	var hooked atomic.Int32
	waiting := make(chan struct{}, 1)
	c.beforeKeys = func() {
		if hooked.Add(1) > 1 { // not the first call's
			waiting <- struct{}{}
		}
	}
	errs := make(chan error, 2)
	go func() { errs <- c.Refresh(context.Background()) }()
	<-src.entered // the first call is fetching the keys
	go func() { errs <- c.Refresh(context.Background()) }()
	<-waiting // the second found no core and is about to wait
	close(src.release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := src.calls.Load(); n != 1 {
		t.Fatalf("the signing keys were fetched %d times, want once", n)
	}
	if v := c.MapVersion(); v != 1 {
		t.Fatalf("map version %d, want 1", v)
	}
	if r := c.Rejected(); r != 0 {
		t.Fatalf("%d maps rejected", r)
	}
}
