package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// The inventory's view of the bucket (backend.Janitor, issue 29), under
// the prefix:
//
//	_marker                   the ownership marker (which database the backend belongs to)
//	_tmp/<random>             a verified multipart write waiting for its copy
//	_staging/<id>/...         a staged upload
//	(multipart uploads)       writes never completed nor aborted, to sha256/, _tmp/ or _staging/
//
// Ages are measured on the store's clock: Modified times are the store's
// (LastModified, Initiated), and now is the Date of its first listing
// response, to the second and so never ahead of it.
//
// Multipart uploads are listed without a prefix and filtered here: MinIO
// lists by prefix only for an exact object name, and without one lists
// what its running server knows. A store that lists none (or not after a
// restart) still needs its own expiry of incomplete uploads: an
// AbortIncompleteMultipartUpload lifecycle rule on AWS, MinIO's stale
// uploads expiry (default 24 h).

// markerKey is the marker's key under the prefix: outside sha256/, so
// never listed as an object.
func (b *Backend) markerKey() string { return b.prefix + "_marker" }

// ReadMarker implements backend.Janitor.
func (b *Backend) ReadMarker(ctx context.Context) ([]byte, error) {
	const op = "s3.ReadMarker"
	key := b.markerKey()
	res, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		err = classify(op, err)
		if errors.Is(err, backend.ErrNotFound) {
			return nil, &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "no marker", Err: err}
		}
		return nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, backend.MaxMarkerSize+1))
	if err != nil {
		return nil, classify(op, err)
	}
	if len(data) > backend.MaxMarkerSize {
		return nil, &blobplane.Error{Code: blobplane.CodeInternal, Op: op, Message: fmt.Sprintf("the marker is larger than %d bytes", backend.MaxMarkerSize)}
	}
	return data, nil
}

// WriteMarker implements backend.Janitor with one PutObject, which
// replaces the object atomically.
func (b *Backend) WriteMarker(ctx context.Context, data []byte) error {
	const op = "s3.WriteMarker"
	if len(data) > backend.MaxMarkerSize {
		return backend.Invalid(op, "marker of %d bytes: at most %d", len(data), backend.MaxMarkerSize)
	}
	key := b.markerKey()
	_, err := b.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &b.bucket, Key: &key, Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
		ContentType: aws.String("application/json"),
	})
	return classify(op, err)
}

// serverTime is the store's Date of a response, else this machine's
// clock.
func serverTime(md middleware.Metadata) time.Time {
	if t, ok := awsmiddleware.GetServerTime(md); ok && !t.IsZero() {
		return t
	}
	return time.Now()
}

// ListResidue implements backend.Janitor: _tmp/ objects, staged uploads
// (one per id, its latest chunk's time) and multipart uploads under the
// prefix, each with the Date of the listing's first response.
func (b *Backend) ListResidue(ctx context.Context, fn func(backend.Residue, time.Time) error) error {
	const op = "s3.ListResidue"
	var now time.Time
	seen := func(md middleware.Metadata) {
		if now.IsZero() {
			now = serverTime(md)
		}
	}
	emit := func(r backend.Residue) error { return fn(r, now) }
	tmp := b.prefix + "_tmp/"
	err := b.listKeys(ctx, op, tmp, seen, func(key string, size int64, mod time.Time) error {
		return emit(backend.Residue{Kind: backend.ResidueTemp, Name: strings.TrimPrefix(key, b.prefix), Size: size, Modified: mod})
	})
	if err != nil {
		return err
	}
	if err := b.listStaged(ctx, op, seen, emit); err != nil {
		return err
	}
	return b.listMultipart(ctx, op, seen, emit)
}

// listKeys calls fn for every object under prefix.
func (b *Backend) listKeys(ctx context.Context, op, prefix string, seen func(middleware.Metadata), fn func(key string, size int64, mod time.Time) error) error {
	var token *string
	for {
		res, err := b.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: &prefix, ContinuationToken: token})
		if err != nil {
			return classify(op, err)
		}
		seen(res.ResultMetadata)
		for _, o := range res.Contents {
			if err := fn(aws.ToString(o.Key), aws.ToInt64(o.Size), aws.ToTime(o.LastModified)); err != nil {
				return err
			}
		}
		if !aws.ToBool(res.IsTruncated) {
			return nil
		}
		token = res.NextContinuationToken
	}
}

