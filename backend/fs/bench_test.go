package fs_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane"

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

// BenchmarkWriteNew4KiB measures writes of new 4 KiB objects (distinct
// contents, so every name is new; all below sha256/00, whose 256 leaf
// directories soon exist and are synced, as in a store that has run for
// a while) as Write makes them, its file linked while the file's fsync
// runs, beside the same writes made in sequence (file fsync, rename,
// directory fsync: SetSyncBeforeLink), on two roots of the same disk.
// Each iteration is one round of `clients` concurrent writes on each
// root, alternating which goes first. Reported: writes/s of each and
// their ratio (x-sequential > 1: faster than in sequence).
//
//	go test -run '^$' -bench WriteNew4KiB -benchtime 300x ./backend/fs/
func BenchmarkWriteNew4KiB(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			open := func(sequential bool) *fs.Backend {
				be, err := fs.OpenWith(b.TempDir(), fs.Options{Sync: backend.SyncFile})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = be.Close() })
				fs.SetSyncBeforeLink(be, sequential)
				return be
			}
			linked, sequential := open(false), open(true)
			round := func(be *fs.Backend) time.Duration { return writeRound(b, be, clients) }
			var linkedTime, sequentialTime time.Duration
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					linkedTime += round(linked)
					sequentialTime += round(sequential)
				} else {
					sequentialTime += round(sequential)
					linkedTime += round(linked)
				}
			}
			writes := float64(b.N * clients)
			b.ReportMetric(writes/linkedTime.Seconds(), "linked-writes/s")
			b.ReportMetric(writes/sequentialTime.Seconds(), "sequential-writes/s")
			b.ReportMetric(sequentialTime.Seconds()/linkedTime.Seconds(), "x-sequential")
		})
	}
}

// writeRound writes clients new 4 KiB objects below sha256/00 to be
// concurrently (timed; making them is not) and returns how long it took.
func writeRound(b *testing.B, be *fs.Backend, clients int) time.Duration {
	b.StopTimer()
	reqs := make([]backend.WriteRequest, clients)
	for i := range reqs {
		content := make([]byte, 4096)
		var sum [32]byte
		for sum = [32]byte{1}; sum[0] != 0; sum = sha256.Sum256(content) {
			_, _ = rand.Read(content)
		}
		reqs[i] = backend.WriteRequest{Digest: blobplane.Digest(fmt.Sprintf("sha256:%x", sum)), Size: 4096, Body: bytes.NewReader(content)}
	}
	b.StartTimer()
	start := time.Now()
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() { _, errs[i] = be.Write(b.Context(), reqs[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkWriteSyncModes measures new 4 KiB objects written as in
// BenchmarkWriteNew4KiB by a backend in backend.SyncFilesystem (one
// syncfs per group of concurrent writes) beside one in backend.SyncFile
// (each write fsyncs its file and directory), on two roots of the same
// disk, in alternating rounds. Reported: writes/s of each and their ratio
// (x-file > 1: the group sync is faster).
//
//	go test -run '^$' -bench WriteSyncModes -benchtime 300x ./backend/fs/
func BenchmarkWriteSyncModes(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			open := func(mode backend.SyncMode) *fs.Backend {
				be, err := fs.OpenWith(b.TempDir(), fs.Options{Sync: mode})
				if err != nil {
					b.Skip(err)
				}
				b.Cleanup(func() { _ = be.Close() })
				return be
			}
			group, file := open(backend.SyncFilesystem), open(backend.SyncFile)
			var groupTime, fileTime time.Duration
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					groupTime += writeRound(b, group, clients)
					fileTime += writeRound(b, file, clients)
				} else {
					fileTime += writeRound(b, file, clients)
					groupTime += writeRound(b, group, clients)
				}
			}
			writes := float64(b.N * clients)
			b.ReportMetric(writes/groupTime.Seconds(), "filesystem-writes/s")
			b.ReportMetric(writes/fileTime.Seconds(), "file-writes/s")
			b.ReportMetric(fileTime.Seconds()/groupTime.Seconds(), "x-file")
		})
	}
}
