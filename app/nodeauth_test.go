package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/internal/pgtest"
)

// Issue 26 point 8: a stolen cluster secret, and what a network attacker
// can do with node-to-node calls short of stealing it. Each attack is sent
// to the home's real internal endpoint; a refusal is 401 before anything
// runs, where a genuine call for an unknown operation is 404.

// signedFinalize is a captured node-to-node call: the finalization of op
// in repo, signed with secret at at.
func signedFinalize(t *testing.T, base, secret, op, repo string, at time.Time) *http.Request {
	t.Helper()
	body := `{"repository":"` + repo + `"}`
	req, err := http.NewRequest("POST", base+"/internal/v1/finalize/"+op, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := nodeauth.SignRequest(req, []byte(secret), []byte(body), at); err != nil {
		t.Fatal(err)
	}
	return req
}

// resend sends req again with the same headers and body.
func resend(t *testing.T, req *http.Request, body string) (int, string) {
	t.Helper()
	again, err := http.NewRequest(req.Method, req.URL.String(), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	again.Header = req.Header.Clone()
	resp, err := http.DefaultClient.Do(again)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const unknownOp = "00000000-0000-4000-8000-00000000002a"

// A call captured on the wire is sent again: the first reaches the
// handler (404, unknown operation), the replay is refused.
func TestAttackReplayedClusterCall(t *testing.T) {
	c := startHomeCluster(t)
	repo := c.repos[1]
	req := signedFinalize(t, c.nodes[1].URL(), testClusterSecret, unknownOp, repo, time.Now())
	body := `{"repository":"` + repo + `"}`
	if code, b := resend(t, req, body); code != http.StatusNotFound {
		t.Fatalf("genuine call: %d %s, want 404", code, b)
	}
	if code, b := resend(t, req, body); code != http.StatusUnauthorized || !strings.Contains(b, "replay") {
		t.Fatalf("replayed call: %d %s, want 401 (replay)", code, b)
	}
}

// A node (or attacker) holding another secret signs a well-formed call.
func TestAttackClusterCallSignedWithWrongSecret(t *testing.T) {
	c := startHomeCluster(t)
	repo := c.repos[1]
	req := signedFinalize(t, c.nodes[1].URL(), strings.Repeat("w", len(testClusterSecret)), unknownOp, repo, time.Now())
	if code, b := resend(t, req, `{"repository":"`+repo+`"}`); code != http.StatusUnauthorized || !strings.Contains(b, "signature") {
		t.Fatalf("wrong secret: %d %s, want 401", code, b)
	}
}

// A call captured a minute ago (or signed ahead) is refused even the first
// time this node sees it: the replay set need not remember forever.
func TestAttackStaleClusterCall(t *testing.T) {
	c := startHomeCluster(t)
	repo := c.repos[1]
	for _, skew := range []time.Duration{-time.Minute, time.Minute} {
		req := signedFinalize(t, c.nodes[1].URL(), testClusterSecret, unknownOp, repo, time.Now().Add(skew))
		if code, b := resend(t, req, `{"repository":"`+repo+`"}`); code != http.StatusUnauthorized || !strings.Contains(b, "window") {
			t.Fatalf("signed %v away: %d %s, want 401", skew, code, b)
		}
	}
}

// A captured call is re-aimed: same signature, another repository in the
// body (or another operation in the path). The signature covers both.
func TestAttackClusterCallBodyChangedAfterSigning(t *testing.T) {
	c := startHomeCluster(t)
	repo := c.repos[1]
	req := signedFinalize(t, c.nodes[1].URL(), testClusterSecret, unknownOp, repo, time.Now())
	if code, b := resend(t, req, `{"repository":"`+c.repos[0]+`"}`); code != http.StatusUnauthorized || !strings.Contains(b, "signature") {
		t.Fatalf("body changed: %d %s, want 401", code, b)
	}
	req.URL.Path = strings.Replace(req.URL.Path, unknownOp, "00000000-0000-4000-8000-00000000002b", 1)
	if code, b := resend(t, req, `{"repository":"`+repo+`"}`); code != http.StatusUnauthorized || !strings.Contains(b, "signature") {
		t.Fatalf("path changed: %d %s, want 401", code, b)
	}
}

// freeInternalPort finds a port free on both 127.0.0.1 and 127.0.0.2:
// every node of a cluster serves its internal listener on the same port.
func freeInternalPort(t *testing.T) string {
	t.Helper()
	for range 20 {
		a, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Skipf("cannot listen on 127.0.0.2: %v", err)
		}
		_, port, _ := net.SplitHostPort(a.Addr().String())
		b, err := net.Listen("tcp", "127.0.0.1:"+port)
		a.Close()
		if err == nil {
			b.Close()
			return port
		}
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return ""
}

// With BLOBPLANE_INTERNAL_LISTEN the node-to-node endpoint is absent from
// the public listener (a signed call there is 404, no route), and
// finalization away from the home still publishes: node-0 forwards to
// node-1's internal listener, at node-1's public host and the cluster's
// internal port.
func TestAttackInternalRouteOnPublicListener(t *testing.T) {
	port := freeInternalPort(t)
	c := startHomeCluster(t, func(i int, cfg *config.Config) {
		host := fmt.Sprintf("127.0.0.%d", i+1)
		cfg.Listen, cfg.InternalListen = host+":0", host+":"+port
	})
	repo := c.repos[1]
	public := signedFinalize(t, c.nodes[1].URL(), testClusterSecret, unknownOp, repo, time.Now())
	if code, b := resend(t, public, `{"repository":"`+repo+`"}`); code != http.StatusNotFound || !strings.Contains(b, "no route") {
		t.Fatalf("internal endpoint on the public listener: %d %s, want 404 no route", code, b)
	}
	if r := c.internalFinalize(t, 1, signedCall, unknownOp, repo); r.StatusCode != http.StatusNotFound {
		t.Fatalf("on the internal listener: %d, want 404 for the unknown operation", r.StatusCode)
	}
	if r := c.internalFinalize(t, 1, "", unknownOp, repo); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unsigned on the internal listener: %d, want 401", r.StatusCode)
	}
	// The internal listener serves nothing else.
	if code, _ := get(t, c.nodes[1].InternalURL()+"/healthz"); code != http.StatusNotFound {
		t.Fatalf("/healthz on the internal listener: %d, want 404", code)
	}

	content := "forwarded over the internal listener"
	d := digestOf(content)
	resp, body := c.send(t, "POST", c.nodes[0].URL()+"/v2/"+repo+"/blobs/uploads/?digest="+d, content, nil)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload away from the home: %d %s", resp.StatusCode, body)
	}
	op := c.opOf(t, repo)
	if n := c.count(t, outcomesQuery, op); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
	if n := c.count(t, jobsQuery, op); n != 0 {
		t.Fatalf("%d finalize jobs: forwarding did not reach the home", n)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key to dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "blobplane test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// BLOBPLANE_TLS_CERT/KEY: the api listener speaks TLS to a client that
// trusts the certificate, refuses plain HTTP, and keeps the internal
// listener (plain, signed calls) apart.
func TestAPIServesTLS(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	cfg := testConfig(t, d.URL)
	cfg.RiverUI = false
	cfg.TLSCert, cfg.TLSKey, _ = selfSigned(t, t.TempDir())
	cfg.InternalListen = "127.0.0.1:0"
	_, _, pool := selfSigned(t, t.TempDir()) // another certificate: not trusted for this one
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.NewAPI(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	if !strings.HasPrefix(a.URL(), "https://") {
		t.Fatalf("URL %s", a.URL())
	}
	certPEM, _ := os.ReadFile(cfg.TLSCert)
	trusted := x509.NewCertPool()
	trusted.AppendCertsFromPEM(certPEM)
	tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: trusted, MinVersion: tls.VersionTLS12}}}
	waitFor(t, func() bool {
		resp, err := tlsClient.Get(a.URL() + "/healthz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == 200 && resp.TLS != nil
	})
	// A client that does not trust the certificate refuses it.
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}).Get(a.URL() + "/healthz"); err == nil {
		t.Fatal("an untrusted certificate was accepted")
	}
	// Plain HTTP on the TLS listener is not served.
	if resp, err := http.Get("http://" + a.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}
	// The internal listener is plain HTTP (signed calls).
	if !strings.HasPrefix(a.InternalURL(), "http://") {
		t.Fatalf("internal URL %s", a.InternalURL())
	}
	if code, _ := get(t, a.InternalURL()+"/internal/v1/finalize/"+unknownOp); code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
		t.Fatalf("GET on the internal listener: %d", code)
	}
}

