package client

import (
	"context"
	"net/http"
	"testing"

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
