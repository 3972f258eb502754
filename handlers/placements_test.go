package handlers_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

var _ handlers.PlacementRouter = (*store.Store)(nil)

// placementsSetup serves the real router over real HTTP on a real store
// whose node lives in eu-1, and returns a token with admin on every
// repository, which sees every digest (issue 26 point 3).
func placementsSetup(t *testing.T) (*store.Store, *httptest.Server, string) {
	t.Helper()
	st := pgtest.NewStore(t)
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Placements: st, Datacenter: "eu-1", Auth: st}))
	t.Cleanup(srv.Close)
	return st, srv, token(t, st, "root", "*:admin")
}

func digestOf(s string) blobplane.Digest {
	sum := sha256.Sum256([]byte(s))
	return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// get fetches a raw path (no client-side cleaning) with cred as a Bearer
// token ("" none) and returns the status and body.
func get(t *testing.T, srv *httptest.Server, cred, rawPath string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	path, query, _ := strings.Cut(rawPath, "?")
	req.URL.Opaque = path
	req.URL.RawQuery = query
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func getPlacements(t *testing.T, srv *httptest.Server, cred, rawPath string) handlers.PlacementsBody {
	t.Helper()
	status, body := get(t, srv, cred, rawPath)
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", rawPath, status, body)
	}
	var b handlers.PlacementsBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("GET %s: %v in %s", rawPath, err, body)
	}
	return b
}

// Issue 4: "unknown digest → 200 with known: false", also before the ledger
// exists (spec: reads before the first write return no placements), with
// every category present as an empty list.
func TestPlacementsUnknownDigest(t *testing.T) {
	t.Parallel()
	_, srv, admin := placementsSetup(t)
	d := digestOf("never stored")
	status, body := get(t, srv, admin, "/v1/blobs/"+string(d)+"/placements")
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if raw["known"] != false || raw["serveable"] != false || raw["digest"] != string(d) || raw["datacenter"] != "eu-1" {
		t.Fatalf("body %s", body)
	}
	for _, k := range []string{"local", "verified_remote", "pending", "failed", "revoked"} {
		if l, ok := raw[k].([]any); !ok || len(l) != 0 {
			t.Fatalf("%s = %v, want []", k, raw[k])
		}
	}
}

// Every routing category over HTTP, with each placement's fields, from the
// default datacenter and from a named one.
func TestPlacementsRoutingOverHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, srv, admin := placementsSetup(t)
	d := digestOf("routed")
	key := func(dc, loc string) placement.Key {
		return placement.Key{Digest: d, Backend: "filesystem", Datacenter: dc, Location: loc}
	}
	stage := func(k placement.Key) {
		if _, err := st.StagePlacement(ctx, k, 3, 7); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []placement.Key{key("eu-1", "l"), key("us-1", "r"), key("eu-1", "p"), key("ap-1", "f"), key("eu-1", "x")} {
		stage(k)
	}
	if _, err := st.VerifyPlacement(ctx, key("eu-1", "l"), d, 3, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := st.VerifyPlacement(ctx, key("us-1", "r"), d, 3, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FailPlacement(ctx, key("ap-1", "f"), placement.BackendRefused, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RevokePlacement(ctx, key("eu-1", "x"), placement.Administrative, 7); err != nil {
		t.Fatal(err)
	}

	b := getPlacements(t, srv, admin, "/v1/blobs/"+string(d)+"/placements")
	if !b.Known || !b.Serveable || b.Datacenter != "eu-1" || len(b.Local) != 1 || len(b.VerifiedRemote) != 1 ||
		len(b.Pending) != 1 || len(b.Failed) != 1 || len(b.Revoked) != 1 {
		t.Fatalf("default datacenter: %+v", b)
	}
	l := b.Local[0]
	if l.Backend != "filesystem" || l.Datacenter != "eu-1" || l.Location != "l" || l.State != "verified" ||
		l.Size != 3 || l.Epoch != 7 || l.Generation != 2 || l.UpdatedAt.IsZero() || l.Reason != "" {
		t.Fatalf("local placement %+v", l)
	}
	if f := b.Failed[0]; f.State != "failed" || f.Reason != "backend_refused" || f.Generation != 2 {
		t.Fatalf("failed placement %+v", f)
	}
	if x := b.Revoked[0]; x.State != "revoked" || x.RevokeReason != "administrative" || x.Reason != "" {
		t.Fatalf("revoked placement %+v", x)
	}

	b = getPlacements(t, srv, admin, "/v1/blobs/"+string(d)+"/placements?datacenter=us-1")
	if b.Datacenter != "us-1" || len(b.Local) != 1 || b.Local[0].Location != "r" || len(b.VerifiedRemote) != 1 || b.VerifiedRemote[0].Location != "l" {
		t.Fatalf("from us-1: %+v", b)
	}

	// Issue 4: "A digest with only pending/failed placements is
	// distinguishable from one with none."
	only := digestOf("pending only")
	stage(placement.Key{Digest: only, Backend: "s3", Datacenter: "eu-1", Location: "p"})
	if b := getPlacements(t, srv, admin, "/v1/blobs/"+string(only)+"/placements"); !b.Known || b.Serveable || len(b.Pending) != 1 {
		t.Fatalf("pending only: %+v", b)
	}
}

// Non-canonical digests and bad datacenter labels are 400 with the stable
// code invalid.
func TestPlacementsRejectsMalformedInput(t *testing.T) {
	t.Parallel()
	_, srv, admin := placementsSetup(t)
	good := string(digestOf("good"))
	for name, path := range map[string]string{
		"uppercase":         "/v1/blobs/sha256:" + strings.ToUpper(good[7:]) + "/placements",
		"short":             "/v1/blobs/" + good[:len(good)-2] + "/placements",
		"other algorithm":   "/v1/blobs/sha512:" + good[7:] + "/placements",
		"no algorithm":      "/v1/blobs/" + good[7:] + "/placements",
		"leading space":     "/v1/blobs/%20" + good + "/placements",
		"trailing newline":  "/v1/blobs/" + good + "%0A/placements",
		"tab inside":        "/v1/blobs/sha256:%09" + good[8:] + "/placements",
		"bad datacenter":    "/v1/blobs/" + good + "/placements?datacenter=EU_1",
		"empty datacenter":  "/v1/blobs/" + good + "/placements?datacenter=",
		"spaced datacenter": "/v1/blobs/" + good + "/placements?datacenter=eu%201",
	} {
		status, body := get(t, srv, admin, path)
		var e handlers.ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || status != http.StatusBadRequest || e.Code != blobplane.CodeInvalid || e.Message == "" {
			t.Errorf("%s: %d %s, want 400 with code invalid", name, status, body)
		}
	}
}
