package client

import (
	"context"
	"crypto/ed25519"
	"net"
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

// movingMaps is a MapSource whose latest map can be replaced.
type movingMaps struct {
	key    authority.TrustedKey
	latest atomic.Pointer[authority.Map]
	reads  atomic.Int32
}

func (m *movingMaps) LatestMap(context.Context) (*authority.Map, error) {
	m.reads.Add(1)
	return m.latest.Load(), nil
}

func (m *movingMaps) SigningKeys(context.Context) ([]authority.TrustedKey, error) {
	return []authority.TrustedKey{m.key}, nil
}

// A home that does not answer makes the client read the map again before
// it gives up: when the controller moved the partition off the dead node
// (issue 30), the same call reaches the new home; when nothing moved, the
// call fails as unavailable after one refresh.
func TestUnreachableHomeRoutesByTheNewerMap(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	signer := authority.Signer{KeyID: "k1", Key: priv}
	build := func(version uint64, endpoint string) *authority.Map {
		m, err := authority.EvenSplit{
			Version: version, GeneratedAt: now, Partitions: 1, State: authority.PrimaryServing, Epoch: version, Class: "standard", Mode: authority.ModeDerived,
			Nodes: []authority.NodeAddr{{Node: "node-" + endpoint, Endpoint: endpoint}},
		}.Build()
		if err != nil {
			t.Fatal(err)
		}
		if err := signer.SignMap(m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	dead := "127.0.0.1:1" // nothing listens on port 1
	src := &movingMaps{key: authority.TrustedKey{KeyID: "k1", Alg: authority.SignatureAlg, PublicKey: pub, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}}
	src.latest.Store(build(1, dead))
	c := New(Config{Maps: src})
	var sentTo []string
	do := func() error {
		resp, err := c.Do(context.Background(), "team/app", func(ctx context.Context, base string) (*http.Request, error) {
			sentTo = append(sentTo, base)
			return http.NewRequestWithContext(ctx, http.MethodGet, base+"/v2/", nil)
		})
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := do(); blobplane.ErrorCode(err) != blobplane.CodeUnavailable || len(sentTo) != 1 || src.reads.Load() != 2 {
		t.Fatalf("nothing moved: %v, sent to %v, %d map reads (want unavailable, once, one refresh)", err, sentTo, src.reads.Load())
	}

	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	src.latest.Store(build(2, ln.Addr().String()))
	c.lastUnreachable.Store(0) // past the refresh interval
	sentTo = nil
	if err := do(); err != nil {
		t.Fatalf("after the move: %v (sent to %v)", err, sentTo)
	}
	if len(sentTo) != 2 || sentTo[1] != "http://"+ln.Addr().String() || c.MapVersion() != 2 {
		t.Fatalf("sent to %v, map v%d: want the dead home, then the new one by map 2", sentTo, c.MapVersion())
	}
}
