// Package backend declares what Blobplane needs from a byte store and the
// pieces every byte store shares: representations, the write pipeline that
// hashes and verifies while streaming, typed errors and the configuration
// syntax.
//
// A backend stores one self-describing object per content digest. The
// representation (codec, payload size, content size) travels on the object,
// in the same atomic write as the payload, so a payload and the description of
// how to decode it can never disagree (S7, ADR-00018). A reader learns the
// representation from the object it is reading, never from Postgres.
//
// Implementations: backend/fs (the embedded default) and backend/s3.
// backend/backendtest is the conformance suite both pass.
package backend

import (
	"context"
	"io"
	"time"

	"github.com/blobplane/blobplane"
)

// Backend is the consumer-side view of one configured byte store. Every
// method is safe for concurrent use. Errors are *blobplane.Error values with
// stable codes; test them with errors.Is against ErrNotFound, ErrRefused,
// ErrMismatch, ErrRangeInvalid, ErrInvalid, and decide retries with
// blobplane.IsRetryable.
type Backend interface {
	// Write streams req.Body into the object for req.Digest, hashing the
	// decoded content as it goes. It confirms digest, content size and the
	// representation actually stored only when they equal what was asked;
	// otherwise nothing is left at the content-addressed location (S2).
	// The body is never fully buffered in memory.
	//
	// Concurrent writers of the same digest are allowed and may store
	// different representations: the last to finish wins and readers
	// always see one whole object (S7).
	//
	// Errors: ErrInvalid (malformed digest, negative size, unknown codec),
	// ErrMismatch (content hashed to another digest or size, or a zstd
	// payload that does not decode), ErrUnavailable (retryable: the body
	// failed mid-stream, the store is unreachable or overloaded),
	// ErrRefused (terminal: the store declined the write, e.g. access
	// denied or a path outside the root).
	Write(ctx context.Context, req WriteRequest) (Info, error)

	// Read opens the object for d. The returned Object's representation
	// and body come from the same object version, even while a writer
	// replaces it. With opts.AcceptStored and no range the payload comes back
	// as stored (possibly zstd); otherwise the body is decoded content,
	// restricted to opts.Range when set. Ranges address content bytes for
	// every representation; for zstd they are served by decoding from the
	// start of the payload (the documented slow path).
	//
	// Errors: ErrNotFound (no object), ErrRangeInvalid (range outside the
	// content), ErrInvalid (malformed digest), ErrUnavailable (retryable),
	// ErrCorrupt (terminal: the object's representation header is missing
	// or disagrees with its size). The body may also fail mid-stream with
	// ErrCorrupt when a stored zstd payload does not decode to the
	// representation's content size.
	Read(ctx context.Context, d blobplane.Digest, opts ReadOptions) (*Object, error)

	// Stat returns the stored object's description without its body. It
	// costs one metadata request; existence checks on hot paths belong to
	// Postgres, not here (ADR-00018).
	//
	// Errors: ErrNotFound, ErrInvalid, ErrUnavailable, ErrCorrupt.
	Stat(ctx context.Context, d blobplane.Digest) (Info, error)

	// Delete removes the object for d. Deleting a missing object succeeds,
	// so sweeps can be re-run safely.
	//
	// Errors: ErrInvalid, ErrUnavailable, ErrRefused.
	Delete(ctx context.Context, d blobplane.Digest) error

	// List returns up to opts.Limit entries in digest order, starting after
	// opts.After (a digest; "" starts at the beginning). Page.Next is the
	// cursor for the next page, or "" when the listing is complete.
	// Entries carry stored sizes only: reading each representation would
	// cost one request per object, which inventory sweeps do not need.
	//
	// Errors: ErrInvalid (bad cursor), ErrUnavailable.
	List(ctx context.Context, opts ListOptions) (Page, error)

	Stager

	Janitor

	Archive

	// Close releases the backend's resources (file descriptors, idle
	// connections). Calls in flight must have returned.
	Close() error
}

