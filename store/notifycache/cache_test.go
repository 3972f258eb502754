package notifycache_test

import (
	"testing"
	"time"

	"github.com/blobplane/blobplane/store/notifycache"
)

// clock is a settable clock for a cache's Now.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

// newCache is a listening cache of ints by string, on its own clock.
func newCache(t *testing.T, ttl time.Duration, max int) (*notifycache.Cache[string, int], *clock) {
	t.Helper()
	clk := &clock{now: time.Now()}
	c := notifycache.New[string, int](notifycache.Options[string]{TTL: ttl, MaxEntries: max, Now: clk.Now})
	c.SetListening(true)
	return c, clk
}

// load is a miss followed by its Put: what a caller does with an answer
// from Postgres.
func load(t *testing.T, c *notifycache.Cache[string, int], key string, v int) {
	t.Helper()
	if got, hit, tk := c.Get(key); hit {
		t.Fatalf("Get(%q) = %d, a hit; want a miss", key, got)
	} else {
		c.Put(tk, key, v)
	}
}

func wantHit(t *testing.T, c *notifycache.Cache[string, int], key string, v int) {
	t.Helper()
	if got, hit, _ := c.Get(key); !hit || got != v {
		t.Fatalf("Get(%q) = %d, %v; want %d, a hit", key, got, hit, v)
	}
}

func wantMiss(t *testing.T, c *notifycache.Cache[string, int], key string) {
	t.Helper()
	if got, hit, _ := c.Get(key); hit {
		t.Fatalf("Get(%q) = %d, a hit; want a miss", key, got)
	}
}

// A miss, its Put, then hits; every lookup counted.
func TestCacheHit(t *testing.T) {
	t.Parallel()
	c, _ := newCache(t, time.Minute, 10)
	load(t, c, "a", 1)
	wantHit(t, c, "a", 1)
	wantHit(t, c, "a", 1)
	wantMiss(t, c, "b")
	want := notifycache.Stats{Hits: 2, Misses: 2, Entries: 1, Listening: true}
	if st := c.Stats(); st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
}

// The race the generation closes: an answer read under a ticket taken
// before the cache was emptied is dropped, whatever emptied it.
func TestCacheTicketTakenBeforeAClearIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		clear func(c *notifycache.Cache[string, int])
	}{
		{"a notification", func(c *notifycache.Cache[string, int]) { c.Invalidate() }},
		{"the listener lost and back", func(c *notifycache.Cache[string, int]) { c.SetListening(false); c.SetListening(true) }},
		{"the listener coming up again", func(c *notifycache.Cache[string, int]) { c.SetListening(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := newCache(t, time.Minute, 10)
			load(t, c, "kept", 1)
			_, _, tk := c.Get("a")
			tc.clear(c)
			c.Put(tk, "a", 1)
			if st := c.Stats(); st.Entries != 0 {
				t.Fatalf("an answer read before the clear was cached: %+v", st)
			}
			wantMiss(t, c, "kept") // the clear emptied it
			load(t, c, "a", 1)     // a ticket taken after the clear is good
			wantHit(t, c, "a", 1)
		})
	}
}

// A cache whose listener is not LISTENing serves nothing and keeps
// nothing, and a ticket taken then stays refused once it listens.
func TestCacheNotListening(t *testing.T) {
	t.Parallel()
	c := notifycache.New[string, int](notifycache.Options[string]{TTL: time.Minute, MaxEntries: 10})
	_, _, before := c.Get("a")
	c.Put(before, "a", 1)
	wantMiss(t, c, "a")
	c.SetListening(true)
	c.Put(before, "a", 1)
	if st := c.Stats(); st.Entries != 0 || !st.Listening {
		t.Fatalf("a ticket taken while not listening was honoured: %+v", st)
	}

	load(t, c, "a", 1)
	c.SetListening(false)
	if st := c.Stats(); st.Entries != 0 || st.Listening || st.Invalidations != 0 {
		t.Fatalf("going down: %+v, want empty and not listening (not an invalidation)", st)
	}
	wantMiss(t, c, "a")
}

// An entry's age counts from its ticket, the start of the query that
// loaded it, not from its Put; it is served for less than the TTL.
func TestCacheTTL(t *testing.T) {
	t.Parallel()
	c, clk := newCache(t, time.Minute, 10)
	_, _, tk := c.Get("a")
	clk.advance(10 * time.Second) // a slow query
	c.Put(tk, "a", 1)
	clk.advance(49 * time.Second)
	wantHit(t, c, "a", 1)
	clk.advance(time.Second) // a minute after the query started
	wantMiss(t, c, "a")
	if st := c.Stats(); st.Entries != 0 {
		t.Fatalf("the expired entry stayed: %+v", st)
	}
}

// A full cache evicts an entry for a new key, not for a key it holds.
func TestCacheMaxEntries(t *testing.T) {
	t.Parallel()
	c, _ := newCache(t, time.Minute, 2)
	load(t, c, "a", 1)
	load(t, c, "b", 2)
	_, _, tk := c.Get("a")
	c.Put(tk, "a", 10) // replaces: nothing evicted
	wantHit(t, c, "a", 10)
	wantHit(t, c, "b", 2)
	load(t, c, "c", 3)
	if st := c.Stats(); st.Entries != 2 {
		t.Fatalf("%d entries, want at most 2", st.Entries)
	}
	wantHit(t, c, "c", 3)
}

// BeforePut runs at every Put, with the key, before the answer may enter
// the cache: an invalidation there drops the answer.
func TestCacheBeforePut(t *testing.T) {
	t.Parallel()
	var c *notifycache.Cache[string, int]
	var seen []string
	c = notifycache.New[string, int](notifycache.Options[string]{TTL: time.Minute, MaxEntries: 10, BeforePut: func(key string) {
		seen = append(seen, key)
		if key == "racing" {
			c.Invalidate()
		}
	}})
	c.SetListening(true)
	load(t, c, "calm", 1)
	load(t, c, "racing", 2)
	wantMiss(t, c, "racing")
	if len(seen) != 2 || seen[0] != "calm" || seen[1] != "racing" {
		t.Fatalf("BeforePut saw %q", seen)
	}
}

// A nil cache is no cache: every lookup misses, uncounted.
func TestNilCache(t *testing.T) {
	t.Parallel()
	var c *notifycache.Cache[string, int]
	_, hit, tk := c.Get("a")
	c.Put(tk, "a", 1)
	c.Invalidate()
	if hit || c.Stats() != (notifycache.Stats{}) {
		t.Fatalf("nil cache: hit %v, stats %+v", hit, c.Stats())
	}
}

func TestNewNeedsBounds(t *testing.T) {
	t.Parallel()
	for _, o := range []notifycache.Options[string]{{TTL: time.Minute}, {MaxEntries: 1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", o)
				}
			}()
			notifycache.New[string, int](o)
		}()
	}
}

// A Waker is called on every notification and when the listener comes up
// (a notification may have been missed), not when it goes down.
func TestWaker(t *testing.T) {
	t.Parallel()
	calls := 0
	w := notifycache.Waker(func() { calls++ })
	w.Invalidate()
	w.SetListening(true)
	w.SetListening(false)
	if calls != 2 {
		t.Fatalf("%d calls, want 2", calls)
	}
}
