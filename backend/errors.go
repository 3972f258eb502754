package backend

import (
	"errors"
	"fmt"

	"github.com/blobplane/blobplane"
)

// Kinds of backend error, for errors.Is. Each matches any *blobplane.Error
// with the same code, whatever its message. Retryability rides on the error
// itself (blobplane.IsRetryable), not on the kind.
var (
	// ErrNotFound: no object (or staged upload) exists under that name.
	ErrNotFound = &blobplane.Error{Code: blobplane.CodeNotFound}
	// ErrRefused: the store declined the operation (access denied, a path
	// that would leave the root, a quota). The placement reason is
	// backend_refused. Terminal.
	ErrRefused = &blobplane.Error{Code: blobplane.CodeForbidden}
	// ErrMismatch: the bytes do not hash (or decode) to the claimed digest
	// and size. The placement reason is digest_mismatch. Terminal (S2).
	ErrMismatch = &blobplane.Error{Code: blobplane.CodeMismatch}
	// ErrRangeInvalid: a byte range outside the content, or an append at an
	// offset other than the staged upload's size. Terminal.
	ErrRangeInvalid = &blobplane.Error{Code: blobplane.CodeRangeInvalid}
	// ErrInvalid: a malformed argument (digest, size, codec, upload id,
	// configuration). Terminal.
	ErrInvalid = &blobplane.Error{Code: blobplane.CodeInvalid}
	// ErrUnavailable: a transient failure (network, overload, a request
	// body that broke off). Retryable.
	ErrUnavailable = &blobplane.Error{Code: blobplane.CodeUnavailable}
	// ErrCorrupt: a stored object whose representation is missing or
	// disagrees with its bytes. Terminal; the read path treats it as a
	// detected loss.
	ErrCorrupt = &blobplane.Error{Code: blobplane.CodeInternal}
)

// NotFound builds a not-found error for op on d.
func NotFound(op string, d blobplane.Digest) error {
	return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: fmt.Sprintf("%s: no such object", d)}
}

// Refused builds a terminal refusal wrapping err.
func Refused(op string, err error, format string, args ...any) error {
	e := blobplane.Wrap(blobplane.CodeForbidden, err, format, args...)
	e.Op = op
	return e
}

// Unavailable builds a retryable error wrapping err.
func Unavailable(op string, err error, format string, args ...any) error {
	e := blobplane.Wrap(blobplane.CodeUnavailable, err, format, args...)
	e.Op = op
	e.Retryable = true
	return e
}

// Corrupt builds a terminal error for an object that cannot be decoded as
// it describes itself.
func Corrupt(op string, d blobplane.Digest, format string, args ...any) error {
	e := blobplane.Errorf(blobplane.CodeInternal, "%s: corrupt object: %s", d, fmt.Sprintf(format, args...))
	e.Op = op
	return e
}

// Mismatch builds the digest-mismatch error callers record as
// failed/digest_mismatch.
func Mismatch(op string, format string, args ...any) error {
	e := blobplane.Errorf(blobplane.CodeMismatch, "digest mismatch: "+format, args...)
	e.Op = op
	return e
}

// RangeInvalid builds a range error.
func RangeInvalid(op string, format string, args ...any) error {
	e := blobplane.Errorf(blobplane.CodeRangeInvalid, format, args...)
	e.Op = op
	return e
}

// Invalid builds an invalid-argument error.
func Invalid(op string, format string, args ...any) error {
	e := blobplane.Errorf(blobplane.CodeInvalid, format, args...)
	e.Op = op
	return e
}

// Classify passes *blobplane.Error values through; anything else (context
// cancellation, an unclassified I/O failure) becomes a retryable unavailable
// error, since it may well pass when tried again.
func Classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var be *blobplane.Error
	if errors.As(err, &be) {
		return err
	}
	return Unavailable(op, err, "%v", err)
}

// ValidDigest revalidates d. Digest is a string type and can be converted
// from anything, so every backend checks before deriving a location from it:
// a location comes only from a validated digest, never from client input.
func ValidDigest(op string, d blobplane.Digest) error {
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		var be *blobplane.Error
		if errors.As(err, &be) {
			be.Op = op
		}
		return err
	}
	return nil
}

// ValidUploadID checks a staged-upload id: exactly 32 lowercase hex
// characters, so it can name a file or key without escaping anything.
func ValidUploadID(op, id string) error {
	if len(id) != 32 {
		return Invalid(op, "upload id %q: want 32 lowercase hex characters", truncate(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return Invalid(op, "upload id %q: want 32 lowercase hex characters", truncate(id))
		}
	}
	return nil
}

// CheckRange validates an optional content range against the content size
// and returns the offset and length to serve.
func CheckRange(op string, rng *Range, contentSize int64) (off, n int64, err error) {
	if rng == nil {
		return 0, contentSize, nil
	}
	if rng.Offset < 0 || rng.Length <= 0 {
		return 0, 0, RangeInvalid(op, "range offset %d length %d: want offset >= 0 and length > 0", rng.Offset, rng.Length)
	}
	if rng.Offset >= contentSize || rng.Length > contentSize-rng.Offset {
		return 0, 0, RangeInvalid(op, "range %d-%d outside content of %d bytes", rng.Offset, rng.Offset+rng.Length-1, contentSize)
	}
	return rng.Offset, rng.Length, nil
}
