// Package backendtest is the conformance suite every byte backend passes.
// A backend's tests call Run with a Harness that opens fresh backends over
// real storage (a temp directory, a real MinIO bucket): no mocks.
package backendtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// Harness opens backends for the suite.
type Harness struct {
	// New returns a backend over fresh, empty storage storing with policy.
	// It registers its own cleanup.
	New func(t *testing.T, policy backend.StorePolicy) backend.Backend
	// Reopen returns a second backend over the same storage as b, as a
	// restarted process would see it.
	Reopen func(t *testing.T, b backend.Backend) backend.Backend
	// RaceRounds overrides the number of S7 race rounds (default 200).
	RaceRounds int
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	t.Run("WriteReadStatDelete", func(t *testing.T) { t.Parallel(); testWriteReadStatDelete(t, h) })
	t.Run("Missing", func(t *testing.T) { t.Parallel(); testMissing(t, h) })
	t.Run("InvalidDigest", func(t *testing.T) { t.Parallel(); testInvalidDigest(t, h) })
	t.Run("List", func(t *testing.T) { t.Parallel(); testList(t, h) })
	t.Run("Ranges", func(t *testing.T) { t.Parallel(); testRanges(t, h) })
	t.Run("RoundTrips", func(t *testing.T) { t.Parallel(); testRoundTrips(t, h) })
	t.Run("Mismatch", func(t *testing.T) { t.Parallel(); testMismatch(t, h) })
	t.Run("BodyFailure", func(t *testing.T) { t.Parallel(); testBodyFailure(t, h) })
	t.Run("BeforeVisible", func(t *testing.T) { t.Parallel(); testBeforeVisible(t, h) })
	t.Run("Staging", func(t *testing.T) { t.Parallel(); testStaging(t, h) })
	t.Run("RacingRepresentations", func(t *testing.T) { t.Parallel(); testRacingRepresentations(t, h) })
	t.Run("Marker", func(t *testing.T) { t.Parallel(); testMarker(t, h) })
	t.Run("Residue", func(t *testing.T) { t.Parallel(); testResidue(t, h) })
	t.Run("Archive", func(t *testing.T) { t.Parallel(); testArchive(t, h) })
}

// Blob is test content with its digest and a zstd payload of it.
type Blob struct {
	Content []byte
	Digest  blobplane.Digest
	Zstd    []byte
}

// NewBlob returns size bytes of compressible, seed-determined content.
func NewBlob(seed uint64, size int) Blob {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	words := []string{"blob", "plane", "digest", "zstd", "payload", "content", "range", "\n"}
	var buf bytes.Buffer
	for buf.Len() < size {
		buf.WriteString(words[r.IntN(len(words))])
		buf.WriteByte(byte('a' + r.IntN(26)))
	}
	content := buf.Bytes()[:size]
	return Blob{Content: content, Digest: DigestOf(content), Zstd: Zstd(content)}
}

// DigestOf returns the content digest of b.
func DigestOf(b []byte) blobplane.Digest {
	h := sha256.New()
	h.Write(b)
	return blobplane.DigestFromHash(h)
}

// Zstd compresses b.
func Zstd(b []byte) []byte {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// Unzstd decompresses b.
func Unzstd(b []byte) ([]byte, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	return dec.DecodeAll(b, nil)
}

// Identity is a write request for the blob's content as is.
func (b Blob) Identity() backend.WriteRequest {
	return backend.WriteRequest{Digest: b.Digest, Size: int64(len(b.Content)), Body: bytes.NewReader(b.Content), Codec: backend.CodecIdentity}
}

// ZstdRequest is a write request submitting the blob's zstd payload.
func (b Blob) ZstdRequest() backend.WriteRequest {
	return backend.WriteRequest{Digest: b.Digest, Size: int64(len(b.Content)), Body: bytes.NewReader(b.Zstd), Codec: backend.CodecZstd}
}

// ReadAll reads d fully with opts and returns the object and its body.
func ReadAll(ctx context.Context, b backend.Backend, d blobplane.Digest, opts backend.ReadOptions) (*backend.Object, []byte, error) {
	obj, err := b.Read(ctx, d, opts)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(obj.Body)
	if cerr := obj.Body.Close(); err == nil {
		err = cerr
	}
	if err == nil && int64(len(body)) != obj.Length {
		err = fmt.Errorf("body is %d bytes, Object.Length says %d", len(body), obj.Length)
	}
	return obj, body, err
}

// MustWrite writes req and fails the test on error.
func MustWrite(t testing.TB, b backend.Backend, req backend.WriteRequest) backend.Info {
	t.Helper()
	info, err := b.Write(t.Context(), req)
	if err != nil {
		t.Fatalf("Write %s: %v", req.Digest, err)
	}
	return info
}

// RequireCode fails unless err matches kind and has the given retryability.
func RequireCode(t testing.TB, err error, kind *blobplane.Error, retryable bool) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error %v: want code %s", err, kind.Code)
	}
	if blobplane.IsRetryable(err) != retryable {
		t.Fatalf("error %v: retryable = %v, want %v", err, !retryable, retryable)
	}
}

