package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// Archived objects (backend.Archive) live under the prefix's _archive/,
// outside sha256/ and the residue's keys.
func (b *Backend) archiveKey(name string) string { return b.prefix + "_archive/" + name }

// PutArchived implements backend.Archive with one conditional PutObject
// (If-None-Match: *): the store refuses it when the key exists, so a name
// is written once even by two writers racing.
func (b *Backend) PutArchived(ctx context.Context, name string, data []byte) error {
	const op = "s3.PutArchived"
	if err := backend.CheckArchivedName(op, name); err != nil {
		return err
	}
	if len(data) > backend.MaxArchivedSize {
		return backend.Invalid(op, "archived object of %d bytes: at most %d", len(data), backend.MaxArchivedSize)
	}
	key := b.archiveKey(name)
	_, err := b.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: &b.bucket, Key: &key, Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
		ContentType: aws.String("application/octet-stream"), IfNoneMatch: aws.String("*"),
	})
	err = classify(op, err)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
		return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: fmt.Sprintf("%s is archived already: names are written once", name), Err: err}
	}
	return err
}

// GetArchived implements backend.Archive.
func (b *Backend) GetArchived(ctx context.Context, name string) ([]byte, error) {
	const op = "s3.GetArchived"
	if err := backend.CheckArchivedName(op, name); err != nil {
		return nil, err
	}
	key := b.archiveKey(name)
	res, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		return nil, classify(op, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, backend.MaxArchivedSize+1))
	if err != nil {
		return nil, classify(op, err)
	}
	if len(data) > backend.MaxArchivedSize {
		return nil, &blobplane.Error{Code: blobplane.CodeInternal, Op: op, Message: fmt.Sprintf("%s is larger than %d bytes", name, backend.MaxArchivedSize)}
	}
	return data, nil
}

// DeleteArchived implements backend.Archive.
func (b *Backend) DeleteArchived(ctx context.Context, name string) error {
	const op = "s3.DeleteArchived"
	if err := backend.CheckArchivedName(op, name); err != nil {
		return err
	}
	key := b.archiveKey(name)
	_, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &key})
	if err = classify(op, err); errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	return err
}

// ListArchived implements backend.Archive.
func (b *Backend) ListArchived(ctx context.Context, prefix string) ([]string, error) {
	const op = "s3.ListArchived"
	if err := backend.CheckArchivedPrefix(op, prefix); err != nil {
		return nil, err
	}
	base := b.archiveKey("")
	var out []string
	err := b.listKeys(ctx, op, base+prefix, func(middleware.Metadata) {}, func(key string, _ int64, _ time.Time) error {
		out = append(out, strings.TrimPrefix(key, base))
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}
