// Package testbin builds the project's real binaries for the tests that
// run them as processes of their own (cmd/api's, the soak).
package testbin

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// Build compiles the real api, worker and controller into a temp dir of
// t's and returns the dir (no race detector: they are the system under
// test, run as they ship). Each call builds anew.
func Build(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"github.com/blobplane/blobplane/cmd/api", "github.com/blobplane/blobplane/cmd/worker", "github.com/blobplane/blobplane/cmd/controller")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}
