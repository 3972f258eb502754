// Package notifycache keeps answers from Postgres in memory, exact because
// Postgres tells it when they may have changed: a Cache is a map that is
// emptied whenever what it caches changes, and a Listener holds the one
// connection that LISTENs on the channels of a process's caches and
// empties each cache on every notification on its channel. While the
// Listener is not LISTENing the caches answer nothing, so every lookup
// asks Postgres.
//
// It knows nothing of what is cached: the store decides the keys, the
// values, the channels and what triggers NOTIFY them.
package notifycache

import (
	"sync"
	"sync/atomic"
	"time"
)

// Cache is a map emptied by notifications: entries by key, each with the
// time the query that loaded it started, bounded by a TTL and a count.
//
// Why an entry can never outlive a change it missed: the generation gen
// moves, under mu, every time the cache is emptied (a notification, a
// local write, the listener coming up or going down). A miss takes a
// Ticket (gen and listening) before it runs its query, and Put keeps the
// result only if, under mu, gen still equals the ticket's and the ticket
// was taken while listening. Take a change C (say a revocation, or a
// reference deleted) that commits after the query's snapshot, so the query
// read the old row:
//   - if the listener was LISTENing when the ticket was taken, C's
//     notification is delivered to it after C commits, and handling it
//     moves gen (if the connection dies first, losing it moves gen).
//     Either that happened before Put (the stale result is refused) or
//     after it (the clear removes the entry it inserted).
//   - if not, the ticket refuses the Put outright; and a listener that
//     comes up later empties the cache and moves gen once LISTEN is in
//     effect, so every change it did not hear was committed before a
//     ticket taken after that point, hence before that miss's query.
//
// A change that committed before the query's snapshot is simply seen by
// the query. So a stale answer is served only between a change's commit
// and the listener handling its notification (milliseconds), and not at
// all, once the call returns, in the process that made the change (which
// calls Invalidate after the write: a ticket taken before that clear is
// refused, one taken after it belongs to a query that sees the change).
// The TTL bounds what a listener that goes silent without an error could
// cost; the Listener's keepalive ping shortens even that.
//
// A nil *Cache is no cache: Get misses without counting, Put and
// Invalidate do nothing and Stats is zero, so a caller reads the same with
// the cache running or not.
type Cache[K comparable, V any] struct {
	ttl       time.Duration
	max       int
	now       func() time.Time
	beforePut func(K)

	mu        sync.Mutex
	entries   map[K]entry[V]
	gen       uint64
	listening bool

	hits, misses, invalidations atomic.Uint64
}

// Options configure a Cache.
type Options[K comparable] struct {
	// TTL bounds how long an entry is served without asking Postgres,
	// counted from the start of the query that loaded it: a safety net
	// behind the notifications. It must be positive.
	TTL time.Duration
	// MaxEntries bounds the number of entries; it must be positive. A full
	// cache evicts an arbitrary entry.
	MaxEntries int
	// Now is the clock entry ages are measured with; nil means time.Now
	// (monotonic).
	Now func() time.Time
	// BeforePut, when set, runs at the start of every Put with its key, on
	// the caller's goroutine with no lock held: between a miss's query and
	// the moment its answer may enter the cache, where a change racing the
	// query meets it. An interleaving point for tests; production code
	// leaves it nil.
	BeforePut func(key K)
}

// entry is one cached answer and when the query that loaded it started.
type entry[V any] struct {
	v      V
	loaded time.Time
}

// Ticket is what a miss knew about the cache before its query; Put needs
// it. The zero Ticket (from a nil Cache) is never kept.
type Ticket struct {
	gen       uint64
	listening bool
	at        time.Time
}

// Stats is what a Cache has done since it was made.
type Stats struct {
	Hits          uint64 // answered without a query
	Misses        uint64 // asked Postgres while the cache was started (not cached, expired, or not listening)
	Invalidations uint64 // emptied because what it caches changed: a notification, or a write through this process
	Entries       int    // entries cached now
	Listening     bool   // the listener is LISTENing, so the cache is in use
}

// New makes an empty cache that does not serve until SetListening(true).
// It panics when o.TTL or o.MaxEntries is not positive.
func New[K comparable, V any](o Options[K]) *Cache[K, V] {
	if o.TTL <= 0 || o.MaxEntries <= 0 {
		panic("notifycache: New needs a positive TTL and MaxEntries")
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return &Cache[K, V]{ttl: o.TTL, max: o.MaxEntries, now: now, beforePut: o.BeforePut, entries: map[K]entry[V]{}}
}

// Get answers key from the cache when it can (hit), counting a hit or a
// miss. On a miss, the ticket is what Put needs: take it before the
// query, never after.
func (c *Cache[K, V]) Get(key K) (v V, hit bool, t Ticket) {
	if c == nil {
		return v, false, t
	}
	now := c.now()
	c.mu.Lock()
	e, found := c.entries[key]
	found = found && c.listening // empty anyway when not listening; belt and braces
	if found && !(now.Sub(e.loaded) < c.ttl) {
		delete(c.entries, key)
		found = false
	}
	t = Ticket{gen: c.gen, listening: c.listening, at: now}
	c.mu.Unlock()
	if !found {
		c.misses.Add(1)
		return v, false, t
	}
	c.hits.Add(1)
	return e.v, true, t
}

// Put caches v, loaded by a query that started after ticket t was taken,
// unless the cache was emptied since (see Cache for why that is enough).
// The cache keeps v itself: a caller that may change it later passes a
// copy. A full cache evicts an arbitrary entry.
func (c *Cache[K, V]) Put(t Ticket, key K, v V) {
	if c == nil {
		return
	}
	if h := c.beforePut; h != nil {
		h(key)
	}
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
	c.entries[key] = entry[V]{v: v, loaded: t.at}
}

// Invalidate empties the cache because what it caches changed: a
// notification on its channel arrived, or this process wrote.
func (c *Cache[K, V]) Invalidate() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
	c.invalidations.Add(1)
}

// SetListening records that the listener came up (LISTEN on the cache's
// channel in effect) or went down. Either way the cache starts empty:
// going down, nothing would remove stale entries; coming up,
// notifications sent while it was down were missed.
func (c *Cache[K, V]) SetListening(on bool) {
	c.mu.Lock()
	c.listening = on
	c.gen++
	clear(c.entries)
	c.mu.Unlock()
}

// Stats reports c's counters and state.
func (c *Cache[K, V]) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	c.mu.Lock()
	entries, listening := len(c.entries), c.listening
	c.mu.Unlock()
	return Stats{
		Hits: c.hits.Load(), Misses: c.misses.Load(), Invalidations: c.invalidations.Load(),
		Entries: entries, Listening: listening,
	}
}
