package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// minioTarget is a MinIO server (single drive, data under a temp dir)
// reached through the S3 API: path-style, UNSIGNED-PAYLOAD bodies, no SDK
// checksums and no retries, so a request costs what the server makes it
// cost. Objects are keyed by the digest's hex.
type minioTarget struct {
	client *s3.Client
	bucket string
	pid    int // the server's
}

var _ target = (*minioTarget)(nil)

const minioBucket = "bench"

// startMinio starts bin serving dir on free loopback ports and creates the
// bucket. cleanup (set even on error) stops it.
func startMinio(ctx context.Context, bin, dir string, cleanup *cleanups) (*minioTarget, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	user, secret := "bench", "bench-"+hex.EncodeToString(b)
	var pid int
	endpoint, err := retryPort(func(port int) (string, error) {
		console, err := freePort()
		if err != nil {
			return "", err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		p, err := startProc("minio", bin, []string{"server", "--quiet",
			"--address", addr, "--console-address", "127.0.0.1:" + strconv.Itoa(console), dir},
			[]string{"MINIO_ROOT_USER=" + user, "MINIO_ROOT_PASSWORD=" + secret, "MINIO_UPDATE=off", "MINIO_BROWSER=off"})
		if err != nil {
			return "", err
		}
		if err := p.waitReady(ctx, "http://"+addr+"/minio/health/cluster", 60*time.Second); err != nil {
			p.stop()
			return "", err
		}
		cleanup.add(func() error { p.stop(); return nil })
		pid = p.cmd.Process.Pid
		return "http://" + addr, nil
	})
	if err != nil {
		return nil, err
	}
	hc := newHTTPClient()
	cleanup.add(func() error { hc.CloseIdleConnections(); return nil })
	m := &minioTarget{bucket: minioBucket, pid: pid, client: s3.New(s3.Options{
		Region:                     "us-east-1",
		BaseEndpoint:               aws.String(endpoint),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(user, secret, ""),
		HTTPClient:                 hc,
		Retryer:                    aws.NopRetryer{},
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})}
	if err := m.createBucket(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	return m, nil
}

// createBucket creates the bucket, polling while MinIO answers that it is
// live but not initialized yet (503).
func (m *minioTarget) createBucket(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := m.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(m.bucket)})
		var re *awshttp.ResponseError
		if err == nil || !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusServiceUnavailable {
			if err != nil {
				return fmt.Errorf("minio: create bucket: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("minio: create bucket: not initialized after %s: %w", timeout, err)
		case <-tick.C:
		}
	}
}

func key(digest string) *string { return aws.String(strings.TrimPrefix(digest, "sha256:")) }

func (m *minioTarget) Put(ctx context.Context, digest string, body io.Reader, size int64) error {
	_, err := m.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(m.bucket), Key: key(digest), Body: body, ContentLength: aws.Int64(size),
		ContentType: aws.String("application/octet-stream"),
	}, s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
	if err != nil {
		return fmt.Errorf("minio PutObject %s: %w", digest, err)
	}
	return nil
}

func (m *minioTarget) Head(ctx context.Context, digest string, size int64) error {
	out, err := m.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(m.bucket), Key: key(digest)})
	if err != nil {
		return fmt.Errorf("minio HeadObject %s: %w", digest, err)
	}
	if got := aws.ToInt64(out.ContentLength); got != size {
		return fmt.Errorf("minio HeadObject %s: %d bytes, want %d", digest, got, size)
	}
	return nil
}

func (m *minioTarget) Get(ctx context.Context, digest string, w io.Writer) (int64, error) {
	out, err := m.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(m.bucket), Key: key(digest)})
	if err != nil {
		return 0, fmt.Errorf("minio GetObject %s: %w", digest, err)
	}
	defer out.Body.Close()
	n, err := io.Copy(w, out.Body)
	if err != nil {
		return n, errors.Join(fmt.Errorf("minio GetObject %s: body", digest), err)
	}
	return n, nil
}
