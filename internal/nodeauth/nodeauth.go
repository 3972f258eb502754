// Package nodeauth signs and verifies node-to-node HTTP requests with the
// cluster secret (issue 26 point 8). The secret never travels: a request
// carries an HMAC-SHA256 over its method, its request URI (path and
// query), the SHA-256 of its body, a timestamp and a random nonce, in
//
//	Authorization: Blobplane-HMAC ts=<unix seconds>,nonce=<32 hex>,sig=<64 hex>
//
// A Verifier refuses a signature that does not match (compared in constant
// time), a timestamp outside its window (default ±30s: nodes need clocks
// within that of each other), and a signature it has already admitted
// within the window (replay). Both sides (handlers.RequireClusterSecret,
// jobs.HomeFinalizer) use this package, so they cannot disagree on the
// canonical form. It performs no I/O beyond reading a request body.
package nodeauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scheme is the Authorization scheme of a signed node-to-node request.
const Scheme = "Blobplane-HMAC"

// Defaults of Verifier.
const (
	// DefaultWindow is how far a request's timestamp may be from the
	// verifier's clock, either way.
	DefaultWindow = 30 * time.Second
	// DefaultMaxSeen bounds the signatures remembered against replay.
	DefaultMaxSeen = 1 << 16
	// MaxBody bounds the body of a node-to-node request: they are small
	// JSON documents, read whole before the signature is checked.
	MaxBody = 64 << 10
)

// Errors of Parse and Verify. Every one but ErrBusy and ErrTooLarge means
// "not authenticated".
var (
	ErrMissing   = errors.New("no " + Scheme + " authorization")
	ErrMalformed = errors.New("malformed " + Scheme + " authorization")
	ErrStale     = errors.New("timestamp outside the accepted window (are the nodes' clocks in sync?)")
	ErrSignature = errors.New("signature does not match (is the cluster secret the same on every node?)")
	ErrReplayed  = errors.New("signed request already seen (replay)")
	// ErrBusy: the replay set is full of signatures still inside the
	// window; the request is refused rather than admitted unremembered.
	ErrBusy = errors.New("too many signed requests within the window")
	// ErrTooLarge: the body exceeds MaxBody.
	ErrTooLarge = fmt.Errorf("body larger than %d bytes", MaxBody)
)

// Credential is a parsed Authorization value.
type Credential struct {
	Timestamp int64  // unix seconds
	Nonce     string // 32 lowercase hex digits
	Sig       []byte // 32 bytes
}

// String formats c as an Authorization value.
func (c Credential) String() string {
	return Scheme + " ts=" + strconv.FormatInt(c.Timestamp, 10) + ",nonce=" + c.Nonce + ",sig=" + hex.EncodeToString(c.Sig)
}

// Canonical is the message a signature covers: a domain label, then the
// method, the request URI as sent (escaped path and query), the body's
// SHA-256, the timestamp and the nonce, each prefixed by its length so
// that no two different requests share a message.
func Canonical(method, requestURI string, bodySum [sha256.Size]byte, ts int64, nonce string) []byte {
	var b bytes.Buffer
	b.WriteString("blobplane-node-v1\n")
	for _, f := range []string{method, requestURI, hex.EncodeToString(bodySum[:]), strconv.FormatInt(ts, 10), nonce} {
		b.WriteString(strconv.Itoa(len(f)))
		b.WriteByte(':')
		b.WriteString(f)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// Signature is the HMAC-SHA256 of Canonical under secret.
func Signature(secret []byte, method, requestURI string, bodySum [sha256.Size]byte, ts int64, nonce string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(Canonical(method, requestURI, bodySum, ts, nonce))
	return m.Sum(nil)
}

// Sign returns the Authorization value of a request with method,
// requestURI and body, signed at now with a fresh nonce. An empty secret
// is an error: nothing signed with it could be verified.
func Sign(secret []byte, method, requestURI string, body []byte, now time.Time) (string, error) {
	if len(secret) == 0 {
		return "", errors.New("nodeauth: empty cluster secret")
	}
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", err
	}
	c := Credential{Timestamp: now.Unix(), Nonce: hex.EncodeToString(n[:])}
	c.Sig = Signature(secret, method, requestURI, sha256.Sum256(body), c.Timestamp, c.Nonce)
	return c.String(), nil
}

// SignRequest sets req's Authorization to its signature at now; body must
// be exactly what req sends.
func SignRequest(req *http.Request, secret, body []byte, now time.Time) error {
	v, err := Sign(secret, req.Method, req.URL.RequestURI(), body, now)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", v)
	return nil
}

// Parse reads an Authorization value of the Blobplane-HMAC scheme: ts,
// nonce and sig exactly once each, in any order. ErrMissing when the value
// is of another scheme or empty.
func Parse(authorization string) (Credential, error) {
	scheme, params, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, Scheme) {
		return Credential{}, ErrMissing
	}
	var c Credential
	var seen [3]bool
	for _, kv := range strings.Split(params, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return Credential{}, ErrMalformed
		}
		i, err := c.setParam(k, v)
		if err != nil {
			return Credential{}, err
		}
		if seen[i] {
			return Credential{}, ErrMalformed
		}
		seen[i] = true
	}
	if !seen[0] || !seen[1] || !seen[2] {
		return Credential{}, ErrMalformed
	}
	return c, nil
}

