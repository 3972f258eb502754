package store

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/auth"
)

// AuthChannel is the NOTIFY channel that a committed change to tokens,
// grants or principals signals (triggers from db/migrations/00011), with an
// empty payload. A tokens UPDATE that only refreshes last_used_at does not.
const AuthChannel = "blobplane_auth"

// AuthListenerName is the application_name of the authentication cache's
// LISTEN connection, as DBAs see it in pg_stat_activity.
const AuthListenerName = "blobplane-auth-listener"

// Authentication cache bounds (AuthCacheOptions).
const (
	DefaultAuthCacheTTL        = 30 * time.Second
	MaxAuthCacheTTL            = time.Minute
	DefaultAuthCacheMaxEntries = 10_000
)

// Listener timing. A LISTEN connection that hears nothing for
// authListenerKeepalive pings the server, so one that died silently (a
// dropped NAT mapping, a half-open TCP connection) is noticed within
// keepalive + ping timeout, well inside the TTL, instead of caching
// against a channel that no longer delivers.
const (
	authListenerKeepalive   = 15 * time.Second
	authListenerPingTimeout = 5 * time.Second
	authListenerDialTimeout = 10 * time.Second
	authListenerMinBackoff  = 250 * time.Millisecond
	authListenerMaxBackoff  = 30 * time.Second
)

// AuthCacheOptions configure StartAuthCache. The zero value is the default.
type AuthCacheOptions struct {
	// TTL bounds how long an entry is served without asking Postgres,
	// as a safety net behind the notifications: zero means
	// DefaultAuthCacheTTL, and anything above MaxAuthCacheTTL is lowered
	// to it (so a token in use still has last_used_at refreshed about once
	// a minute, see Store.Authenticate).
	TTL time.Duration
	// MaxEntries bounds the number of cached tokens; zero means
	// DefaultAuthCacheMaxEntries. A full cache evicts an arbitrary entry.
	MaxEntries int
	// Now is the clock entry ages are measured with; nil means time.Now
	// (monotonic).
	Now func() time.Time
	// Hooks are interleaving points for tests; leave them nil.
	Hooks AuthCacheHooks
}

// AuthCacheHooks let tests stop the cache at the points where races
// happen. Each runs on the goroutine that reaches the point, with no lock
// held. Production code leaves them nil.
type AuthCacheHooks struct {
	// AfterQuery runs on a cache miss after TokenForAuth read a valid
	// token and before the result may enter the cache.
	AfterQuery func(tokenID string)
	// BeforeConnect runs before each attempt to open the listener
	// connection; an error fails the attempt (retried with backoff).
	BeforeConnect func(ctx context.Context) error
}

// AuthCacheStats is what the authentication cache has done since
// StartAuthCache; all zero when no cache runs.
type AuthCacheStats struct {
	Hits          uint64 // answered without a query (a success, or a wrong secret for a cached token id)
	Misses        uint64 // asked Postgres while a cache was started (not cached, expired, or not listening)
	Invalidations uint64 // emptied because the auth tables changed: a notification, or a write through this Store
	Entries       int    // tokens cached now
	Listening     bool   // the listener is LISTENing, so the cache is in use
}

// StartAuthCache puts an in-process cache of successful authentications in
// front of Authenticate's query, kept exact by LISTEN/NOTIFY: a goroutine
// holds one connection of its own (outside the pool, with the pool's
// settings and application_name AuthListenerName) LISTENing on
// AuthChannel, and every notification empties the cache. The cache serves
// only while that connection is LISTENing; while it is down every
// Authenticate asks Postgres, and it is re-opened with backoff. The
// goroutine runs until ctx ends or stop is called; stop waits for it and
// closes the connection, after which Authenticate is exactly the uncached
// path again. Only API processes use it; one cache per Store (starting a
// second before stopping the first panics).
func (s *Store) StartAuthCache(ctx context.Context, opts AuthCacheOptions) (stop func()) {
	c := newAuthCache(opts)
	if !s.authCache.CompareAndSwap(nil, c) {
		panic("store: StartAuthCache called while an authentication cache runs for this Store")
	}
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = AuthListenerName
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx, cfg, s.logger.With("service", "auth_cache"))
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			s.authCache.CompareAndSwap(c, nil)
		})
	}
}

