package store

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// CacheListenerName is the application_name of the one LISTEN connection
// an API process's caches share (StartCaches), as DBAs see it in
// pg_stat_activity.
const CacheListenerName = "blobplane-cache-listener"

// Listener timing. A LISTEN connection that hears nothing for
// listenerKeepalive pings the server, so one that died silently (a
// dropped NAT mapping, a half-open TCP connection) is noticed within
// keepalive + ping timeout, well inside the caches' TTLs, instead of
// caching against a channel that no longer delivers.
const (
	listenerKeepalive   = 15 * time.Second
	listenerPingTimeout = 5 * time.Second
	listenerDialTimeout = 10 * time.Second
	listenerMinBackoff  = 250 * time.Millisecond
	listenerMaxBackoff  = 30 * time.Second
)

// CacheOptions choose the caches StartCaches runs; a nil field leaves that
// cache off. All of them share one listener connection.
type CacheOptions struct {
	// Auth runs the authentication cache (authcache.go).
	Auth *AuthCacheOptions
	// Existence runs the blob existence cache (existencecache.go).
	Existence *ExistenceCacheOptions
	// MapPublished, when set, is called on every map publication
	// (MapChannel), and each time the listener starts listening, since a
	// publication may have landed while it was not (the API wakes its
	// lease keeper with it). Not a cache: it rides on the same connection.
	MapPublished func()
	// Hooks are interleaving points for tests; leave them nil.
	Hooks ListenerHooks
}

// ListenerHooks let tests hold the shared listener. Production code
// leaves them nil.
type ListenerHooks struct {
	// BeforeConnect runs before each attempt to open the listener
	// connection; an error fails the attempt (retried with backoff).
	BeforeConnect func(ctx context.Context) error
}

// StartCaches puts the in-process caches opts asks for in front of their
// queries, each kept exact by LISTEN/NOTIFY: a goroutine holds one
// connection of its own (outside the pool, with the pool's settings and
// application_name CacheListenerName) LISTENing on every cache's channel,
// and a notification empties the caches registered for its channel. The
// caches serve only while that connection is LISTENing; while it is down
// every lookup asks Postgres, and it is re-opened with backoff. The
// goroutine runs until ctx ends or stop is called; stop waits for it and
// closes the connection, after which every lookup is exactly the uncached
// path again. Only API processes use it. With no cache chosen nothing is
// started. One set of caches per Store: starting a cache that already runs
// panics.
func (s *Store) StartCaches(ctx context.Context, opts CacheOptions) (stop func()) {
	l := &notifyListener{targets: map[string][]listenerTarget{}, hooks: opts.Hooks}
	var undo []func()
	fail := func(what string) {
		for _, u := range undo {
			u()
		}
		panic("store: StartCaches: " + what + " cache already runs for this Store")
	}
	if opts.Auth != nil {
		c := newAuthCache(*opts.Auth)
		if !s.authCache.CompareAndSwap(nil, c) {
			fail("an authentication")
		}
		undo = append(undo, func() { s.authCache.CompareAndSwap(c, nil) })
		l.register(AuthChannel, "auth", c)
	}
	if opts.Existence != nil {
		c := newExistenceCache(*opts.Existence)
		if !s.existenceCache.CompareAndSwap(nil, c) {
			fail("an existence")
		}
		undo = append(undo, func() { s.existenceCache.CompareAndSwap(c, nil) })
		l.register(RefsChannel, "existence", c)
	}
	if opts.MapPublished != nil {
		l.register(MapChannel, "map", mapWaker(opts.MapPublished))
	}
	if len(l.channels) == 0 {
		return func() {}
	}
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = CacheListenerName
	l.cfg = cfg
	l.logger = s.logger.With("service", "cache_listener", "caches", l.names)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			for _, u := range undo {
				u()
			}
		})
	}
}

// listenerTarget is what the listener drives in a cache.
type listenerTarget interface {
	// invalidate empties the cache: a notification on its channel arrived.
	invalidate()
	// setListening empties the cache and records that the listener came up
	// (LISTEN on every channel in effect) or went down.
	setListening(on bool)
}

var (
	_ listenerTarget = (*authCache)(nil)
	_ listenerTarget = (*existenceCache)(nil)
	_ listenerTarget = mapWaker(nil)
)

// mapWaker is CacheOptions.MapPublished as a listener target: called on
// each notification, and when the listener comes up.
type mapWaker func()

func (w mapWaker) invalidate() { w() }

func (w mapWaker) setListening(on bool) {
	if on {
		w()
	}
}

