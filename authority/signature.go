package authority

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane"
)

// SignatureAlg is the only signature algorithm maps and deltas carry (R10).
const SignatureAlg = "ed25519"

// Signer signs maps and deltas with the controller's key (R10: a key held
// only by the controller; nodes and clients hold only public keys).
type Signer struct {
	KeyID string // names the key in the document, so rotation can overlap (R12)
	Key   ed25519.PrivateKey
}

// SignMap validates m and sets its signature over the canonical encoding
// (R10). A map failing validation is never signed, so never published (R5).
func (s Signer) SignMap(m *Map) error {
	if err := Validate(m); err != nil {
		return err
	}
	msg, err := signedMapMessage(m)
	if err != nil {
		return err
	}
	m.Signature = s.signMessage(msg)
	return nil
}

// SignDelta sets d's signature over its canonical encoding (R10: a delta
// is signed as well as a full map). Compute d with Diff.
func (s Signer) SignDelta(d *Delta) error {
	msg, err := signedDeltaMessage(d)
	if err != nil {
		return err
	}
	d.Signature = s.signMessage(msg)
	return nil
}

func (s Signer) signMessage(msg []byte) *Signature {
	return &Signature{KeyID: s.KeyID, Alg: SignatureAlg, Value: base64.StdEncoding.EncodeToString(ed25519.Sign(s.Key, msg))}
}

// TrustedKey is one public key a verifier accepts, inside its validity
// window [NotBefore, NotAfter) (R12). Windows of successive keys overlap so
// a rotation never leaves a moment with no valid key. On the wire (a
// keyring file) public_key is standard base64 of the 32-byte key.
type TrustedKey struct {
	KeyID     string            `json:"key_id"`
	Alg       string            `json:"alg"`
	PublicKey ed25519.PublicKey `json:"public_key"`
	NotBefore time.Time         `json:"not_before"`
	NotAfter  time.Time         `json:"not_after"`
}

// Keyring is the set of keys a Verifier trusts, by key id.
type Keyring struct {
	keys map[string]TrustedKey
}

// NewKeyring checks and indexes keys: ids unique and non-empty, alg
// ed25519, 32-byte public keys, non-empty windows. Windows may overlap
// (R12).
func NewKeyring(keys ...TrustedKey) (*Keyring, error) {
	const op = "authority.NewKeyring"
	kr := &Keyring{keys: make(map[string]TrustedKey, len(keys))}
	for _, k := range keys {
		switch {
		case k.KeyID == "":
			return nil, invalidf(op, ErrMissingField, "key without key_id")
		case k.Alg != SignatureAlg:
			return nil, invalidf(op, ErrBadAlg, "key %q: alg %q", k.KeyID, k.Alg)
		case len(k.PublicKey) != ed25519.PublicKeySize:
			return nil, invalidf(op, ErrMalformed, "key %q: public key is %d bytes", k.KeyID, len(k.PublicKey))
		case !k.NotBefore.Before(k.NotAfter):
			return nil, invalidf(op, ErrMalformed, "key %q: empty window [%s, %s)", k.KeyID, k.NotBefore, k.NotAfter)
		}
		if _, dup := kr.keys[k.KeyID]; dup {
			return nil, invalidf(op, ErrMalformed, "key %q listed twice", k.KeyID)
		}
		kr.keys[k.KeyID] = k
	}
	return kr, nil
}

// ParseKeyring reads a keyring document: {"keys": [TrustedKey, ...]}.
func ParseKeyring(data []byte) (*Keyring, error) {
	var doc struct {
		Keys []TrustedKey `json:"keys"`
	}
	if err := strictDecode(data, &doc); err != nil {
		return nil, invalidf("authority.ParseKeyring", ErrMalformed, "%v", err)
	}
	return NewKeyring(doc.Keys...)
}

