package controller

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/internal/atomicfile"
)

// KeyFile is the controller's signing key on disk (or in
// BLOBPLANE_SIGNING_KEY): the only copy of the private key (R10). The
// public half and window are published to Postgres; the private half never
// is.
type KeyFile struct {
	KeyID      string             `json:"key_id"`
	Alg        string             `json:"alg"`
	PrivateKey ed25519.PrivateKey `json:"private_key"` // standard base64 of the 64-byte key
	NotBefore  time.Time          `json:"not_before"`
	NotAfter   time.Time          `json:"not_after"`
}

// Signer returns the authority signer for k.
func (k KeyFile) Signer() authority.Signer {
	return authority.Signer{KeyID: k.KeyID, Key: k.PrivateKey}
}

// Trusted returns the public half with its validity window.
func (k KeyFile) Trusted() authority.TrustedKey {
	return authority.TrustedKey{KeyID: k.KeyID, Alg: authority.SignatureAlg,
		PublicKey: k.PrivateKey.Public().(ed25519.PublicKey), NotBefore: k.NotBefore, NotAfter: k.NotAfter}
}

// DefaultKeyPath is where keygen writes and publish reads the key when no
// path is configured.
func DefaultKeyPath(dataDir string) string {
	return filepath.Join(dataDir, "controller", "signing-key.json")
}

// DefaultKeyValidity is a new key's validity window. Rotate by generating
// the next key well before the current one's not_after: windows overlap and
// verifiers accept either (R12).
const DefaultKeyValidity = 365 * 24 * time.Hour

// GenerateKey creates an ed25519 key valid over [notBefore, notBefore +
// validFor). An empty keyID becomes "map-<date>-<random>".
func GenerateKey(r io.Reader, keyID string, notBefore time.Time, validFor time.Duration) (KeyFile, error) {
	if r == nil {
		r = rand.Reader
	}
	if validFor <= 0 {
		return KeyFile{}, blobplane.Errorf(blobplane.CodeInvalid, "key validity %v must be positive", validFor)
	}
	_, priv, err := ed25519.GenerateKey(r)
	if err != nil {
		return KeyFile{}, err
	}
	if keyID == "" {
		var b [5]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return KeyFile{}, err
		}
		keyID = "map-" + notBefore.UTC().Format("20060102") + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
	}
	nb := notBefore.UTC().Truncate(time.Second)
	return KeyFile{KeyID: keyID, Alg: authority.SignatureAlg, PrivateKey: priv, NotBefore: nb, NotAfter: nb.Add(validFor)}, nil
}

// ParseKey reads a key file's contents and checks it.
func ParseKey(data []byte) (KeyFile, error) {
	var k KeyFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		return KeyFile{}, blobplane.Errorf(blobplane.CodeInvalid, "signing key: not a key file: %v", err)
	}
	if len(k.PrivateKey) != ed25519.PrivateKeySize {
		return KeyFile{}, blobplane.Errorf(blobplane.CodeInvalid, "signing key %q: private key is %d bytes, want %d", k.KeyID, len(k.PrivateKey), ed25519.PrivateKeySize)
	}
	if _, err := authority.NewKeyring(k.Trusted()); err != nil {
		return KeyFile{}, err
	}
	return k, nil
}

// LoadKey returns the signing key from inline (the contents of
// BLOBPLANE_SIGNING_KEY) when set, else from the file at path.
func LoadKey(inline, path string) (KeyFile, error) {
	if inline != "" {
		return ParseKey([]byte(inline))
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return KeyFile{}, blobplane.Errorf(blobplane.CodeNotFound, "no signing key at %s (run: controller keygen, or set BLOBPLANE_SIGNING_KEY_FILE)", path)
	}
	if err != nil {
		return KeyFile{}, err
	}
	return ParseKey(data)
}

// WriteKey writes k to path with mode 0600, refusing to replace an existing
// file (losing a published key's private half forces a rotation). The
// write is atomic: temp file in the same directory, fsync, link into place,
// fsync the directory.
func WriteKey(path string, k KeyFile) error {
	data, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	// atomicfile.Create fails when path exists: never overwrite a key.
	if err := atomicfile.Create(path, append(data, '\n')); err != nil {
		if errors.Is(err, os.ErrExist) {
			return blobplane.Errorf(blobplane.CodeConflict, "%s already exists; keep it, or pass another --out to rotate", path)
		}
		return err
	}
	return nil
}

// Keygen generates a key, writes it to path (0600) and publishes its public
// half and window, so verifiers accept maps it signs from not_before on.
// If publishing fails the file stays: run keygen again with another path,
// or publish later by hand; an unpublished key signs nothing that verifies.
func Keygen(ctx context.Context, st Store, path, keyID string, notBefore time.Time, validFor time.Duration) (KeyFile, error) {
	k, err := GenerateKey(nil, keyID, notBefore, validFor)
	if err != nil {
		return KeyFile{}, err
	}
	if err := WriteKey(path, k); err != nil {
		return KeyFile{}, err
	}
	if err := st.PublishSigningKey(ctx, k.Trusted()); err != nil {
		return KeyFile{}, fmt.Errorf("key written to %s but not published: %w", path, err)
	}
	return k, nil
}
