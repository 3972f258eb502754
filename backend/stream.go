package backend

import (
	"context"
	"crypto/sha256"
	"errors"
	"hash"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/blobplane/blobplane"
)

// MaxZstdWindow bounds the zstd window a payload may use, and so the memory
// one decoding stream may take. zstd's default levels use at most 8 MiB;
// 64 MiB leaves room for --long, and refuses payloads built to exhaust
// memory.
const MaxZstdWindow = 64 << 20

// copyBufSize is the chunk the pipeline moves at a time. Bodies are streamed
// through buffers of this size and never held whole in memory.
const copyBufSize = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

var decoders = sync.Pool{New: func() any {
	// Concurrency 1 decodes synchronously on the caller's goroutine: no
	// background goroutines outlive a read.
	d, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(MaxZstdWindow),
		zstd.WithDecoderMaxMemory(1<<62))
	if err != nil {
		panic(err) // options are constant
	}
	return d
}}

var encoders = sync.Pool{New: func() any {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		panic(err)
	}
	return e
}}

func getDecoder(r io.Reader) (*zstd.Decoder, error) {
	d := decoders.Get().(*zstd.Decoder)
	if err := d.Reset(r); err != nil {
		decoders.Put(d)
		return nil, err
	}
	return d, nil
}

func putDecoder(d *zstd.Decoder) {
	_ = d.Reset(nil)
	decoders.Put(d)
}

// sourceReader remembers the first error of the request body, so the
// pipeline can tell "the client went away" (retryable) from "the bytes are
// wrong" (a mismatch).
type sourceReader struct {
	r   io.Reader
	n   int64
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n += int64(n)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// ctxReader ends a stream when its context is done, so a cancelled request
// stops a write between chunks.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// CtxReader returns r, failing with ctx's error once ctx is done.
func CtxReader(ctx context.Context, r io.Reader) io.Reader { return ctxReader{ctx: ctx, r: r} }

// sinkWriter counts payload bytes and remembers the store's first error.
type sinkWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (s *sinkWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	s.n += int64(n)
	if err != nil {
		s.err = &SinkError{Err: err}
	}
	return n, s.err
}

// SinkError wraps a failure of the destination a pipeline wrote to, so the
// backend can classify its own store's errors (and tell them from the
// body's).
type SinkError struct{ Err error }

func (e *SinkError) Error() string { return e.Err.Error() }
func (e *SinkError) Unwrap() error { return e.Err }

// Encode streams req.Body (encoded with req.Codec) into dst encoded with
// out, hashing the decoded content on the way. A zstd body is verified by
// decoding it while it streams, and the digest is always of the decoded
// content. Encode returns the representation written to dst when the content
// digest and size equal req's; otherwise an ErrMismatch error, and whatever
// reached dst must be discarded by the caller (S2).
//
// Errors: ErrInvalid (bad request), ErrMismatch, ErrUnavailable (the body
// failed mid-stream), or a *SinkError from dst, which the caller classifies.
func Encode(ctx context.Context, dst io.Writer, req WriteRequest, out Codec) (Representation, error) {
	const op = "backend.Encode"
	in, out, err := checkEncode(op, req, out)
	if err != nil {
		return Representation{}, err
	}

	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)

	e := &encoding{
		src:  &sourceReader{r: ctxReader{ctx: ctx, r: req.Body}},
		sink: &sinkWriter{w: dst},
		h:    sha256.New(),
		buf:  *bufp,
		size: req.Size,
	}
	switch {
	case in == CodecIdentity && out == CodecIdentity:
		e.copyIdentity()
	case in == CodecIdentity && out == CodecZstd:
		e.compress()
	case in == CodecZstd:
		e.decompress(out)
	}
	if err := e.failure(op); err != nil {
		return Representation{}, err
	}
	if got := blobplane.DigestFromHash(e.h); got != req.Digest {
		return Representation{}, Mismatch(op, "content hashed to %s, expected %s", got, req.Digest)
	}
	repr := Representation{Codec: out, PayloadSize: e.sink.n, ContentSize: e.content}
	if in == CodecZstd && req.PayloadSize > 0 && req.PayloadSize != e.src.n {
		return Representation{}, Mismatch(op, "payload is %d bytes, declared %d", e.src.n, req.PayloadSize)
	}
	return repr, nil
}

