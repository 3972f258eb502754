package backendtest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
)

// Opener opens a backend over fresh storage for a benchmark.
type Opener func(tb testing.TB, policy backend.StorePolicy) backend.Backend

// BenchSizes are the blob sizes every backend is benchmarked with.
var BenchSizes = []int{1 << 20, 256 << 20}

var benchBlobs sync.Map // size → Blob

func benchBlob(size int) Blob {
	if b, ok := benchBlobs.Load(size); ok {
		return b.(Blob)
	}
	b := NewBlob(uint64(size), size)
	benchBlobs.Store(size, b)
	return b
}

func sizeName(n int) string { return fmt.Sprintf("%dMiB", n>>20) }

// rawWrite is the floor a write is measured against: sha256 of the same
// bytes while writing them to a new file on the same disk, then fsync.
func rawWrite(tb testing.TB, dir string, content []byte) time.Duration {
	start := time.Now()
	f, err := os.CreateTemp(dir, "raw-")
	if err != nil {
		tb.Fatal(err)
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(io.MultiWriter(h, f), bytes.NewReader(content), buf); err != nil {
		tb.Fatal(err)
	}
	h.Sum(nil)
	if err := f.Sync(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	elapsed := time.Since(start)
	_ = os.Remove(f.Name())
	return elapsed
}

// report prints backend and raw throughput side by side and their ratio
// (backend MB/s ÷ raw MB/s: 1.0 means as fast as the raw pipeline).
func report(b *testing.B, size int, backendTime, rawTime time.Duration) {
	n := float64(b.N) * float64(size) / 1e6
	b.ReportMetric(n/backendTime.Seconds(), "backend-MB/s")
	b.ReportMetric(n/rawTime.Seconds(), "raw-MB/s")
	b.ReportMetric(rawTime.Seconds()/backendTime.Seconds(), "x-raw")
}

// BenchWrite measures Write for each BenchSizes size, identity stored as
// identity and identity compressed into a zstd store, each beside the raw
// pipeline (sha256 + write + fsync of the same bytes to rawDir, on the
// same disk as the backend) run in the same benchmark.
func BenchWrite(b *testing.B, open Opener, rawDir string) {
	for _, size := range BenchSizes {
		blob := benchBlob(size)
		for _, mode := range []struct {
			name   string
			policy backend.StorePolicy
			req    func() backend.WriteRequest
		}{
			{"identity", backend.StoreAsSubmitted, blob.Identity},
			{"zstd-payload", backend.StoreAsSubmitted, blob.ZstdRequest},
			{"compress-to-zstd", backend.StoreZstd, blob.Identity},
		} {
			b.Run(sizeName(size)+"/"+mode.name, func(b *testing.B) {
				be := open(b, mode.policy)
				b.SetBytes(int64(size))
				var backendTime, rawTime time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					// Alternate which goes first, so neither always pays
					// for the other's writeback.
					if i%2 == 0 {
						b.StopTimer()
						rawTime += rawWrite(b, rawDir, blob.Content)
						b.StartTimer()
					}
					req := mode.req()
					start := time.Now()
					if _, err := be.Write(b.Context(), req); err != nil {
						b.Fatal(err)
					}
					backendTime += time.Since(start)
					if i%2 == 1 {
						b.StopTimer()
						rawTime += rawWrite(b, rawDir, blob.Content)
						b.StartTimer()
					}
				}
				report(b, size, backendTime, rawTime)
			})
		}
	}
}

// BenchRead measures whole-object decoded reads of identity and zstd
// objects beside a raw read of the same bytes from a plain file on the
// same disk, and content-range reads (the last MiB), where zstd objects
// take the decode-from-the-start slow path.
func BenchRead(b *testing.B, open Opener, rawDir string) {
	for _, size := range BenchSizes {
		blob := benchBlob(size)
		raw := filepath.Join(rawDir, fmt.Sprintf("raw-read-%d", size))
		if err := os.WriteFile(raw, blob.Content, 0o644); err != nil {
			b.Fatal(err)
		}
		defer os.Remove(raw)
		for _, mode := range []struct {
			name string
			req  func() backend.WriteRequest
		}{
			{"identity", blob.Identity},
			{"zstd", blob.ZstdRequest},
		} {
			be := open(b, backend.StoreAsSubmitted)
			if _, err := be.Write(b.Context(), mode.req()); err != nil {
				b.Fatal(err)
			}
			read := func(b *testing.B, rg *backend.Range, want int64) {
				obj, err := be.Read(b.Context(), blob.Digest, backend.ReadOptions{Range: rg})
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, obj.Body)
				obj.Body.Close()
				if err != nil || n != want {
					b.Fatalf("read %d bytes, %v", n, err)
				}
			}
			b.Run(sizeName(size)+"/whole/"+mode.name, func(b *testing.B) {
				b.SetBytes(int64(size))
				var backendTime, rawTime time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					start := time.Now()
					f, err := os.Open(raw)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, f)
					f.Close()
					rawTime += time.Since(start)
					b.StartTimer()
					start = time.Now()
					read(b, nil, int64(size))
					backendTime += time.Since(start)
				}
				report(b, size, backendTime, rawTime)
			})
			b.Run(sizeName(size)+"/last-MiB/"+mode.name, func(b *testing.B) {
				rg := &backend.Range{Offset: int64(size) - 1<<20, Length: 1 << 20}
				b.SetBytes(rg.Length)
				for i := 0; i < b.N; i++ {
					read(b, rg, rg.Length)
				}
			})
		}
	}
}