// AuthCacheStats reports the running authentication cache's counters, for
// metrics; the zero value when StartAuthCache was not called.
func (s *Store) AuthCacheStats() AuthCacheStats {
	c := s.runningAuthCache()
	if c == nil {
		return AuthCacheStats{}
	}
	c.mu.Lock()
	entries, listening := len(c.entries), c.listening
	c.mu.Unlock()
	return AuthCacheStats{
		Hits:          c.hits.Load(),
		Misses:        c.misses.Load(),
		Invalidations: c.invalidations.Load(),
		Entries:       entries,
		Listening:     listening,
	}
}

// runningAuthCache is the cache StartAuthCache runs, or nil.
func (s *Store) runningAuthCache() *authCache { return s.authCache.Load() }

// invalidateAuthCache empties this process's cache after a write to the auth
// tables through this Store, so the caller's next request sees it without
// waiting for the notification (which every other process waits for). It
// is called whether or not the write reported success: an error may hide a
// commit, and a spurious clear costs one query per cached token.
func (s *Store) invalidateAuthCache() {
	if c := s.runningAuthCache(); c != nil {
		c.invalidate()
	}
}

// authCache is the state behind StartAuthCache.
//
// Why an entry can never outlive a change it missed: the generation gen
// moves, under mu, every time the cache is emptied (a notification, a
// local write, the listener coming up or going down). A miss takes a
// ticket (gen and listening) before it runs TokenForAuth, and insert keeps
// the result only if, under mu, gen still equals the ticket's and the
// ticket was taken while listening. Take a change C (say a revocation)
// that commits after the query's snapshot, so the query read the old row:
//   - if the listener was LISTENing when the ticket was taken, C's
//     notification is delivered to it after C commits, and handling it
//     moves gen (if the connection dies first, losing it moves gen).
//     Either that happened before insert (the stale result is refused) or
//     after it (the clear removes the entry it inserted).
//   - if not, the ticket refuses the insert outright; and a listener that
//     comes up later empties the cache and moves gen once LISTEN is in
//     effect, so every change it did not hear was committed before a
//     ticket taken after that point, hence before that miss's query.
//
// A change that committed before the query's snapshot is simply seen by
// the query. So a stale principal is served only between a change's commit
// and the listener handling its notification (milliseconds), and not at
// all, once the call returns, in the process that made the change through
// this Store (invalidateAuthCache). TTL bounds what a listener that goes silent
// without an error could cost; the keepalive ping shortens even that.
type authCache struct {
	ttl   time.Duration
	max   int
	now   func() time.Time
	hooks AuthCacheHooks

	mu        sync.Mutex
	entries   map[string]authEntry // by token id
	gen       uint64
	listening bool

	hits, misses, invalidations atomic.Uint64
}

// authEntry is one successful authentication: the stored secret hash (a
// presented token is compared against it in constant time; the token
// string itself is never a key), the principal with its effective grants,
// and when the query that loaded it started.
type authEntry struct {
	hash      []byte
	principal auth.Principal
	loaded    time.Time
}

// authTicket is what a miss knew about the cache before its query.
type authTicket struct {
	gen       uint64
	listening bool
	at        time.Time
}

