// Package s3 is the S3 byte backend (aws-sdk-go-v2), for AWS S3 and any
// S3-compatible store (MinIO in tests).
//
// Keys, under an optional prefix:
//
//	sha256/<64 hex>              one object per content digest
//	_tmp/<random>                a verified write waiting to be copied (see below)
//	_staging/<id>/upload         marks a staged upload
//	_staging/<id>/<offset>       its chunks, offset zero-padded to 20 digits
//	_marker                      which database the backend belongs to
//
// The representation is one user-metadata header on the object,
// x-amz-meta-blobplane-repr: zstd:4096:16384, set in the same request that
// makes the object visible (PutObject, CompleteMultipartUpload or
// CopyObject), so payload and representation form one object version (S7,
// ADR-00018) and `aws s3api head-object` shows it.
//
// Nothing appears at a content-addressed key before the content verified
// (S2): a body up to PartSize is hashed while it is buffered and PUT only
// when it matched; a larger body goes through a multipart upload that is
// completed only when it matched (aborted otherwise). When the
// representation cannot be named before the bytes arrive (compressing on the
// way in, or a zstd body without a declared payload size) the multipart
// upload goes to a _tmp key and a server-side copy, which sets the metadata,
// publishes it. Crashes can leave _tmp objects, staged uploads and
// incomplete multipart uploads behind: the inventory reclaims them past a
// minimum age (janitor.go, backend.Janitor); the _marker object names the
// database the bucket (under the prefix) belongs to.
package s3

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// MetaRepr is the user-metadata key carrying the representation
// (x-amz-meta-blobplane-repr on the wire).
const MetaRepr = "blobplane-repr"

// DefaultPartSize is the multipart part size and the single-PUT threshold.
const DefaultPartSize = 16 << 20

// maxCopySize is the largest object one CopyObject may copy; larger ones
// are copied part by part.
const maxCopySize = 5 << 30

func init() {
	backend.Register(backend.KindS3, func(ctx context.Context, spec backend.Spec) (backend.Backend, error) {
		return Open(ctx, spec.S3, spec.Store)
	})
}

// Backend stores objects in one S3 bucket.
type Backend struct {
	client    *s3.Client
	transport *http.Transport
	bucket    string
	prefix    string
	policy    backend.StorePolicy
	partSize  int64
	// copyLimit and copyPartSize shape server-side copies (tests shrink
	// them to exercise the part-by-part path).
	copyLimit    int64
	copyPartSize int64
}

var _ backend.Backend = (*Backend)(nil)