// notifyCache is a map emptied by notifications, the part the
// authentication and existence caches share: entries by key, each with the
// time the query that loaded it started, bounded by a TTL and a count.
//
// Why an entry can never outlive a change it missed: the generation gen
// moves, under mu, every time the cache is emptied (a notification, a
// local write, the listener coming up or going down). A miss takes a
// ticket (gen and listening) before it runs its query, and put keeps the
// result only if, under mu, gen still equals the ticket's and the ticket
// was taken while listening. Take a change C (say a revocation, or a
// reference deleted) that commits after the query's snapshot, so the query
// read the old row:
//   - if the listener was LISTENing when the ticket was taken, C's
//     notification is delivered to it after C commits, and handling it
//     moves gen (if the connection dies first, losing it moves gen).
//     Either that happened before put (the stale result is refused) or
//     after it (the clear removes the entry it inserted).
//   - if not, the ticket refuses the put outright; and a listener that
//     comes up later empties the cache and moves gen once LISTEN is in
//     effect, so every change it did not hear was committed before a
//     ticket taken after that point, hence before that miss's query.
//
// A change that committed before the query's snapshot is simply seen by
// the query. So a stale answer is served only between a change's commit
// and the listener handling its notification (milliseconds), and not at
// all, once the call returns, in the process that made the change through
// its Store (which empties its own cache after the write: a ticket taken
// before that clear is refused, one taken after it belongs to a query that
// sees the change). The TTL bounds what a listener that goes silent
// without an error could cost; the keepalive ping shortens even that.
type notifyCache[V any] struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu        sync.Mutex
	entries   map[string]cacheEntry[V]
	gen       uint64
	listening bool

	hits, misses, invalidations atomic.Uint64
}

// cacheEntry is one cached answer and when the query that loaded it
// started.
type cacheEntry[V any] struct {
	v      V
	loaded time.Time
}

// cacheTicket is what a miss knew about the cache before its query.
type cacheTicket struct {
	gen       uint64
	listening bool
	at        time.Time
}

// CacheStats is what one of StartCaches' caches has done since it
// started (Store.AuthCacheStats, Store.ExistenceCacheStats); all zero when
// that cache does not run.
type CacheStats struct {
	Hits          uint64 // answered without a query
	Misses        uint64 // asked Postgres while the cache was started (not cached, expired, or not listening)
	Invalidations uint64 // emptied because what it caches changed: a notification, or a write through this Store
	Entries       int    // entries cached now
	Listening     bool   // the listener is LISTENing, so the cache is in use
}

// newNotifyCache makes a cache with ttl (def when not positive, at most
// maxTTL), at most max entries (defMax when not positive) and clock now
// (time.Now when nil).
func newNotifyCache[V any](ttl, def, maxTTL time.Duration, max, defMax int, now func() time.Time) *notifyCache[V] {
	if ttl <= 0 {
		ttl = def
	}
	if max <= 0 {
		max = defMax
	}
	if now == nil {
		now = time.Now
	}
	return &notifyCache[V]{ttl: min(ttl, maxTTL), max: max, now: now, entries: map[string]cacheEntry[V]{}}
}

// get answers key from the cache when it can (hit), counting a hit or a
// miss. On a miss, the ticket is what put needs.
func (c *notifyCache[V]) get(key string) (v V, hit bool, t cacheTicket) {
	now := c.now()
	c.mu.Lock()
	e, found := c.entries[key]
	found = found && c.listening // empty anyway when not listening; belt and braces
	if found && !(now.Sub(e.loaded) < c.ttl) {
		delete(c.entries, key)
		found = false
	}
	t = cacheTicket{gen: c.gen, listening: c.listening, at: now}
	c.mu.Unlock()
	if !found {
		c.misses.Add(1)
		return v, false, t
	}
	c.hits.Add(1)
	return e.v, true, t
}

