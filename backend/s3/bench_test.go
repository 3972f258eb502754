package s3_test

import (
	"testing"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/internal/minio"
)

// Run with: go test -run '^$' -bench . -benchtime 3x ./backend/s3/
// The raw pipeline writes into MinIO's own data directory, the same disk.

func openBench(tb testing.TB, policy backend.StorePolicy) backend.Backend {
	srv := minio.Shared(tb)
	return open(tb, bucket{srv: srv, name: srv.Bucket(tb)}, policy)
}

func BenchmarkWrite(b *testing.B) {
	backendtest.BenchWrite(b, openBench, minio.Shared(b).DataDir())
}

func BenchmarkRead(b *testing.B) {
	backendtest.BenchRead(b, openBench, minio.Shared(b).DataDir())
}