// Open builds an S3 backend. Credentials are the static keys in cfg when
// given, otherwise the standard AWS chain (environment, shared config and
// credentials files, web identity, IMDS). It does not contact the store;
// the first request does.
func Open(ctx context.Context, cfg backend.S3Config, policy backend.StorePolicy) (*Backend, error) {
	const op = "s3.Open"
	if policy == "" {
		policy = backend.StoreAsSubmitted
	}
	switch policy {
	case backend.StoreAsSubmitted, backend.StoreZstd, backend.StoreIdentity:
	default:
		return nil, backend.Invalid(op, "store policy %q: want as-submitted, zstd or identity", policy)
	}
	if cfg.Bucket == "" {
		return nil, backend.Invalid(op, "no bucket")
	}
	var opts []func(*config.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, backend.Invalid(op, "aws configuration: %v", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	// Take the transport the AWS config built (it honours AWS_CA_BUNDLE
	// and proxies) and keep a handle on it, so Close can drop idle
	// connections and goroutines.
	var transport *http.Transport
	if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
		transport = bc.GetTransport()
		transport.MaxIdleConns = 256
		transport.MaxIdleConnsPerHost = 64
		// A store that accepts a connection but never answers must not
		// hang a request forever.
		transport.ResponseHeaderTimeout = 60 * time.Second
		awsCfg.HTTPClient = &http.Client{
			Transport: transport,
			// Like the SDK's own client: hand redirects back, never follow.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// Integrity is Blobplane's own: content is sha256-verified before
		// it becomes visible. Optional SDK checksums would also force
		// per-part checksums into CompleteMultipartUpload.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	partSize := cfg.PartSize
	if partSize <= 0 {
		partSize = DefaultPartSize
	}
	return &Backend{
		client: client, transport: transport,
		bucket: cfg.Bucket, prefix: cfg.Prefix, policy: policy,
		partSize: partSize, copyLimit: maxCopySize, copyPartSize: 1 << 30,
	}, nil
}

// Close drops idle connections.
func (b *Backend) Close() error {
	if b.transport != nil {
		b.transport.CloseIdleConnections()
	}
	return nil
}

// Key returns the content-addressed key of d (with the backend's prefix).
func (b *Backend) Key(d blobplane.Digest) string { return b.prefix + "sha256/" + d.Hex() }

func (b *Backend) stagingPrefix(id string) string { return b.prefix + "_staging/" + id + "/" }

// Write implements backend.Backend.
func (b *Backend) Write(ctx context.Context, req backend.WriteRequest) (backend.Info, error) {
	const op = "s3.Write"
	if err := backend.ValidDigest(op, req.Digest); err != nil {
		return backend.Info{}, err
	}
	in, err := backend.ParseCodec(string(req.Codec))
	if err != nil {
		return backend.Info{}, err
	}
	req.Codec = in
	if req.BeforeVisible != nil {
		// Parts of a direct multipart upload live under the final key
		// before its completion: the hook goes first, not in between.
		if err := req.BeforeVisible(); err != nil {
			return backend.Info{}, err
		}
	}
	out := backend.StoredCodec(b.policy, in)
	key := b.Key(req.Digest)
	known, direct := backend.PayloadKnown(req, out)

	// With the representation known up front a multipart upload can go
	// straight to the content-addressed key: its metadata is fixed at
	// creation and it only becomes visible on completion.
	u := &upload{b: b, ctx: ctx, key: key}
	if direct {
		u.meta = reprMeta(known)
	} else {
		u.key = b.prefix + "_tmp/" + randHex(16)
	}
	repr, err := backend.Encode(ctx, u, req, out)
	if err != nil {
		u.abort()
		return backend.Info{}, classify(op, err)
	}
	if direct && repr != known {
		// Encode verified sizes, so this is a bug, never a client error.
		u.abort()
		return backend.Info{}, blobplane.Errorf(blobplane.CodeInternal, "%s: stored %v, announced %v", req.Digest, repr, known)
	}
	if !u.multipart() {
		// Verified and still in memory: one PUT to the final key with its
		// metadata, whichever path we were on.
		u.key, u.meta = key, reprMeta(repr)
		if err := u.finish(); err != nil {
			return backend.Info{}, classify(op, err)
		}
		return backend.Info{Digest: req.Digest, Repr: repr}, nil
	}
	if err := u.finish(); err != nil {
		u.abort()
		return backend.Info{}, classify(op, err)
	}
	if !direct {
		// Publish the verified temp object with its representation in one
		// server-side copy, then drop the temp.
		err := b.copyObject(ctx, u.key, key, repr)
		b.deleteQuietly(u.key)
		if err != nil {
			return backend.Info{}, classify(op, err)
		}
	}
	return backend.Info{Digest: req.Digest, Repr: repr}, nil
}

func reprMeta(r backend.Representation) map[string]string {
	return map[string]string{MetaRepr: r.String()}
}

func (b *Backend) deleteQuietly(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &key})
}

// copyObject copies src to dst with repr as dst's metadata, atomically at
// dst: CopyObject up to 5 GiB, a multipart copy (completed in one request)
// beyond.
func (b *Backend) copyObject(ctx context.Context, src, dst string, repr backend.Representation) error {
	source := b.bucket + "/" + url.PathEscape(src)
	source = strings.ReplaceAll(source, "%2F", "/")
	if repr.PayloadSize <= b.copyLimit {
		_, err := b.client.CopyObject(ctx, &s3.CopyObjectInput{
			Bucket: &b.bucket, Key: &dst, CopySource: &source,
			Metadata: reprMeta(repr), MetadataDirective: types.MetadataDirectiveReplace,
		})
		return err
	}
	mpu, err := b.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &b.bucket, Key: &dst, Metadata: reprMeta(repr)})
	if err != nil {
		return err
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = b.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &b.bucket, Key: &dst, UploadId: mpu.UploadId})
	}
	var parts []types.CompletedPart
	for off, n := int64(0), int32(1); off < repr.PayloadSize; off, n = off+b.copyPartSize, n+1 {
		end := min(off+b.copyPartSize, repr.PayloadSize) - 1
		res, err := b.client.UploadPartCopy(ctx, &s3.UploadPartCopyInput{
			Bucket: &b.bucket, Key: &dst, UploadId: mpu.UploadId, PartNumber: aws.Int32(n),
			CopySource: &source, CopySourceRange: aws.String(fmt.Sprintf("bytes=%d-%d", off, end)),
		})
		if err != nil {
			abort()
			return err
		}
		parts = append(parts, types.CompletedPart{ETag: res.CopyPartResult.ETag, PartNumber: aws.Int32(n)})
	}
	_, err = b.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &b.bucket, Key: &dst, UploadId: mpu.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		abort()
	}
	return err
}

