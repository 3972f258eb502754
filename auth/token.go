package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"strings"

	"github.com/blobplane/blobplane"
)

// Token format: "bp_" + id + "_" + secret, where id is 10 random bytes and
// secret 32 random bytes, both lowercase unpadded base32 (16 and 52
// characters; 72 in all). The id is public (stored, logged, shown by
// `api token revoke`); the secret is shown once and only its SHA-256 is
// stored. With 256 random bits a plain SHA-256 is enough: there is nothing to
// brute-force that a slow hash would protect.
const (
	TokenPrefix   = "bp_"
	idBytes       = 10
	secretBytes   = 32
	idLen         = 16 // base32 of 10 bytes
	secretLen     = 52 // base32 of 32 bytes, unpadded
	tokenLen      = len(TokenPrefix) + idLen + 1 + secretLen
	base32Charset = "abcdefghijklmnopqrstuvwxyz234567"
)

var b32 = base32.NewEncoding(base32Charset).WithPadding(base32.NoPadding)

// Token is a parsed token string.
type Token struct {
	ID     string
	Secret string
}

// NewToken returns a fresh random token.
func NewToken() Token {
	id := make([]byte, idBytes)
	secret := make([]byte, secretBytes)
	rand.Read(id) // crypto/rand.Read never fails (it crashes the program instead)
	rand.Read(secret)
	return Token{ID: b32.EncodeToString(id), Secret: b32.EncodeToString(secret)}
}

// String returns the token as clients present it.
func (t Token) String() string { return TokenPrefix + t.ID + "_" + t.Secret }

// Hash returns the SHA-256 of the secret, the only part the store keeps.
func (t Token) Hash() []byte {
	h := sha256.Sum256([]byte(t.Secret))
	return h[:]
}

// Matches reports, in constant time, whether t's secret hashes to hash.
func (t Token) Matches(hash []byte) bool {
	return subtle.ConstantTimeCompare(t.Hash(), hash) == 1
}

// ParseToken parses a token string. A malformed one is an unauthorized
// error that does not echo the input (it may be a mistyped secret).
func ParseToken(s string) (Token, error) {
	bad := blobplane.Errorf(blobplane.CodeUnauthorized, "malformed token: expected %s<id>_<secret>", TokenPrefix)
	if len(s) != tokenLen || !strings.HasPrefix(s, TokenPrefix) || s[len(TokenPrefix)+idLen] != '_' {
		return Token{}, bad
	}
	t := Token{ID: s[len(TokenPrefix) : len(TokenPrefix)+idLen], Secret: s[len(TokenPrefix)+idLen+1:]}
	if !ValidTokenID(t.ID) || !isBase32(t.Secret) {
		return Token{}, bad
	}
	return t, nil
}

// ValidTokenID reports whether id has the shape of a token id.
func ValidTokenID(id string) bool { return len(id) == idLen && isBase32(id) }

// TokenIDOf returns the id of s, which may be a token id or a whole token
// (so `api token revoke` accepts either).
func TokenIDOf(s string) (string, error) {
	if ValidTokenID(s) {
		return s, nil
	}
	if t, err := ParseToken(s); err == nil {
		return t.ID, nil
	}
	return "", blobplane.Errorf(blobplane.CodeInvalid, "%q is neither a token id (16 base32 characters) nor a token", truncate(s))
}

func isBase32(s string) bool {
	for i := 0; i < len(s); i++ {
		if !strings.ContainsRune(base32Charset, rune(s[i])) {
			return false
		}
	}
	return true
}
