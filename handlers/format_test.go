package handlers_test

import (
	"context"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/store"
)

var _ handlers.FormatAdmin = (*store.Store)(nil)

// ZBP-5 R44, R88: *:admin reads the cluster's format level and every
// node's, and raises it (finalize) only once no live node reads less: a
// 409 names the node in the way; a malformed body or an unknown level is
// 400. Below level 2 a quota with an upload rate is 409 naming the
// finalize; after it, accepted. (Who may not: TestAdminAPITwoTenantsAndAStranger.)
func TestAdminAPIClusterFormat(t *testing.T) {
	t.Parallel()
	e := adminAPISetup(t)
	ctx := context.Background()
	const path = "/v1/admin/cluster/format"
	var cf handlers.ClusterFormatJSON
	decode(t, "GET on a fresh database", e.do(t, "GET", path, "", e.root), 200, &cf)
	if cf.Level != 2 || cf.RaisedBy != "migration 00043" || len(cf.Nodes) != 0 {
		t.Fatalf("a fresh database: %+v", cf)
	}
	for _, q := range []string{
		`UPDATE cluster_format SET level = 1`,
		`INSERT INTO nodes (node_id, datacenter, role) VALUES ('api-old', 'eu-1', 'api')`,
	} {
		if _, err := e.st.Pool().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	rate := `{"max_blobs_per_minute": 600}`
	a := e.do(t, "PUT", "/v1/admin/quotas/"+e.repoA, rate, e.root)
	wantCode(t, "a rate at level 1", a, 409, "conflict")
	if !strings.Contains(a.body, "api cluster finalize") {
		t.Errorf("a rate at level 1 does not say how to finalize: %s", a.body)
	}
	if a := e.do(t, "PUT", "/v1/admin/quotas/"+e.repoA, `{"max_blobs": 10}`, e.root); a.status != 200 {
		t.Fatalf("a quota without a rate at level 1: %d %s", a.status, a.body)
	}

	for _, body := range []string{``, `{"level": "two"}`, `{"lvl": 2}`, `[2]`, `{"level": 3}`, `{"level": 0}`} {
		wantCode(t, "finalize with "+body, e.do(t, "POST", path, body, e.root), 400, "invalid")
	}
	a = e.do(t, "POST", path, `{"level": 2}`, e.root)
	wantCode(t, "finalize with api-old live", a, 409, "conflict")
	if !strings.Contains(a.body, "api-old (api, reads level 1)") {
		t.Errorf("the refusal does not name api-old: %s", a.body)
	}
	decode(t, "GET at level 1", e.do(t, "GET", path, "", e.root), 200, &cf)
	if cf.Level != 1 || len(cf.Nodes) != 1 || cf.Nodes[0] != (handlers.FormatNodeJSON{Node: "api-old", Role: "api", ReadsFormat: 1, Live: true}) {
		t.Fatalf("at level 1: %+v", cf)
	}

	if err := e.st.MarkNodeDown(ctx, "api-old"); err != nil {
		t.Fatal(err)
	}
	decode(t, "finalize", e.do(t, "POST", path, `{"level": 2}`, e.root), 200, &cf)
	if cf.Level != 2 || cf.Raised == nil || *cf.Raised != (handlers.FormatRaisedJSON{From: 1, To: 2}) || cf.RaisedBy != "api by root" {
		t.Fatalf("finalize: %+v %+v", cf, cf.Raised)
	}
	decode(t, "finalize again", e.do(t, "POST", path, `{"level": 2}`, e.root), 200, &cf)
	if cf.Level != 2 || *cf.Raised != (handlers.FormatRaisedJSON{From: 2, To: 2}) {
		t.Fatalf("finalize again: %+v %+v", cf, cf.Raised)
	}
	if a := e.do(t, "PUT", "/v1/admin/quotas/"+e.repoA, rate, e.root); a.status != 200 || !strings.Contains(a.body, `"max_blobs_per_minute": 600`) {
		t.Fatalf("a rate at level 2: %d %s", a.status, a.body)
	}
}