// Rejection describes one map or delta that failed verification. Every
// rejection is a correctness fault (R12): count it as a metric and log it
// at error level; never apply the document, however new.
type Rejection struct {
	Doc         string // "map" or "delta"
	Version     uint64 // the document's claimed map_version (unverified)
	BaseVersion uint64 // deltas only
	KeyID       string // the claimed key id, possibly empty
	Err         error  // chains to ErrUnsigned, ErrBadAlg, ErrUnknownKey, ErrKeyNotYetValid, ErrKeyExpired, ErrTampered, ErrWrongBase or a validation sentinel
}

// VerificationError is the typed error a Verifier returns (inside a
// CodeInvalid *blobplane.Error); errors.As recovers it and errors.Is
// matches its sentinel.
type VerificationError struct {
	Rejection
}

func (e *VerificationError) Error() string {
	return fmt.Sprintf("%s version %d (key %q) rejected: %v", e.Doc, e.Version, e.KeyID, e.Err)
}

func (e *VerificationError) Unwrap() error { return e.Err }

// Verifier checks signatures before anything is applied (R11), from
// whatever source a document arrived, and counts and reports every
// rejection (R12). It never reads a clock: callers pass the wall time to
// judge key windows by. Safe for concurrent use.
type Verifier struct {
	keys     *Keyring
	onReject func(Rejection)
	rejected atomic.Uint64
}

// NewVerifier returns a verifier trusting keys. onReject, if non-nil, is
// called synchronously for every rejection — wire it to a counter metric and
// an error-level "correctness fault" log (the keeper logs each one).
func NewVerifier(keys *Keyring, onReject func(Rejection)) *Verifier {
	return &Verifier{keys: keys, onReject: onReject}
}

// Rejected is the number of documents rejected so far (R12).
func (v *Verifier) Rejected() uint64 { return v.rejected.Load() }

func (v *Verifier) reject(op string, r Rejection) error {
	v.rejected.Add(1)
	if v.onReject != nil {
		v.onReject(r)
	}
	ve := &VerificationError{r}
	return &blobplane.Error{Code: blobplane.CodeInvalid, Op: op, Message: ve.Error(), Err: ve}
}

// check verifies sig over msg (domain + canonical) with a key valid at now.
func (v *Verifier) check(sig *Signature, msg []byte, now time.Time) error {
	if sig == nil || sig.Value == "" {
		return ErrUnsigned
	}
	if sig.Alg != SignatureAlg {
		return fmt.Errorf("alg %q: %w", sig.Alg, ErrBadAlg)
	}
	k, ok := v.keys.keys[sig.KeyID]
	if !ok {
		return fmt.Errorf("key %q: %w", sig.KeyID, ErrUnknownKey)
	}
	if now.Before(k.NotBefore) { // R12: only keys inside their window
		return fmt.Errorf("key %q valid from %s, now %s: %w", sig.KeyID, k.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), ErrKeyNotYetValid)
	}
	if !now.Before(k.NotAfter) {
		return fmt.Errorf("key %q valid until %s, now %s: %w", sig.KeyID, k.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), ErrKeyExpired)
	}
	raw, err := base64.StdEncoding.DecodeString(sig.Value)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("signature value malformed: %w", ErrTampered)
	}
	if !ed25519.Verify(k.PublicKey, msg, raw) {
		return ErrTampered
	}
	return nil
}

// VerifiedMap is a map whose signature has been checked (or which was
// derived from one by applying a verified delta) and which passed
// validation. Only a Verifier makes one, so code that takes a *VerifiedMap
// cannot be handed an unverified document (R11). It is immutable.
type VerifiedMap struct {
	m  *Map
	ix *Index
}

// Map returns the verified document. Callers must not modify it.
func (vm *VerifiedMap) Map() *Map { return vm.m }

// Version is the map_version, or 0 for a nil map ("no map").
func (vm *VerifiedMap) Version() uint64 {
	if vm == nil {
		return 0
	}
	return vm.m.Version
}

// Index returns the slot index of the verified map.
func (vm *VerifiedMap) Index() *Index { return vm.ix }

// ResolveKey resolves key against the verified map (R97, V3).
func (vm *VerifiedMap) ResolveKey(key string) (Resolution, error) { return vm.ix.ResolveKey(key) }