// upload is an io.Writer that turns a stream into one object: it buffers up
// to one part; if the stream ends within it, finish PUTs the buffer,
// otherwise it becomes a multipart upload. Parts are double-buffered: one
// uploads in the background while the next fills, so hashing and upload
// overlap, and a write holds at most two parts in memory.
type upload struct {
	b           *Backend
	ctx         context.Context
	key         string
	meta        map[string]string
	ifNoneMatch bool // create-only (staged chunks)

	buf      []byte
	spare    []byte
	n        int64
	uploadID *string
	parts    []types.CompletedPart
	next     int32

	inflight    chan partResult // the part uploading in the background
	inflightBuf []byte
}

type partResult struct {
	part types.CompletedPart
	err  error
}

func (u *upload) multipart() bool { return u.uploadID != nil }

func (u *upload) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if int64(len(u.buf)) == u.b.partSize {
			if err := u.flushPart(true); err != nil {
				return written, &backend.SinkError{Err: err}
			}
		}
		if u.buf == nil {
			u.buf = make([]byte, 0, min(u.b.partSize, 1<<20))
		}
		k := min(int(u.b.partSize)-len(u.buf), len(p))
		u.buf = append(u.buf, p[:k]...)
		p = p[k:]
		written += k
		u.n += int64(k)
	}
	return written, nil
}

// wait collects the part uploading in the background, if any, and frees its
// buffer for reuse.
func (u *upload) wait() error {
	if u.inflight == nil {
		return nil
	}
	r := <-u.inflight
	u.inflight = nil
	u.spare, u.inflightBuf = u.inflightBuf[:0], nil
	if r.err != nil {
		return r.err
	}
	u.parts = append(u.parts, r.part)
	return nil
}

// flushPart uploads the buffer as the next part, in the background when
// async (the caller keeps filling the other buffer).
func (u *upload) flushPart(async bool) error {
	if u.uploadID == nil {
		res, err := u.b.client.CreateMultipartUpload(u.ctx, &s3.CreateMultipartUploadInput{
			Bucket: &u.b.bucket, Key: &u.key, Metadata: u.meta,
		})
		if err != nil {
			return err
		}
		u.uploadID = res.UploadId
	}
	if err := u.wait(); err != nil {
		return err
	}
	u.next++
	num, body := aws.Int32(u.next), u.buf
	send := func() partResult {
		res, err := u.b.client.UploadPart(u.ctx, &s3.UploadPartInput{
			Bucket: &u.b.bucket, Key: &u.key, UploadId: u.uploadID, PartNumber: num,
			Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
		})
		if err != nil {
			return partResult{err: err}
		}
		return partResult{part: types.CompletedPart{ETag: res.ETag, PartNumber: num}}
	}
	if !async {
		r := send()
		if r.err != nil {
			return r.err
		}
		u.parts = append(u.parts, r.part)
		u.buf = u.buf[:0]
		return nil
	}
	ch := make(chan partResult, 1)
	u.inflight, u.inflightBuf = ch, body
	go func() { ch <- send() }()
	u.buf, u.spare = u.spare, nil
	return nil
}

// finish makes the object visible: one PUT, or the last part and the
// completion of the multipart upload.
func (u *upload) finish() error {
	if u.uploadID == nil {
		in := &s3.PutObjectInput{
			Bucket: &u.b.bucket, Key: &u.key, Metadata: u.meta,
			Body: bytes.NewReader(u.buf), ContentLength: aws.Int64(int64(len(u.buf))),
		}
		if u.ifNoneMatch {
			in.IfNoneMatch = aws.String("*")
		}
		_, err := u.b.client.PutObject(u.ctx, in)
		u.buf = nil
		return err
	}
	if err := u.wait(); err != nil {
		return err
	}
	if len(u.buf) > 0 || len(u.parts) == 0 {
		if err := u.flushPart(false); err != nil {
			return err
		}
	}
	in := &s3.CompleteMultipartUploadInput{
		Bucket: &u.b.bucket, Key: &u.key, UploadId: u.uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: u.parts},
	}
	if u.ifNoneMatch {
		in.IfNoneMatch = aws.String("*")
	}
	_, err := u.b.client.CompleteMultipartUpload(u.ctx, in)
	u.buf, u.spare = nil, nil
	return err
}