// checkEncode validates an Encode request before a byte is read, and
// returns its input and output codecs in canonical form.
func checkEncode(op string, req WriteRequest, out Codec) (Codec, Codec, error) {
	in, err := ParseCodec(string(req.Codec))
	if err != nil {
		return "", "", err
	}
	if out, err = ParseCodec(string(out)); err != nil {
		return "", "", err
	}
	if err := ValidDigest(op, req.Digest); err != nil {
		return "", "", err
	}
	if req.Size < 0 {
		return "", "", Invalid(op, "size %d: must not be negative", req.Size)
	}
	if req.PayloadSize < 0 || (in == CodecIdentity && req.PayloadSize > 0 && req.PayloadSize != req.Size) {
		return "", "", Invalid(op, "payload size %d does not fit codec %s and size %d", req.PayloadSize, in, req.Size)
	}
	if req.Body == nil {
		return "", "", Invalid(op, "no body")
	}
	return in, out, nil
}

// encoding is one run of Encode's pipeline: the body it reads, the
// destination it writes, the hash of the decoded content, and what the run
// saw.
type encoding struct {
	src  *sourceReader
	sink *sinkWriter
	h    hash.Hash
	buf  []byte
	size int64 // the content size the request claims

	content   int64 // decoded bytes seen
	decodeErr error // the payload is not valid zstd
	err       error // the copy failed otherwise
}

// limit stops a body (or a zstd bomb) one byte past the claimed size: that
// byte alone proves a mismatch.
func (e *encoding) limit() int64 { return e.size + 1 }

// copyIdentity stores an identity body as it is.
func (e *encoding) copyIdentity() {
	e.content, e.err = io.CopyBuffer(io.MultiWriter(e.h, e.sink), io.LimitReader(e.src, e.limit()), e.buf)
}

// compress stores an identity body zstd-encoded.
func (e *encoding) compress() {
	enc := encoders.Get().(*zstd.Encoder)
	enc.Reset(e.sink)
	e.content, e.err = io.CopyBuffer(io.MultiWriter(e.h, enc), io.LimitReader(e.src, e.limit()), e.buf)
	if cerr := enc.Close(); e.err == nil {
		e.err = cerr
	}
	enc.Reset(nil)
	encoders.Put(enc)
}

// decompress verifies a zstd body by decoding it, and stores either the
// payload as read (zstd → zstd) or the decoded content (zstd → identity).
func (e *encoding) decompress(out Codec) {
	var payload io.Reader = e.src
	var contentDst io.Writer = e.h
	if out == CodecZstd {
		payload = io.TeeReader(e.src, e.sink)
	} else {
		contentDst = io.MultiWriter(e.h, e.sink)
	}
	err := e.decode(payload, contentDst)
	if err != nil && e.streamsIntact() {
		// Neither the body nor dst failed: the payload itself is bad.
		e.decodeErr = err
		return
	}
	e.err = err
}

// decode copies the content decoded from payload to contentDst, then checks
// nothing but zstd frames made up the payload.
func (e *encoding) decode(payload io.Reader, contentDst io.Writer) error {
	dec, err := getDecoder(payload)
	if err != nil {
		return err
	}
	e.content, err = io.CopyBuffer(contentDst, io.LimitReader(dec, e.limit()), e.buf)
	putDecoder(dec)
	if err != nil || e.content > e.size {
		return err
	}
	// All frames decoded; anything after them is not zstd.
	if n, _ := io.CopyBuffer(io.Discard, payload, e.buf); n > 0 && e.streamsIntact() {
		e.decodeErr = errors.New("trailing bytes after the last zstd frame")
	}
	return nil
}

// streamsIntact reports that neither the body nor the destination failed,
// so a failure of the pipeline is the payload's own.
func (e *encoding) streamsIntact() bool { return e.src.err == nil && e.sink.err == nil }

// failure says why the run did not carry exactly the claimed content, or
// returns nil. A failing body or destination outranks what it left behind.
func (e *encoding) failure(op string) error {
	switch {
	case e.src.err != nil:
		return Unavailable(op, e.src.err, "request body failed after %d content bytes: %v", e.content, e.src.err)
	case e.sink.err != nil:
		return e.sink.err
	case e.err != nil:
		return Classify(op, e.err)
	case e.decodeErr != nil:
		return Mismatch(op, "payload does not decode as zstd: %v", e.decodeErr)
	case e.content > e.size:
		return Mismatch(op, "content is larger than the expected %d bytes", e.size)
	case e.content != e.size:
		return Mismatch(op, "content is %d bytes, expected %d", e.content, e.size)
	}
	return nil
}

// StoredCodec is what a backend configured with policy stores for a body
// submitted with codec in.
func StoredCodec(policy StorePolicy, in Codec) Codec {
	switch policy {
	case StoreIdentity:
		return CodecIdentity
	case StoreZstd:
		return CodecZstd
	}
	if in == "" {
		return CodecIdentity
	}
	return in
}

