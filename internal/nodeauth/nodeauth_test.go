package nodeauth_test

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/nodeauth"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

const uri = "/internal/v1/finalize/00000000-0000-4000-8000-000000000001"

var body = []byte(`{"repository":"team/app"}`)

func sign(t testing.TB, s []byte, method, uri string, body []byte, at time.Time) string {
	t.Helper()
	v, err := nodeauth.Sign(s, method, uri, body, at)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Each refusal of issue 26 point 8, cell by cell, against one verifier on
// a fixed clock.
func TestVerify(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	v := nodeauth.NewVerifier(secret)
	v.Now = func() time.Time { return now }
	good := sign(t, secret, "POST", uri, body, now)
	for _, tc := range []struct {
		name, method, uri string
		body              []byte
		authz             string
		want              error
	}{
		{"signed", "POST", uri, body, good, nil},
		{"replayed", "POST", uri, body, good, nodeauth.ErrReplayed},
		{"another nonce, same second", "POST", uri, body, sign(t, secret, "POST", uri, body, now), nil},
		{"edge of the window", "POST", uri, body, sign(t, secret, "POST", uri, body, now.Add(-30*time.Second)), nil},
		{"stale", "POST", uri, body, sign(t, secret, "POST", uri, body, now.Add(-31*time.Second)), nodeauth.ErrStale},
		{"from the future", "POST", uri, body, sign(t, secret, "POST", uri, body, now.Add(31*time.Second)), nodeauth.ErrStale},
		{"wrong secret", "POST", uri, body, sign(t, bytes.Repeat([]byte("x"), 32), "POST", uri, body, now), nodeauth.ErrSignature},
		{"body changed", "POST", uri, []byte(`{"repository":"evil/app"}`), sign(t, secret, "POST", uri, body, now), nodeauth.ErrSignature},
		{"path changed", "POST", uri[:len(uri)-1] + "2", body, sign(t, secret, "POST", uri, body, now), nodeauth.ErrSignature},
		{"query added", "POST", uri + "?x=1", body, sign(t, secret, "POST", uri, body, now), nodeauth.ErrSignature},
		{"method changed", "PUT", uri, body, sign(t, secret, "POST", uri, body, now), nodeauth.ErrSignature},
		{"static bearer", "POST", uri, body, "Bearer " + string(secret), nodeauth.ErrMissing},
		{"none", "POST", uri, body, "", nodeauth.ErrMissing},
		{"no sig", "POST", uri, body, "Blobplane-HMAC ts=1800000000,nonce=00000000000000000000000000000000", nodeauth.ErrMalformed},
	} {
		if err := v.Verify(tc.method, tc.uri, tc.body, tc.authz); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// An empty configured secret verifies nothing, not even its own.
	empty := nodeauth.NewVerifier(nil)
	forged := nodeauth.Credential{Timestamp: time.Now().Unix(), Nonce: strings.Repeat("0", 32)}
	forged.Sig = nodeauth.Signature(nil, "POST", uri, [32]byte{}, forged.Timestamp, forged.Nonce)
	if err := empty.Verify("POST", uri, nil, forged.String()); !errors.Is(err, nodeauth.ErrSignature) {
		t.Errorf("empty secret: %v", err)
	}
	if _, err := nodeauth.Sign(nil, "POST", uri, body, now); err == nil {
		t.Error("signing with an empty secret must fail")
	}
}

// The replay set stays bounded: full of live signatures it refuses
// (ErrBusy) rather than forgets; once they are stale it makes room.
func TestVerifierReplaySetIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	v := nodeauth.NewVerifier(secret)
	v.MaxSeen = 2
	v.Now = func() time.Time { return now }
	for i := range 2 {
		if err := v.Verify("POST", uri, body, sign(t, secret, "POST", uri, body, now)); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	if err := v.Verify("POST", uri, body, sign(t, secret, "POST", uri, body, now)); !errors.Is(err, nodeauth.ErrBusy) {
		t.Fatalf("third within the window: %v, want ErrBusy", err)
	}
	now = now.Add(31 * time.Second)
	if err := v.Verify("POST", uri, body, sign(t, secret, "POST", uri, body, now)); err != nil {
		t.Fatalf("after the first two went stale: %v", err)
	}
}

// VerifyRequest reads at most MaxBody bytes, and hands the handler the
// same bytes it verified.
func TestVerifyRequestBody(t *testing.T) {
	t.Parallel()
	v := nodeauth.NewVerifier(secret)
	big := bytes.Repeat([]byte("a"), nodeauth.MaxBody+1)
	r := httptest.NewRequest("POST", uri, bytes.NewReader(big))
	if err := nodeauth.SignRequest(r, secret, big, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := v.VerifyRequest(r); !errors.Is(err, nodeauth.ErrTooLarge) {
		t.Fatalf("oversized body: %v", err)
	}
	r = httptest.NewRequest("POST", uri, bytes.NewReader(body))
	if err := nodeauth.SignRequest(r, secret, body, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := v.VerifyRequest(r); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := got.ReadFrom(r.Body); err != nil || !bytes.Equal(got.Bytes(), body) {
		t.Fatalf("body after verification: %q %v", got.Bytes(), err)
	}
}

// FuzzParse: any Authorization value either parses into a credential that
// formats back to a value parsing to the same credential, or is refused;
// never a panic.
func FuzzParse(f *testing.F) {
	f.Add(sign(f, secret, "POST", uri, body, time.Unix(1_800_000_000, 0)))
	f.Add("Blobplane-HMAC sig=" + strings.Repeat("ab", 32) + ",ts=1,nonce=" + strings.Repeat("0", 32))
	f.Add("Blobplane-HMAC ts=1,ts=2")
	f.Add("Bearer x")
	f.Add("")
	f.Fuzz(func(t *testing.T, authz string) {
		c, err := nodeauth.Parse(authz)
		if err != nil {
			return
		}
		again, err := nodeauth.Parse(c.String())
		if err != nil || again.Timestamp != c.Timestamp || again.Nonce != c.Nonce || !bytes.Equal(again.Sig, c.Sig) {
			t.Fatalf("%q parsed to %+v, which formats to %q (%v)", authz, c, c.String(), err)
		}
	})
}

// FuzzVerify: a signed request verifies exactly when method, URI and body
// are the ones signed.
func FuzzVerify(f *testing.F) {
	f.Add("POST", uri, body, "POST", uri, body)
	f.Add("POST", uri, body, "POST", uri+"x", body)
	f.Add("POST", uri, body, "POST", uri, []byte(`{"repository":"team/apq"}`))
	f.Add("GET", "/", []byte{}, "GET", "/", []byte(nil))
	f.Fuzz(func(t *testing.T, m1, u1 string, b1 []byte, m2, u2 string, b2 []byte) {
		now := time.Unix(1_800_000_000, 0)
		v := nodeauth.NewVerifier(secret)
		v.Now = func() time.Time { return now }
		err := v.Verify(m2, u2, b2, sign(t, secret, m1, u1, b1, now))
		same := m1 == m2 && u1 == u2 && bytes.Equal(b1, b2)
		if same != (err == nil) {
			t.Fatalf("signed %q %q %q, verified %q %q %q: %v", m1, u1, b1, m2, u2, b2, err)
		}
	})
}
