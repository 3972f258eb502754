package app_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/stream"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
)

// recorder notes every request go-containerregistry sends, so the test can
// prove which protocol path it took.
type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.seen = append(r.seen, req.Method+" "+req.URL.Path+"?"+req.URL.RawQuery+" -> "+resp.Status)
		r.mu.Unlock()
	}
	return resp, err
}

func (r *recorder) has(method, query, status string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.seen {
		if strings.HasPrefix(s, method+" ") && strings.Contains(s, query) && strings.HasSuffix(s, status) {
			return true
		}
	}
	return false
}

// go-containerregistry — the library crane is built on, used unchanged —
// pushes a streamed layer through the chunked protocol (POST, PATCH without
// a size, PUT ?digest=), mounts it into a second repository through
// POST ?mount=&from= (no bytes re-sent), and fetches both back, with HTTP
// Basic auth. (The crane and oras command lines only expose monolithic blob
// pushes without manifests; their test is in oci_clients_test.go.)
func TestGoContainerRegistryChunkedPushAndMount(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx := context.Background()
	// Both repositories share one home so the mount publishes synchronously.
	src, dst := c.repos[0], c.repos[0]+"-copy"
	for n := 1; ; n++ {
		if home, _ := c.homeOf(t, dst); home == 0 {
			break
		}
		dst = c.repos[0] + "-copy" + strings.Repeat("x", n)
	}
	for _, r := range []string{src, dst} {
		if err := c.st.CreateRepository(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	gs, _ := auth.ParseGrants([]string{"*:write"})
	tok, _, err := c.st.CreateToken(ctx, "ggcr", gs)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	opts := []remote.Option{remote.WithAuth(&authn.Basic{Username: "ggcr", Password: tok}), remote.WithTransport(rec), remote.WithContext(ctx)}
	host := strings.TrimPrefix(c.nodes[0].URL(), "http://")

	content := make([]byte, 2<<20+5)
	rand.Read(content)
	layer := stream.NewLayer(io.NopCloser(bytes.NewReader(content)))
	srcRepo, err := name.NewRepository(host+"/"+src, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(srcRepo, layer, opts...); err != nil {
		t.Fatalf("chunked push: %v", err)
	}
	d, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if !rec.has("PATCH", "", "202 Accepted") || !rec.has("PUT", "digest="+url.QueryEscape(d.String()), "201 Created") {
		t.Fatalf("not the chunked path: %v", rec.seen)
	}

	// Mount into dst from a layer read from src.
	fromSrc, err := remote.Layer(srcRepo.Digest(d.String()), opts...)
	if err != nil {
		t.Fatal(err)
	}
	dstRepo, _ := name.NewRepository(host+"/"+dst, name.Insecure)
	rec.mu.Lock()
	rec.seen = nil
	rec.mu.Unlock()
	if err := remote.WriteLayer(dstRepo, fromSrc, opts...); err != nil {
		t.Fatalf("mount: %v", err)
	}
	if !rec.has("POST", "mount="+url.QueryEscape(d.String()), "201 Created") || rec.has("PATCH", "", "") {
		t.Fatalf("not a mount: %v", rec.seen)
	}

	// Fetch back from both repositories: the compressed bytes ggcr pushed.
	for _, repo := range []name.Repository{srcRepo, dstRepo} {
		l, err := remote.Layer(repo.Digest(d.String()), opts...)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("fetch %s: %v", repo, err)
		}
		// ggcr verifies the digest while reading; the size must match too.
		size, _ := layer.Size()
		if int64(len(got)) != size {
			t.Fatalf("fetch %s: %d bytes, pushed %d", repo, len(got), size)
		}
	}
}

// homeOf is the index of the node the published map makes repo's home.
func (c *cluster) homeOf(t *testing.T, repo string) (int, string) {
	t.Helper()
	ix, err := authority.NewIndex(c.m)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ix.ResolveKey(repo)
	if err != nil {
		t.Fatal(err)
	}
	if r.Partition.Primary.Node == "node-1" {
		return 1, r.Partition.ID
	}
	return 0, r.Partition.ID
}
