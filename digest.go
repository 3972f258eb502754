package blobplane

import (
	"encoding/hex"
	"hash"
	"strings"
)

// DigestPrefix is the only algorithm Blobplane accepts.
const DigestPrefix = "sha256:"

// Digest is a validated, canonical content digest: "sha256:" followed by 64
// lowercase hex characters of the SHA-256 of the content (decoded) bytes.
// The zero value is not a valid digest.
type Digest string

// ParseDigest validates s and returns it as a Digest. Anything but the
// canonical form is rejected: uppercase hex, other algorithms, whitespace,
// wrong length.
func ParseDigest(s string) (Digest, error) {
	if !strings.HasPrefix(s, DigestPrefix) {
		return "", Errorf(CodeInvalid, "digest %q: must be sha256:<64 lowercase hex>", truncate(s))
	}
	h := s[len(DigestPrefix):]
	if len(h) != 64 {
		return "", Errorf(CodeInvalid, "digest %q: must be sha256:<64 lowercase hex>", truncate(s))
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", Errorf(CodeInvalid, "digest %q: must be sha256:<64 lowercase hex>", truncate(s))
		}
	}
	return Digest(s), nil
}

// DigestFromHash returns the digest of a finished sha256 hash.
func DigestFromHash(h hash.Hash) Digest {
	var buf [32]byte
	return Digest(DigestPrefix + hex.EncodeToString(h.Sum(buf[:0])))
}

// Hex returns the 64 hex characters without the algorithm prefix.
func (d Digest) Hex() string { return strings.TrimPrefix(string(d), DigestPrefix) }

func (d Digest) String() string { return string(d) }

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
