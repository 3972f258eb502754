package upload_test

import (
	"testing"

	"github.com/blobplane/blobplane/upload"
)

func TestParseContentRange(t *testing.T) {
	t.Parallel()
	for s, want := range map[string][2]int64{"0-4": {0, 4}, "bytes 5-9": {5, 9}, "7-7": {7, 7}} {
		a, b, err := upload.ParseContentRange(s)
		if err != nil || a != want[0] || b != want[1] {
			t.Errorf("%q: %d %d %v", s, a, b, err)
		}
	}
	for _, s := range []string{"", "-", "4-1", "-1-2", "a-b", "1-", "+1-2", "1 -2"} {
		if _, _, err := upload.ParseContentRange(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"0-4", "bytes 5-9", "4-1", "-", "9223372036854775807-9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, b, err := upload.ParseContentRange(s)
		if err == nil && (a < 0 || b < a) {
			t.Fatalf("%q: %d-%d", s, a, b)
		}
	})
}
