package replication_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/replication"
)

// Replication throughput beside a raw copy of the same bytes between the
// two backend roots (issue 28): run both in one process and compare.
//
//	go test -run XXX -bench 'Copy|Scrub' -benchtime 5x ./replication
//
// raw: read the object's file, sha256 it, write it to a file under the
// other root, fsync: the least any verified copy costs. transfer:
// replication.Transfer.Run, the whole copy: the ledger's stage and
// verification (two transactions), the backend read, the target
// backend's verifying write (temp file, hash, fsync, rename, directory
// sync). Each iteration copies a blob the target does not hold (the
// previous copy is deleted and its row failed outside the timer).

type benchEnv struct {
	srcDir, dstDir string
	src, dst       *fs.Backend
	transfer       *replication.Transfer
	scrub          *replication.Scrub
	blobs          []benchBlob
}

type benchBlob struct {
	d    blobplane.Digest
	size int64
}

func setupBench(b *testing.B, n int, size int64) *benchEnv {
	b.Helper()
	ctx := context.Background()
	st := pgtest.NewStore(b)
	e := &benchEnv{srcDir: b.TempDir(), dstDir: b.TempDir()}
	var err error
	if e.src, err = fs.Open(e.srcDir, ""); err != nil {
		b.Fatal(err)
	}
	if e.dst, err = fs.Open(e.dstDir, ""); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.src.Close(); e.dst.Close() })
	for range n {
		content := make([]byte, size)
		if _, err := rand.Read(content); err != nil {
			b.Fatal(err)
		}
		sum := sha256.Sum256(content)
		d := blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
		if _, err := e.src.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: bytes.NewReader(content)}); err != nil {
			b.Fatal(err)
		}
		k := placement.Key{Digest: d, Backend: "fs", Datacenter: "eu-1", Location: placement.ObjectLocation(d)}
		if _, err := st.StagePlacement(ctx, k, size, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := st.VerifyPlacement(ctx, k, d, size, 0); err != nil {
			b.Fatal(err)
		}
		e.blobs = append(e.blobs, benchBlob{d: d, size: size})
	}
	logger := slog.New(slog.DiscardHandler)
	e.transfer = &replication.Transfer{Ledger: st, Datacenter: "us-1", BackendName: "fs", Backend: e.dst,
		Remote: &switchSource{be: e.src}, Logger: logger}
	// Every pass re-reads everything (a period shorter than a pass), as
	// fast as it can (a budget of a nanosecond: no pacing).
	e.scrub = &replication.Scrub{Ledger: st, Datacenter: "eu-1", Backends: map[string]backend.Backend{"fs": e.src},
		Repair: &repairs{}, Period: time.Nanosecond, Budget: time.Nanosecond, Logger: logger}
	return e
}

// reset makes the target lose blob i: its object deleted, its row failed.
func (e *benchEnv) reset(b *testing.B, i int) {
	ctx := context.Background()
	bl := e.blobs[i]
	if err := e.dst.Delete(ctx, bl.d); err != nil {
		b.Fatal(err)
	}
	k := e.transfer.Key(bl.d)
	p, err := e.transfer.Ledger.Placements(ctx, bl.d)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range p {
		if q.Key == k && q.State == placement.Verified {
			if _, err := e.transfer.Ledger.FailPlacement(ctx, k, placement.SourceUnavailable, q.Epoch+1); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func (e *benchEnv) rawCopy(b *testing.B, i int) {
	bl := e.blobs[i]
	in, err := os.Open(filepath.Join(e.srcDir, fs.ObjectPath(bl.d)))
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(filepath.Join(e.dstDir, "raw-copy"))
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(h, out), in); err != nil {
		b.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		b.Fatal(err)
	}
	_ = h.Sum(nil)
}

func benchCopy(b *testing.B, n int, size int64) {
	e := setupBench(b, n, size)
	b.Run("raw", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; b.Loop(); i++ {
			e.rawCopy(b, i%n)
		}
	})
	b.Run("transfer", func(b *testing.B) {
		b.SetBytes(size)
		ctx := context.Background()
		i := 0
		for b.Loop() {
			b.StopTimer()
			bl := e.blobs[i%n]
			if i >= n {
				e.reset(b, i%n)
			}
			b.StartTimer()
			if _, err := e.transfer.Run(ctx, replication.Request{Digest: bl.d, Size: bl.size, TakeOver: true}); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

func BenchmarkCopy256MiB(b *testing.B) { benchCopy(b, 2, 256<<20) }
func BenchmarkCopy4KiB(b *testing.B)   { benchCopy(b, 200, 4<<10) }

// Scrub throughput beside a raw sha256 of the same files.
func BenchmarkScrub256MiB(b *testing.B) {
	const size = 256 << 20
	e := setupBench(b, 1, size)
	b.Run("raw-sha256", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			f, err := os.Open(filepath.Join(e.srcDir, fs.ObjectPath(e.blobs[0].d)))
			if err != nil {
				b.Fatal(err)
			}
			h := sha256.New()
			if _, err := io.Copy(h, f); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("scrub", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if rep, err := e.scrub.Run(context.Background()); err != nil || rep.Intact != 1 {
				b.Fatalf("%+v, %v", rep, err)
			}
		}
	})
}
