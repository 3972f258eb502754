// Package placement is the pure logic of the placement ledger
// (../shared/spec/blob-placement.md): placement keys and their validation,
// states and reasons, the transition table, and the routing categories a
// router picks between. It performs no I/O; store persists placements and
// applies transitions under the epoch fence, handlers serve the routing
// query.
package placement

import (
	"regexp"
	"time"

	"github.com/blobplane/blobplane"
)

// MaxPerDigest is the spec's bound: "The same digest can hold up to 64
// placements ... A stage that would exceed the bound is refused rather than
// growing an unbounded history."
const MaxPerDigest = 64

// MaxLocationLen bounds a location (object key or store-relative path).
const MaxLocationLen = 1024

// State is a placement's evidence state.
type State string

// The states of the spec's evidence-based lifecycle.
const (
	// Absent is not a stored state: it is the "from" state of a key that has
	// no row yet.
	Absent State = ""
	// Pending: a transfer is in flight or a file is staged; no serving
	// evidence exists.
	Pending State = "pending"
	// Verified: the backend confirmed the object with a matching digest and
	// byte size. The only state routing serves from (DESIGN S2).
	Verified State = "verified"
	// Failed: an attempt failed for a classified Reason.
	Failed State = "failed"
	// Revoked: withdrawn from serving (reclamation or an administrative
	// decision), with a RevokeReason.
	Revoked State = "revoked"
)

// States lists the stored states in lifecycle order.
var States = []State{Pending, Verified, Failed, Revoked}

// Valid reports whether s is a stored state.
func (s State) Valid() bool {
	switch s {
	case Pending, Verified, Failed, Revoked:
		return true
	}
	return false
}

// Reason classifies a failure. A failed placement always has one and no
// other state has one (the table enforces it too).
type Reason string

// The failure reasons of the spec: "the source was unavailable, the
// transferred bytes hashed to a different digest, or the backend refused the
// write".
const (
	SourceUnavailable Reason = "source_unavailable"
	DigestMismatch    Reason = "digest_mismatch"
	BackendRefused    Reason = "backend_refused"
)

// Reasons lists every failure reason.
var Reasons = []Reason{SourceUnavailable, DigestMismatch, BackendRefused}

// Valid reports whether r is a failure reason.
func (r Reason) Valid() bool {
	switch r {
	case SourceUnavailable, DigestMismatch, BackendRefused:
		return true
	}
	return false
}

// RevokeReason says why a placement was withdrawn from serving. It is kept
// apart from Reason because the ledger's failure reason exists only and
// always with the failed state.
type RevokeReason string

// The spec's two grounds for revocation: "withdrawn from serving for
// reclamation or an administrative decision".
const (
	Reclamation    RevokeReason = "reclamation"
	Administrative RevokeReason = "administrative"
)

// RevokeReasons lists every revoke reason.
var RevokeReasons = []RevokeReason{Reclamation, Administrative}

// Valid reports whether r is a revoke reason.
func (r RevokeReason) Valid() bool { return r == Reclamation || r == Administrative }

// Key identifies one placement: the spec's four-part key. Every part is a
// neutral identifier; no ecosystem metadata belongs in the ledger.
type Key struct {
	Digest     blobplane.Digest
	Backend    string // byte store kind, such as filesystem or s3
	Datacenter string // opaque operator label
	Location   string // object key or store-relative path inside the backend
}

var (
	datacenterRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	backendRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
)

// ValidDatacenter reports whether s is a datacenter label: 1-63 lowercase
// letters, digits or dashes, not starting or ending with a dash (the same
// rule as BLOBPLANE_DATACENTER and the table's CHECK).
func ValidDatacenter(s string) bool { return datacenterRe.MatchString(s) }

// ValidBackend reports whether s is a backend label (1-32 lowercase letters,
// digits, '_' or '-').
func ValidBackend(s string) bool { return backendRe.MatchString(s) }

// Validate checks every part of k, returning a blobplane CodeInvalid error
// naming the first bad part. The digest must be canonical
// sha256:<64 lowercase hex>.
func (k Key) Validate() error {
	if _, err := blobplane.ParseDigest(string(k.Digest)); err != nil {
		return err
	}
	if !ValidBackend(k.Backend) {
		return blobplane.Errorf(blobplane.CodeInvalid, "backend %q: must be 1-32 lowercase letters, digits, '_' or '-'", k.Backend)
	}
	if !ValidDatacenter(k.Datacenter) {
		return blobplane.Errorf(blobplane.CodeInvalid, "datacenter %q: must be 1-63 lowercase letters, digits or dashes", k.Datacenter)
	}
	if k.Location == "" || len(k.Location) > MaxLocationLen {
		return blobplane.Errorf(blobplane.CodeInvalid, "location: must be 1-%d bytes", MaxLocationLen)
	}
	for i := 0; i < len(k.Location); i++ {
		if c := k.Location[i]; c < 0x20 || c == 0x7f {
			return blobplane.Errorf(blobplane.CodeInvalid, "location: must not contain control characters")
		}
	}
	return nil
}

// Placement is one ledger row.
type Placement struct {
	Key
	State        State
	Reason       Reason       // set only and always when State is Failed
	RevokeReason RevokeReason // set only and always when State is Revoked
	Size         int64        // expected byte size, recorded at stage
	Epoch        int64        // fencing epoch of the last accepted transition
	Generation   int64        // advanced by every accepted transition (DESIGN S3)
	CreatedAt    time.Time    // database time the row was first staged
	UpdatedAt    time.Time    // database time of the last accepted transition
	VerifiedAt   time.Time    // database time of the last verification; zero if never verified
}

// ObjectLocation is the location of d's content-addressed object in any
// backend: the ledger's one location rule for the bytes of d.
func ObjectLocation(d blobplane.Digest) string { return "sha256/" + d.Hex() }
