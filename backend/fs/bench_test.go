package fs_test

import (
	"testing"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// Run with: go test -run '^$' -bench . -benchtime 3x ./backend/fs/
// The raw pipeline writes into the same temp directory tree as the backend.

func openBench(dir string) backendtest.Opener {
	return func(tb testing.TB, policy backend.StorePolicy) backend.Backend {
		b, err := fs.Open(tb.TempDir(), policy)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = b.Close() })
		return b
	}
}

func BenchmarkWrite(b *testing.B) {
	dir := b.TempDir()
	backendtest.BenchWrite(b, openBench(dir), dir)
}

func BenchmarkRead(b *testing.B) {
	dir := b.TempDir()
	backendtest.BenchRead(b, openBench(dir), dir)
}
