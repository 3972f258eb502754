package read

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
)

// The cost of verifying whole reads (issue 29), beside a raw sha256 of
// the same stored file, in one process: a 256 MiB blob read from a
// filesystem backend and written into a loopback TCP connection that
// another goroutine drains (what an HTTP answer does), unverified
// (BLOBPLANE_READ_UNVERIFIED_BACKENDS), verified with the hash in line,
// and verified with each chunk hashed while it is written out (as built,
// for blobs from overlapMin up).
//
//	go test ./read -run '^$' -bench VerifiedRead -benchtime 5x
func BenchmarkVerifiedRead(b *testing.B) {
	const size = 256 << 20
	dir := b.TempDir()
	be, err := fs.Open(dir, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	content := make([]byte, size)
	rand.Read(content)
	d := digestOf(content)
	if _, err := be.Write(b.Context(), backend.WriteRequest{Digest: d, Size: size, Body: bytes.NewReader(content)}); err != nil {
		b.Fatal(err)
	}
	content = nil
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	drained := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, err = io.Copy(io.Discard, c)
			c.Close()
			drained <- err
		}
	}()
	send := func(b *testing.B, hashed bool, overlap int64) {
		overlapMin = overlap
		defer func() { overlapMin = 1 << 20 }()
		b.SetBytes(size)
		buf := make([]byte, 256<<10)
		for b.Loop() {
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			obj, err := be.Read(b.Context(), d, backend.ReadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			v := newVerifier(obj.Body, d, size, hashed, func() { b.Error("corrupt") })
			if _, err := io.CopyBuffer(struct{ io.Writer }{conn}, v, buf); err != nil {
				b.Fatal(err)
			}
			v.Close()
			conn.Close()
			if err := <-drained; err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("raw-sha256", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			f, err := os.Open(filepath.Join(dir, fs.ObjectPath(d)))
			if err != nil {
				b.Fatal(err)
			}
			h := sha256.New()
			if _, err := io.CopyBuffer(h, f, make([]byte, 256<<10)); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("unverified", func(b *testing.B) { send(b, false, 1<<20) })
	b.Run("verified-inline", func(b *testing.B) { send(b, true, size+1) })
	b.Run("verified-overlapped", func(b *testing.B) { send(b, true, 1<<20) })
}