// put caches v, loaded under ticket t, unless the cache was emptied since
// (see notifyCache for why that is enough). A full cache evicts an
// arbitrary entry.
func (c *notifyCache[V]) put(t cacheTicket, key string, v V) {
	if !t.listening {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != t.gen || !c.listening {
		return
	}
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[key] = cacheEntry[V]{v: v, loaded: t.at}
}

// invalidate empties the cache because what it caches changed.
func (c *notifyCache[V]) invalidate() {
	c.mu.Lock()
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
	c.invalidations.Add(1)
}

// setListening records that the listener came up or went down. Either
// way the cache starts empty: going down, nothing would remove stale
// entries; coming up, notifications sent while it was down were missed.
func (c *notifyCache[V]) setListening(on bool) {
	c.mu.Lock()
	c.listening = on
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
}

// stats reports c's counters and state.
func (c *notifyCache[V]) stats() CacheStats {
	c.mu.Lock()
	entries, listening := len(c.entries), c.listening
	c.mu.Unlock()
	return CacheStats{
		Hits: c.hits.Load(), Misses: c.misses.Load(), Invalidations: c.invalidations.Load(),
		Entries: entries, Listening: listening,
	}
}

// notifyListener keeps one LISTEN connection for every registered channel
// and dispatches each notification to the caches registered for its
// channel. Losing the connection empties and disables all of them; once
// LISTEN is in effect again on every channel they are emptied and enabled.
type notifyListener struct {
	cfg      *pgx.ConnConfig
	hooks    ListenerHooks
	logger   *slog.Logger
	channels []string                    // in registration order, without repeats
	names    []string                    // of the caches, for logs
	targets  map[string][]listenerTarget // by channel
}

func (l *notifyListener) register(channel, name string, t listenerTarget) {
	if _, ok := l.targets[channel]; !ok {
		l.channels = append(l.channels, channel)
	}
	l.targets[channel] = append(l.targets[channel], t)
	l.names = append(l.names, name)
}

// setListening tells every cache that the listener came up or went down.
func (l *notifyListener) setListening(on bool) {
	for _, ch := range l.channels {
		for _, t := range l.targets[ch] {
			t.setListening(on)
		}
	}
}

// run keeps the LISTEN connection up until ctx ends: connect, LISTEN,
// follow notifications until the connection fails, then reconnect (at
// once after a loss, then with jittered exponential backoff while attempts
// fail).
func (l *notifyListener) run(ctx context.Context) {
	var lostAt time.Time // zero until the listener is first lost
	failures := 0
	for {
		conn, err := l.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			delay := listenerBackoff(failures)
			l.logger.WarnContext(ctx, "cache listener: cannot listen for changes; every request asks Postgres",
				"channels", l.channels, "attempt", failures, "retry_in", delay, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		failures = 0
		l.setListening(true)
		if lostAt.IsZero() {
			l.logger.InfoContext(ctx, "cache listener: listening for changes; caches in use", "channels", l.channels)
		} else {
			l.logger.InfoContext(ctx, "cache listener: recovered; caches in use again", "channels", l.channels, "outage", time.Since(lostAt))
		}
		err = l.follow(ctx, conn)
		l.setListening(false)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), listenerPingTimeout)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		lostAt = time.Now()
		l.logger.WarnContext(ctx, "cache listener: lost; every request asks Postgres until it is back",
			"channels", l.channels, "err", err)
	}
}

// connect opens the listener connection and LISTENs on every channel.
// Once it returns, every change committed from then on is notified to it.
func (l *notifyListener) connect(ctx context.Context) (*pgx.Conn, error) {
	if h := l.hooks.BeforeConnect; h != nil {
		if err := h(ctx); err != nil {
			return nil, err
		}
	}
	dialCtx, cancel := context.WithTimeout(ctx, listenerDialTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(dialCtx, l.cfg.Copy())
	if err != nil {
		return nil, err
	}
	// One round trip; several statements in one simple query run as one
	// implicit transaction, so every LISTEN is in effect when Exec returns.
	var sql string
	for _, ch := range l.channels {
		sql += "LISTEN " + pgx.Identifier{ch}.Sanitize() + ";"
	}
	if _, err := conn.Exec(dialCtx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// follow empties the caches of each notification's channel until the
// connection fails or ctx ends. A quiet connection is pinged every
// keepalive period.
func (l *notifyListener) follow(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenerKeepalive)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		if n != nil {
			l.dispatch(n.Channel)
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
		pingCtx, cancel := context.WithTimeout(ctx, listenerPingTimeout)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return err
		}
	}
}

// dispatch empties the caches registered for channel. A notification on a
// channel nobody registered (none is LISTENed, so none should arrive)
// empties every cache: a spurious clear is cheap, a missed one is not.
func (l *notifyListener) dispatch(channel string) {
	for _, ch := range l.channels {
		if ch == channel || l.targets[channel] == nil {
			for _, t := range l.targets[ch] {
				t.invalidate()
			}
		}
	}
}

// listenerBackoff is the delay before reconnect attempt n+1 after n
// failures: exponential from listenerMinBackoff to listenerMaxBackoff,
// with jitter so that API processes that lost Postgres together do not
// return in step.
func listenerBackoff(failures int) time.Duration {
	d := listenerMaxBackoff
	if failures < 20 {
		d = min(listenerMinBackoff<<(failures-1), listenerMaxBackoff)
	}
	return d/2 + rand.N(d/2+1)
}