// RequireAbsent fails unless d is invisible: Stat and Read say not found and
// List does not show it.
func RequireAbsent(t testing.TB, b backend.Backend, d blobplane.Digest) {
	t.Helper()
	ctx := t.Context()
	if _, err := b.Stat(ctx, d); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Stat %s after failed write: %v, want not found", d, err)
	}
	if _, err := b.Read(ctx, d, backend.ReadOptions{}); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Read %s after failed write: %v, want not found", d, err)
	}
	for _, e := range ListAll(t, b, 1000) {
		if e.Digest == d {
			t.Fatalf("List shows %s after failed write", d)
		}
	}
}

// ListAll pages through b with the given page size.
func ListAll(t testing.TB, b backend.Backend, pageSize int) []backend.Entry {
	t.Helper()
	var all []backend.Entry
	opts := backend.ListOptions{Limit: pageSize}
	for i := 0; ; i++ {
		page, err := b.List(t.Context(), opts)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(page.Entries) > pageSize {
			t.Fatalf("List returned %d entries, limit %d", len(page.Entries), pageSize)
		}
		all = append(all, page.Entries...)
		if page.Next == "" {
			return all
		}
		if i > 10000 {
			t.Fatal("List does not terminate")
		}
		opts.After = page.Next
	}
}

func requireBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: got %d bytes, want %d (differ)", what, len(got), len(want))
	}
}

