package s3_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/s3"
	"github.com/blobplane/blobplane/internal/minio"
)

// TestMain stops the shared MinIO server after the tests (minio.Main) and
// then fails the package if any goroutine outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(minioMain{m}) }

// minioMain runs the tests through minio.Main, so goleak checks after the
// shared server is stopped.
type minioMain struct{ m *testing.M }

func (w minioMain) Run() int { return minio.Main(w.m) }

// testPartSize is S3's minimum part size, so multipart paths run with
// blobs of a few MiB.
const testPartSize = 5 << 20

type bucket struct {
	srv  *minio.Server
	name string
}

func open(t testing.TB, bk bucket, policy backend.StorePolicy) *s3.Backend {
	t.Helper()
	b, err := s3.Open(t.Context(), backend.S3Config{
		Bucket: bk.name, Endpoint: bk.srv.Endpoint, Region: minio.Region, PathStyle: true,
		AccessKeyID: bk.srv.AccessKey, SecretAccessKey: bk.srv.SecretKey, PartSize: testPartSize,
	}, policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func newS3(t *testing.T, policy backend.StorePolicy) backend.Backend {
	srv := minio.Shared(t)
	return open(t, bucket{srv: srv, name: srv.Bucket(t)}, policy)
}

func TestConformance(t *testing.T) {
	var buckets sync.Map // backend.Backend → bucket
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T, policy backend.StorePolicy) backend.Backend {
			srv := minio.Shared(t)
			bk := bucket{srv: srv, name: srv.Bucket(t)}
			b := open(t, bk, policy)
			buckets.Store(backend.Backend(b), bk)
			return b
		},
		Reopen: func(t *testing.T, old backend.Backend) backend.Backend {
			bk, _ := buckets.Load(old)
			return open(t, bk.(bucket), backend.StoreAsSubmitted)
		},
	})
}

func rawClient(b *s3.Backend) *awss3.Client { return b.Client().(*awss3.Client) }

// requireNoLeftovers checks a bucket holds no temp objects and no
// incomplete multipart uploads: failed and finished writes clean up.
func requireNoLeftovers(t *testing.T, b *s3.Backend, bucketName string) {
	t.Helper()
	c := rawClient(b)
	mpus, err := c.ListMultipartUploads(t.Context(), &awss3.ListMultipartUploadsInput{Bucket: &bucketName})
	if err != nil {
		t.Fatal(err)
	}
	if len(mpus.Uploads) != 0 {
		t.Fatalf("%d multipart uploads left in progress", len(mpus.Uploads))
	}
	objs, err := c.ListObjectsV2(t.Context(), &awss3.ListObjectsV2Input{Bucket: &bucketName, Prefix: aws.String("_tmp/")})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Contents) != 0 {
		t.Fatalf("%d temp objects left", len(objs.Contents))
	}
}

// TestRepresentationIsObjectMetadata: the representation is one plain-text
// user-metadata header, legible with `aws s3api head-object` (ADR-00018).
func TestRepresentationIsObjectMetadata(t *testing.T) {
	srv := minio.Shared(t)
	bk := bucket{srv: srv, name: srv.Bucket(t)}
	b := open(t, bk, backend.StoreAsSubmitted)
	blob := backendtest.NewBlob(1, 16384)
	info := backendtest.MustWrite(t, b, blob.ZstdRequest())
	head, err := rawClient(b).HeadObject(t.Context(), &awss3.HeadObjectInput{Bucket: &bk.name, Key: aws.String("sha256/" + blob.Digest.Hex())})
	if err != nil {
		t.Fatal(err)
	}
	if got := head.Metadata["blobplane-repr"]; got != info.Repr.String() || !strings.HasPrefix(got, "zstd:") {
		t.Fatalf("x-amz-meta-blobplane-repr = %q, want %q", got, info.Repr)
	}
	if aws.ToInt64(head.ContentLength) != int64(len(blob.Zstd)) {
		t.Fatalf("object body is %d bytes, want the %d-byte payload", aws.ToInt64(head.ContentLength), len(blob.Zstd))
	}
}

