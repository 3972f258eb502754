package store

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blobplane/blobplane/store/notifycache"
)

// CacheListenerName is the application_name of the one LISTEN connection
// an API process's caches share (StartCaches), as DBAs see it in
// pg_stat_activity.
const CacheListenerName = "blobplane-cache-listener"

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
	// HandoffChanged, when set, is called whenever a handoff starts or
	// changes state (HandoffChannel) and each time the listener starts
	// listening: the lease keeper and the controller act on it at once.
	HandoffChanged func()
	// Hooks are interleaving points for tests; leave them nil.
	Hooks ListenerHooks
}

// ListenerHooks let tests hold the shared listener (BeforeConnect runs
// before each attempt to open its connection; an error fails the attempt,
// retried with backoff). Production code leaves them nil.
type ListenerHooks = notifycache.Hooks

// CacheStats is what one of StartCaches' caches has done since it
// started (Store.AuthCacheStats, Store.ExistenceCacheStats); all zero when
// that cache does not run.
type CacheStats = notifycache.Stats

// StartCaches puts the in-process caches opts asks for in front of their
// queries, each kept exact by LISTEN/NOTIFY (package notifycache): a
// goroutine holds one connection of its own (outside the pool, with the
// pool's settings and application_name CacheListenerName) LISTENing on
// every cache's channel, and a notification empties the caches registered
// for its channel. The caches serve only while that connection is
// LISTENing; while it is down every lookup asks Postgres, and it is
// re-opened with backoff. The goroutine runs until ctx ends or stop is
// called; stop waits for it and closes the connection, after which every
// lookup is exactly the uncached path again. Only API processes use it.
// With no cache chosen nothing is started. One set of caches per Store:
// starting a cache that already runs panics.
func (s *Store) StartCaches(ctx context.Context, opts CacheOptions) (stop func()) {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = CacheListenerName
	l := notifycache.NewListener(notifycache.Config{
		Conn: cfg, Logger: s.logger.With("service", "cache_listener"), Hooks: opts.Hooks,
	})
	var undo []func()
	if opts.Auth != nil {
		c := newAuthCache(*opts.Auth)
		undo = claimCache(&s.authCache, c, undo, "an authentication")
		l.Register(AuthChannel, "auth", c.cache())
	}
	if opts.Existence != nil {
		c := newExistenceCache(*opts.Existence)
		undo = claimCache(&s.existenceCache, c, undo, "an existence")
		l.Register(RefsChannel, "existence", c.cache())
	}
	if opts.MapPublished != nil {
		l.Register(MapChannel, "map", notifycache.Waker(opts.MapPublished))
	}
	if opts.HandoffChanged != nil {
		l.Register(HandoffChannel, "handoff", notifycache.Waker(opts.HandoffChanged))
	}
	stopListener := l.Start(ctx)
	var once sync.Once
	return func() {
		once.Do(func() {
			stopListener()
			for _, u := range undo {
				u()
			}
		})
	}
}

// claimCache makes c the cache running in slot and returns undo with what
// takes it out again. When slot already holds one, it takes out the
// caches undo claimed before and panics: one set of caches per Store.
func claimCache[C any](slot *atomic.Pointer[C], c *C, undo []func(), what string) []func() {
	if !slot.CompareAndSwap(nil, c) {
		for _, u := range undo {
			u()
		}
		panic("store: StartCaches: " + what + " cache already runs for this Store")
	}
	return append(undo, func() { slot.CompareAndSwap(c, nil) })
}

// cacheBounds are one cache's defaults and ceiling, as its exported
// constants state them.
type cacheBounds struct {
	defTTL, maxTTL time.Duration
	defEntries     int
}

// cacheOptions are the notifycache options for a cache configured with
// ttl (b.defTTL when not positive, at most b.maxTTL), at most entries
// (b.defEntries when not positive), clock now and the test hook afterQuery
// (run before each answer may enter the cache).
func cacheOptions[K comparable](b cacheBounds, ttl time.Duration, entries int, now func() time.Time, afterQuery func(K)) notifycache.Options[K] {
	if ttl <= 0 {
		ttl = b.defTTL
	}
	if entries <= 0 {
		entries = b.defEntries
	}
	return notifycache.Options[K]{TTL: min(ttl, b.maxTTL), MaxEntries: entries, Now: now, BeforePut: afterQuery}
}

type freshKey struct{}

// Fresh marks ctx's lookups as reads that must see every change committed
// before them: the in-process caches are not asked (their entries may
// wait for a notification still in flight), the ledger is. A read that
// presents a position token (X-Min-Position, ZBP-5-R107) runs under it:
// the change behind the token committed before the token was issued.
func Fresh(ctx context.Context) context.Context { return context.WithValue(ctx, freshKey{}, true) }

func isFresh(ctx context.Context) bool {
	v, _ := ctx.Value(freshKey{}).(bool)
	return v
}
