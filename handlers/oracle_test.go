package handlers_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// Issue 26 point 3: the tenants of the attacks. alice may push and pull
// victim; mallory may push to her own repository attacker; bob may only
// pull victim; carol holds victim/* (every repository under victim/, not
// victim itself); root administers every repository.
type oracleEnv struct {
	st                               *store.Store
	srv                              *httptest.Server
	alice, mallory, bob, carol, root string
	clusterSecret                    string
}

func oracleSetup(t *testing.T) *oracleEnv {
	t.Helper()
	st, be, home := homeFixture(t, "victim", "attacker")
	e := &oracleEnv{st: st, clusterSecret: "cluster-secret-for-the-oracle-tests"}
	e.srv = httptest.NewServer(handlers.NewRouter(handlers.Deps{
		Auth: st, Placements: st, Datacenter: "eu-1",
		OCI: &handlers.OCI{Store: st, ClusterSecret: e.clusterSecret, Config: upload.Config{Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1", Home: home}},
	}))
	t.Cleanup(e.srv.Close)
	e.alice = token(t, st, "alice", "victim:write")
	e.mallory = token(t, st, "mallory", "attacker:write")
	e.bob = token(t, st, "bob", "victim:read")
	e.carol = token(t, st, "carol", "victim/*:read")
	e.root = token(t, st, "root", "*:admin")
	return e
}

// oracleAnswer is what a client can observe of one answer: status,
// the headers that vary with the outcome, and the body.
type oracleAnswer struct {
	Status      int
	ContentType string
	Challenges  []string
	Body        string
}

// send sends GET path with cred as a Bearer token ("" none; "signed:<s>"
// a node's request signed with the cluster secret s) and a fixed request
// id, so that two answers can be compared byte for byte (the id
// is echoed in error bodies); every occurrence of name in the body, the
// digest or id the request named, becomes "<named>".
func (e *oracleEnv) send(t *testing.T, cred, path, name string) oracleAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Request-Id", "oracle")
	if secret, ok := strings.CutPrefix(cred, "signed:"); ok {
		if err := nodeauth.SignRequest(req, []byte(secret), nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	} else if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return oracleAnswer{
		Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"),
		Challenges: resp.Header.Values("WWW-Authenticate"),
		Body:       strings.ReplaceAll(string(b), name, "<named>"),
	}
}

// push uploads content to repo as cred in one request.
func (e *oracleEnv) push(t *testing.T, cred, repo, content string) string {
	t.Helper()
	d := ociDigest(content)
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v2/"+repo+"/blobs/uploads/?digest="+d, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("oras", cred)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("push to %s: %d", repo, resp.StatusCode)
	}
	return d
}

func randomDigest(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(b)
}

func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Issue 26 point 3: GET /v1/blobs/{digest}/placements answered anyone
// with a digest's size and location. mallory (another tenant), carol (a
// grant on victim/* that does not cover victim), a wrong token, a node
// request signed with a wrong secret, the cluster secret sent as a static
// bearer and an anonymous client now get, for alice's digest, byte for
// byte the answer they get for a digest nobody stored; alice, bob (read on
// victim), an admin of every repository and a node's request signed with
// the cluster secret see it.
func TestAttackPlacementsOracle(t *testing.T) {
	t.Parallel()
	e := oracleSetup(t)
	content := "alice's private layer"
	d := e.push(t, e.alice, "victim", content)
	unknown := randomDigest(t)
	path := func(dg string) string { return "/v1/blobs/" + dg + "/placements" }

	for who, cred := range map[string]string{
		"mallory": e.mallory, "carol": e.carol, "anonymous": "", "a wrong token": "bp_notatoken_x",
		"a node signing with a wrong secret": "signed:" + e.clusterSecret + "x",
		"the cluster secret as a bearer":     e.clusterSecret,
	} {
		known, none := e.send(t, cred, path(d), d), e.send(t, cred, path(unknown), unknown)
		if known.Status != none.Status || known.ContentType != none.ContentType ||
			strings.Join(known.Challenges, ",") != strings.Join(none.Challenges, ",") || known.Body != none.Body {
			t.Errorf("%s tells alice's digest from an unknown one:\n%+v\n%+v", who, known, none)
		}
		if strings.Contains(known.Body, `"known": true`) || strings.Contains(known.Body, `"size"`) {
			t.Errorf("%s sees alice's placements: %s", who, known.Body)
		}
	}
	if a := e.send(t, "", path(d), d); a.Status != http.StatusUnauthorized || len(a.Challenges) == 0 {
		t.Errorf("anonymous: %+v, want 401 with challenges", a)
	}

	for who, cred := range map[string]string{"alice": e.alice, "bob": e.bob, "root": e.root, "a node": "signed:" + e.clusterSecret} {
		a := e.send(t, cred, path(d), d)
		var b handlers.PlacementsBody
		if err := json.Unmarshal([]byte(a.Body), &b); err != nil || a.Status != http.StatusOK {
			t.Fatalf("%s: %+v", who, a)
		}
		if !b.Known || !b.Serveable || len(b.Local) != 1 || b.Local[0].Size != int64(len(content)) {
			t.Errorf("%s does not see alice's placement: %s", who, a.Body)
		}
	}
}

// Issue 26 point 3, /v1/operations/{id}: an absent operation, a malformed
// id and alice's operation asked by mallory were three different answers
// (the last confirmed the id exists). They are now one, byte for byte;
// alice still reads hers.
func TestAttackOperationOracle(t *testing.T) {
	t.Parallel()
	e := oracleSetup(t)
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v2/victim/blobs/uploads/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("oras", e.alice)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	op := resp.Header.Get("Docker-Upload-UUID")
	if resp.StatusCode != http.StatusAccepted || op == "" {
		t.Fatalf("open session: %d %q", resp.StatusCode, op)
	}

	for who, cred := range map[string]string{"mallory": e.mallory, "carol": e.carol} {
		want := e.send(t, cred, "/v1/operations/"+op, op)
		if want.Status != http.StatusNotFound {
			t.Fatalf("%s reads alice's operation: %+v", who, want)
		}
		for what, id := range map[string]string{
			"absent": randomUUID(), "malformed": "not-an-operation", "long": strings.Repeat("a", 200),
			"uppercase": strings.ToUpper(op),
		} {
			if got := e.send(t, cred, "/v1/operations/"+id, id); got.Status != want.Status || got.ContentType != want.ContentType || got.Body != want.Body {
				t.Errorf("%s tells alice's operation from an %s one:\n%+v\n%+v", who, what, want, got)
			}
		}
	}
	absent := randomUUID()
	anon, anonAbsent := e.send(t, "", "/v1/operations/"+op, op), e.send(t, "", "/v1/operations/"+absent, absent)
	if anon.Status != http.StatusUnauthorized || anon.Body != anonAbsent.Body {
		t.Errorf("anonymous: %+v / %+v", anon, anonAbsent)
	}
	if a := e.send(t, e.alice, "/v1/operations/"+op, op); a.Status != http.StatusOK || !strings.Contains(a.Body, `"state": "pending"`) {
		t.Errorf("alice: %+v", a)
	}
}