func testWriteReadStatDelete(t *testing.T, h Harness) {
	ctx := t.Context()
	b := h.New(t, backend.StoreAsSubmitted)
	blob := NewBlob(1, 100_000)
	info := MustWrite(t, b, blob.Identity())
	if info.Digest != blob.Digest || info.Repr != backend.Identity(int64(len(blob.Content))) {
		t.Fatalf("Write confirmed %+v", info)
	}
	st, err := b.Stat(ctx, blob.Digest)
	if err != nil || st != info {
		t.Fatalf("Stat = %+v, %v; want %+v", st, err, info)
	}
	obj, body, err := ReadAll(ctx, b, blob.Digest, backend.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requireBytes(t, "Read", body, blob.Content)
	if obj.Repr != info.Repr || obj.Codec != backend.CodecIdentity {
		t.Fatalf("Read repr %v codec %s", obj.Repr, obj.Codec)
	}
	if err := b.Delete(ctx, blob.Digest); err != nil {
		t.Fatal(err)
	}
	RequireAbsent(t, b, blob.Digest)
	// Delete is idempotent: sweeps re-run.
	if err := b.Delete(ctx, blob.Digest); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	// Overwrite after delete works.
	MustWrite(t, b, blob.Identity())

	empty := NewBlob(2, 0)
	info = MustWrite(t, b, empty.Identity())
	if info.Repr != backend.Identity(0) {
		t.Fatalf("empty blob repr %v", info.Repr)
	}
	_, body, err = ReadAll(ctx, b, empty.Digest, backend.ReadOptions{})
	if err != nil || len(body) != 0 {
		t.Fatalf("read empty: %d bytes, %v", len(body), err)
	}
}

func testMissing(t *testing.T, h Harness) {
	ctx := t.Context()
	b := h.New(t, backend.StoreAsSubmitted)
	d := NewBlob(3, 10).Digest
	_, err := b.Read(ctx, d, backend.ReadOptions{})
	RequireCode(t, err, backend.ErrNotFound, false)
	_, err = b.Read(ctx, d, backend.ReadOptions{Range: &backend.Range{Offset: 0, Length: 1}})
	RequireCode(t, err, backend.ErrNotFound, false)
	_, err = b.Stat(ctx, d)
	RequireCode(t, err, backend.ErrNotFound, false)
	if err := b.Delete(ctx, d); err != nil {
		t.Fatalf("Delete of missing: %v", err)
	}
}

func testInvalidDigest(t *testing.T, h Harness) {
	ctx := t.Context()
	b := h.New(t, backend.StoreAsSubmitted)
	bad := []blobplane.Digest{
		"", "sha256:", "sha256:../../../../etc/passwd", "/etc/passwd", "../x",
		blobplane.Digest("sha256:AB" + NewBlob(4, 1).Digest.Hex()[2:]), // uppercase
		"md5:d41d8cd98f00b204e9800998ecf8427e",
		blobplane.Digest("sha256:" + NewBlob(4, 1).Digest.Hex()[:62] + "/."),
	}
	for _, d := range bad {
		_, err := b.Write(ctx, backend.WriteRequest{Digest: d, Size: 1, Body: bytes.NewReader([]byte("x"))})
		RequireCode(t, err, backend.ErrInvalid, false)
		_, err = b.Read(ctx, d, backend.ReadOptions{})
		RequireCode(t, err, backend.ErrInvalid, false)
		_, err = b.Stat(ctx, d)
		RequireCode(t, err, backend.ErrInvalid, false)
		RequireCode(t, b.Delete(ctx, d), backend.ErrInvalid, false)
	}
	_, err := b.List(ctx, backend.ListOptions{After: "sha256:../../x"})
	RequireCode(t, err, backend.ErrInvalid, false)
	for _, id := range []string{"", "../../etc/passwd", "/etc/passwd", "0123456789abcdef0123456789ABCDEF", "0123456789abcdef0123456789abcde/"} {
		_, err := b.UploadSize(ctx, id)
		RequireCode(t, err, backend.ErrInvalid, false)
		_, err = b.AppendUpload(ctx, id, 0, bytes.NewReader(nil))
		RequireCode(t, err, backend.ErrInvalid, false)
		RequireCode(t, b.AbortUpload(ctx, id), backend.ErrInvalid, false)
	}
}

func testList(t *testing.T, h Harness) {
	b := h.New(t, backend.StoreAsSubmitted)
	if got := ListAll(t, b, 10); len(got) != 0 {
		t.Fatalf("empty backend lists %d entries", len(got))
	}
	var want []blobplane.Digest
	for i := range 11 {
		blob := NewBlob(uint64(100+i), 10+i)
		MustWrite(t, b, blob.Identity())
		want = append(want, blob.Digest)
	}
	slices.Sort(want)
	for _, pageSize := range []int{1, 3, 11, 12, 1000} {
		var got []blobplane.Digest
		for _, e := range ListAll(t, b, pageSize) {
			if e.StoredSize <= 0 {
				t.Fatalf("entry %s: stored size %d", e.Digest, e.StoredSize)
			}
			got = append(got, e.Digest)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("page size %d: listed %v\nwant %v", pageSize, got, want)
		}
	}
	// A cursor that names no object still positions the listing.
	gap := blobplane.Digest("sha256:" + want[4].Hex()[:63] + "f")
	page, err := b.List(t.Context(), backend.ListOptions{After: gap, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var rest []blobplane.Digest
	for _, e := range page.Entries {
		rest = append(rest, e.Digest)
	}
	i, _ := slices.BinarySearch(want, gap)
	if !slices.Equal(rest, want[i:]) {
		t.Fatalf("after a gap cursor: %v, want %v", rest, want[i:])
	}
}

func testRanges(t *testing.T, h Harness) {
	ctx := t.Context()
	b := h.New(t, backend.StoreAsSubmitted)
	idBlob := NewBlob(5, 70_000)
	zBlob := NewBlob(6, 70_000)
	MustWrite(t, b, idBlob.Identity())
	if info := MustWrite(t, b, zBlob.ZstdRequest()); info.Repr.Codec != backend.CodecZstd {
		t.Fatalf("zstd blob stored as %v", info.Repr)
	}
	for _, blob := range []Blob{idBlob, zBlob} {
		n := int64(len(blob.Content))
		for _, rg := range []backend.Range{
			{Offset: 0, Length: 1},        // first byte
			{Offset: n - 1, Length: 1},    // last byte
			{Offset: 0, Length: n},        // whole
			{Offset: 12345, Length: 1000}, // middle
			{Offset: 1, Length: n - 1},    // all but the first
		} {
			obj, body, err := ReadAll(ctx, b, blob.Digest, backend.ReadOptions{Range: &rg, AcceptStored: true})
			if err != nil {
				t.Fatalf("range %+v: %v", rg, err)
			}
			if obj.Codec != backend.CodecIdentity {
				t.Fatalf("range %+v returned codec %s; ranges address content", rg, obj.Codec)
			}
			requireBytes(t, fmt.Sprintf("range %+v of %s", rg, obj.Repr), body, blob.Content[rg.Offset:rg.Offset+rg.Length])
		}
		for _, rg := range []backend.Range{
			{Offset: n, Length: 1},       // starts past the end
			{Offset: n + 100, Length: 1}, // far past
			{Offset: n - 1, Length: 2},   // runs past the end
			{Offset: -1, Length: 1},
			{Offset: 0, Length: 0},
		} {
			_, err := b.Read(ctx, blob.Digest, backend.ReadOptions{Range: &rg})
			RequireCode(t, err, backend.ErrRangeInvalid, false)
		}
	}
}

func testRoundTrips(t *testing.T, h Harness) {
	blob := NewBlob(7, 200_000)
	cases := []struct {
		name   string
		policy backend.StorePolicy
		req    func() backend.WriteRequest
		stored backend.Codec
	}{
		{"identity as submitted", backend.StoreAsSubmitted, blob.Identity, backend.CodecIdentity},
		{"zstd as submitted", backend.StoreAsSubmitted, blob.ZstdRequest, backend.CodecZstd},
		{"zstd with declared payload size", backend.StoreAsSubmitted, func() backend.WriteRequest {
			r := blob.ZstdRequest()
			r.PayloadSize = int64(len(blob.Zstd))
			return r
		}, backend.CodecZstd},
		{"identity into a zstd store", backend.StoreZstd, blob.Identity, backend.CodecZstd},
		{"zstd into a zstd store", backend.StoreZstd, blob.ZstdRequest, backend.CodecZstd},
		{"zstd into an identity store", backend.StoreIdentity, blob.ZstdRequest, backend.CodecIdentity},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := h.New(t, c.policy)
			req := c.req()
			info := MustWrite(t, b, req)
			checkConfirmed(t, b, blob, info, c.stored, req.Codec)
			checkDecodedRead(t, b, blob, info)
			checkStoredRead(t, b, blob, info, c.stored, req.Codec)
		})
	}
}

// checkConfirmed checks what a write of blob submitted as codec submitted
// confirmed (info), and that Stat agrees with it.
func checkConfirmed(t *testing.T, b backend.Backend, blob Blob, info backend.Info, stored, submitted backend.Codec) {
	t.Helper()
	n := int64(len(blob.Content))
	if info.Repr.Codec != stored || info.Repr.ContentSize != n || info.Digest != blob.Digest {
		t.Fatalf("confirmed %+v, want codec %s content %d", info, stored, n)
	}
	if stored == backend.CodecIdentity && info.Repr.PayloadSize != n {
		t.Fatalf("identity payload size %d", info.Repr.PayloadSize)
	}
	if stored == backend.CodecZstd && submitted == backend.CodecZstd && info.Repr.PayloadSize != int64(len(blob.Zstd)) {
		t.Fatalf("zstd stored as submitted: payload %d, submitted %d", info.Repr.PayloadSize, len(blob.Zstd))
	}
	if st, err := b.Stat(t.Context(), blob.Digest); err != nil || st != info {
		t.Fatalf("Stat %+v, %v; want %+v", st, err, info)
	}
}

// checkDecodedRead reads blob decoded.
func checkDecodedRead(t *testing.T, b backend.Backend, blob Blob, info backend.Info) {
	t.Helper()
	obj, body, err := ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requireBytes(t, "decoded read", body, blob.Content)
	if obj.Codec != backend.CodecIdentity || obj.Repr != info.Repr {
		t.Fatalf("decoded read: codec %s repr %v", obj.Codec, obj.Repr)
	}
}

// checkStoredRead reads blob as stored: the payload written, and for a zstd
// payload submitted as zstd the very bytes submitted.
func checkStoredRead(t *testing.T, b backend.Backend, blob Blob, info backend.Info, stored, submitted backend.Codec) {
	t.Helper()
	obj, body, err := ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{AcceptStored: true})
	if err != nil {
		t.Fatal(err)
	}
	if obj.Codec != stored || int64(len(body)) != info.Repr.PayloadSize {
		t.Fatalf("stored read: codec %s, %d bytes; want %s, %d", obj.Codec, len(body), stored, info.Repr.PayloadSize)
	}
	if stored == backend.CodecZstd {
		if submitted == backend.CodecZstd {
			requireBytes(t, "stored payload", body, blob.Zstd)
		}
		if body, err = Unzstd(body); err != nil {
			t.Fatalf("stored payload does not decode: %v", err)
		}
	}
	requireBytes(t, "stored read, decoded", body, blob.Content)
}

