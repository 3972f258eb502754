package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/backend"
)

func TestParseRepresentation(t *testing.T) {
	good := map[string]backend.Representation{
		"zstd:4096:16384":            {Codec: backend.CodecZstd, PayloadSize: 4096, ContentSize: 16384},
		"identity:16384:16384":       backend.Identity(16384),
		"identity:0:0":               backend.Identity(0),
		"zstd:0:0":                   {Codec: backend.CodecZstd},
		"zstd:9223372036854775807:1": {Codec: backend.CodecZstd, PayloadSize: 1<<63 - 1, ContentSize: 1},
	}
	for s, want := range good {
		got, err := backend.ParseRepresentation(s)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", s, got, err, want)
		}
		if got.String() != s {
			t.Errorf("String() = %q, want %q", got.String(), s)
		}
	}
	for _, s := range []string{
		"", "zstd", "zstd:1", "zstd:1:", "zstd::1", "lz4:1:1", "ZSTD:1:1", "identity:1:2",
		"zstd:-1:1", "zstd:+1:1", "zstd:01:1", "zstd:1:1:1", "zstd: 1:1", "zstd:1:1 ",
		"zstd:9223372036854775808:1", "zstd:0x10:1", strings.Repeat("9", 200),
	} {
		if _, err := backend.ParseRepresentation(s); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("Parse(%q): %v, want invalid", s, err)
		}
	}
}

// FuzzParseRepresentation: whatever parses is valid and formats back to
// exactly the input (the text on objects is canonical), and the parser
// never panics. Seed corpus: testdata/fuzz/FuzzParseRepresentation.
func FuzzParseRepresentation(f *testing.F) {
	for _, s := range []string{"zstd:4096:16384", "identity:5:5", "identity:0:0", "zstd:1:2:3", "lz4:1:1", "zstd:01:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := backend.ParseRepresentation(s)
		if err != nil {
			if !errors.Is(err, backend.ErrInvalid) {
				t.Fatalf("Parse(%q): error %v is not ErrInvalid", s, err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("Parse(%q) accepted an invalid %+v: %v", s, r, err)
		}
		if r.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, r.String())
		}
		if len(s) > backend.MaxReprLen {
			t.Fatalf("accepted %d bytes, max %d", len(s), backend.MaxReprLen)
		}
	})
}
