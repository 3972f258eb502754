package handlers

import (
	"container/list"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
)

// Failed authentications are limited per client address and per token id
// (issue 26 point 6). Each costs a database query when the token is not
// cached, and a flood of them is how one would guess a token. Successful
// authentications are never counted nor limited.
//
//   - Per client address: over the limit, every attempt that presents a
//     token is refused (429) without checking it, until the address's
//     bucket refills. A correct token from that address is refused too:
//     checking it would tell a guesser when it hit. The cost is that
//     clients sharing an address with a guesser (a NAT, a proxy) wait
//     with it. A request without credentials is never refused: it only
//     asks for the challenge.
//   - Per token id: token ids are public (logged, listed), so refusing
//     every attempt at an id over its limit would let anyone who read one
//     lock its owner out. Over the limit, an attempt at that id is
//     refused unchecked only from an address that itself failed within
//     the last Per; a client with no recent failure is still checked, and
//     a correct token passes. A guesser spread over many addresses gets
//     one check per address per Per at that id.
//
// Memory is bounded: each of the two maps holds at most failureKeysMax
// keys, forgets a key once its bucket is full again (Per after its last
// failure), and past the cap forgets the key that failed least recently.

// FailureLimit bounds failed authentications: Burst failures at once,
// refilled at Burst per Per, counted per client address and, separately,
// per token id. The zero value is DefaultFailureLimit.
type FailureLimit struct {
	Burst int
	Per   time.Duration
}

// DefaultFailureLimit allows 20 failures at once, refilled at 20 a minute.
var DefaultFailureLimit = FailureLimit{Burst: 20, Per: time.Minute}

// failureKeysMax bounds each map of the limiter (addresses, token ids).
const failureKeysMax = 10_000

// failureLimiter counts failed authentications per client address and per
// token id and decides which attempts are refused unchecked.
type failureLimiter struct {
	addrs, tokens *failureLog
	now           func() time.Time
	refused       func(limit string) // counts a refusal by "address" or "token"
}

func newFailureLimiter(l FailureLimit, refused func(string)) *failureLimiter {
	if l.Burst <= 0 || l.Per <= 0 {
		l = DefaultFailureLimit
	}
	return &failureLimiter{addrs: newFailureLog(l, failureKeysMax), tokens: newFailureLog(l, failureKeysMax), now: time.Now, refused: refused}
}

// refuse says how long an attempt from addr presenting token id id ("" for
// a malformed token) must wait, and which limit holds it; 0 lets it be
// checked.
func (l *failureLimiter) refuse(addr, id string, now time.Time) (time.Duration, string) {
	if wait := l.addrs.wait(addr, now); wait > 0 {
		return wait, "address"
	}
	if id != "" && l.addrs.recent(addr, now) {
		if wait := l.tokens.wait(id, now); wait > 0 {
			return wait, "token"
		}
	}
	return 0, ""
}

// failed records a failed attempt from addr at token id id.
func (l *failureLimiter) failed(addr, id string, now time.Time) {
	l.addrs.fail(addr, now)
	if id != "" {
		l.tokens.fail(id, now)
	}
}

// failureLog is one dimension of the limiter: a token bucket per key, kept
// while the key has failed recently, most recent failure first.
type failureLog struct {
	mu     sync.Mutex
	limit  rate.Limit
	burst  int
	memory time.Duration // after this long without a failure a key's bucket is full: it is forgotten
	max    int
	keys   map[string]*list.Element
	order  list.List // of *failureEntry, most recent failure at the front
}

type failureEntry struct {
	key  string
	last time.Time // last failure
	lim  *rate.Limiter
}

func newFailureLog(l FailureLimit, max int) *failureLog {
	return &failureLog{
		limit: rate.Limit(float64(l.Burst) / l.Per.Seconds()), burst: l.Burst,
		memory: l.Per, max: max, keys: map[string]*list.Element{},
	}
}

// wait returns how long until key may fail once more; 0 when it may now.
func (f *failureLog) wait(key string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	el, ok := f.keys[key]
	if !ok {
		return 0
	}
	tokens := el.Value.(*failureEntry).lim.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	return time.Duration(math.Ceil((1 - tokens) / float64(f.limit) * float64(time.Second)))
}

