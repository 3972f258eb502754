package authority

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane"
)

// The client side of the routing contract (A.1), without transport: the
// HTTP client package sends what Target returns and feeds every non-served
// answer to OnAnswer, which says what to do next.

// Target is where to send one attempt of a request, and what to put in it
// (R98: key, slot and the map version resolved against).
type Target struct {
	Key        string
	Slot       Slot
	SlotBits   int
	MapVersion uint64
	Partition  string
	Epoch      uint64
	Node       string
	Endpoint   string
}

// ClientConfig bounds the client's behaviour.
type ClientConfig struct {
	MaxRedirects  int           // R104: MOVED answers followed per logical request; >= 1
	NotReadyRetry time.Duration // A.1 step 3: wait when the cached map says the primary is not SERVING
	RefreshEvery  time.Duration // R106: base interval between full-map refreshes
	RefreshJitter float64       // R106: spread, as a fraction of RefreshEvery, in [0, 1)
}

// Client holds a client's cached verified map (R97) and applies the
// routing contract's client rules. It never consults a router or the
// controller per request (R97, R109). Safe for concurrent use.
type Client struct {
	verifier *Verifier
	cfg      ClientConfig
	current  atomic.Pointer[VerifiedMap]
}

// NewClient returns a client with no map; Install one before routing.
func NewClient(v *Verifier, cfg ClientConfig) *Client {
	if cfg.MaxRedirects < 1 {
		cfg.MaxRedirects = 1
	}
	return &Client{verifier: v, cfg: cfg}
}

// Map returns the cached verified map, or nil.
func (c *Client) Map() *VerifiedMap { return c.current.Load() }

// Rejected counts the maps and deltas its verifier refused.
func (c *Client) Rejected() uint64 { return c.verifier.Rejected() }

// Install verifies a fetched full map and caches it if it is newer (R11,
// R12: a map failing verification is rejected and counted even when newer;
// R6). It returns the map now cached.
func (c *Client) Install(m *Map, now time.Time) (*VerifiedMap, error) {
	for {
		cur := c.current.Load()
		vm, err := c.verifier.Adopt(cur, m, now)
		if err != nil {
			return cur, err
		}
		if c.current.CompareAndSwap(cur, vm) {
			return vm, nil
		}
	}
}

// Target resolves key against the cached map (A.1 steps 1–3). Errors chain
// to ErrNoMap (no map, or no partition covers the slot: fetch a full map
// and restart) or ErrNotReady (the map says the primary is not SERVING:
// wait RetryAfterOf(err) and restart, within the caller's deadline).
func (c *Client) Target(key string) (Target, error) {
	vm := c.current.Load()
	if vm == nil {
		return Target{Key: key}, coded(blobplane.CodeUnavailable, "authority.Target", ErrNoMap)
	}
	r, err := vm.ResolveKey(key)
	if err != nil {
		return Target{Key: key, Slot: r.Slot, SlotBits: vm.ix.bits, MapVersion: vm.Version()}, err
	}
	p := r.Partition
	t := Target{Key: key, Slot: r.Slot, SlotBits: vm.ix.bits, MapVersion: vm.Version(), Partition: p.ID, Epoch: p.Epoch, Node: p.Primary.Node, Endpoint: p.Primary.Endpoint}
	if p.Primary.State != PrimaryServing { // A.1 step 3
		return t, &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "authority.Target", Retryable: true,
			Message: fmt.Sprintf("partition %s is %s", p.ID, p.Primary.State), Err: &retryAfterError{c.cfg.NotReadyRetry, ErrNotReady}}
	}
	return t, nil
}

// Action is what a client does after a non-served answer (A.1 steps 5–7).
type Action uint8

// Client actions.
const (
	RetryNow   Action = iota // re-resolve against the (updated) cached map and resend
	RetryAfter               // wait Step.After, then re-resolve and resend
	FetchMap                 // fetch a full map (Install), then re-resolve and resend
	Fail                     // give up; Step.Err says why
)