// The api refuses to start, with an error naming the setting, on TLS files
// it cannot load, and on a cluster secret file others can read.
func TestAPIRefusesBadTLSAndReadableSecretAtStart(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	start := func(cfg *config.Config) error {
		a, err := app.NewAPI(ctx, cfg, slog.New(slog.DiscardHandler))
		if err == nil {
			a.Close()
		}
		return err
	}
	cfg := testConfig(t, d.URL)
	cert, key, _ := selfSigned(t, t.TempDir())
	cfg.TLSCert, cfg.TLSKey, cfg.InternalListen = cert, filepath.Join(t.TempDir(), "missing.pem"), "127.0.0.1:0"
	if err := start(cfg); err == nil || !strings.Contains(err.Error(), "BLOBPLANE_TLS_CERT") {
		t.Errorf("missing key file: %v", err)
	}
	cfg.TLSKey = cert // a certificate is no key
	if err := start(cfg); err == nil || !strings.Contains(err.Error(), "BLOBPLANE_TLS_KEY") {
		t.Errorf("certificate as key: %v", err)
	}
	cfg.TLSKey, cfg.InternalListen = key, ""
	if err := start(cfg); err == nil || !strings.Contains(err.Error(), "BLOBPLANE_INTERNAL_LISTEN") {
		t.Errorf("TLS without an internal listener: %v", err)
	}

	// Issue 26 point 8: the generated secret file made readable by all.
	cfg = testConfig(t, d.URL)
	cfg.ClusterSecret = ""
	path := filepath.Join(cfg.DataDir, "cluster-secret")
	if err := os.WriteFile(path, []byte(strings.Repeat("s", 64)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := start(cfg); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Errorf("world-readable secret file: %v", err)
	}
	wcfg := testConfig(t, d.URL)
	wcfg.ClusterSecret, wcfg.DataDir = "", cfg.DataDir
	if err := app.RunWorker(ctx, wcfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Errorf("worker, world-readable secret file: %v", err)
	}
}
