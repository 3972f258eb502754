package handlers_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// fakeHome stands for the repository's home across the network: it
// finalizes with the real store under the lease, or fails with err.
type fakeHome struct {
	st    *store.Store
	epoch uint64
	err   error
	// lost: the home publishes, then its answer is lost (a timeout, a
	// home that died after its commit).
	lost bool
	// abandon: the home abandons the upload (over a quota), then its
	// answer is lost.
	abandon bool

	mu     sync.Mutex
	queued []string // repo/op of each EnqueueFinalize
}

func (f *fakeHome) ForwardFinalize(ctx context.Context, repo, op string) (upload.Outcome, error) {
	if f.abandon {
		if _, err := f.st.AbandonIntent(ctx, op); err != nil {
			return upload.Outcome{}, err
		}
		return upload.Outcome{}, blobplane.Errorf(blobplane.CodeUnavailable, "the home's answer was lost")
	}
	if f.err != nil {
		return upload.Outcome{}, f.err
	}
	in, err := f.st.GetIntent(ctx, op)
	if err != nil {
		return upload.Outcome{}, err
	}
	o, err := f.st.Finalize(ctx, upload.FinalizeRequest{OperationID: op, Digest: in.ExpectedDigest, Size: in.ExpectedSize,
		Partition: "p-0001", Node: "node-a", Epoch: f.epoch})
	if err == nil && f.lost {
		return upload.Outcome{}, blobplane.Errorf(blobplane.CodeUnavailable, "the home's answer was lost")
	}
	return o, err
}

func (f *fakeHome) ForwardDeleteReference(ctx context.Context, repo string, d blobplane.Digest) (string, error) {
	if f.err != nil {
		return "", f.err
	}
	return "", f.st.DeleteReferenceAtHome(ctx, upload.Home{Partition: "p-0001", Node: "node-a", Epoch: f.epoch}, repo, d)
}

func (f *fakeHome) EnqueueFinalizeTx(_ context.Context, _ pgx.Tx, repo, op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queued = append(f.queued, repo+"/"+op)
	return nil
}

// A close away from the home: published by the home (201 with a local
// publication's headers), its final refusal as the local answer, or queued
// (202 with the operation) when it cannot publish now.
func TestOCIAwayFromTheHomeForwardsOrQueues(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		err     error
		lost    bool
		abandon bool
		status  int
		queued  bool
	}{
		"published by the home":       {status: 201},
		"published, the answer lost":  {lost: true, status: 201},
		"home unreachable":            {err: blobplane.Errorf(blobplane.CodeUnavailable, "dial: connection refused"), status: 202, queued: true},
		"home moved (stale epoch)":    {err: blobplane.Errorf(blobplane.CodeStaleEpoch, "superseded"), status: 202, queued: true},
		"secret rejected by the home": {err: blobplane.Errorf(blobplane.CodeUnauthorized, "cluster secret"), status: 202, queued: true},
		"grant revoked":               {err: blobplane.Errorf(blobplane.CodeForbidden, "revoked"), status: 403},
		"abandoned":                   {err: blobplane.Errorf(blobplane.CodeConflict, "abandoned"), status: 409},
		// The client learns why by pushing again: retryable.
		"abandoned, the answer lost": {abandon: true, status: 503},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := pgtest.NewStore(t)
			if err := st.CreateRepository(ctx, "team/app"); err != nil {
				t.Fatal(err)
			}
			lease, err := st.AcquireLease(ctx, "p-0001", "node-a", "node-a:7443", 15*time.Second, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := fs.Open(t.TempDir(), backend.StoreAsSubmitted)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			home := &fakeHome{st: st, epoch: lease.Epoch, err: tc.err, lost: tc.lost, abandon: tc.abandon}
			away := &staticHome{} // never the home
			srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, OCI: &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": raw}, Backend: "fs", Datacenter: "eu-1", Home: away, Forward: home, Later: home}}}))
			t.Cleanup(srv.Close)
			e := &ociEnv{st: st, srv: srv, writer: token(t, st, "alice", "team/*:write")}

			d := ociDigest("away " + name)
			a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, "away "+name, e.writer, nil)
			if a.status != tc.status {
				t.Fatalf("close: %d, want %d (%s)", a.status, tc.status, a.body)
			}
			var op string
			if err := onlyOperation(ctx, st, &op); err != nil {
				t.Fatal(err)
			}
			switch a.status {
			case 503:
				if a.header.Get("Retry-After") == "" || ociCode(t, a) != "UNAVAILABLE" || !strings.Contains(string(a.body), "push the blob again") {
					t.Fatalf("abandoned, the answer lost: %v %s", a.header, a.body)
				}
			case 201:
				if a.header.Get("Location") != "/v2/team/app/blobs/"+d || a.header.Get("Docker-Content-Digest") != d {
					t.Fatalf("published answer: %v", a.header)
				}
				if _, err := st.Outcome(ctx, op); err != nil {
					t.Fatalf("no outcome after a forwarded publication: %v", err)
				}
				// A DELETE away from the home is the home's to do (R19).
				if a := e.do(t, "DELETE", "/v2/team/app/blobs/"+d, "", e.writer, nil); a.status != 202 {
					t.Fatalf("forwarded delete: %d %s", a.status, a.body)
				}
				if a := e.do(t, "DELETE", "/v2/team/app/blobs/"+d, "", e.writer, nil); a.status != 404 || ociCode(t, a) != "BLOB_UNKNOWN" {
					t.Fatalf("second forwarded delete: %d %s", a.status, a.body)
				}
			case 202:
				if tc.err != nil && blobplane.ErrorCode(tc.err) == blobplane.CodeUnavailable {
					// Nobody to delete it: retryable, nothing changed here.
					if a := e.do(t, "DELETE", "/v2/team/app/blobs/"+d, "", e.writer, nil); a.status != 503 || a.header.Get("Retry-After") == "" {
						t.Fatalf("delete with the home unreachable: %d %v %s", a.status, a.header, a.body)
					}
				}
				if a.header.Get("Location") != "/v1/operations/"+op || a.header.Get("Docker-Upload-UUID") != op {
					t.Fatalf("queued answer: %v", a.header)
				}
			}
			home.mu.Lock()
			defer home.mu.Unlock()
			if queued := len(home.queued) == 1 && home.queued[0] == "team/app/"+op; queued != tc.queued || len(home.queued) > 1 {
				t.Fatalf("queued %v, want queued=%v", home.queued, tc.queued)
			}
		})
	}
}