// badWrites are requests whose bytes do not match their claim.
func badWrites(blob, other Blob) map[string]backend.WriteRequest {
	n := int64(len(blob.Content))
	return map[string]backend.WriteRequest{
		"other content": {Digest: blob.Digest, Size: n, Body: bytes.NewReader(other.Content)},
		"short body":    {Digest: blob.Digest, Size: n, Body: bytes.NewReader(blob.Content[:n-1])},
		"long body":     {Digest: blob.Digest, Size: n, Body: io.MultiReader(bytes.NewReader(blob.Content), bytes.NewReader([]byte("x")))},
		"wrong size":    {Digest: blob.Digest, Size: n + 1, Body: bytes.NewReader(blob.Content)},
		"zstd of other content": {Digest: blob.Digest, Size: n, Codec: backend.CodecZstd,
			Body: bytes.NewReader(other.Zstd)},
		"not zstd": {Digest: blob.Digest, Size: n, Codec: backend.CodecZstd, Body: bytes.NewReader(blob.Content)},
		"truncated zstd": {Digest: blob.Digest, Size: n, Codec: backend.CodecZstd,
			Body: bytes.NewReader(blob.Zstd[:len(blob.Zstd)-10])},
		"zstd with trailing garbage": {Digest: blob.Digest, Size: n, Codec: backend.CodecZstd,
			Body: io.MultiReader(bytes.NewReader(blob.Zstd), bytes.NewReader([]byte("garbage")))},
		"zstd with wrong declared payload size": {Digest: blob.Digest, Size: n, Codec: backend.CodecZstd,
			PayloadSize: int64(len(blob.Zstd)) + 1, Body: bytes.NewReader(blob.Zstd)},
	}
}

