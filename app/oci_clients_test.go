package app_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
)

// tool returns the path of a pinned OCI client, built by scripts/tool.sh
// (from the Go module proxy) when it is not cached yet.
func tool(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("real OCI clients are not built in -short runs")
	}
	out, err := exec.Command("bash", filepath.Join("..", "scripts", "tool.sh"), name).Output()
	if err != nil {
		t.Fatalf("scripts/tool.sh %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// Real clients, unchanged, with HTTP Basic (token as password): oras pushes
// and fetches a blob, crane reads it, and oras deletes the reference.
func TestOCIRealClients(t *testing.T) {
	oras, crane := tool(t, "oras"), tool(t, "crane")
	c := startCluster(t)
	ctx := context.Background()
	repo := c.repos[0]
	if err := c.st.CreateRepository(ctx, repo); err != nil {
		t.Fatal(err)
	}
	gs, _ := auth.ParseGrants([]string{"team/*:write"})
	tok, _, err := c.st.CreateToken(ctx, "ci", gs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func(name string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "DOCKER_CONFIG="+dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, out, stderr.String())
		}
		return out
	}

	content := make([]byte, 3<<20+17)
	rand.Read(content)
	sum := sha256.Sum256(content)
	d := "sha256:" + hex.EncodeToString(sum[:])
	file := filepath.Join(dir, "layer.bin")
	if err := os.WriteFile(file, content, 0o600); err != nil {
		t.Fatal(err)
	}
	home := strings.TrimPrefix(c.nodes[0].URL(), "http://")
	orasAuth := []string{"--plain-http", "-u", "ci", "-p", tok, "--registry-config", filepath.Join(dir, "oras.json")}

	out := run(oras, append([]string{"blob", "push", home + "/" + repo, file}, orasAuth...)...)
	if !strings.Contains(string(out), d) {
		t.Fatalf("oras blob push printed %q, want %s", out, d)
	}
	got := run(oras, append([]string{"blob", "fetch", "--output", "-", home + "/" + repo + "@" + d}, orasAuth...)...)
	if !bytes.Equal(got, content) {
		t.Fatalf("oras blob fetch: %d bytes, want %d", len(got), len(content))
	}

	// Both test nodes name their own temporary directory "fs" in one
	// datacenter; a real datacenter shares one backend, so read at home.
	run(crane, "auth", "login", home, "-u", "ci", "-p", tok)
	got = run(crane, "blob", "--insecure", home+"/"+repo+"@"+d)
	if !bytes.Equal(got, content) {
		t.Fatalf("crane blob: %d bytes, want %d", len(got), len(content))
	}

	run(oras, append([]string{"blob", "delete", "--force", home + "/" + repo + "@" + d}, orasAuth...)...)
	if _, err := c.st.ReferencedBlob(ctx, repo, blobplaneDigest(d)); err == nil {
		t.Fatal("reference survived oras blob delete")
	}
}

func blobplaneDigest(s string) blobplane.Digest { return blobplane.Digest(s) }
