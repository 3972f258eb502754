package config

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Issue 26 point 8: a cluster secret file that others on the machine can
// read is a stolen secret; it is refused at start with the fix, not used.
func TestAttackWorldReadableClusterSecretRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
		dir := t.TempDir()
		path := filepath.Join(dir, "cluster-secret")
		if err := os.WriteFile(path, []byte(strings.Repeat("s", 64)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		c := &Config{DataDir: dir}
		err := c.ResolveClusterSecret()
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "chmod 600 "+path) {
			t.Errorf("mode %04o: %v, want a refusal naming %s and the chmod", mode, err, path)
		}
		if c.ClusterSecret != "" {
			t.Errorf("mode %04o: the secret was used", mode)
		}
	}
	// A file holding less than a secret (truncated, tampered) is refused
	// too, never used or overwritten.
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster-secret")
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (&Config{DataDir: dir}).ResolveClusterSecret(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("short secret file: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "short" {
		t.Errorf("short secret file rewritten: %q", b)
	}
}

// Processes starting together agree on one secret: exactly one creates
// the file (whole, mode 0600, no temp file left), the others read it.
func TestClusterSecretCreatedOnceAtomically(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	const n = 16
	got := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := &Config{DataDir: dir}
			errs[i] = c.ResolveClusterSecret()
			got[i] = c.ClusterSecret
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || len(got[i]) < 32 || got[i] != got[0] {
			t.Fatalf("process %d: %q (%v), process 0: %q", i, got[i], errs[i], got[0])
		}
	}
	path := filepath.Join(dir, "cluster-secret")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != got[0] {
		t.Fatalf("file holds %q, processes use %q", b, got[0])
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left in the data dir: %v", entries)
	}
}

// TLS files: both or neither, and only with an internal listener.
func TestTLSSettingsBothOrNeither(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": goodURL}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		env  map[string]string
		want string // "" accepted, else a word of the error
	}{
		{with(), ""},
		{with("BLOBPLANE_INTERNAL_LISTEN", "127.0.0.1:9444"), ""},
		{with("BLOBPLANE_TLS_CERT", "c.pem", "BLOBPLANE_TLS_KEY", "k.pem", "BLOBPLANE_INTERNAL_LISTEN", "127.0.0.1:9444"), ""},
		{with("BLOBPLANE_TLS_CERT", "c.pem", "BLOBPLANE_INTERNAL_LISTEN", "127.0.0.1:9444"), "BLOBPLANE_TLS_KEY too"},
		{with("BLOBPLANE_TLS_KEY", "k.pem", "BLOBPLANE_INTERNAL_LISTEN", "127.0.0.1:9444"), "BLOBPLANE_TLS_CERT too"},
		{with("BLOBPLANE_TLS_CERT", "c.pem", "BLOBPLANE_TLS_KEY", "k.pem"), "BLOBPLANE_INTERNAL_LISTEN"},
		{with("BLOBPLANE_INTERNAL_LISTEN", "example.com:9444"), "BLOBPLANE_INTERNAL_LISTEN"},
	} {
		c, _, err := Load(API, nil, env(tc.env), nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.env, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error about %s", tc.env, err, tc.want)
		case err == nil && c.InternalPort() != "" && c.InternalPort() != "9444":
			t.Errorf("%v: internal port %q", tc.env, c.InternalPort())
		}
	}
}
