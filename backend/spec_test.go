package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/backend"
)

func TestParseSpecs(t *testing.T) {
	specs, err := backend.ParseSpecs("fs=filesystem:./.data/local/blobs, s3main=s3://bucket?endpoint=http://127.0.0.1:9000&path_style=true&region=us-east-1,arch=s3://archive-1/blobs/v1?store=zstd&access_key_id=AK&secret_access_key=SK&part_size=8388608")
	if err != nil {
		t.Fatal(err)
	}
	want := []backend.Spec{
		{Name: "fs", Kind: backend.KindFilesystem, Store: backend.StoreAsSubmitted, Path: "./.data/local/blobs"},
		{Name: "s3main", Kind: backend.KindS3, Store: backend.StoreAsSubmitted, S3: backend.S3Config{
			Bucket: "bucket", Endpoint: "http://127.0.0.1:9000", Region: "us-east-1", PathStyle: true}},
		{Name: "arch", Kind: backend.KindS3, Store: backend.StoreZstd, S3: backend.S3Config{
			Bucket: "archive-1", Prefix: "blobs/v1/", AccessKeyID: "AK", SecretAccessKey: "SK", PartSize: 8 << 20}},
	}
	if len(specs) != len(want) {
		t.Fatalf("got %d specs", len(specs))
	}
	for i := range want {
		if specs[i] != want[i] {
			t.Errorf("spec %d = %+v\nwant %+v", i, specs[i], want[i])
		}
	}
	if s := specs[2].String(); strings.Contains(s, "SK") || !strings.Contains(s, "REDACTED") {
		t.Errorf("String() leaks the secret: %s", s)
	}
	if specs[0].String() != "fs=filesystem:./.data/local/blobs" {
		t.Errorf("String() = %s", specs[0].String())
	}
}

func TestParseSpecsErrors(t *testing.T) {
	for in, mention := range map[string]string{
		"":                                            "empty list",
		"fs":                                          `entry 1 ("fs")`,
		"fs=filesystem:/a,fs=filesystem:/b":           `entry 2 ("fs=filesystem:/b"): name "fs" is used twice`,
		"a=filesystem:/a,b=nfs:/x":                    `entry 2 ("b=nfs:/x"): unknown backend kind "nfs"`,
		"Fs=filesystem:/a":                            `name "Fs"`,
		"a=filesystem:":                               "empty path",
		"a=filesystem:/x?store=lz4":                   `store "lz4"`,
		"a=filesystem:/x?colour=red":                  `unknown option "colour"`,
		"a=filesystem:/x?sync=always":                 `sync "always": want file or filesystem`,
		"a=filesystem:/x?direct=8MiB":                 `direct "8MiB": want the smallest size in bytes`,
		"a=filesystem:/x?direct=0":                    `direct "0"`,
		"a=filesystem:/x?direct=-5":                   `direct "-5"`,
		"a=s3://bucket?direct=1":                      `unknown option "direct"`,
		"a=s3://B?region=x":                           `bucket "B"`,
		"a=s3://bucket?endpoint=127.0.0.1:9000":       "endpoint",
		"a=s3://bucket?path_style=maybe":              "path_style",
		"a=s3://bucket?access_key_id=x":               "go together",
		"a=s3://bucket?part_size=1":                   "part_size",
		"a=s3://bucket?regoin=us-east-1":              `unknown option "regoin"`,
		"a=s3://bucket?secret_access_key=hunter2&x=1": "REDACTED",
	} {
		_, err := backend.ParseSpecs(in)
		if !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("ParseSpecs(%q): %v, want invalid", in, err)
			continue
		}
		if !strings.Contains(err.Error(), mention) {
			t.Errorf("ParseSpecs(%q): %q does not mention %q", in, err, mention)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error leaks a secret: %v", err)
		}
	}
}

func TestParseSyncMode(t *testing.T) {
	for in, want := range map[string]backend.SyncMode{
		"fs=filesystem:/x":                            "",
		"fs=filesystem:/x?sync=file":                  backend.SyncFile,
		"fs=filesystem:/x?store=zstd&sync=filesystem": backend.SyncFilesystem,
	} {
		spec, err := backend.ParseSpec(in)
		if err != nil || spec.Sync != want {
			t.Errorf("ParseSpec(%q): sync %q, %v; want %q", in, spec.Sync, err, want)
			continue
		}
		if back, err := backend.ParseSpec(spec.String()); err != nil || back != spec {
			t.Errorf("String() of %q = %q, which parses to %+v, %v", in, spec.String(), back, err)
		}
	}
	if _, err := backend.ParseSpec("s3=s3://bucket?sync=file"); !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), `unknown option "sync"`) {
		t.Errorf("sync on an s3 backend: %v", err)
	}
}

// direct=<bytes> sets the smallest write a filesystem backend makes past
// the page cache, and survives String().
func TestParseDirect(t *testing.T) {
	for in, want := range map[string]int64{
		"fs=filesystem:/x":                              0,
		"fs=filesystem:/x?direct=8388608":               8 << 20,
		"fs=filesystem:/x?sync=file&direct=1":           1,
		"fs=filesystem:/x?direct=1073741824&store=zstd": 1 << 30,
	} {
		spec, err := backend.ParseSpec(in)
		if err != nil || spec.Direct != want {
			t.Errorf("ParseSpec(%q): direct %d, %v; want %d", in, spec.Direct, err, want)
			continue
		}
		if back, err := backend.ParseSpec(spec.String()); err != nil || back != spec {
			t.Errorf("String() of %q = %q, which parses to %+v, %v", in, spec.String(), back, err)
		}
	}
}

func TestOpenUnknownKind(t *testing.T) {
	_, err := backend.Open(t.Context(), backend.Spec{Name: "x", Kind: "tape"})
	if !errors.Is(err, backend.ErrInvalid) || !strings.Contains(err.Error(), "not compiled") {
		t.Fatalf("Open of an unregistered kind: %v", err)
	}
}

// FuzzParseSpecs: any input either fails with ErrInvalid or gives specs
// that render back (String) to the same specs, secrets aside (String
// redacts them).
//
//	go test -run '^$' -fuzz FuzzParseSpecs -fuzztime 30s ./backend/
func FuzzParseSpecs(f *testing.F) {
	for _, seed := range []string{
		"fs=filesystem:./.data/local/blobs",
		"fs=filesystem:/x?store=zstd&sync=file&direct=8388608",
		"fs=filesystem:/x?direct=0",
		"s3main=s3://bucket/p?endpoint=http://127.0.0.1:9000&path_style=true&region=us-east-1&part_size=8388608",
		"a=s3://bucket?access_key_id=x&secret_access_key=y,b=filesystem:/y",
		"a=filesystem:/x?sync=always",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		specs, err := backend.ParseSpecs(in)
		if err != nil {
			if !errors.Is(err, backend.ErrInvalid) {
				t.Fatalf("ParseSpecs(%q): %v, want ErrInvalid", in, err)
			}
			return
		}
		for _, spec := range specs {
			if spec.S3.SecretAccessKey != "" {
				continue
			}
			back, err := backend.ParseSpec(spec.String())
			if err != nil || back != spec {
				t.Fatalf("ParseSpecs(%q): %+v renders as %q, which parses to %+v, %v", in, spec, spec.String(), back, err)
			}
		}
	})
}
