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
	resp, err := http.Get(srv.Endpoint + "/minio/health/live")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("live: %s", resp.Status)
	}
	if a, b := srv.Bucket(t), srv.Bucket(t); a == b {
		t.Fatalf("two tests got bucket %s", a)
	}
}