func testMismatch(t *testing.T, h Harness) {
	blob := NewBlob(8, 50_000)
	other := NewBlob(9, 50_000)
	for _, policy := range []backend.StorePolicy{backend.StoreAsSubmitted, backend.StoreZstd, backend.StoreIdentity} {
		t.Run(string(policy), func(t *testing.T) {
			ctx := t.Context()
			b := h.New(t, policy)
			for name, req := range badWrites(blob, other) {
				_, err := b.Write(ctx, req)
				if !errors.Is(err, backend.ErrMismatch) || blobplane.IsRetryable(err) {
					t.Fatalf("%s: %v, want terminal digest mismatch", name, err)
				}
				// Nothing visible at the content-addressed location (S2).
				RequireAbsent(t, b, blob.Digest)
			}
			if got := ListAll(t, b, 100); len(got) != 0 {
				t.Fatalf("failed writes left %d listed objects", len(got))
			}
			// A mismatching write over a good object leaves the good one.
			good := MustWrite(t, b, blob.Identity())
			for name, req := range badWrites(blob, other) {
				if _, err := b.Write(ctx, req); !errors.Is(err, backend.ErrMismatch) {
					t.Fatalf("%s over a good object: %v", name, err)
				}
			}
			obj, body, err := ReadAll(ctx, b, blob.Digest, backend.ReadOptions{})
			if err != nil || obj.Repr != good.Repr {
				t.Fatalf("good object after failed overwrites: %v, %v", obj, err)
			}
			requireBytes(t, "good object after failed overwrites", body, blob.Content)
		})
	}
}

// failingReader yields n bytes of r and then fails, as a client that drops
// its connection does.
type failingReader struct {
	r io.Reader
	n int
}

var errClientGone = errors.New("client went away")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errClientGone
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