// onlyOperation reads the one intent's operation id.
func onlyOperation(ctx context.Context, st *store.Store, op *string) error {
	return st.Pool().QueryRow(ctx, `SELECT operation_id::text FROM intents WHERE repository = 'team/app'`).Scan(op)
}

// The internal endpoint is not reachable with user credentials even when
// no cluster secret is configured (it is then not mounted at all).
func TestInternalFinalizeNotMountedWithoutSecret(t *testing.T) {
	t.Parallel()
	st := pgtest.NewStore(t)
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, OCI: &handlers.OCI{Store: st, Config: upload.Config{Home: &staticHome{}}}}))
	t.Cleanup(srv.Close)
	e := &ociEnv{st: st, srv: srv}
	a := e.do(t, "POST", "/internal/v1/finalize/00000000-0000-4000-8000-000000000001", `{"repository":"team/app"}`, token(t, st, "root", "*:admin"), nil)
	if a.status != 404 && a.status != 405 {
		t.Fatalf("internal endpoint without a secret: %d %s", a.status, a.body)
	}
}

// RequireClusterSecret over real HTTP: a request signed with the secret
// passes, once, with its body handed on unchanged; the static Bearer
// secret of before issue 26 point 8, a replay, or anything under an empty
// configured secret is 401.
func TestRequireClusterSecret(t *testing.T) {
	t.Parallel()
	const secret = "0123456789abcdef0123456789abcdef"
	const path = "/internal/v1/finalize/x"
	body := []byte(`{"repository":"team/app"}`)
	serve := func(configured string) *httptest.Server {
		srv := httptest.NewServer(handlers.RequireClusterSecret(configured, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(w, r.Body)
		})))
		t.Cleanup(srv.Close)
		return srv
	}
	post := func(srv *httptest.Server, authz string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+path, bytes.NewReader(body))
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	signed := func(s string) string {
		v, err := nodeauth.Sign([]byte(s), "POST", path, body, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	srv := serve(secret)
	good := signed(secret)
	if code, got := post(srv, good); code != 200 || got != string(body) {
		t.Fatalf("signed: %d %q", code, got)
	}
	for name, authz := range map[string]string{
		"replayed":             good,
		"static bearer secret": "Bearer " + secret,
		"secret as basic":      "Basic " + secret,
		"none":                 "",
		"signed with another":  signed(strings.Repeat("y", 32)),
		"signature, no scheme": strings.TrimPrefix(signed(secret), nodeauth.Scheme+" "),
	} {
		if code, got := post(srv, authz); code != 401 || !strings.Contains(got, `"code": "unauthorized"`) {
			t.Errorf("%s: %d %s, want 401", name, code, got)
		}
	}
	if code, _ := post(serve(""), signed(secret)); code != 401 {
		t.Errorf("empty configured secret admitted a signed request: %d", code)
	}
}