// VerifyMap checks m's signature with a key valid at now (R11, R12) and then
// validates it (R5, R7). Any failure is counted and reported as a
// rejection and returned as a CodeInvalid error whose chain holds a
// *VerificationError — regardless of how new m is (R12). The result holds
// a private copy of m.
func (v *Verifier) VerifyMap(m *Map, now time.Time) (*VerifiedMap, error) {
	const op = "authority.VerifyMap"
	rej := Rejection{Doc: "map", Version: m.Version}
	if m.Signature != nil {
		rej.KeyID = m.Signature.KeyID
	}
	msg, err := signedMapMessage(m)
	if err == nil {
		err = v.check(m.Signature, msg, now)
	}
	if err == nil {
		err = Validate(m) // a signed but malformed map is still a fault
	}
	if err != nil {
		rej.Err = err
		return nil, v.reject(op, rej)
	}
	cp := m.Clone()
	ix, err := NewIndex(cp)
	if err != nil {
		rej.Err = err
		return nil, v.reject(op, rej)
	}
	return &VerifiedMap{m: cp, ix: ix}, nil
}

// VerifyDelta checks d's signature with a key valid at now (R10–R12),
// counting and reporting a failure as VerifyMap does.
func (v *Verifier) VerifyDelta(d *Delta, now time.Time) error {
	rej := Rejection{Doc: "delta", Version: d.Version, BaseVersion: d.BaseVersion}
	if d.Signature != nil {
		rej.KeyID = d.Signature.KeyID
	}
	msg, err := signedDeltaMessage(d)
	if err == nil {
		err = v.check(d.Signature, msg, now)
	}
	if err != nil {
		rej.Err = err
		return v.reject("authority.VerifyDelta", rej)
	}
	return nil
}

// ApplyDelta verifies d (R11: whoever relayed it) and applies it to base
// (R9, R103). A delta for a different base returns ErrWrongBase without
// counting a fault — a client holding another version is ordinary — but a
// signed delta that produces an invalid map is a fault.
func (v *Verifier) ApplyDelta(base *VerifiedMap, d *Delta, now time.Time) (*VerifiedMap, error) {
	const op = "authority.ApplyDelta"
	if err := v.VerifyDelta(d, now); err != nil {
		return nil, err
	}
	if base == nil || d.BaseVersion != base.Version() {
		return nil, invalidf(op, ErrWrongBase, "delta %d is based on %d, cached map is %d", d.Version, d.BaseVersion, base.Version())
	}
	out, err := ApplyDelta(base.m, d)
	if err != nil {
		return nil, v.reject(op, Rejection{Doc: "delta", Version: d.Version, BaseVersion: d.BaseVersion, KeyID: d.Signature.KeyID, Err: err})
	}
	ix, err := NewIndex(out)
	if err != nil {
		return nil, v.reject(op, Rejection{Doc: "delta", Version: d.Version, BaseVersion: d.BaseVersion, KeyID: d.Signature.KeyID, Err: err})
	}
	return &VerifiedMap{m: out, ix: ix}, nil
}

// Adopt verifies candidate and returns it if it is newer than cached
// (R11, R12, R6). A candidate that fails verification is rejected even when
// newer; a valid one that is not newer returns ErrNotNewer (not a fault).
func (v *Verifier) Adopt(cached *VerifiedMap, candidate *Map, now time.Time) (*VerifiedMap, error) {
	vm, err := v.VerifyMap(candidate, now)
	if err != nil {
		return nil, err
	}
	if vm.Version() <= cached.Version() {
		return nil, coded(blobplane.CodeConflict, "authority.Adopt", fmt.Errorf("candidate %d, cached %d: %w", vm.Version(), cached.Version(), ErrNotNewer))
	}
	if cached != nil {
		if err := CheckSuccessor(cached.m, vm.m); err != nil { // R16: a signed map that regresses an epoch is still a fault
			return nil, v.reject("authority.Adopt", Rejection{Doc: "map", Version: candidate.Version, KeyID: candidate.Signature.KeyID, Err: err})
		}
	}
	return vm, nil
}