func randomBlob(t *testing.T, size int) backendtest.Blob {
	content := make([]byte, size)
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	return backendtest.Blob{Content: content, Digest: backendtest.DigestOf(content), Zstd: backendtest.Zstd(content)}
}

// TestMultipart covers every way a body larger than a part becomes an
// object, and that a mismatch on each leaves nothing visible (S2) and no
// leftovers.
func TestMultipart(t *testing.T) {
	blob := randomBlob(t, 2*testPartSize+12345) // incompressible: the zstd payload is multipart too
	declared := func() backend.WriteRequest {
		r := blob.ZstdRequest()
		r.PayloadSize = int64(len(blob.Zstd))
		return r
	}
	cases := []struct {
		name       string
		policy     backend.StorePolicy
		req        func() backend.WriteRequest
		partCopies bool
	}{
		{"identity straight to the key", backend.StoreAsSubmitted, blob.Identity, false},
		{"declared zstd straight to the key", backend.StoreAsSubmitted, declared, false},
		{"undeclared zstd via temp and copy", backend.StoreAsSubmitted, blob.ZstdRequest, false},
		{"compressing via temp and copy", backend.StoreZstd, blob.Identity, false},
		{"decoding via temp and copy", backend.StoreIdentity, blob.ZstdRequest, false},
		{"compressing via temp and part copies", backend.StoreZstd, blob.Identity, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			srv := minio.Shared(t)
			bk := bucket{srv: srv, name: srv.Bucket(t)}
			b := open(t, bk, c.policy)
			if c.partCopies {
				s3.SetCopyLimits(b, 1, testPartSize)
			}
			bad := c.req()
			bad.Digest = backendtest.NewBlob(2, 10).Digest
			if _, err := b.Write(ctx, bad); !errors.Is(err, backend.ErrMismatch) {
				t.Fatalf("mismatching write: %v", err)
			}
			backendtest.RequireAbsent(t, b, bad.Digest)
			requireNoLeftovers(t, b, bk.name)

			info := backendtest.MustWrite(t, b, c.req())
			requireNoLeftovers(t, b, bk.name)
			obj, body, err := backendtest.ReadAll(ctx, b, blob.Digest, backend.ReadOptions{})
			if err != nil || !bytes.Equal(body, blob.Content) || obj.Repr != info.Repr {
				t.Fatalf("read back: %d bytes, repr %v (wrote %v), %v", len(body), obj.Repr, info.Repr, err)
			}
			rg := backend.Range{Offset: int64(len(blob.Content)) - 100, Length: 100}
			_, body, err = backendtest.ReadAll(ctx, b, blob.Digest, backend.ReadOptions{Range: &rg})
			if err != nil || !bytes.Equal(body, blob.Content[rg.Offset:]) {
				t.Fatalf("last 100 bytes: %v", err)
			}
		})
	}
}

// TestStagedLargeChunk: a chunk bigger than a part is a multipart object
// of its own.
func TestStagedLargeChunk(t *testing.T) {
	ctx := t.Context()
	b := newS3(t, backend.StoreAsSubmitted)
	blob := randomBlob(t, testPartSize+1000)
	id, err := b.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.AppendUpload(ctx, id, 0, bytes.NewReader(blob.Content[:100])); err != nil || n != 100 {
		t.Fatalf("append: %d, %v", n, err)
	}
	if n, err := b.AppendUpload(ctx, id, 100, bytes.NewReader(blob.Content[100:])); err != nil || n != int64(len(blob.Content)) {
		t.Fatalf("append big chunk: %d, %v", n, err)
	}
	if _, err := b.PromoteUpload(ctx, id, backend.WriteRequest{Digest: blob.Digest, Size: int64(len(blob.Content))}); err != nil {
		t.Fatal(err)
	}
	_, body, err := backendtest.ReadAll(ctx, b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("read promoted: %v", err)
	}
}