// abort discards a multipart upload in progress, so a failed write leaves
// nothing behind (not even invisible parts). It waits for a background part
// first, so no goroutine outlives the write.
func (u *upload) abort() {
	_ = u.wait()
	u.buf, u.spare = nil, nil
	if u.uploadID == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(u.ctx), 30*time.Second)
	defer cancel()
	_, _ = u.b.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &u.b.bucket, Key: &u.key, UploadId: u.uploadID})
	u.uploadID = nil
}

func parseReprMeta(op string, d blobplane.Digest, meta map[string]string, length *int64, wantLength func(backend.Representation) int64) (backend.Representation, error) {
	text, ok := meta[MetaRepr]
	if !ok {
		return backend.Representation{}, backend.Corrupt(op, d, "no %s metadata", MetaRepr)
	}
	repr, err := backend.ParseRepresentation(text)
	if err != nil {
		return backend.Representation{}, backend.Corrupt(op, d, "%s metadata: %v", MetaRepr, err)
	}
	if length != nil && *length != wantLength(repr) {
		return backend.Representation{}, backend.Corrupt(op, d, "object holds %d bytes, representation %s says %d", *length, repr, wantLength(repr))
	}
	return repr, nil
}

func payloadSize(r backend.Representation) int64 { return r.PayloadSize }

// Read implements backend.Backend. Headers and body come from one GetObject
// response, so the representation is that of the bytes being streamed.
//
// A content range of an identity object is one ranged GET. The first GET
// cannot know the codec, so it asks for the range optimistically; when the
// response says zstd, the range addressed payload bytes and is dropped, and
// a whole-object GET is decoded from the start instead (the zstd slow path).
func (b *Backend) Read(ctx context.Context, d blobplane.Digest, opts backend.ReadOptions) (*backend.Object, error) {
	const op = "s3.Read"
	if err := backend.ValidDigest(op, d); err != nil {
		return nil, err
	}
	if rg := opts.Range; rg != nil {
		if rg.Offset < 0 || rg.Length <= 0 {
			return nil, backend.RangeInvalid(op, "range offset %d length %d: want offset >= 0 and length > 0", rg.Offset, rg.Length)
		}
		obj, err := b.readIdentityRange(ctx, op, d, opts)
		if obj != nil || err != nil {
			return obj, err
		}
	}
	key := b.Key(d)
	res, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		return nil, classifyKey(op, d, err)
	}
	repr, err := parseReprMeta(op, d, res.Metadata, res.ContentLength, payloadSize)
	if err != nil {
		res.Body.Close()
		return nil, err
	}
	var payload io.Reader = res.Body
	if repr.Codec == backend.CodecIdentity && opts.Range != nil {
		// A racing writer replaced the zstd object seen by the ranged GET
		// with an identity one: skip to the range in this body.
		if _, _, err := backend.CheckRange(op, opts.Range, repr.ContentSize); err != nil {
			res.Body.Close()
			return nil, err
		}
		if _, err := io.CopyN(io.Discard, res.Body, opts.Range.Offset); err != nil {
			res.Body.Close()
			return nil, classifyKey(op, d, err)
		}
	}
	return backend.DecodeBody(op, d, &bodyReader{op: op, d: d, r: payload}, res.Body.Close, repr, opts)
}