// Stager keeps in-progress uploads (OCI upload sessions) beside the
// content-addressed objects. A staged upload survives a process restart:
// its identifier and current size are all a client needs to resume.
type Stager interface {
	// CreateUpload starts an empty staged upload and returns its
	// identifier: 32 lowercase hex characters chosen by the backend, never
	// by a client.
	//
	// Errors: ErrUnavailable, ErrRefused.
	CreateUpload(ctx context.Context) (string, error)

	// AppendUpload appends r to the staged upload id at offset, which must
	// equal the upload's current size; it returns the new size. Chunks are
	// streamed, never fully buffered.
	//
	// Errors: ErrNotFound (unknown id), ErrInvalid (malformed id),
	// ErrRangeInvalid (offset is not the current size; the error's message
	// carries the current size), ErrUnavailable (retryable: the body failed
	// mid-stream, in which case part of the chunk may have been kept — ask
	// UploadSize before resuming).
	AppendUpload(ctx context.Context, id string, offset int64, r io.Reader) (int64, error)

	// UploadSize reports how many bytes the staged upload holds, so a
	// client can resume after a restart.
	//
	// Errors: ErrNotFound, ErrInvalid, ErrUnavailable.
	UploadSize(ctx context.Context, id string) (int64, error)

	// PromoteUpload verifies the staged bytes against req (req.Body is
	// ignored) exactly as Write does, stores them at the content-addressed
	// location and removes the staged upload. On mismatch the staged upload
	// is kept so the caller can decide; nothing appears at the
	// content-addressed location (S2).
	//
	// Errors: those of Write, plus ErrNotFound for an unknown id.
	PromoteUpload(ctx context.Context, id string, req WriteRequest) (Info, error)

	// AbortUpload discards a staged upload. Aborting an unknown id
	// succeeds.
	//
	// Errors: ErrInvalid, ErrUnavailable.
	AbortUpload(ctx context.Context, id string) error
}

// Janitor is what the inventory needs of a backend beyond its objects
// (issue 29, "No leaked bytes"; docs/backends.md): the ownership marker
// that says which database the backend belongs to, and the residue that
// crashes leave beside the objects — temp files or objects of writes
// that never finished, staged uploads, incomplete multipart uploads.
// Nothing in Postgres names residue except staged uploads (an intent's
// staged_location); the inventory reclaims it only past a minimum age,
// measured on the backend's own clock (Now), and only on a backend whose
// marker names the database it runs against.
type Janitor interface {
	// ReadMarker returns the marker last stored by WriteMarker, whole.
	//
	// Errors: ErrNotFound (no marker was ever written, or it was
	// deleted), ErrCorrupt (larger than MaxMarkerSize), ErrUnavailable,
	// ErrRefused.
	ReadMarker(ctx context.Context) ([]byte, error)

	// WriteMarker replaces the marker with data (at most MaxMarkerSize
	// bytes) in one atomic, durable write: a reader sees the old marker
	// or the new one, never a mix or a short one.
	//
	// Errors: ErrInvalid (too large), ErrUnavailable, ErrRefused.
	WriteMarker(ctx context.Context, data []byte) error

	// ListResidue calls fn once for each piece of residue, in no
	// particular order, with now: a time on the backend's clock taken
	// before the listing started (the file system's clock, the object
	// store's Date), against which Residue.Modified ages are measured
	// (Residue.Age). An error from fn stops the listing and comes back
	// unchanged. Residue of a write or an upload in progress is listed
	// too: only its age tells it apart.
	//
	// Errors: those of fn, ErrUnavailable, ErrRefused.
	ListResidue(ctx context.Context, fn func(r Residue, now time.Time) error) error

	// DeleteResidue removes r as ListResidue described it. Removing
	// residue that is gone already succeeds. A writer whose residue is
	// removed under it fails (its write or append answers an error and
	// its client retries): nothing visible at a content-addressed key is
	// ever removed here.
	//
	// Errors: ErrInvalid (r was not listed by this kind of backend),
	// ErrUnavailable, ErrRefused.
	DeleteResidue(ctx context.Context, r Residue) error
}

// MaxMarkerSize bounds a backend marker.
const MaxMarkerSize = 4096

// ResidueKind says what a piece of residue is.
type ResidueKind string

const (
	// ResidueTemp is a write's temporary file or object: a filesystem
	// .tmp- file in an object directory, an S3 _tmp/ object waiting for
	// its copy. Nothing refers to it once its writer is gone.
	ResidueTemp ResidueKind = "tmp"
	// ResidueStaged is a staged upload (an OCI upload session's bytes),
	// Residue.Name its upload id. An intent names it while its upload is
	// pending (intents.staged_location); one that no intent names is
	// left by a writer killed between CreateUpload and recording it, or
	// by a promotion that could not remove it.
	ResidueStaged ResidueKind = "staged"
	// ResidueMultipart is an S3 multipart upload never completed nor
	// aborted (a writer killed mid-write). Invisible; it holds its parts'
	// storage until aborted.
	ResidueMultipart ResidueKind = "multipart"
)

