package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
)

// Blob content is generated, never read from disk and never held whole: a
// random block chosen once per run, repeated, with each repetition stamped
// with its index and a seed. Two seeds give two different blobs (and
// digests); the same seed gives the same bytes to every system, so every
// system stores the same data.

// patternReader streams size bytes of the blob named by seed.
type patternReader struct {
	base, cur []byte
	seed      uint64
	left      int64
	blockN    uint64
	pos       int
}

func newPatternReader(block []byte, size int64, seed uint64) *patternReader {
	p := &patternReader{base: block, cur: make([]byte, len(block)), seed: seed, left: size}
	p.fill()
	return p
}

func (p *patternReader) fill() {
	copy(p.cur, p.base)
	stamp(p.cur, p.blockN, p.seed)
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

// stamp writes the block index and the seed over the first 16 bytes (or as
// many as there are).
func stamp(b []byte, blockN, seed uint64) {
	var s [16]byte
	binary.LittleEndian.PutUint64(s[0:], blockN)
	binary.LittleEndian.PutUint64(s[8:], seed)
	copy(b, s[:])
}

// patternDigest hashes the blob named by seed by streaming it.
func patternDigest(block []byte, size int64, seed uint64) string {
	h := sha256.New()
	_, _ = io.CopyBuffer(h, newPatternReader(block, size, seed), make([]byte, 256<<10))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// smallBlob returns the whole blob named by seed (size at most one block)
// and its digest.
func smallBlob(block []byte, size int, seed uint64) ([]byte, string) {
	b := make([]byte, size)
	copy(b, block)
	stamp(b, 0, seed)
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:])
}

// Seeds are unique per workload, repetition and op, so no upload is ever a
// duplicate of an earlier one (which a content-addressed store could
// answer without writing).
func seedOf(workload, rep, op int) uint64 {
	return uint64(workload)<<56 | uint64(rep)<<40 | uint64(op)
}

// Workload tags in seeds.
const (
	seedBig = iota + 1
	seedPut1
	seedPut16
	seedPreload
	seedOne1
	seedOne16
	seedRepWarm
	seedRepLarge
	seedRepSmall
	seedRepSource
)
