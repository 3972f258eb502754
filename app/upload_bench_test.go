package app_test

// Issue 6 benchmarks, through real HTTP with Basic auth against one real
// api (startBenchAPI): 4 KiB uploads/s (POST+PUT) with 1 and 16 clients,
// one 256 MiB upload in GB/s beside the raw pipeline on the same disk in
// the same run, and HEAD ops/s. Figures and the machine they were taken on
// are in docs/performance.md.
//
//	go test ./app -run '^$' -bench 'Upload4KiB' -benchtime 200x   (and Upload4KiBQuota, Upload4KiBRate)
//	go test ./app -run '^$' -bench 'Upload256MiB' -benchtime 1x
//	go test ./app -run '^$' -bench 'Head16' -benchtime 2000x

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/blobplane/blobplane/quota"
)

// Each op is POST /v2/<repo>/blobs/uploads/ then PUT <location>?digest=
// with a distinct random 4 KiB body, published synchronously at the home.
func BenchmarkUpload4KiB(b *testing.B) {
	benchUpload4KiB(b, startBenchAPI(b))
}

// BenchmarkUpload4KiBQuota is BenchmarkUpload4KiB into a repository with
// a quota (issue 33), large enough never to refuse: each upload is
// admitted against it, reserved, and released by the home's next catch-up
// (the admission's cost per upload; BenchmarkUpload4KiB's repository has
// none, so its uploads reserve nothing).
func BenchmarkUpload4KiBQuota(b *testing.B) {
	s := startBenchAPI(b)
	if _, err := s.store.SetRepositoryQuota(context.Background(), s.Repo, quota.Limit{Bytes: 1 << 50}, "bench"); err != nil {
		b.Fatal(err)
	}
	benchUpload4KiB(b, s)
}

// BenchmarkUpload4KiBRate is BenchmarkUpload4KiBQuota with an upload
// rate too, high enough never to refuse: each publication's record also
// carries its time, and each admission measures the minute's window.
func BenchmarkUpload4KiBRate(b *testing.B) {
	s := startBenchAPI(b)
	if _, err := s.store.SetRepositoryQuota(context.Background(), s.Repo, quota.Limit{Bytes: 1 << 50, BlobsPerMinute: 1 << 40}, "bench"); err != nil {
		b.Fatal(err)
	}
	benchUpload4KiB(b, s)
}

func benchUpload4KiB(b *testing.B, s *benchAPI) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			blobs := randomBlobs(b.N, 4<<10)
			b.SetBytes(4 << 10)
			elapsed, lat := runClients(b, clients, b.N, func(i int) error {
				return s.upload(bytes.NewReader(blobs[i].content), int64(len(blobs[i].content)), blobs[i].digest)
			})
			reportLatency(b, "uploads/s", elapsed, lat)
		})
	}
}

// Each op is one 256 MiB upload (POST, then PUT with a streaming body),
// timed beside the raw pipeline over the same bytes into a directory on
// the same disk as the backend: sha256 while writing a new file, fsync,
// rename to its digest, fsync the directory. x-raw is blobplane GB/s ÷
// raw GB/s (1.0: as fast as the raw pipeline).
func BenchmarkUpload256MiB(b *testing.B) {
	const size = 256 << 20
	s := startBenchAPI(b)
	rawDir := filepath.Join(s.Dir, "raw")
	if err := os.Mkdir(rawDir, 0o755); err != nil {
		b.Fatal(err)
	}
	block := make([]byte, 4<<20)
	rand.Read(block)
	b.SetBytes(size)
	var upTime, rawTime time.Duration
	raw := func(op int, want string) {
		elapsed, d, err := rawPipeline(rawDir, newPatternReader(block, size, op))
		if err != nil {
			b.Fatal(err)
		}
		if d != want {
			b.Fatalf("raw pipeline hashed %s, want %s", d, want)
		}
		rawTime += elapsed
	}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		h := sha256.New()
		if _, err := io.Copy(h, newPatternReader(block, size, i)); err != nil {
			b.Fatal(err)
		}
		d := "sha256:" + hex.EncodeToString(h.Sum(nil))
		// Alternate which goes first, so neither always pays for the
		// other's writeback.
		if i%2 == 0 {
			raw(i, d)
		}
		b.StartTimer()
		start := time.Now()
		if err := s.upload(newPatternReader(block, size, i), size, d); err != nil {
			b.Fatal(err)
		}
		upTime += time.Since(start)
		b.StopTimer()
		if i%2 == 1 {
			raw(i, d)
		}
		b.StartTimer()
	}
	b.StopTimer()
	gb := float64(b.N) * size / 1e9
	b.ReportMetric(gb/upTime.Seconds(), "blobplane-GB/s")
	b.ReportMetric(gb/rawTime.Seconds(), "raw-GB/s")
	b.ReportMetric(rawTime.Seconds()/upTime.Seconds(), "x-raw")
}