// recent reports whether key failed within the last memory.
func (f *failureLog) recent(key string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	el, ok := f.keys[key]
	return ok && now.Sub(el.Value.(*failureEntry).last) < f.memory
}

// fail records a failure of key at now.
func (f *failureLog) fail(key string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Keys whose last failure is memory old have full buckets again:
	// absent and present are the same to them.
	for el := f.order.Back(); el != nil && now.Sub(el.Value.(*failureEntry).last) >= f.memory; el = f.order.Back() {
		delete(f.keys, el.Value.(*failureEntry).key)
		f.order.Remove(el)
	}
	el, ok := f.keys[key]
	if ok {
		f.order.MoveToFront(el)
	} else {
		if f.order.Len() >= f.max {
			oldest := f.order.Back()
			delete(f.keys, oldest.Value.(*failureEntry).key)
			f.order.Remove(oldest)
		}
		el = f.order.PushFront(&failureEntry{key: key, lim: rate.NewLimiter(f.limit, f.burst)})
		f.keys[key] = el
	}
	e := el.Value.(*failureEntry)
	e.last = now
	e.lim.AllowN(now, 1)
}

// len is how many keys the log holds (for tests).
func (f *failureLog) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}

// clientKey names the client of a request for the limiter: its IP address,
// or for IPv6 its /64, which one host commonly holds whole. It is the
// peer's address: behind a reverse proxy every client shares the proxy's
// (X-Forwarded-For is the client's to forge), so raise the limit there.
func clientKey(remoteAddr string) string {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return "unknown"
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is6() {
		return netip.PrefixFrom(a, 64).Masked().String()
	}
	return a.String()
}

// limitedAuth is an Authenticator behind a failureLimiter: what NewRouter
// hands every Authenticate middleware.
type limitedAuth struct {
	Authenticator
	limits *failureLimiter
}

// requestAuthenticator is an Authenticator that weighs the request too (its
// client address): limitedAuth.
type requestAuthenticator interface {
	authenticateRequest(r *http.Request, token string) (auth.Principal, error)
}

// authenticate checks token for r through a, through its limiter when a has
// one.
func authenticate(r *http.Request, a Authenticator, token string) (auth.Principal, error) {
	if ra, ok := a.(requestAuthenticator); ok {
		return ra.authenticateRequest(r, token)
	}
	return a.Authenticate(r.Context(), token)
}

func (a *limitedAuth) authenticateRequest(r *http.Request, token string) (auth.Principal, error) {
	addr, id := clientKey(r.RemoteAddr), ""
	if t, err := auth.ParseToken(token); err == nil {
		id = t.ID
	}
	now := a.limits.now()
	if wait, limit := a.limits.refuse(addr, id, now); wait > 0 {
		if a.limits.refused != nil {
			a.limits.refused(limit)
		}
		what := "from this address"
		if limit == "token" {
			what = "at this token id"
		}
		t := &throttled{retryAfter: wait}
		t.err = blobplane.Errorf(blobplane.CodeTooManyRequests, "too many failed authentications %s: retry after %s seconds", what, t.retryAfterHeader())
		return auth.Principal{}, t
	}
	p, err := a.Authenticator.Authenticate(r.Context(), token)
	if blobplane.ErrorCode(err) == blobplane.CodeUnauthorized {
		a.limits.failed(addr, id, now)
	}
	return p, err
}

// throttled is the refusal of an attempt over a failure limit; retryAfter
// says when one more will be checked.
type throttled struct {
	err        *blobplane.Error
	retryAfter time.Duration
}

func (t *throttled) Error() string { return t.err.Error() }
func (t *throttled) Unwrap() error { return t.err }

// retryAfterHeader is the Retry-After value: whole seconds, at least 1.
func (t *throttled) retryAfterHeader() string {
	return strconv.FormatInt(max(1, int64(math.Ceil(t.retryAfter.Seconds()))), 10)
}