func TestOpenViaSpec(t *testing.T) {
	srv := minio.Shared(t)
	specs, err := backend.ParseSpecs("fs=filesystem:" + t.TempDir() + ",s3main=" + srv.Spec(srv.Bucket(t), "store=zstd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range specs {
		b, err := backend.Open(t.Context(), spec)
		if err != nil && strings.Contains(err.Error(), "not compiled") && spec.Kind == backend.KindFilesystem {
			continue // this test binary links only the s3 kind
		}
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		blob := backendtest.NewBlob(3, 5000)
		if info := backendtest.MustWrite(t, b, blob.Identity()); info.Repr.Codec != backend.CodecZstd {
			t.Fatalf("store=zstd stored %v", info.Repr)
		}
	}
}

// TestRefusedAndUnavailable: the errors say whether retrying can help.
func TestRefusedAndUnavailable(t *testing.T) {
	ctx := t.Context()
	srv := minio.Shared(t)
	blob := backendtest.NewBlob(4, 100)

	wrongKey, err := s3.Open(ctx, backend.S3Config{Bucket: srv.Bucket(t), Endpoint: srv.Endpoint, Region: minio.Region, PathStyle: true,
		AccessKeyID: "nobody", SecretAccessKey: "wrong-secret"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer wrongKey.Close()
	_, err = wrongKey.Write(ctx, blob.Identity())
	backendtest.RequireCode(t, err, backend.ErrRefused, false)

	noBucket := open(t, bucket{srv: srv, name: "no-such-bucket"}, "")
	_, err = noBucket.Write(ctx, blob.Identity())
	backendtest.RequireCode(t, err, backend.ErrRefused, false)

	// Nothing listens on a port we just closed.
	down, err := s3.Open(ctx, backend.S3Config{Bucket: "b-down", Endpoint: "http://127.0.0.1:1", Region: minio.Region, PathStyle: true,
		AccessKeyID: "a", SecretAccessKey: "b"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	_, err = down.Stat(ctx, blob.Digest)
	backendtest.RequireCode(t, err, backend.ErrUnavailable, true)
}

const killHelperEnv = "BLOBPLANE_S3_KILL_HELPER_SPEC"

// TestKilledWriter kills a writer process in the middle of a multipart
// write: the content-addressed key stays empty and a re-write succeeds.
func TestKilledWriter(t *testing.T) {
	if os.Getenv(killHelperEnv) != "" {
		t.Skip("running as the helper")
	}
	srv := minio.Shared(t)
	bk := bucket{srv: srv, name: srv.Bucket(t)}
	cmd := backendtest.StartKilledWriter(t, killHelperEnv+"=k="+srv.Spec(bk.name, "part_size="+strconv.Itoa(testPartSize)))
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	b := open(t, bk, backend.StoreAsSubmitted)
	blob := killBlob()
	backendtest.RequireAbsent(t, b, blob.Digest)
	// The killed writer's multipart upload is still open (invisible): it
	// is residue for the inventory (issue 29), dated by its last part, and
	// deleting it aborts it.
	rs, now := backendtest.ListResidue(t, b)
	key := "sha256/" + blob.Digest.Hex()
	r, ok := backendtest.FindResidue(rs, backend.ResidueMultipart, func(name string) bool { return name == key })
	if !ok || len(rs) != 1 || r.UploadID == "" || r.Modified.After(now.Add(time.Second)) {
		t.Fatalf("residue %+v at %v: want the killed writer's multipart upload to %s alone", rs, now, key)
	}
	if err := b.DeleteResidue(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if rs, _ := backendtest.ListResidue(t, b); len(rs) != 0 {
		t.Fatalf("residue after aborting the upload: %+v", rs)
	}
	if err := b.DeleteResidue(t.Context(), r); err != nil {
		t.Fatalf("aborting it again: %v", err)
	}
	// The re-write does not depend on any of it.
	backendtest.MustWrite(t, b, blob.Identity())
	_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
	if err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("re-write read back %d bytes, %v", len(body), err)
	}
}

var killBlobOnce = sync.OnceValue(func() backendtest.Blob { return backendtest.NewBlob(77, 3*testPartSize) })

func killBlob() backendtest.Blob { return killBlobOnce() }

// stallingReader yields its first n bytes, announces the write is under
// way, and blocks until the process is killed.
type stallingReader struct {
	r io.Reader
	n int
}

func (s *stallingReader) Read(p []byte) (int, error) {
	if s.n <= 0 {
		os.Stdout.WriteString("\nWRITING\n")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0, errors.New("stdin closed: parent went away")
	}
	if len(p) > s.n {
		p = p[:s.n]
	}
	n, err := s.r.Read(p)
	s.n -= n
	return n, err
}

func TestKilledWriterHelper(t *testing.T) {
	spec := os.Getenv(killHelperEnv)
	if spec == "" {
		t.Skip("helper for TestKilledWriter")
	}
	specs, err := backend.ParseSpecs(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := backend.Open(t.Context(), specs[0])
	if err != nil {
		t.Fatal(err)
	}
	req := killBlob().Identity()
	// Past the first part: a multipart upload is open when we stall.
	req.Body = &stallingReader{r: req.Body, n: testPartSize + testPartSize/2}
	_, err = b.Write(t.Context(), req)
	t.Fatalf("helper write returned: %v", err)
}

// The inventory's residue under a prefix (issue 29): a _tmp/ object and a
// multipart upload to a key this backend writes are listed and deleted;
// objects, the marker and an incomplete upload to a key outside the
// backend's prefix are not residue and stay.
func TestResidueUnderPrefix(t *testing.T) {
	srv := minio.Shared(t)
	bk := bucket{srv: srv, name: srv.Bucket(t)}
	b, err := s3.Open(t.Context(), backend.S3Config{
		Bucket: bk.name, Prefix: "eu-1/", Endpoint: srv.Endpoint, Region: minio.Region, PathStyle: true,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey, PartSize: testPartSize,
	}, backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx := t.Context()
	c := rawClient(b)
	blob := backendtest.NewBlob(41, 1000)
	backendtest.MustWrite(t, b, blob.Identity())
	if err := b.WriteMarker(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutObject(ctx, &awss3.PutObjectInput{Bucket: &bk.name, Key: aws.String("eu-1/_tmp/0123abcd"), Body: strings.NewReader("left by a crash")}); err != nil {
		t.Fatal(err)
	}
	ours, err := c.CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: &bk.name, Key: aws.String("eu-1/sha256/" + blob.Digest.Hex())})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := c.CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: &bk.name, Key: aws.String("us-1/sha256/" + blob.Digest.Hex())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.AbortMultipartUpload(t.Context(), &awss3.AbortMultipartUploadInput{Bucket: &bk.name, Key: theirs.Key, UploadId: theirs.UploadId})
	})
	rs, now := backendtest.ListResidue(t, b)
	tmp, okT := backendtest.FindResidue(rs, backend.ResidueTemp, func(n string) bool { return n == "_tmp/0123abcd" })
	mpu, okM := backendtest.FindResidue(rs, backend.ResidueMultipart, func(n string) bool { return n == "sha256/"+blob.Digest.Hex() })
	if !okT || !okM || len(rs) != 2 || tmp.Size != int64(len("left by a crash")) || mpu.UploadID != aws.ToString(ours.UploadId) {
		t.Fatalf("residue %+v at %v: want the temp object and the upload under eu-1/ alone", rs, now)
	}
	for _, r := range rs {
		if err := b.DeleteResidue(ctx, r); err != nil {
			t.Fatalf("DeleteResidue %+v: %v", r, err)
		}
	}
	if rs, _ := backendtest.ListResidue(t, b); len(rs) != 0 {
		t.Fatalf("residue after the deletes: %+v", rs)
	}
	if _, err := c.ListParts(ctx, &awss3.ListPartsInput{Bucket: &bk.name, Key: theirs.Key, UploadId: theirs.UploadId}); err != nil {
		t.Fatalf("the upload outside the prefix was touched: %v", err)
	}
	if _, body, err := backendtest.ReadAll(ctx, b, blob.Digest, backend.ReadOptions{}); err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("the object after the residue deletes: %v", err)
	}
	if m, err := b.ReadMarker(ctx); err != nil || string(m) != `{}` {
		t.Fatalf("the marker after the residue deletes: %q, %v", m, err)
	}
}
