// Package client is Blobplane's Go client for home-only endpoints: it
// resolves a repository's home locally against a cached, verified partition
// map (ZBP-5 R97), sends the routing headers (R98), follows MOVED after
// applying the signed delta (R103) a bounded number of times (R104), fails
// fast on MISROUTED and counts it (R105), and refreshes the map on a
// jittered interval as well as on redirect (R106).
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
)

// MapSource serves published maps and the controller's signing keys
// without HTTP: store.Store, for processes that share the control-plane
// database (the worker has no seed URL).
type MapSource interface {
	LatestMap(ctx context.Context) (*authority.Map, error)
	SigningKeys(ctx context.Context) ([]authority.TrustedKey, error)
}

// Config configures a Client.
type Config struct {
	// Seed is the base URL of any Blobplane api node, used to fetch maps.
	// Unused when Maps is set.
	Seed string
	// Maps, when set, is where maps and (unless Keys is set) signing keys
	// come from instead of the seed. Every map is still verified.
	Maps MapSource
	// Keys are the trusted controller keys. Nil fetches them from the seed
	// at the first refresh (trust on first use; pin them in production).
	Keys *authority.Keyring
	// HTTP is the transport; nil means http.DefaultClient.
	HTTP *http.Client
	// MaxRedirects bounds MOVED answers followed per call (R104); default 3.
	MaxRedirects int
	// RefreshEvery is the mean periodic map refresh (R106); default 30s.
	RefreshEvery time.Duration
	// MaxWait bounds the total NOT_READY/STALE_MAP waiting of one call;
	// default 10s.
	MaxWait time.Duration
}

// Client routes requests to the home of a key. Safe for concurrent use.
type Client struct {
	cfg       Config
	core      atomic.Pointer[authority.Client]
	misrouted atomic.Uint64
	next      atomic.Int64 // unix nanos of the next periodic refresh
	// lastUnreachable is when a home last failed to answer (unix nanos):
	// it makes Do refresh the map before giving up, at most once per
	// unreachableRefresh across calls.
	lastUnreachable atomic.Int64
	// keysMu serialises the first fetch of the signing keys: concurrent
	// first calls (a worker's finalize jobs) fetch them once and share
	// one core, not each install their own.
	keysMu sync.Mutex
	// beforeKeys, when set (tests), runs before a call waits for keysMu.
	beforeKeys func()
}

// New returns a client; call Refresh (or just Do) to load the map.
func New(cfg Config) *Client {
	if cfg.HTTP == nil {
		cfg.HTTP = http.DefaultClient
	}
	if cfg.MaxRedirects <= 0 {
		cfg.MaxRedirects = 3
	}
	if cfg.RefreshEvery <= 0 {
		cfg.RefreshEvery = 30 * time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 10 * time.Second
	}
	cfg.Seed = strings.TrimRight(cfg.Seed, "/")
	c := &Client{cfg: cfg}
	if cfg.Keys != nil {
		c.setKeys(cfg.Keys)
	}
	return c
}

func (c *Client) setKeys(k *authority.Keyring) {
	v := authority.NewVerifier(k, nil)
	c.core.Store(authority.NewClient(v, authority.ClientConfig{
		MaxRedirects: c.cfg.MaxRedirects, NotReadyRetry: 200 * time.Millisecond,
		RefreshEvery: c.cfg.RefreshEvery, RefreshJitter: 0.25,
	}))
}

// Misrouted counts MISROUTED answers: each is a correctness fault (R105).
func (c *Client) Misrouted() uint64 { return c.misrouted.Load() }

// Rejected counts maps and deltas that failed verification.
func (c *Client) Rejected() uint64 {
	core := c.core.Load()
	if core == nil {
		return 0
	}
	return core.Rejected()
}

// MapVersion is the cached map's version (0 before the first).
func (c *Client) MapVersion() uint64 {
	core := c.core.Load()
	if core == nil || core.Map() == nil {
		return 0
	}
	return core.Map().Version()
}

// Refresh fetches the seed's latest map and installs it if it verifies and
// is newer.
func (c *Client) Refresh(ctx context.Context) error {
	if err := c.loadKeys(ctx); err != nil {
		return err
	}
	core := c.core.Load()
	m, err := c.latestMap(ctx)
	if err != nil {
		return err
	}
	if _, err := core.Install(m, time.Now()); err != nil && !errors.Is(err, authority.ErrNotNewer) {
		return err
	}
	c.next.Store(time.Now().Add(core.NextRefresh(rand.Float64())).UnixNano())
	return nil
}

// loadKeys makes the core, with the signing keys fetched once, unless it
// exists.
func (c *Client) loadKeys(ctx context.Context) error {
	if c.core.Load() != nil {
		return nil
	}
	if c.beforeKeys != nil {
		c.beforeKeys()
	}
	c.keysMu.Lock()
	defer c.keysMu.Unlock()
	if c.core.Load() != nil {
		return nil // another call fetched them meanwhile
	}
	ring, err := c.keys(ctx)
	if err != nil {
		return err
	}
	c.setKeys(ring)
	return nil
}

func (c *Client) keys(ctx context.Context) (*authority.Keyring, error) {
	if c.cfg.Maps == nil {
		b, err := c.get(ctx, "/v1/map/keys")
		if err != nil {
			return nil, err
		}
		return authority.ParseKeyring(b)
	}
	keys, err := c.cfg.Maps.SigningKeys(ctx)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 { // nothing to verify with yet: ask again next time
		return nil, blobplane.Errorf(blobplane.CodeUnavailable, "no map signing keys are published yet")
	}
	return authority.NewKeyring(keys...)
}

