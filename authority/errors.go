package authority

import (
	"errors"
	"fmt"

	"github.com/blobplane/blobplane"
)

// Sentinel errors. Every error this package returns is a *blobplane.Error
// (so handlers map it to a status in one place) whose chain contains one of
// these, so callers test the precise condition with errors.Is.
var (
	// Map shape (R5, R7).
	ErrCoverageGap    = errors.New("slot not covered by any partition")
	ErrOverlap        = errors.New("slot ranges overlap")
	ErrUnsorted       = errors.New("slot ranges not sorted")
	ErrBadRange       = errors.New("bad slot range")
	ErrUnknownState   = errors.New("unknown state")
	ErrUnknownMode    = errors.New("unknown recovery mode")
	ErrMissingField   = errors.New("missing required field")
	ErrDuplicateID    = errors.New("duplicate partition id")
	ErrBadSlotBits    = errors.New("slot_bits out of range")
	ErrUnknownHash    = errors.New("unknown hash function")
	ErrBadLineage     = errors.New("bad lineage")
	ErrOutOfRange     = errors.New("integer outside the canonical range")
	ErrMalformed      = errors.New("malformed document")
	ErrVersionOrder   = errors.New("map version does not advance")
	ErrSlotBitsShrink = errors.New("slot_bits decreased")
	ErrEpochRegress   = errors.New("epoch decreased")

	// Deltas (R9).
	ErrWrongBase = errors.New("delta does not apply to this base version")

	// Signatures (R10–R12).
	ErrUnsigned       = errors.New("document is unsigned")
	ErrBadAlg         = errors.New("unsupported signature algorithm")
	ErrUnknownKey     = errors.New("unknown signing key")
	ErrKeyNotYetValid = errors.New("signing key not yet valid")
	ErrKeyExpired     = errors.New("signing key expired")
	ErrTampered       = errors.New("signature does not match document")
	ErrNotNewer       = errors.New("map is not newer than the cached one")

	// Resolution and routing (A.1, R104, R105).
	ErrNoMap            = errors.New("no map covers the slot")
	ErrNotReady         = errors.New("partition not ready")
	ErrRedirectLoop     = errors.New("redirect bound exceeded")
	ErrHashDisagreement = errors.New("client and server disagree about the slot")
	ErrUnsignedRedirect = errors.New("MOVED without a signed delta")

	// Leases (R14–R28, A.7).
	ErrStaleEpoch   = errors.New("stale epoch")
	ErrLeaseHeld    = errors.New("lease held by another owner and not expired")
	ErrNotOwner     = errors.New("not the lease owner")
	ErrSealed       = errors.New("partition sealed under this epoch")
	ErrLeaseExpired = errors.New("lease expired (self-fenced)")
	ErrLeaseTiming  = errors.New("lease timing violates the self-fence margin")
)

// invalid wraps cause (which should chain to a sentinel) as a terminal
// CodeInvalid error for op.
func invalid(op string, cause error) error {
	return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: cause.Error(), Err: cause}
}

func invalidf(op string, sentinel error, format string, args ...any) error {
	return invalid(op, fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sentinel))
}

// coded wraps cause with code; only CodeUnavailable is retryable, as with
// blobplane.Errorf.
func coded(code blobplane.Code, op string, cause error) error {
	return &blobplane.Error{Code: code, Op: op, Message: cause.Error(), Err: cause, Retryable: code == blobplane.CodeUnavailable}
}

// retryable wraps cause with code, marked retryable.
func retryable(code blobplane.Code, op string, cause error) error {
	return &blobplane.Error{Code: code, Op: op, Message: cause.Error(), Err: cause, Retryable: true}
}
