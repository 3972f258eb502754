package blobplane_test

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
)

// refValidDigest is the reference model of ParseDigest's acceptance:
// exactly "sha256:" followed by 64 characters from [0-9a-f].
func refValidDigest(s string) bool {
	const hexdigits = "0123456789abcdef"
	if len(s) != len("sha256:")+64 || s[:7] != "sha256:" {
		return false
	}
	for _, c := range []byte(s[7:]) {
		if strings.IndexByte(hexdigits, c) < 0 {
			return false
		}
	}
	return true
}

// checkParseDigest asserts ParseDigest's contract for one input: it
// agrees with the reference model; a rejection carries CodeInvalid; an
// accepted digest renders back to the input.
func checkParseDigest(t *testing.T, s string) {
	t.Helper()
	d, err := blobplane.ParseDigest(s)
	want := refValidDigest(s)
	switch {
	case want && err != nil:
		t.Fatalf("ParseDigest(%q) = %v; want accepted", s, err)
	case !want && err == nil:
		t.Fatalf("ParseDigest(%q) = %q; want rejected", s, d)
	case err != nil:
		if c := blobplane.ErrorCode(err); c != blobplane.CodeInvalid {
			t.Fatalf("ParseDigest(%q): code %q, want %q (%v)", s, c, blobplane.CodeInvalid, err)
		}
		if d != "" {
			t.Fatalf("ParseDigest(%q): rejected but returned %q", s, d)
		}
	default:
		if string(d) != s || d.String() != s {
			t.Fatalf("ParseDigest(%q) renders as %q / %q", s, string(d), d.String())
		}
		if d.Hex() != s[len(blobplane.DigestPrefix):] {
			t.Fatalf("ParseDigest(%q).Hex() = %q", s, d.Hex())
		}
	}
}

var (
	emptySHA = blobplane.DigestFromHash(sha256.New()).String()
	allHex   = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestParseDigest(t *testing.T) {
	t.Parallel()
	valid := []string{
		emptySHA,
		allHex,
		"sha256:" + strings.Repeat("0", 64),
		"sha256:" + strings.Repeat("f", 64),
	}
	for _, s := range valid {
		if !refValidDigest(s) {
			t.Fatalf("reference model rejects valid %q", s)
		}
		checkParseDigest(t, s)
	}
	invalid := []string{
		"",
		"sha256:",
		"sha256",
		strings.Repeat("a", 64),             // no algorithm
		"sha256:" + strings.Repeat("A", 64), // uppercase
		"SHA256:" + strings.Repeat("a", 64), // uppercase algorithm
		"sha256:" + strings.Repeat("a", 63), // short
		"sha256:" + strings.Repeat("a", 65), // long
		"sha256:" + strings.Repeat("a", 63) + "g",     // not hex
		"sha256:" + strings.Repeat("a", 63) + "\x00",  // NUL
		"sha256:" + strings.Repeat("a", 63) + "é"[:1], // high byte
		" sha256:" + strings.Repeat("a", 64),          // leading space
		"sha256:" + strings.Repeat("a", 64) + "\n",    // trailing newline
		"sha256: " + strings.Repeat("a", 63),          // space in hex
		"sha512:" + strings.Repeat("a", 128),          // other algorithm
		"sha384:" + strings.Repeat("a", 64),           // other algorithm, sha256 length
		"sha256:sha256:" + strings.Repeat("a", 57),    // doubled prefix, right total length
		"sha256:" + strings.Repeat("a", 32) + "-" + strings.Repeat("a", 31),
		"sha256:" + strings.Repeat("ａ", 21) + "a", // multibyte, 64 bytes
	}
	for _, s := range invalid {
		if refValidDigest(s) {
			t.Fatalf("reference model accepts invalid %q", s)
		}
		checkParseDigest(t, s)
	}
}

func FuzzParseDigest(f *testing.F) {
	for _, s := range []string{
		emptySHA,
		allHex,
		"sha256:" + strings.Repeat("A", 64),
		"sha256:" + strings.Repeat("a", 63),
		"sha512:" + strings.Repeat("a", 64),
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkParseDigest(t, s)
		// Lowercasing a rejected string with uppercase hex must not make
		// ParseDigest disagree with the model either.
		checkParseDigest(t, strings.ToLower(s))
	})
}