// listStaged reports each staged upload once: its chunks and marker are
// listed together (their keys share _staging/<id>/), summed, dated by
// the latest.
func (b *Backend) listStaged(ctx context.Context, op string, seen func(middleware.Metadata), fn func(backend.Residue) error) error {
	staging := b.prefix + "_staging/"
	var cur *backend.Residue
	flush := func() error {
		if cur == nil {
			return nil
		}
		r := *cur
		cur = nil
		return fn(r)
	}
	err := b.listKeys(ctx, op, staging, seen, func(key string, size int64, mod time.Time) error {
		id, _, ok := strings.Cut(strings.TrimPrefix(key, staging), "/")
		if !ok || backend.ValidUploadID(op, id) != nil {
			return nil // not ours
		}
		if cur != nil && cur.Name != id {
			if err := flush(); err != nil {
				return err
			}
		}
		if cur == nil {
			cur = &backend.Residue{Kind: backend.ResidueStaged, Name: id}
		}
		cur.Size += size
		if mod.After(cur.Modified) {
			cur.Modified = mod
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// listMultipart reports the incomplete multipart uploads to keys this
// backend writes, dated by their latest part (or their start).
func (b *Backend) listMultipart(ctx context.Context, op string, seen func(middleware.Metadata), fn func(backend.Residue) error) error {
	ours := []string{b.prefix + "sha256/", b.prefix + "_tmp/", b.prefix + "_staging/"}
	var keyMarker, idMarker *string
	for {
		res, err := b.client.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &b.bucket, KeyMarker: keyMarker, UploadIdMarker: idMarker})
		if err != nil {
			return classify(op, err)
		}
		seen(res.ResultMetadata)
		for _, u := range res.Uploads {
			key := aws.ToString(u.Key)
			if !hasAnyPrefix(key, ours) {
				continue
			}
			mod, err := b.lastPart(ctx, op, key, aws.ToString(u.UploadId), aws.ToTime(u.Initiated))
			if errors.Is(err, backend.ErrNotFound) {
				continue // completed or aborted since
			}
			if err != nil {
				return err
			}
			r := backend.Residue{Kind: backend.ResidueMultipart, Name: strings.TrimPrefix(key, b.prefix), UploadID: aws.ToString(u.UploadId), Modified: mod}
			if err := fn(r); err != nil {
				return err
			}
		}
		if !aws.ToBool(res.IsTruncated) {
			return nil
		}
		keyMarker, idMarker = res.NextKeyMarker, res.NextUploadIdMarker
	}
}

// lastPart is the time of the upload's latest part, or initiated when it
// has none (or when that is later).
func (b *Backend) lastPart(ctx context.Context, op, key, id string, initiated time.Time) (time.Time, error) {
	last := initiated
	var marker *string
	for {
		res, err := b.client.ListParts(ctx, &s3.ListPartsInput{Bucket: &b.bucket, Key: &key, UploadId: &id, PartNumberMarker: marker})
		if err != nil {
			return last, classify(op, err)
		}
		for _, p := range res.Parts {
			if t := aws.ToTime(p.LastModified); t.After(last) {
				last = t
			}
		}
		if !aws.ToBool(res.IsTruncated) {
			return last, nil
		}
		marker = res.NextPartNumberMarker
	}
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// DeleteResidue implements backend.Janitor.
func (b *Backend) DeleteResidue(ctx context.Context, r backend.Residue) error {
	const op = "s3.DeleteResidue"
	switch r.Kind {
	case backend.ResidueStaged:
		return b.AbortUpload(ctx, r.Name)
	case backend.ResidueTemp:
		if !strings.HasPrefix(r.Name, "_tmp/") || strings.Contains(r.Name[len("_tmp/"):], "/") || len(r.Name) == len("_tmp/") {
			return backend.Invalid(op, "%q is not a temp object of this backend", r.Name)
		}
		key := b.prefix + r.Name
		_, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &key})
		if err = classify(op, err); errors.Is(err, backend.ErrNotFound) {
			return nil
		}
		return err
	case backend.ResidueMultipart:
		if r.UploadID == "" || !hasAnyPrefix(r.Name, []string{"sha256/", "_tmp/", "_staging/"}) {
			return backend.Invalid(op, "%q (upload %q) is not a multipart upload of this backend", r.Name, r.UploadID)
		}
		key := b.prefix + r.Name
		_, err := b.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &b.bucket, Key: &key, UploadId: aws.String(r.UploadID)})
		if err = classify(op, err); errors.Is(err, backend.ErrNotFound) {
			return nil
		}
		return err
	}
	return backend.Invalid(op, "residue of kind %q: the S3 backend has none", r.Kind)
}