// Step is the client's next move for one logical request.
type Step struct {
	Action    Action
	After     time.Duration
	Redirects int   // redirects followed so far, including this one
	Err       error // set when Action is Fail
}

// OnAnswer decides the next step after env, the routing envelope a server
// answered with, given redirects already followed for this logical request
// (A.1):
//
//   - MOVED: count a redirect and fail with ErrRedirectLoop past the bound
//     (R104; A.1 REDIRECT_LOOP: fail and alarm — the error is retryable as
//     a whole request later, after backoff, since maps converge). Verify and apply the signed delta before retrying (R103, R11);
//     a missing, unsigned, forged or wrong-base delta is discarded — never
//     narrowed to its unsigned assignment — and the client fetches a full
//     map instead.
//   - MISROUTED: fail at once with ErrHashDisagreement, never retried (R105);
//     the caller counts and alarms it.
//   - NOT_READY, STALE_MAP: wait retry_after_ms and retry (A.1 step 7).
func (c *Client) OnAnswer(env *Envelope, redirects int, now time.Time) Step {
	const op = "authority.OnAnswer"
	switch env.Code {
	case RouteMisrouted: // R105
		return Step{Action: Fail, Redirects: redirects, Err: &blobplane.Error{Code: blobplane.CodeInternal, Op: op,
			Message: fmt.Sprintf("server computes slot %d at map %d; client and server disagree about the slot", env.Slot, env.MapVersion), Err: ErrHashDisagreement}}
	case RouteNotReady, RouteStaleMap: // A.1 step 7
		return Step{Action: RetryAfter, After: env.RetryAfter(), Redirects: redirects}
	case RouteMoved:
	default:
		return Step{Action: Fail, Redirects: redirects, Err: invalidf(op, ErrMalformed, "routing code %q", env.Code)}
	}
	redirects++
	if redirects > c.cfg.MaxRedirects { // R104
		return Step{Action: Fail, Redirects: redirects, Err: &blobplane.Error{Code: blobplane.CodeUnavailable, Op: op, Retryable: true,
			Message: fmt.Sprintf("%d redirects exceed the bound of %d", redirects, c.cfg.MaxRedirects), Err: ErrRedirectLoop}}
	}
	if env.MapDelta == nil || env.MapDelta.Signature == nil { // R103: unsigned is discarded
		return Step{Action: FetchMap, Redirects: redirects}
	}
	for {
		cur := c.current.Load()
		if cur.Version() >= env.MapDelta.Version { // already at least as new (a concurrent request applied it)
			return Step{Action: RetryNow, Redirects: redirects}
		}
		next, err := c.verifier.ApplyDelta(cur, env.MapDelta, now) // R11: verify, whoever relayed it
		if err != nil {
			return Step{Action: FetchMap, Redirects: redirects} // forged (counted by the verifier) or wrong base
		}
		if c.current.CompareAndSwap(cur, next) {
			return Step{Action: RetryNow, Redirects: redirects}
		}
	}
}

// NextRefresh is the delay until the next periodic full-map refresh
// (R106), drawn with u uniform in [0, 1) from the caller's randomness.
func (c *Client) NextRefresh(u float64) time.Duration {
	return JitteredInterval(c.cfg.RefreshEvery, c.cfg.RefreshJitter, u)
}

// JitteredInterval spreads base uniformly over
// [base·(1 − spread), base·(1 + spread)) as u ranges over [0, 1), so a
// map change does not produce a synchronised refresh from every client
// (R106). spread is clamped to [0, 1) and u to [0, 1).
func JitteredInterval(base time.Duration, spread, u float64) time.Duration {
	spread = min(max(spread, 0), 0.999)
	u = min(max(u, 0), 0.999999)
	return time.Duration(float64(base) * (1 - spread + 2*spread*u))
}

// retryAfterError carries a retry hint inside an error chain.
type retryAfterError struct {
	after time.Duration
	err   error
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfterOf returns the retry hint carried by err (from Target), or 0.
func RetryAfterOf(err error) time.Duration {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after
	}
	return 0
}
