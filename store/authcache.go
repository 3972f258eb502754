package store

import (
	"bytes"
	"slices"
	"time"

	"github.com/blobplane/blobplane/auth"
)

// AuthChannel is the NOTIFY channel that a committed change to tokens,
// grants or principals signals (triggers from db/migrations/00011), with an
// empty payload. A tokens UPDATE that only refreshes last_used_at does not.
const AuthChannel = "blobplane_auth"

// Authentication cache bounds (AuthCacheOptions).
const (
	DefaultAuthCacheTTL        = 30 * time.Second
	MaxAuthCacheTTL            = time.Minute
	DefaultAuthCacheMaxEntries = 10_000
)

// AuthCacheOptions configure the authentication cache (CacheOptions.Auth).
// The zero value is the default.
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
}

// AuthCacheStats is what the authentication cache has done since
// StartCaches started it; all zero when no cache runs.
type AuthCacheStats struct {
	Hits          uint64 // answered without a query (a success, or a wrong secret for a cached token id)
	Misses        uint64 // asked Postgres while a cache was started (not cached, expired, or not listening)
	Invalidations uint64 // emptied because the auth tables changed: a notification, or a write through this Store
	Entries       int    // tokens cached now
	Listening     bool   // the listener is LISTENing, so the cache is in use
}

// AuthCacheStats reports the running authentication cache's counters, for
// metrics; the zero value when StartCaches did not start it.
func (s *Store) AuthCacheStats() AuthCacheStats {
	c := s.runningAuthCache()
	if c == nil {
		return AuthCacheStats{}
	}
	st := c.stats()
	return AuthCacheStats{
		Hits:          st.hits,
		Misses:        st.misses,
		Invalidations: st.invalidations,
		Entries:       st.entries,
		Listening:     st.listening,
	}
}

// runningAuthCache is the authentication cache StartCaches runs, or nil.
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

// authCache is the authentication cache: successful authentications by
// token id, in a notifyCache emptied by every notification on AuthChannel.
// Why an entry never outlives a revocation it missed (beyond the
// milliseconds until the notification arrives) is argued on notifyCache:
// Authenticate takes its ticket in lookup, before TokenForAuth, and
// inserts under it.
type authCache struct {
	*notifyCache[authEntry]
	hooks AuthCacheHooks
}

// authEntry is one successful authentication: the stored secret hash (a
// presented token is compared against it in constant time; the token
// string itself is never a key) and the principal with its effective
// grants.
type authEntry struct {
	hash      []byte
	principal auth.Principal
}

// authTicket is what a miss knew about the cache before its query.
type authTicket = cacheTicket

func newAuthCache(opts AuthCacheOptions) *authCache {
	return &authCache{
		notifyCache: newNotifyCache[authEntry](opts.TTL, DefaultAuthCacheTTL, MaxAuthCacheTTL, opts.MaxEntries, DefaultAuthCacheMaxEntries, opts.Now),
		hooks:       opts.Hooks,
	}
}

// lookup answers tok from the cache when it can: hit reports that it did,
// and then matched whether the secret is right. On a miss, the ticket is
// what insert needs.
func (c *authCache) lookup(tok auth.Token) (p auth.Principal, matched, hit bool, t authTicket) {
	e, hit, t := c.get(tok.ID)
	if !hit {
		return auth.Principal{}, false, false, t
	}
	if !tok.Matches(e.hash) {
		return auth.Principal{}, false, true, t
	}
	p = e.principal
	p.Grants = slices.Clone(p.Grants) // the caller may append
	return p, true, true, t
}

// insert caches a successful authentication loaded under ticket t, unless
// the cache was emptied since.
func (c *authCache) insert(t authTicket, hash []byte, p auth.Principal) {
	if h := c.hooks.AfterQuery; h != nil {
		h(p.TokenID)
	}
	e := authEntry{hash: bytes.Clone(hash), principal: p}
	e.principal.Grants = slices.Clone(p.Grants)
	c.put(t, p.TokenID, e)
}
