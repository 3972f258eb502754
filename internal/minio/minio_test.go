package minio_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/blobplane/blobplane/internal/minio"
)

func TestMain(m *testing.M) { os.Exit(minio.Main(m)) }

func TestSharedServerIsLive(t *testing.T) {
	srv := minio.Shared(t)
	// Ready, not only live: the object layer answers (S3 calls made now
	// do not fail with XMinioServerNotInitialized).
	for _, probe := range []string{"live", "cluster"} {
		resp, err := http.Get(srv.Endpoint + "/minio/health/" + probe)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", probe, resp.Status)
		}
	}
	if a, b := srv.Bucket(t), srv.Bucket(t); a == b {
		t.Fatalf("two tests got bucket %s", a)
	}
}