func (c *Client) latestMap(ctx context.Context) (*authority.Map, error) {
	if c.cfg.Maps != nil {
		return c.cfg.Maps.LatestMap(ctx)
	}
	b, err := c.get(ctx, "/v1/map")
	if err != nil {
		return nil, err
	}
	return authority.ParseMap(b)
}

// Do sends the request build makes for key's home and applies the routing
// contract to the answer. build gets the home's base URL and must return a
// fresh request each time (it may be called several times). A served answer
// is returned as is, whatever its status; routing answers are consumed.
func (c *Client) Do(ctx context.Context, key string, build func(ctx context.Context, base string) (*http.Request, error)) (*http.Response, error) {
	core, err := c.routing(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(c.cfg.MaxWait)
	redirects := 0
	for {
		t, err := core.Target(key)
		if err != nil {
			if err := waitNotReady(ctx, err, deadline); err != nil {
				return nil, err
			}
			continue
		}
		resp, err := c.send(ctx, key, t, build)
		if err != nil {
			if c.homeMoved(ctx, t.MapVersion) {
				continue // issue 30: a dead home's partition moved; route again
			}
			return nil, err
		}
		env, ok := routingAnswer(resp)
		if !ok {
			return resp, nil
		}
		step := core.OnAnswer(env, redirects, time.Now())
		redirects = step.Redirects
		if err := c.follow(ctx, key, env, step, deadline); err != nil {
			return nil, err
		}
	}
}

// unreachableRefresh bounds how often an unreachable home makes the
// client read the map again.
const unreachableRefresh = 250 * time.Millisecond

// homeMoved refreshes the map after a home did not answer (its node died,
// and the controller may have moved its partitions, issue 30) and reports
// whether a newer map than the one the request was routed by is installed.
// Concurrent failures share one refresh per unreachableRefresh.
func (c *Client) homeMoved(ctx context.Context, routedBy uint64) bool {
	now := time.Now().UnixNano()
	last := c.lastUnreachable.Load()
	if now-last >= int64(unreachableRefresh) && c.lastUnreachable.CompareAndSwap(last, now) {
		_ = c.Refresh(ctx) // a failed refresh leaves the map as it was
	}
	return c.MapVersion() > routedBy
}

// routing returns the core to route with, refreshing the map first when
// there is none or the periodic refresh is due. A failed refresh is an
// error only when there is no map to route with.
func (c *Client) routing(ctx context.Context) (*authority.Client, error) {
	if core := c.core.Load(); core == nil || core.Map() == nil || time.Now().UnixNano() > c.next.Load() {
		if err := c.Refresh(ctx); err != nil {
			if core := c.core.Load(); core == nil || core.Map() == nil {
				return nil, err
			}
		}
	}
	return c.core.Load(), nil
}

// waitNotReady waits out err, a home that is not ready yet, when its
// retry-after ends before deadline; nil means route again. Any other
// error comes back as it is.
func waitNotReady(ctx context.Context, err error, deadline time.Time) error {
	if errors.Is(err, authority.ErrNotReady) && time.Now().Add(authority.RetryAfterOf(err)).Before(deadline) {
		return sleep(ctx, authority.RetryAfterOf(err))
	}
	return err
}

// send sends the request build makes to t, key's home, stamped with the
// slot and map version it was routed by.
func (c *Client) send(ctx context.Context, key string, t authority.Target, build func(ctx context.Context, base string) (*http.Request, error)) (*http.Response, error) {
	req, err := build(ctx, "http://"+t.Endpoint)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Blobplane-Slot", strconv.FormatUint(uint64(t.Slot), 10))
	req.Header.Set("Blobplane-Slot-Bits", strconv.Itoa(t.SlotBits))
	req.Header.Set("Blobplane-Map-Version", strconv.FormatUint(t.MapVersion, 10))
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		return nil, blobplane.Wrap(blobplane.CodeUnavailable, err, "home %s of %q unreachable", t.Endpoint, key)
	}
	return resp, nil
}

// follow takes the step the routing answer env called for; nil means
// route and send again.
func (c *Client) follow(ctx context.Context, key string, env *authority.Envelope, step authority.Step, deadline time.Time) error {
	switch step.Action {
	case authority.Fail:
		if env.Code == authority.RouteMisrouted {
			c.misrouted.Add(1) // R105: counted; the caller alarms
		}
		return step.Err
	case authority.FetchMap:
		return c.Refresh(ctx)
	case authority.RetryAfter:
		if time.Now().Add(step.After).After(deadline) {
			return blobplane.Errorf(blobplane.CodeUnavailable, "%s for %q did not clear within %v", env.Code, key, c.cfg.MaxWait)
		}
		return sleep(ctx, step.After)
	}
	return nil
}

// routingAnswer reads a routing envelope from resp, consuming the body, or
// reports that resp is a served answer.
func routingAnswer(resp *http.Response) (*authority.Envelope, bool) {
	if resp.StatusCode != authority.StatusMoved && resp.StatusCode != http.StatusServiceUnavailable {
		return nil, false
	}
	if resp.Header.Get("Blobplane-Partition") != "" {
		return nil, false // served by the home, which answered 503 itself
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return &authority.Envelope{Code: authority.RouteStaleMap}, true
	}
	env, err := authority.ParseEnvelope(b)
	if err != nil {
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		return nil, false
	}
	return env, true
}

func (c *Client) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.Seed+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.cfg.HTTP.Do(req)
	if err != nil {
		return nil, blobplane.Wrap(blobplane.CodeUnavailable, err, "seed %s unreachable", c.cfg.Seed)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, blobplane.Errorf(blobplane.CodeUnavailable, "GET %s: %d %s", path, resp.StatusCode, strings.TrimSpace(string(b[:min(len(b), 512)])))
	}
	return b, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