// readIdentityRange serves a range with one ranged GET when the object is
// identity; it returns (nil, nil) when the object is zstd.
func (b *Backend) readIdentityRange(ctx context.Context, op string, d blobplane.Digest, opts backend.ReadOptions) (*backend.Object, error) {
	rg := opts.Range
	key := b.Key(d)
	res, err := b.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: &b.bucket, Key: &key,
		Range: aws.String(fmt.Sprintf("bytes=%d-%d", rg.Offset, rg.Offset+rg.Length-1)),
	})
	if err != nil {
		err = classifyKey(op, d, err)
		if !errors.Is(err, backend.ErrRangeInvalid) {
			return nil, err
		}
		// The range starts past the payload's end. For identity that is
		// past the content's end too; a zstd payload is shorter than its
		// content, so ask what the object is.
		info, serr := b.Stat(ctx, d)
		if serr != nil {
			return nil, serr
		}
		if info.Repr.Codec == backend.CodecIdentity {
			if _, _, err := backend.CheckRange(op, rg, info.Repr.ContentSize); err != nil {
				return nil, err
			}
		}
		// zstd, or replaced meanwhile: the whole-object path re-checks the
		// range against whatever version it gets.
		return nil, nil
	}
	repr, err := parseReprMeta(op, d, res.Metadata, nil, nil)
	if err != nil {
		res.Body.Close()
		return nil, err
	}
	if repr.Codec != backend.CodecIdentity {
		res.Body.Close()
		return nil, nil
	}
	if _, _, err := backend.CheckRange(op, rg, repr.ContentSize); err != nil {
		res.Body.Close()
		return nil, err
	}
	if res.ContentLength == nil || *res.ContentLength != rg.Length {
		res.Body.Close()
		return nil, backend.Corrupt(op, d, "ranged GET returned %v bytes, want %d", aws.ToInt64(res.ContentLength), rg.Length)
	}
	return backend.DecodeBody(op, d, &bodyReader{op: op, d: d, r: res.Body}, res.Body.Close, repr, opts)
}

// bodyReader classifies failures of a response body mid-stream.
type bodyReader struct {
	op string
	d  blobplane.Digest
	r  io.Reader
}

func (r *bodyReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = backend.Unavailable(r.op, err, "reading %s: %v", r.d, err)
	}
	return n, err
}

// Stat implements backend.Backend with one HeadObject.
func (b *Backend) Stat(ctx context.Context, d blobplane.Digest) (backend.Info, error) {
	const op = "s3.Stat"
	if err := backend.ValidDigest(op, d); err != nil {
		return backend.Info{}, err
	}
	key := b.Key(d)
	res, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		return backend.Info{}, classifyKey(op, d, err)
	}
	repr, err := parseReprMeta(op, d, res.Metadata, res.ContentLength, payloadSize)
	if err != nil {
		return backend.Info{}, err
	}
	return backend.Info{Digest: d, Repr: repr}, nil
}

// Delete implements backend.Backend. S3 deletes are idempotent already.
func (b *Backend) Delete(ctx context.Context, d blobplane.Digest) error {
	const op = "s3.Delete"
	if err := backend.ValidDigest(op, d); err != nil {
		return err
	}
	key := b.Key(d)
	if _, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &key}); err != nil {
		err = classifyKey(op, d, err)
		if errors.Is(err, backend.ErrNotFound) {
			return nil
		}
		return err
	}
	return nil
}

// List implements backend.Backend with ListObjectsV2 (keys come back in
// order, so the digest cursor maps onto StartAfter).
func (b *Backend) List(ctx context.Context, opts backend.ListOptions) (backend.Page, error) {
	const op = "s3.List"
	limit := opts.Limit
	if limit <= 0 {
		limit = backend.DefaultListLimit
	}
	prefix := b.prefix + "sha256/"
	var startAfter string
	if opts.After != "" {
		if err := backend.ValidDigest(op, opts.After); err != nil {
			return backend.Page{}, err
		}
		startAfter = b.Key(opts.After)
	}
	var page backend.Page
	for {
		res, err := b.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
			Bucket: &b.bucket, Prefix: &prefix, StartAfter: aws.String(startAfter),
			MaxKeys: aws.Int32(int32(min(limit-len(page.Entries)+1, 1000))),
		})
		if err != nil {
			return backend.Page{}, classify(op, err)
		}
		if page.Now.IsZero() {
			page.Now = serverTime(res.ResultMetadata)
		}
		for _, o := range res.Contents {
			k := aws.ToString(o.Key)
			startAfter = k
			d, err := blobplane.ParseDigest(blobplane.DigestPrefix + strings.TrimPrefix(k, prefix))
			if err != nil {
				continue // not ours
			}
			if len(page.Entries) == limit {
				page.Next = page.Entries[limit-1].Digest
				return page, nil
			}
			page.Entries = append(page.Entries, backend.Entry{Digest: d, StoredSize: aws.ToInt64(o.Size), Modified: aws.ToTime(o.LastModified)})
		}
		if !aws.ToBool(res.IsTruncated) || len(res.Contents) == 0 {
			return page, nil
		}
	}
}