// HEAD /v2/<repo>/blobs/<digest> with 16 clients over 64 published 4 KiB
// blobs (the answer comes from Postgres alone).
func BenchmarkHead16(b *testing.B) {
	s := startBenchAPI(b)
	blobs := randomBlobs(64, 4<<10)
	for _, bl := range blobs {
		if err := s.upload(bytes.NewReader(bl.content), int64(len(bl.content)), bl.digest); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("clients=16", func(b *testing.B) {
		elapsed, lat := runClients(b, 16, b.N, func(i int) error {
			bl := blobs[i%len(blobs)]
			h, err := s.do(http.MethodHead, s.api.URL()+"/v2/"+s.Repo+"/blobs/"+bl.digest, nil, 0, http.StatusOK)
			if err == nil && h.Get("Content-Length") != strconv.Itoa(len(bl.content)) {
				err = fmt.Errorf("HEAD %s: Content-Length %q", bl.digest, h.Get("Content-Length"))
			}
			return err
		})
		reportLatency(b, "ops/s", elapsed, lat)
	})
}

// rawPipeline is the floor an upload is measured against: sha256 of r
// while writing it to a new file in dir, fsync, rename to the digest,
// fsync dir. The file is removed afterwards (untimed).
func rawPipeline(dir string, r io.Reader) (time.Duration, string, error) {
	start := time.Now()
	f, err := os.CreateTemp(dir, "raw-*.tmp")
	if err != nil {
		return 0, "", err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	if _, err := io.CopyBuffer(io.MultiWriter(h, f), r, make([]byte, 256<<10)); err != nil {
		f.Close()
		return 0, "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, "", err
	}
	if err := f.Close(); err != nil {
		return 0, "", err
	}
	final := filepath.Join(dir, sum)
	if err := os.Rename(f.Name(), final); err != nil {
		return 0, "", err
	}
	defer os.Remove(final)
	dh, err := os.Open(dir)
	if err != nil {
		return 0, "", err
	}
	err = dh.Sync()
	dh.Close()
	if err != nil {
		return 0, "", err
	}
	return time.Since(start), "sha256:" + sum, nil
}

// patternReader streams size bytes without holding them: block repeated,
// each repetition stamped with its index and the op, so every op's
// content (and digest) is distinct and no two blocks are equal.
type patternReader struct {
	base, cur []byte
	op        uint64
	left      int64
	blockN    uint64
	pos       int
}

func newPatternReader(block []byte, size int64, op int) *patternReader {
	p := &patternReader{base: block, cur: make([]byte, len(block)), op: uint64(op), left: size}
	p.fill()
	return p
}

func (p *patternReader) fill() {
	copy(p.cur, p.base)
	binary.LittleEndian.PutUint64(p.cur[0:], p.blockN)
	binary.LittleEndian.PutUint64(p.cur[8:], p.op)
	p.pos = 0
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	if p.pos == len(p.cur) {
		p.blockN++
		p.fill()
	}
	n := copy(b, p.cur[p.pos:])
	n = int(min(int64(n), p.left))
	p.pos += n
	p.left -= int64(n)
	return n, nil
}