// ResidueKinds lists every kind, for reports and metrics.
var ResidueKinds = []ResidueKind{ResidueTemp, ResidueStaged, ResidueMultipart}

// Residue is one piece of residue as ListResidue found it.
type Residue struct {
	Kind ResidueKind
	// Name locates it in the backend: the temp file's path under the
	// root or the temp object's key under the prefix, the staged
	// upload's id, the multipart upload's key under the prefix.
	Name string
	// UploadID is the store's id of a multipart upload ("" otherwise).
	UploadID string
	// Size is the bytes it occupies, as far as the listing tells (the
	// parts of a multipart upload are not summed: 0).
	Size int64
	// Modified is its last activity on the backend's clock: the latest
	// write to a temp or staged file, the latest chunk of a staged
	// upload, the latest part (or the start) of a multipart upload.
	Modified time.Time
}

// Age is r's age at now (never negative).
func (r Residue) Age(now time.Time) time.Duration { return max(now.Sub(r.Modified), 0) }

// WriteRequest describes one write: the content the caller claims and the
// stream that should produce it.
type WriteRequest struct {
	// Digest and Size are the expected content digest and content size
	// (of the decoded bytes, whatever Codec says).
	Digest blobplane.Digest
	Size   int64
	// Body is the payload, encoded with Codec ("" means identity).
	Body  io.Reader
	Codec Codec
	// PayloadSize, when > 0, declares the payload length of a zstd body.
	// It is checked, and lets a backend that must name the representation
	// before the bytes arrive (S3 multipart) write straight to the
	// content-addressed key.
	PayloadSize int64
	// BeforeVisible, when set, is called once before any byte becomes
	// visible at the content-addressed key, and only if the write got
	// that far; its error aborts the write (nothing becomes visible) and
	// Write returns it unchanged. It is what must precede the object's
	// appearance (an upload's claim, S6). The filesystem backend calls it
	// after the bytes are verified and written to a private temp file,
	// while that file's fsync runs, so the caller's work overlaps the
	// write and the sync; S3 calls it before sending anything.
	BeforeVisible func() error
	// DeferSync, when set, lets Write return before its last syncs (the
	// filesystem backend's wait for the object file's fsync and the
	// directory fsync that makes its name durable): the backend passes
	// that step to DeferSync instead of running it. The caller must then call it exactly once, and treat
	// the object as stored durably only after it returned nil (nothing
	// that says so may commit before). A backend with no such step (S3)
	// never calls DeferSync.
	DeferSync func(sync func() error)
}

// Info is what a backend confirms about a stored object.
type Info struct {
	Digest blobplane.Digest
	Repr   Representation
}

// ReadOptions selects what Read returns.
type ReadOptions struct {
	// Range, when non-nil, restricts the body to content bytes
	// [Offset, Offset+Length). It must lie within the content; the HTTP
	// layer clamps open-ended client ranges before asking.
	Range *Range
	// AcceptStored lets a whole-object read return the payload as stored
	// (for example zstd, for a client that sent Accept-Encoding: zstd).
	AcceptStored bool
}

// Range is a content byte range.
type Range struct {
	Offset int64
	Length int64
}

// Object is an open read. Close it.
type Object struct {
	Repr Representation
	// Codec is the encoding of Body: Repr.Codec when the payload is
	// returned as stored, CodecIdentity when decoded.
	Codec Codec
	// Length is the number of bytes Body yields.
	Length int64
	Body   io.ReadCloser
}

// ListOptions pages through a backend's objects.
type ListOptions struct {
	After blobplane.Digest
	Limit int // <= 0 means DefaultListLimit
}

// DefaultListLimit is the page size when ListOptions.Limit is unset.
const DefaultListLimit = 1000

// Entry is one listed object.
type Entry struct {
	Digest blobplane.Digest
	// StoredSize is the number of bytes the object occupies in the store
	// (payload plus any header), not the content size.
	StoredSize int64
	// Modified is the object's last write, on the backend's clock (see
	// Page.Now).
	Modified time.Time
}

// Page is one page of a listing.
type Page struct {
	Entries []Entry
	// Next is the cursor for the following page ("" when done).
	Next blobplane.Digest
	// Now is the time on the backend's clock taken before the page was
	// read (the file system's clock, the object store's Date; zero when
	// unknown), against which Entry.Modified ages are measured.
	Now time.Time
}