func newAuthCache(opts AuthCacheOptions) *authCache {
	c := &authCache{ttl: opts.TTL, max: opts.MaxEntries, now: opts.Now, hooks: opts.Hooks, entries: map[string]authEntry{}}
	if c.ttl <= 0 {
		c.ttl = DefaultAuthCacheTTL
	}
	c.ttl = min(c.ttl, MaxAuthCacheTTL)
	if c.max <= 0 {
		c.max = DefaultAuthCacheMaxEntries
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// lookup answers tok from the cache when it can: hit reports that it did,
// and then matched whether the secret is right. On a miss, the ticket is
// what insert needs.
func (c *authCache) lookup(tok auth.Token) (p auth.Principal, matched, hit bool, t authTicket) {
	now := c.now()
	c.mu.Lock()
	e, found := c.entries[tok.ID]
	found = found && c.listening // empty anyway when not listening; belt and braces
	if found && !(now.Sub(e.loaded) < c.ttl) {
		delete(c.entries, tok.ID)
		found = false
	}
	t = authTicket{gen: c.gen, listening: c.listening, at: now}
	c.mu.Unlock()
	if !found {
		c.misses.Add(1)
		return auth.Principal{}, false, false, t
	}
	c.hits.Add(1)
	if !tok.Matches(e.hash) {
		return auth.Principal{}, false, true, t
	}
	p = e.principal
	p.Grants = slices.Clone(p.Grants) // the caller may append
	return p, true, true, t
}

// insert caches a successful authentication loaded under ticket t, unless
// the cache was emptied since (see authCache for why that is enough).
func (c *authCache) insert(t authTicket, hash []byte, p auth.Principal) {
	if h := c.hooks.AfterQuery; h != nil {
		h(p.TokenID)
	}
	if !t.listening {
		return
	}
	e := authEntry{hash: bytes.Clone(hash), principal: p, loaded: t.at}
	e.principal.Grants = slices.Clone(p.Grants)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != t.gen || !c.listening {
		return
	}
	if _, ok := c.entries[p.TokenID]; !ok && len(c.entries) >= c.max {
		for id := range c.entries {
			delete(c.entries, id)
			break
		}
	}
	c.entries[p.TokenID] = e
}

// invalidate empties the cache because the auth tables changed.
func (c *authCache) invalidate() {
	c.mu.Lock()
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
	c.invalidations.Add(1)
}

// setListening records that the listener came up or went down. Either
// way the cache starts empty: going down, nothing would remove stale
// entries; coming up, notifications sent while it was down were missed.
func (c *authCache) setListening(on bool) {
	c.mu.Lock()
	c.listening = on
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
}

// run keeps a LISTEN connection up until ctx ends: connect, LISTEN, follow
// notifications until the connection fails, then reconnect (at once after
// a loss, then with jittered exponential backoff while attempts fail).
func (c *authCache) run(ctx context.Context, cfg *pgx.ConnConfig, logger *slog.Logger) {
	var lostAt time.Time // zero until the listener is first lost
	failures := 0
	for {
		conn, err := c.connect(ctx, cfg)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			delay := authListenerBackoff(failures)
			logger.WarnContext(ctx, "auth cache: cannot listen for token changes; every request authenticates against Postgres",
				"channel", AuthChannel, "attempt", failures, "retry_in", delay, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		failures = 0
		c.setListening(true)
		if lostAt.IsZero() {
			logger.InfoContext(ctx, "auth cache: listening for token changes; caching authentications", "channel", AuthChannel, "ttl", c.ttl)
		} else {
			logger.InfoContext(ctx, "auth cache: listener recovered; caching authentications again", "channel", AuthChannel, "outage", time.Since(lostAt))
		}
		err = c.follow(ctx, conn)
		c.setListening(false)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), authListenerPingTimeout)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		lostAt = time.Now()
		logger.WarnContext(ctx, "auth cache: listener lost; every request authenticates against Postgres until it is back",
			"channel", AuthChannel, "err", err)
	}
}

// connect opens the listener connection and LISTENs. Once it returns, every
// change committed from then on is notified to it.
func (c *authCache) connect(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	if h := c.hooks.BeforeConnect; h != nil {
		if err := h(ctx); err != nil {
			return nil, err
		}
	}
	dialCtx, cancel := context.WithTimeout(ctx, authListenerDialTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(dialCtx, cfg.Copy())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(dialCtx, "LISTEN "+AuthChannel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// follow empties the cache on every notification until the connection
// fails or ctx ends. A quiet connection is pinged every keepalive period.
func (c *authCache) follow(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, authListenerKeepalive)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		if n != nil {
			c.invalidate()
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed() {
			return err
		}
		pingCtx, cancel := context.WithTimeout(ctx, authListenerPingTimeout)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return err
		}
	}
}

// authListenerBackoff is the delay before reconnect attempt n+1 after n failures:
// exponential from authListenerMinBackoff to authListenerMaxBackoff, with
// jitter so that API processes that lost Postgres together do not return
// in step.
func authListenerBackoff(failures int) time.Duration {
	d := authListenerMaxBackoff
	if failures < 20 {
		d = min(authListenerMinBackoff<<(failures-1), authListenerMaxBackoff)
	}
	return d/2 + rand.N(d/2+1)
}
