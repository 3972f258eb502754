package admin_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/admin"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// `api cluster format|finalize` (ZBP-5 R44): the level and each node's;
// finalize refused, listing the live nodes that read less and leaving
// the level, then raising it once they are gone, and saying so again.
func TestClusterCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	for _, q := range []string{
		`UPDATE cluster_format SET level = 1`,
		`INSERT INTO nodes (node_id, datacenter, role) VALUES ('api-old', 'eu-1', 'api')`,
	} {
		if _, err := d.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.RegisterNode(ctx, store.Node{ID: "api-new", Datacenter: "eu-1", Role: "api"}); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		err := admin.Cluster(ctx, st, args, &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: api cluster"},
		{[]string{"frob"}, "unknown cluster command"},
		{[]string{"finalize", "extra"}, "want 0 argument(s)"},
		{[]string{"finalize", "--level", "3"}, "this build knows levels 1 to 2"},
	} {
		if _, _, err := run(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want %q", c.args, err, c.want)
		}
	}
	out, _, err := run("format")
	if err != nil || !strings.Contains(out, "cluster format level 1") || !strings.Contains(out, "api-old  api   1      true") ||
		!strings.Contains(out, "api-new  api   2      true") {
		t.Fatalf("format at level 1: %v\n%s", err, out)
	}
	out, errOut, err := run("finalize", "--by", "ops")
	if err == nil || !strings.Contains(err.Error(), "stays 1") || !strings.Contains(errOut, "api-old (api) reads level 1") || strings.Contains(errOut, "api-new") || out != "" {
		t.Fatalf("finalize with api-old live: %v\nstdout %q\nstderr %q", err, out, errOut)
	}
	if err := st.MarkNodeDown(ctx, "api-old"); err != nil {
		t.Fatal(err)
	}
	if out, _, err := run("finalize", "--by", "ops"); err != nil || out != "cluster format level 1 -> 2\n" {
		t.Fatalf("finalize: %v %q", err, out)
	}
	if out, _, err := run("finalize"); err != nil || !strings.Contains(out, "level 2 already") {
		t.Fatalf("finalize again: %v %q", err, out)
	}
	if out, _, err := run("format"); err != nil || !strings.Contains(out, "cluster format level 2 (set by cli by ops") {
		t.Fatalf("format at level 2: %v %q", err, out)
	}
}