// classifyKey maps S3 errors for one digest's key.
func classifyKey(op string, d blobplane.Digest, err error) error {
	err = classify(op, err)
	if errors.Is(err, backend.ErrNotFound) {
		return backend.NotFound(op, d)
	}
	return err
}

// classify maps S3 errors onto the backend taxonomy.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *backend.SinkError
	if errors.As(err, &se) {
		err = se.Err
	}
	var be *blobplane.Error
	if errors.As(err, &be) {
		return err
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound", "NoSuchUpload":
			return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: ae.ErrorMessage(), Err: err}
		case "InvalidRange":
			return backend.RangeInvalid(op, "range outside the object")
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccountProblem",
			"NoSuchBucket", "InvalidBucketName", "EntityTooLarge", "InvalidObjectState", "AllAccessDisabled":
			return backend.Refused(op, err, "s3 refused: %s", ae.ErrorCode())
		case "PreconditionFailed", "ConditionalRequestConflict":
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: "s3: " + ae.ErrorCode(), Err: err}
		}
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		switch code := re.HTTPStatusCode(); {
		case code == http.StatusNotFound:
			return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "no such object", Err: err}
		case code == http.StatusRequestedRangeNotSatisfiable:
			return backend.RangeInvalid(op, "range outside the object")
		case code == http.StatusForbidden || code == http.StatusUnauthorized || code == http.StatusRequestEntityTooLarge:
			return backend.Refused(op, err, "s3 refused: HTTP %d", code)
		case code == http.StatusPreconditionFailed:
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: "s3: precondition failed", Err: err}
		}
	}
	// Network errors, 5xx, throttling, timeouts, cancellation: retryable.
	return backend.Unavailable(op, err, "s3: %v", err)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// --- staging ---

const markerName = "upload"

// CreateUpload implements backend.Stager: an empty marker object names the
// upload, so it exists (with size 0) before any chunk.
func (b *Backend) CreateUpload(ctx context.Context) (string, error) {
	const op = "s3.CreateUpload"
	id := randHex(16)
	key := b.stagingPrefix(id) + markerName
	if _, err := b.client.PutObject(ctx, &s3.PutObjectInput{Bucket: &b.bucket, Key: &key, Body: bytes.NewReader(nil), ContentLength: aws.Int64(0)}); err != nil {
		return "", classify(op, err)
	}
	return id, nil
}

type chunk struct {
	key  string
	off  int64
	size int64
}

// chunks lists a staged upload's chunks in offset order and returns its
// size: the length of the contiguous run from offset 0.
func (b *Backend) chunks(ctx context.Context, op, id string) ([]chunk, int64, error) {
	if err := backend.ValidUploadID(op, id); err != nil {
		return nil, 0, err
	}
	prefix := b.stagingPrefix(id)
	var chunks []chunk
	marker := false
	var token *string
	for {
		res, err := b.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: &prefix, ContinuationToken: token})
		if err != nil {
			return nil, 0, classify(op, err)
		}
		for _, o := range res.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), prefix)
			if name == markerName {
				marker = true
				continue
			}
			off, err := strconv.ParseInt(name, 10, 64)
			if err != nil || len(name) != 20 {
				continue
			}
			chunks = append(chunks, chunk{key: aws.ToString(o.Key), off: off, size: aws.ToInt64(o.Size)})
		}
		if !aws.ToBool(res.IsTruncated) {
			break
		}
		token = res.NextContinuationToken
	}
	if !marker {
		return nil, 0, &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "upload " + id + ": no such staged upload"}
	}
	slices.SortFunc(chunks, func(a, b chunk) int { return cmp.Compare(a.off, b.off) })
	var size int64
	for i, c := range chunks {
		if c.off != size {
			chunks = chunks[:i]
			break
		}
		size += c.size
	}
	return chunks, size, nil
}

