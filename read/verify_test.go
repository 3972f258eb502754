package read

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

func digestOf(b []byte) blobplane.Digest {
	sum := sha256.Sum256(b)
	return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// drain reads v the way the HTTP handler does (io.Copy through a buffer)
// and returns what a client would have received.
func drain(v io.Reader, buf int) ([]byte, error) {
	var out bytes.Buffer
	_, err := io.CopyBuffer(struct{ io.Writer }{&out}, v, make([]byte, buf))
	return out.Bytes(), err
}

// S2, "no complete wrong body": whatever the stored bytes, a whole read
// either hands over exactly the content that proves the digest, or fails
// with ErrCorrupt having handed over fewer bytes than the blob's size (or,
// for an object longer than its content, exactly the content), and
// reports the corruption once.
func TestVerifierNeverHandsOverACompleteWrongBody(t *testing.T) {
	t.Parallel()
	// Below and above overlapMin: hashed in line, and hashed while the
	// chunk is written out.
	for _, n := range []int{10_000, 200_000} {
		verifierCases(t, bytes.Repeat([]byte("blobplane "), n))
	}
}

func verifierCases(t *testing.T, content []byte) {
	d := digestOf(content)
	size := int64(len(content))
	flipLast := bytes.Clone(content)
	flipLast[len(flipLast)-1] ^= 1
	flipFirst := bytes.Clone(content)
	flipFirst[0] ^= 1
	for _, c := range []struct {
		name    string
		stored  []byte
		corrupt bool
	}{
		{"intact", content, false},
		{"last byte flipped", flipLast, true},
		{"first byte flipped", flipFirst, true},
		{"short by one", content[:len(content)-1], true},
		{"empty", nil, true},
		{"long by one", append(bytes.Clone(content), 'x'), true},
	} {
		for _, buf := range []int{1000, 4096, 256 << 10, 4 << 20} {
			reported := 0
			v := newVerifier(io.NopCloser(bytes.NewReader(c.stored)), d, size, true, func() { reported++ })
			got, err := drain(v, buf)
			_ = v.Close()
			switch {
			case !c.corrupt && (err != nil || !bytes.Equal(got, content) || reported != 0):
				t.Errorf("%s (buffer %d): %d bytes, %v, reported %d", c.name, buf, len(got), err, reported)
			case c.corrupt && (!errors.Is(err, ErrCorrupt) || reported != 1 || int64(len(got)) >= size && !bytes.Equal(got, content)):
				// Short of the size, or (an object longer than its
				// content) exactly the content: never a complete wrong body.
				t.Errorf("%s (buffer %d): handed over %d of %d bytes, err %v, reported %d; want ErrCorrupt short of the size, reported once",
					c.name, buf, len(got), size, err, reported)
			}
		}
	}
}

// One byte at a time, and with reads that return data with io.EOF: the
// same guarantee.
func TestVerifierUnderOddReaders(t *testing.T) {
	t.Parallel()
	content := []byte("a small blob")
	d := digestOf(content)
	bad := bytes.Clone(content)
	bad[len(bad)-1] = '!'
	for name, r := range map[string]io.Reader{
		"one byte":      iotest.OneByteReader(bytes.NewReader(bad)),
		"data with EOF": iotest.DataErrReader(bytes.NewReader(bad)),
	} {
		v := newVerifier(io.NopCloser(r), d, int64(len(content)), true, func() {})
		got, err := drain(v, 3)
		if !errors.Is(err, ErrCorrupt) || len(got) >= len(content) {
			t.Errorf("%s: %q, %v", name, got, err)
		}
	}
	v := newVerifier(io.NopCloser(iotest.DataErrReader(bytes.NewReader(content))), d, int64(len(content)), true, func() {})
	if got, err := drain(v, 3); err != nil || !bytes.Equal(got, content) {
		t.Errorf("intact, data with EOF: %q, %v", got, err)
	}
}

// An empty blob proves its digest with no bytes.
func TestVerifierEmptyBlob(t *testing.T) {
	t.Parallel()
	v := newVerifier(io.NopCloser(bytes.NewReader(nil)), digestOf(nil), 0, true, func() { t.Error("reported") })
	if got, err := drain(v, 16); err != nil || len(got) != 0 {
		t.Fatalf("%q, %v", got, err)
	}
	v = newVerifier(io.NopCloser(bytes.NewReader([]byte("x"))), digestOf(nil), 0, true, func() {})
	if _, err := drain(v, 16); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a byte where none belongs: %v", err)
	}
}

// Unverified backends (BLOBPLANE_READ_UNVERIFIED_BACKENDS): other bytes
// of the right length pass; a short object is still caught.
func TestVerifierWithoutHashingChecksTheLength(t *testing.T) {
	t.Parallel()
	content := []byte("unverified store")
	d := digestOf(content)
	other := bytes.ToUpper(content)
	v := newVerifier(io.NopCloser(bytes.NewReader(other)), d, int64(len(content)), false, func() {})
	if got, err := drain(v, 4); err != nil || !bytes.Equal(got, other) {
		t.Fatalf("unhashed: %q, %v", got, err)
	}
	v = newVerifier(io.NopCloser(bytes.NewReader(content[:4])), d, int64(len(content)), false, func() {})
	if _, err := drain(v, 4); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("short, unhashed: %v", err)
	}
}

// A transport failure is not corruption: it passes through unreported.
func TestVerifierPassesTransportErrorsThrough(t *testing.T) {
	t.Parallel()
	content := []byte("cut off in flight")
	r := io.MultiReader(bytes.NewReader(content[:5]), iotest.ErrReader(io.ErrUnexpectedEOF))
	v := newVerifier(io.NopCloser(r), digestOf(content), int64(len(content)), true, func() { t.Error("reported") })
	if _, err := drain(v, 4); !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("%v", err)
	}
	// backend.ErrCorrupt mid-stream (a zstd frame) is corruption.
	r = io.MultiReader(bytes.NewReader(content[:5]), iotest.ErrReader(backend.ErrCorrupt))
	v = newVerifier(io.NopCloser(r), digestOf(content), int64(len(content)), true, func() {})
	if _, err := drain(v, 4); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("backend corruption: %v", err)
	}
}

// FuzzVerifier: for any stored bytes, a whole read hands over the
// content exactly, or fails with fewer bytes than its size.
func FuzzVerifier(f *testing.F) {
	content := []byte("the content the digest names")
	d := digestOf(content)
	f.Add(content, 7)
	f.Add(content[:3], 1)
	f.Add([]byte("the content the digest nameZ"), 64)
	f.Fuzz(func(t *testing.T, stored []byte, buf int) {
		buf = 1 + (buf&0xffff)%4096
		v := newVerifier(io.NopCloser(bytes.NewReader(stored)), d, int64(len(content)), true, func() {})
		got, err := drain(v, buf)
		if err == nil && !bytes.Equal(got, content) {
			t.Fatalf("handed over %q without an error", got)
		}
		if err != nil && len(got) >= len(content) && !bytes.Equal(got, content) {
			t.Fatalf("handed over %d wrong bytes, then %v", len(got), err)
		}
	})
}
