package admin_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/admin"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// `api blob obliterate|unmark|obliterations` (docs/obliteration.md): the
// same store calls as the admin API, recorded in the audit table under
// --by; bad invocations name the problem and change nothing.
func TestBlobCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	sum := sha256.Sum256([]byte("obliterated from the command line"))
	dg := "sha256:" + hex.EncodeToString(sum[:])
	if err := st.CreateRepository(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO blobs (digest, size_bytes) VALUES ($1, 33)`,
		`INSERT INTO blob_references (repository, digest, operation_id) VALUES ('team/app', $1, gen_random_uuid())`,
	} {
		if _, err := d.Pool.Exec(ctx, q, dg); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		err := admin.Blob(ctx, st, args, &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: api blob"},
		{[]string{"frob"}, "unknown blob command"},
		{[]string{"obliterate", dg}, "--reason is required"},
		{[]string{"obliterate", dg, "--reason", "  "}, "--reason is required"},
		{[]string{"obliterate", "--reason", "x"}, "name one digest"},
		{[]string{"obliterate", "sha256:abc", "--reason", "x"}, "must be sha256:"},
		{[]string{"obliterate", dg, "--reason", strings.Repeat("x", 2000)}, "at most 1024"},
		{[]string{"obliterate", dg, "--reason", "x", "--by", "not a principal"}, "principal"},
		{[]string{"unmark", dg, "--reason", "x"}, "is not obliterated"},
		{[]string{"obliterations", "--reason", "x", dg}, "flag provided but not defined"},
	} {
		if _, _, err := run(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want %q", c.args, err, c.want)
		}
	}
	var n int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM blob_obliterations`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d audit rows after refusals (%v)", n, err)
	}

	out, notes, err := run("obliterate", "--by", "oncall", dg, "--reason", "leaked credential")
	if err != nil || !strings.Contains(out, "obliterated "+dg) || !strings.Contains(notes, "api blob obliterations "+dg) {
		t.Fatalf("obliterate: %q %q %v", out, notes, err)
	}
	if out, _, err := run("obliterate", dg, "--reason", "again"); err != nil || !strings.Contains(out, "already obliterated") {
		t.Fatalf("obliterate again: %q %v", out, err)
	}
	if out, _, err := run("unmark", dg, "--reason", "rotated", "--by", "oncall"); err != nil || !strings.Contains(out, "may be uploaded again") {
		t.Fatalf("unmark: %q %v", out, err)
	}
	out, _, err = run("obliterations", dg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], dg+"\tcollected\treferences=0 ") ||
		!strings.Contains(lines[1], "\tunmark\toncall\t") || !strings.HasSuffix(lines[1], "\t-\trotated") ||
		!strings.Contains(lines[2], "\tobliterate\toncall\t") || !strings.HasSuffix(lines[2], "\tleaked credential") {
		t.Fatalf("obliterations:\n%s", out)
	}
}