// AppendUpload implements backend.Stager. Each chunk is one object written
// create-only (If-None-Match: *), so two appends racing for one offset
// cannot both land; a chunk interrupted mid-body leaves nothing.
func (b *Backend) AppendUpload(ctx context.Context, id string, offset int64, r io.Reader) (int64, error) {
	const op = "s3.AppendUpload"
	_, size, err := b.chunks(ctx, op, id)
	if err != nil {
		return 0, err
	}
	if offset != size {
		return size, backend.RangeInvalid(op, "upload %s: append at offset %d, but it holds %d bytes", id, offset, size)
	}
	u := &upload{b: b, ctx: ctx, key: fmt.Sprintf("%s%020d", b.stagingPrefix(id), offset), ifNoneMatch: true}
	src := &backend.SourceReader{R: backend.CtxReader(ctx, r)}
	if _, err := io.Copy(u, src); err != nil {
		u.abort()
		if src.Err != nil {
			return size, backend.Unavailable(op, src.Err, "upload %s: request body failed: %v", id, src.Err)
		}
		return size, classify(op, err)
	}
	if u.n == 0 {
		u.abort()
		return size, nil
	}
	if err := u.finish(); err != nil {
		u.abort()
		err = classify(op, err)
		if errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
			return size, backend.RangeInvalid(op, "upload %s: another append at offset %d won", id, offset)
		}
		return size, err
	}
	return size + u.n, nil
}

// UploadSize implements backend.Stager.
func (b *Backend) UploadSize(ctx context.Context, id string) (int64, error) {
	_, size, err := b.chunks(ctx, "s3.UploadSize", id)
	return size, err
}

// PromoteUpload implements backend.Stager: the chunks are streamed back in
// order through the same verifying write as Write, then deleted.
func (b *Backend) PromoteUpload(ctx context.Context, id string, req backend.WriteRequest) (backend.Info, error) {
	const op = "s3.PromoteUpload"
	chunks, _, err := b.chunks(ctx, op, id)
	if err != nil {
		return backend.Info{}, err
	}
	cr := &chunkReader{ctx: ctx, b: b, chunks: chunks}
	defer cr.close()
	req.Body = cr
	info, err := b.Write(ctx, req)
	if err != nil {
		return backend.Info{}, err
	}
	return info, b.deleteStaged(ctx, op, id)
}

// chunkReader concatenates staged chunks, opening one GET at a time.
type chunkReader struct {
	ctx    context.Context
	b      *Backend
	chunks []chunk
	cur    io.ReadCloser
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for {
		if c.cur == nil {
			if len(c.chunks) == 0 {
				return 0, io.EOF
			}
			key := c.chunks[0].key
			c.chunks = c.chunks[1:]
			res, err := c.b.client.GetObject(c.ctx, &s3.GetObjectInput{Bucket: &c.b.bucket, Key: &key})
			if err != nil {
				return 0, classify("s3.PromoteUpload", err)
			}
			c.cur = res.Body
		}
		n, err := c.cur.Read(p)
		if err == io.EOF {
			c.cur.Close()
			c.cur = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (c *chunkReader) close() {
	if c.cur != nil {
		c.cur.Close()
	}
}

func (b *Backend) deleteStaged(ctx context.Context, op, id string) error {
	prefix := b.stagingPrefix(id)
	var token *string
	for {
		res, err := b.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: &prefix, ContinuationToken: token})
		if err != nil {
			return classify(op, err)
		}
		// Chunks first, marker last: an interrupted abort leaves an upload
		// that still exists rather than orphaned chunks.
		var ids []types.ObjectIdentifier
		var marker *string
		for _, o := range res.Contents {
			if strings.TrimPrefix(aws.ToString(o.Key), prefix) == markerName {
				marker = o.Key
				continue
			}
			ids = append(ids, types.ObjectIdentifier{Key: o.Key})
		}
		if len(ids) > 0 {
			if _, err := b.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: &b.bucket, Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)}}); err != nil {
				return classify(op, err)
			}
		}
		if marker != nil {
			if _, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: marker}); err != nil {
				return classify(op, err)
			}
		}
		if !aws.ToBool(res.IsTruncated) {
			return nil
		}
		token = res.NextContinuationToken
	}
}

// AbortUpload implements backend.Stager.
func (b *Backend) AbortUpload(ctx context.Context, id string) error {
	const op = "s3.AbortUpload"
	if err := backend.ValidUploadID(op, id); err != nil {
		return err
	}
	return b.deleteStaged(ctx, op, id)
}
