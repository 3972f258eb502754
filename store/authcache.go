package store

import (
	"bytes"
	"slices"
	"time"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store/notifycache"
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
func (s *Store) AuthCacheStats() CacheStats { return s.authCache.Load().cache().Stats() }

// invalidateAuthCache empties this process's cache after a write to the auth
// tables through this Store, so the caller's next request sees it without
// waiting for the notification (which every other process waits for). It
// is called whether or not the write reported success: an error may hide a
// commit, and a spurious clear costs one query per cached token.
func (s *Store) invalidateAuthCache() { s.authCache.Load().cache().Invalidate() }

// authCache is the authentication cache: successful authentications by
// token id, in a notifycache.Cache emptied by every notification on
// AuthChannel. Why an entry never outlives a revocation it missed (beyond
// the milliseconds until the notification arrives) is argued on
// notifycache.Cache: Authenticate takes its ticket in lookup, before
// TokenForAuth, and inserts under it.
//
// Its methods accept a nil receiver (no cache running): lookup misses
// without counting and insert does nothing.
type authCache notifycache.Cache[string, authEntry]

// authEntry is one successful authentication: the stored secret hash (a
// presented token is compared against it in constant time; the token
// string itself is never a key) and the principal with its effective
// grants.
type authEntry struct {
	hash      []byte
	principal auth.Principal
}

var authBounds = cacheBounds{defTTL: DefaultAuthCacheTTL, maxTTL: MaxAuthCacheTTL, defEntries: DefaultAuthCacheMaxEntries}

func newAuthCache(opts AuthCacheOptions) *authCache {
	o := cacheOptions(authBounds, opts.TTL, opts.MaxEntries, opts.Now, opts.Hooks.AfterQuery)
	return (*authCache)(notifycache.New[string, authEntry](o))
}

// cache is c as the generic cache it is (nil when c is).
func (c *authCache) cache() *notifycache.Cache[string, authEntry] {
	return (*notifycache.Cache[string, authEntry])(c)
}

// lookup answers tok from the cache when it can: hit reports that it did,
// and then matched whether the secret is right. On a miss, the ticket is
// what insert needs; take it before the query.
func (c *authCache) lookup(tok auth.Token) (p auth.Principal, matched, hit bool, t notifycache.Ticket) {
	e, hit, t := c.cache().Get(tok.ID)
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
func (c *authCache) insert(t notifycache.Ticket, hash []byte, p auth.Principal) {
	if c == nil {
		return
	}
	e := authEntry{hash: bytes.Clone(hash), principal: p}
	e.principal.Grants = slices.Clone(p.Grants) // the caller may change p
	c.cache().Put(t, p.TokenID, e)
}