// PayloadKnown reports the representation a write will store when it can be
// known before the body is read: always for identity stored as identity,
// and for zstd stored as zstd when the payload size is declared. Backends
// that must name the representation before the bytes (S3 multipart) use it.
func PayloadKnown(req WriteRequest, out Codec) (Representation, bool) {
	in := req.Codec
	if in == "" {
		in = CodecIdentity
	}
	switch {
	case in == CodecIdentity && out == CodecIdentity:
		return Identity(req.Size), true
	case in == CodecZstd && out == CodecZstd && req.PayloadSize > 0:
		return Representation{Codec: CodecZstd, PayloadSize: req.PayloadSize, ContentSize: req.Size}, true
	}
	return Representation{}, false
}

// DecodeBody returns the body of a read: payload (the stored bytes of an
// object with representation repr, positioned at the payload's start) as
// stored, decoded, or decoded and restricted to a content range. close is
// called when the returned body is closed. It is the one place that serves
// content ranges of zstd objects: it decodes from the start of the payload
// and discards bytes before the range (the documented slow path).
func DecodeBody(op string, d blobplane.Digest, payload io.Reader, close func() error, repr Representation, opts ReadOptions) (*Object, error) {
	off, n, err := CheckRange(op, opts.Range, repr.ContentSize)
	if err != nil {
		return nil, err
	}
	obj := &Object{Repr: repr, Codec: CodecIdentity}
	if repr.Codec == CodecIdentity || (opts.AcceptStored && opts.Range == nil) {
		// payload is already positioned (identity ranges are served by the
		// store itself); just bound it.
		obj.Codec = repr.Codec
		obj.Length = repr.PayloadSize
		if repr.Codec == CodecIdentity {
			obj.Length = n
		}
		obj.Body = &readCloser{Reader: io.LimitReader(payload, obj.Length), close: close}
		return obj, nil
	}
	src := &sourceReader{r: payload}
	dec, err := getDecoder(src)
	if err != nil {
		_ = close()
		return nil, Corrupt(op, d, "zstd: %v", err)
	}
	body := &decodingBody{op: op, d: d, src: src, dec: dec, remain: n, whole: opts.Range == nil, close: close}
	if off > 0 {
		if _, err := io.CopyN(io.Discard, dec, off); err != nil {
			_ = body.Close()
			return nil, decodeFailure(op, d, src, err)
		}
	}
	obj.Length = n
	obj.Body = body
	return obj, nil
}

// decodeFailure classifies an error met while decoding a stored payload: a
// failure of the store underneath is retryable, anything else means the
// payload does not decode as its representation says.
func decodeFailure(op string, d blobplane.Digest, src *sourceReader, err error) error {
	var be *blobplane.Error
	switch {
	case src.err != nil:
		return Classify(op, src.err)
	case errors.As(err, &be):
		return err
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return Corrupt(op, d, "zstd payload decodes to fewer bytes than its representation says")
	}
	return Corrupt(op, d, "zstd: %v", err)
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r *readCloser) Close() error { return r.close() }

// decodingBody yields exactly remain decoded bytes. For a whole-object read
// it also checks the payload ends where the representation says the content
// does, so a stored payload that disagrees with its description fails loudly
// instead of returning short or long content.
type decodingBody struct {
	op     string
	d      blobplane.Digest
	src    *sourceReader
	dec    *zstd.Decoder
	remain int64
	whole  bool
	close  func() error
	done   bool
}

func (b *decodingBody) Read(p []byte) (int, error) {
	if b.dec == nil {
		return 0, errors.New("read after close")
	}
	if b.remain <= 0 {
		if b.whole && !b.done {
			b.done = true
			var one [1]byte
			if n, _ := io.ReadFull(b.dec, one[:]); n > 0 {
				return 0, Corrupt(b.op, b.d, "zstd payload decodes to more bytes than its representation says")
			}
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.remain {
		p = p[:b.remain]
	}
	n, err := b.dec.Read(p)
	b.remain -= int64(n)
	if err == io.EOF && b.remain > 0 {
		return n, Corrupt(b.op, b.d, "zstd payload decodes to fewer bytes than its representation says")
	}
	if err != nil && err != io.EOF {
		return n, decodeFailure(b.op, b.d, b.src, err)
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

func (b *decodingBody) Close() error {
	if b.dec == nil {
		return nil
	}
	putDecoder(b.dec)
	b.dec = nil
	return b.close()
}

// SourceReader wraps a request body and remembers the first error it
// returned (other than EOF), so a backend can tell a body that broke off
// (the client's failure: retryable) from a failure of its own store.
type SourceReader struct {
	R   io.Reader
	Err error
}

func (s *SourceReader) Read(p []byte) (int, error) {
	n, err := s.R.Read(p)
	if err != nil && err != io.EOF && s.Err == nil {
		s.Err = err
	}
	return n, err
}
