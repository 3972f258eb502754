package read

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// verifier is a whole read's body: it hashes what passes and hands over
// the bytes that complete the content only once the content proves the
// digest (S2: no complete wrong body). Other bytes, a short object (an
// end before size) or a long one (bytes past size) are corruption:
// onCorrupt runs and the read fails with ErrCorrupt. With hashing off
// (an unverified backend) the length is still checked.
//
// Any other read error passes through as it is, not as corruption: from
// a remote node, a stream that breaks off (io.ErrUnexpectedEOF) is the
// network's failure or the node's own abort (the node verifies its read
// and fails its copy itself); only bytes that arrived whole and wrong, or
// a response that ended cleanly short, are the copy's.
//
// Overlapped (a large blob): a chunk is hashed by a goroutine while the
// caller writes it out, both only reading it; the next Read, Close, and
// the chunk that completes the content wait for that hash first. The
// caller must not change a chunk it was handed before its next Read or
// Close (io.Copy does not), and must Close before reusing the buffer
// (handlers.stream does).
type verifier struct {
	body      io.ReadCloser
	h         hash.Hash // nil: length only
	want      blobplane.Digest
	size, n   int64
	onCorrupt func()
	err       error
	overlap   bool
	hashing   chan struct{} // closed when the chunk in hand is hashed; nil: none
}

// overlapMin is the smallest blob whose chunks are hashed while they are
// written out (measured: BenchmarkVerifiedRead).
var overlapMin int64 = 1 << 20

func newVerifier(body io.ReadCloser, d blobplane.Digest, size int64, hashed bool, onCorrupt func()) *verifier {
	v := &verifier{body: body, want: d, size: size, onCorrupt: onCorrupt, overlap: hashed && size >= overlapMin}
	if hashed {
		v.h = sha256.New()
	}
	return v
}

// wait returns once the chunk handed over last is hashed.
func (v *verifier) wait() {
	if v.hashing != nil {
		<-v.hashing
		v.hashing = nil
	}
}

func (v *verifier) Read(p []byte) (int, error) {
	v.wait()
	if v.err != nil {
		return 0, v.err
	}
	k, err := v.body.Read(p)
	if int64(k) > v.size-v.n {
		return 0, v.corrupt("more than its %d bytes", v.size)
	}
	v.n += int64(k)
	complete := v.n == v.size && k > 0 || v.size == 0 && v.n == 0 && err == io.EOF
	if v.h != nil {
		if v.overlap && !complete && k > 0 {
			done := make(chan struct{})
			go func(b []byte) { v.h.Write(b); close(done) }(p[:k])
			v.hashing = done
		} else {
			v.h.Write(p[:k])
		}
	}
	if complete {
		// The content is complete: it proves the digest, or its last
		// bytes are never handed over.
		if v.h != nil {
			if got := "sha256:" + hex.EncodeToString(v.h.Sum(nil)); got != string(v.want) {
				return 0, v.corrupt("it hashes to %s", got)
			}
		}
		return k, err
	}
	switch {
	case err == io.EOF && v.n < v.size:
		return k, v.corrupt("it ends after %d of its %d bytes", v.n, v.size)
	case errors.Is(err, backend.ErrCorrupt):
		return k, v.corrupt("%v", err)
	}
	return k, err
}

// corrupt records the corruption (once) and fails the read.
func (v *verifier) corrupt(format string, args ...any) error {
	v.err = fmt.Errorf("%w: %s: %s", ErrCorrupt, v.want, fmt.Sprintf(format, args...))
	v.onCorrupt()
	return v.err
}

func (v *verifier) Close() error {
	v.wait()
	return v.body.Close()
}

// rangeBody is a range read's body: the backend checks what it can (a
// zstd frame's checksum) and says backend.ErrCorrupt; that is recorded
// as the copy's corruption.
type rangeBody struct {
	io.ReadCloser
	onCorrupt func()
}

func (b *rangeBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	if errors.Is(err, backend.ErrCorrupt) {
		b.onCorrupt()
		return k, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return k, err
}
