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

// AuthCacheStats reports the authentication cache's counters, for
// metrics (Hits also counts a wrong secret refused for a cached token id).
func (s *Store) AuthCacheStats() CacheStats {
	if c := s.runningAuthCache(); c != nil {
		return c.stats()
	}
	return CacheStats{}
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

func newAuthCache(opts AuthCacheOptions) *authCache {
	return &authCache{
		notifyCache: newNotifyCache[authEntry](opts.TTL, DefaultAuthCacheTTL, MaxAuthCacheTTL, opts.MaxEntries, DefaultAuthCacheMaxEntries, opts.Now),
		hooks:       opts.Hooks,
	}
}

// lookup answers tok from the cache when it can: hit reports that it did,
// and then matched whether the secret is right. On a miss, the ticket is
// what insert needs.
func (c *authCache) lookup(tok auth.Token) (p auth.Principal, matched, hit bool, t cacheTicket) {
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
func (c *authCache) insert(t cacheTicket, hash []byte, p auth.Principal) {
	if h := c.hooks.AfterQuery; h != nil {
		h(p.TokenID)
	}
	e := authEntry{hash: bytes.Clone(hash), principal: p}
	e.principal.Grants = slices.Clone(p.Grants)
	c.put(t, p.TokenID, e)
}