// setParam sets c's parameter k from its value v, and returns the
// parameter's place in ts, nonce, sig. ErrMalformed for an unknown
// parameter or a value not in canonical form.
func (c *Credential) setParam(k, v string) (int, error) {
	switch k {
	case "ts":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || len(v) > 12 || v[0] == '+' || v[0] == '0' {
			return 0, ErrMalformed
		}
		c.Timestamp = n
		return 0, nil
	case "nonce":
		if len(v) != 32 || !lowerHex(v) {
			return 0, ErrMalformed
		}
		c.Nonce = v
		return 1, nil
	case "sig":
		if len(v) != 2*sha256.Size || !lowerHex(v) {
			return 0, ErrMalformed
		}
		c.Sig, _ = hex.DecodeString(v)
		return 2, nil
	}
	return 0, ErrMalformed
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Verifier checks signed requests and remembers the signatures it admitted
// until their timestamps leave the window. Safe for concurrent use; one
// per listener (the replay set is this process's only).
type Verifier struct {
	secret []byte
	// Window is how far a timestamp may be from Now, either way.
	Window time.Duration
	// MaxSeen bounds the replay set.
	MaxSeen int
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time

	mu   sync.Mutex
	seen map[string]int64 // signature → unix second after which it is stale anyway
}

// NewVerifier returns a Verifier of secret with the default window and
// bound. An empty secret verifies nothing.
func NewVerifier(secret []byte) *Verifier {
	return &Verifier{secret: bytes.Clone(secret), Window: DefaultWindow, MaxSeen: DefaultMaxSeen, seen: map[string]int64{}}
}

// Verify checks authorization against method, requestURI and body, and
// admits each signature once. Errors: ErrMissing, ErrMalformed, ErrStale,
// ErrSignature, ErrReplayed (all "not authenticated"), or ErrBusy.
// The signature is checked before the replay set is touched, so only a
// holder of the secret can fill it.
func (v *Verifier) Verify(method, requestURI string, body []byte, authorization string) error {
	c, err := Parse(authorization)
	if err != nil {
		return err
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	t := now().Unix()
	window := int64(v.Window / time.Second)
	if c.Timestamp < t-window || c.Timestamp > t+window {
		return ErrStale
	}
	if len(v.secret) == 0 || !hmac.Equal(c.Sig, Signature(v.secret, method, requestURI, sha256.Sum256(body), c.Timestamp, c.Nonce)) {
		return ErrSignature
	}
	return v.remember(string(c.Sig), c.Timestamp+window, t)
}

// remember admits sig once: ErrReplayed when it is already in the set,
// ErrBusy when the set is full of unexpired signatures.
func (v *Verifier) remember(sig string, expires, now int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.seen[sig]; ok {
		return ErrReplayed
	}
	if len(v.seen) >= v.MaxSeen {
		for s, exp := range v.seen {
			if exp < now {
				delete(v.seen, s)
			}
		}
		if len(v.seen) >= v.MaxSeen {
			return ErrBusy
		}
	}
	v.seen[sig] = expires
	return nil
}

// VerifyRequest reads r's body (at most MaxBody bytes: ErrTooLarge past
// it), verifies r's signature over it, and gives r a fresh reader of the
// same bytes. The request URI is the one on the request line.
func (v *Verifier) VerifyRequest(r *http.Request) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(body) > MaxBody {
		return ErrTooLarge
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	uri := r.RequestURI
	if uri == "" { // a request built in-process, not read off the wire
		uri = r.URL.RequestURI()
	}
	return v.Verify(r.Method, uri, body, r.Header.Get("Authorization"))
}