func testBodyFailure(t *testing.T, h Harness) {
	ctx := t.Context()
	blob := NewBlob(10, 300_000)
	b := h.New(t, backend.StoreAsSubmitted)
	for _, req := range []backend.WriteRequest{blob.Identity(), blob.ZstdRequest()} {
		req.Body = &failingReader{r: req.Body, n: 1000}
		_, err := b.Write(ctx, req)
		RequireCode(t, err, backend.ErrUnavailable, true)
		if !errors.Is(err, errClientGone) {
			t.Fatalf("error %v does not wrap the body's failure", err)
		}
		RequireAbsent(t, b, blob.Digest)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := b.Write(cctx, blob.Identity())
	RequireCode(t, err, backend.ErrUnavailable, true)
	RequireAbsent(t, b, blob.Digest)
}

// testBeforeVisible: WriteRequest.BeforeVisible runs once, before the
// object is visible, and its error aborts the write with nothing visible.
func testBeforeVisible(t *testing.T, h Harness) {
	ctx := t.Context()
	blob := NewBlob(12, 40_000)
	b := h.New(t, backend.StoreAsSubmitted)

	refused := errors.New("the claim was refused")
	req := blob.Identity()
	calls := 0
	req.BeforeVisible = func() error {
		calls++
		RequireAbsent(t, b, blob.Digest)
		return refused
	}
	if _, err := b.Write(ctx, req); !errors.Is(err, refused) {
		t.Fatalf("write with a refusing hook: %v, want its error", err)
	}
	if calls != 1 {
		t.Fatalf("hook called %d times, want 1", calls)
	}
	RequireAbsent(t, b, blob.Digest)
	if got := ListAll(t, b, 100); len(got) != 0 {
		t.Fatalf("a refused write left %d listed objects", len(got))
	}

	req = blob.Identity()
	calls = 0
	req.BeforeVisible = func() error {
		calls++
		RequireAbsent(t, b, blob.Digest)
		return nil
	}
	MustWrite(t, b, req)
	if calls != 1 {
		t.Fatalf("hook called %d times, want 1", calls)
	}
	obj, body, err := ReadAll(ctx, b, blob.Digest, backend.ReadOptions{})
	if err != nil {
		t.Fatalf("object after the hook allowed it: %v, %v", obj, err)
	}
	requireBytes(t, "object after the hook allowed it", body, blob.Content)

	// DeferSync: a deferred sync, when the backend has one, is handed
	// over once, succeeds, and the object is readable before and after.
	other := NewBlob(14, 40_000)
	req = other.Identity()
	var syncs []func() error
	req.DeferSync = func(sync func() error) { syncs = append(syncs, sync) }
	MustWrite(t, b, req)
	if len(syncs) > 1 {
		t.Fatalf("DeferSync called %d times", len(syncs))
	}
	if _, body, err := ReadAll(ctx, b, other.Digest, backend.ReadOptions{}); err != nil || !bytes.Equal(body, other.Content) {
		t.Fatalf("object before its deferred sync: %v", err)
	}
	for _, sync := range syncs {
		if err := sync(); err != nil {
			t.Fatalf("deferred sync: %v", err)
		}
	}
	if _, body, err := ReadAll(ctx, b, other.Digest, backend.ReadOptions{}); err != nil || !bytes.Equal(body, other.Content) {
		t.Fatalf("object after its deferred sync: %v", err)
	}
}

func testStaging(t *testing.T, h Harness) {
	blob := NewBlob(11, 90_000)
	b := h.New(t, backend.StoreAsSubmitted)
	b2, id := stageAcrossRestart(t, h, b, blob)
	promoteStaged(t, b2, id, blob)
	promoteStagedZstd(t, b)
	abortStaged(t, b, blob.Content[:1000])
	resumeInterrupted(t, b, blob)
}

// stageAcrossRestart stages blob in three appends, the last one through a
// new backend over the same storage, and returns that backend and the
// upload's id.
func stageAcrossRestart(t *testing.T, h Harness, b backend.Backend, blob Blob) (backend.Backend, string) {
	ctx := t.Context()
	id, err := b.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.ValidUploadID("test", id); err != nil {
		t.Fatalf("upload id: %v", err)
	}
	if n, err := b.UploadSize(ctx, id); err != nil || n != 0 {
		t.Fatalf("new upload size %d, %v", n, err)
	}
	parts := [][]byte{blob.Content[:1000], blob.Content[1000:40_000], blob.Content[40_000:]}
	off := int64(0)
	for i, p := range parts[:2] {
		n, err := b.AppendUpload(ctx, id, off, bytes.NewReader(p))
		if err != nil || n != off+int64(len(p)) {
			t.Fatalf("append %d: size %d, %v", i, n, err)
		}
		off = n
	}
	// Appends address the end: a repeat or a gap is refused.
	for _, bad := range []int64{0, off - 1, off + 1} {
		_, err := b.AppendUpload(ctx, id, bad, bytes.NewReader(parts[2]))
		RequireCode(t, err, backend.ErrRangeInvalid, false)
	}

	// Resume after a restart: a new backend over the same storage knows
	// the upload and its size.
	b2 := h.Reopen(t, b)
	if n, err := b2.UploadSize(ctx, id); err != nil || n != off {
		t.Fatalf("size after reopen %d, %v; want %d", n, err, off)
	}
	if n, err := b2.AppendUpload(ctx, id, off, bytes.NewReader(parts[2])); err != nil || n != int64(len(blob.Content)) {
		t.Fatalf("append after reopen: %d, %v", n, err)
	}
	return b2, id
}

// promoteStaged promotes the staged upload id of blob, after a promotion
// that does not verify.
func promoteStaged(t *testing.T, b backend.Backend, id string, blob Blob) {
	ctx := t.Context()
	// A promotion that does not verify leaves nothing at the
	// content-addressed location and keeps the staged bytes.
	wrong := NewBlob(12, 90_000)
	_, err := b.PromoteUpload(ctx, id, backend.WriteRequest{Digest: wrong.Digest, Size: int64(len(wrong.Content))})
	RequireCode(t, err, backend.ErrMismatch, false)
	RequireAbsent(t, b, wrong.Digest)
	RequireAbsent(t, b, blob.Digest)
	if n, err := b.UploadSize(ctx, id); err != nil || n != int64(len(blob.Content)) {
		t.Fatalf("staged upload after failed promote: %d, %v", n, err)
	}

	info, err := b.PromoteUpload(ctx, id, backend.WriteRequest{Digest: blob.Digest, Size: int64(len(blob.Content))})
	if err != nil || info.Digest != blob.Digest || info.Repr.ContentSize != int64(len(blob.Content)) {
		t.Fatalf("promote: %+v, %v", info, err)
	}
	_, body, err := ReadAll(ctx, b, blob.Digest, backend.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requireBytes(t, "promoted", body, blob.Content)
	_, err = b.UploadSize(ctx, id)
	RequireCode(t, err, backend.ErrNotFound, false)
	_, err = b.PromoteUpload(ctx, id, backend.WriteRequest{Digest: blob.Digest, Size: int64(len(blob.Content))})
	RequireCode(t, err, backend.ErrNotFound, false)
}

// promoteStagedZstd: a staged zstd payload promotes with its codec.
func promoteStagedZstd(t *testing.T, b backend.Backend) {
	ctx := t.Context()
	zb := NewBlob(13, 120_000)
	zid, err := b.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	half := int64(len(zb.Zstd) / 2)
	if _, err := b.AppendUpload(ctx, zid, 0, bytes.NewReader(zb.Zstd[:half])); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AppendUpload(ctx, zid, half, bytes.NewReader(zb.Zstd[half:])); err != nil {
		t.Fatal(err)
	}
	info, err := b.PromoteUpload(ctx, zid, backend.WriteRequest{Digest: zb.Digest, Size: int64(len(zb.Content)), Codec: backend.CodecZstd})
	if err != nil || info.Repr.Codec != backend.CodecZstd || info.Repr.PayloadSize != int64(len(zb.Zstd)) {
		t.Fatalf("promote zstd: %+v, %v", info, err)
	}
	_, body, err := ReadAll(ctx, b, zb.Digest, backend.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	requireBytes(t, "promoted zstd, decoded", body, zb.Content)
}

// abortStaged: abort discards an upload holding chunk, and is idempotent.
func abortStaged(t *testing.T, b backend.Backend, chunk []byte) {
	ctx := t.Context()
	aid, err := b.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AppendUpload(ctx, aid, 0, bytes.NewReader(chunk)); err != nil {
		t.Fatal(err)
	}
	if err := b.AbortUpload(ctx, aid); err != nil {
		t.Fatal(err)
	}
	_, err = b.UploadSize(ctx, aid)
	RequireCode(t, err, backend.ErrNotFound, false)
	_, err = b.AppendUpload(ctx, aid, 0, bytes.NewReader(chunk))
	RequireCode(t, err, backend.ErrNotFound, false)
	if err := b.AbortUpload(ctx, aid); err != nil {
		t.Fatalf("second abort: %v", err)
	}
}

// resumeInterrupted: after an interrupted chunk the error is retryable and
// UploadSize says where to resume.
func resumeInterrupted(t *testing.T, b backend.Backend, blob Blob) {
	ctx := t.Context()
	rid, err := b.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.AppendUpload(ctx, rid, 0, &failingReader{r: bytes.NewReader(blob.Content), n: 5000})
	RequireCode(t, err, backend.ErrUnavailable, true)
	have, err := b.UploadSize(ctx, rid)
	if err != nil || have < 0 || have > 5000 {
		t.Fatalf("size after interrupted append: %d, %v", have, err)
	}
	if _, err := b.AppendUpload(ctx, rid, have, bytes.NewReader(blob.Content[have:])); err != nil {
		t.Fatalf("resume at %d: %v", have, err)
	}
	if _, err := b.PromoteUpload(ctx, rid, backend.WriteRequest{Digest: blob.Digest, Size: int64(len(blob.Content))}); err != nil {
		t.Fatalf("promote resumed upload: %v", err)
	}
}

// testRacingRepresentations is S7 and the ADR-00018 scenario: two writers
// store different representations (identity, zstd) of the same content at
// the same key while readers read. Each write is one atomic object, so every
// read sees a payload that decodes by the representation it came with: zero
// decode failures, whichever writer lands last.
func testRacingRepresentations(t *testing.T, h Harness) {
	ctx := t.Context()
	rounds := h.RaceRounds
	if rounds == 0 {
		rounds = 200
	}
	if testing.Short() {
		rounds = 20
	}
	blob := NewBlob(14, 64<<10)
	n := int64(len(blob.Content))
	r := &reprRace{
		t:      t,
		b:      h.New(t, backend.StoreAsSubmitted),
		blob:   blob,
		idRepr: backend.Identity(n),
		zRepr:  backend.Representation{Codec: backend.CodecZstd, PayloadSize: int64(len(blob.Zstd)), ContentSize: n},
	}
	MustWrite(t, r.b, blob.Identity())
	for round := 0; round < rounds && r.failures.Load() == 0; round++ {
		r.round(ctx, round)
	}
	if f := r.failures.Load(); f > 0 {
		t.Fatalf("%d decode failures in %d reads", f, r.reads.Load())
	}
	t.Logf("%d rounds, %d reads, 0 decode failures", rounds, r.reads.Load())
}

// reprRace is testRacingRepresentations' backend and blob, the two
// representations its writers store, and its tally.
type reprRace struct {
	t               *testing.T
	b               backend.Backend
	blob            Blob
	idRepr, zRepr   backend.Representation
	failures, reads atomic.Int64
}

// fail reports a failure; only the first five are logged.
func (r *reprRace) fail(format string, args ...any) {
	if r.failures.Add(1) <= 5 {
		r.t.Errorf(format, args...)
	}
}

// known reports that repr is one of the writers'.
func (r *reprRace) known(repr backend.Representation) bool {
	return repr == r.idRepr || repr == r.zRepr
}

// round races the two writers against three readers, then checks the
// object one of them left.
func (r *reprRace) round(ctx context.Context, round int) {
	start := make(chan struct{})
	var writers, readers sync.WaitGroup
	var writing atomic.Bool
	writing.Store(true)
	for _, req := range []backend.WriteRequest{r.blob.Identity(), r.blob.ZstdRequest()} {
		writers.Add(1)
		go func() {
			defer writers.Done()
			<-start
			if info, err := r.b.Write(ctx, req); err != nil {
				r.fail("round %d: write %s: %v", round, req.Codec, err)
			} else if !r.known(info.Repr) {
				r.fail("round %d: write confirmed %v", round, info.Repr)
			}
		}()
	}
	for k := range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			<-start
			// Read at least once, and keep reading while the writers
			// race; no sleeps, the writers' completion ends the loop.
			for i := k; ; i += 3 {
				r.readOnce(ctx, i)
				if !writing.Load() {
					return
				}
			}
		}()
	}
	close(start)
	writers.Wait()
	writing.Store(false)
	readers.Wait()
	info, err := r.b.Stat(ctx, r.blob.Digest)
	if err != nil || !r.known(info.Repr) {
		r.fail("round %d: after the race Stat = %v, %v", round, info, err)
	}
}

// readOnce reads the object one of three ways, by i.
func (r *reprRace) readOnce(ctx context.Context, i int) {
	r.reads.Add(1)
	n := int64(len(r.blob.Content))
	switch i % 3 {
	case 0: // as stored: decode by the representation that came with it
		r.readStored(ctx)
	case 1: // decoded whole
		_, body, err := ReadAll(ctx, r.b, r.blob.Digest, backend.ReadOptions{})
		if err != nil || !bytes.Equal(body, r.blob.Content) {
			r.fail("decoded read: %d bytes, %v", len(body), err)
		}
	case 2: // decoded range
		rg := backend.Range{Offset: n - 1000, Length: 1000}
		_, body, err := ReadAll(ctx, r.b, r.blob.Digest, backend.ReadOptions{Range: &rg})
		if err != nil || !bytes.Equal(body, r.blob.Content[n-1000:]) {
			r.fail("range read: %d bytes, %v", len(body), err)
		}
	}
}

// readStored reads the object as stored and decodes it by the
// representation that came with it.
func (r *reprRace) readStored(ctx context.Context) {
	obj, body, err := ReadAll(ctx, r.b, r.blob.Digest, backend.ReadOptions{AcceptStored: true})
	if err != nil {
		r.fail("stored read: %v", err)
		return
	}
	if !r.known(obj.Repr) {
		r.fail("stored read: representation %v is neither writer's", obj.Repr)
		return
	}
	if obj.Codec == backend.CodecZstd {
		if body, err = Unzstd(body); err != nil {
			r.fail("stored read: payload does not decode as %v: %v", obj.Repr, err)
			return
		}
	}
	if !bytes.Equal(body, r.blob.Content) {
		r.fail("stored read as %v: wrong content (%d bytes)", obj.Repr, len(body))
	}
}
