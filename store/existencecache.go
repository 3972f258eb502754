package store

import (
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store/notifycache"
)

// RefsChannel is the NOTIFY channel that a committed change able to make a
// positive existence answer wrong signals (triggers from
// db/migrations/00012), with an empty payload: a reference deleted (or
// rewritten, or the table truncated), a blob row leaving state live (or
// its size rewritten), blob rows deleted or truncated. Publications
// (inserts, and a blob becoming live) do not: only found rows are cached.
const RefsChannel = "blobplane_refs"

// Existence cache bounds (ExistenceCacheOptions).
const (
	DefaultExistenceCacheTTL        = 30 * time.Second
	MaxExistenceCacheTTL            = time.Minute
	DefaultExistenceCacheMaxEntries = 100_000
)

// ExistenceCacheOptions configure the blob existence cache
// (CacheOptions.Existence). The zero value is the default.
type ExistenceCacheOptions struct {
	// TTL bounds how long an answer is served without asking Postgres, as
	// a safety net behind the notifications: zero means
	// DefaultExistenceCacheTTL, and anything above MaxExistenceCacheTTL is
	// lowered to it.
	TTL time.Duration
	// MaxEntries bounds the number of cached (repository, digest) pairs;
	// zero means DefaultExistenceCacheMaxEntries. A full cache evicts an
	// arbitrary entry.
	MaxEntries int
	// Now is the clock entry ages are measured with; nil means time.Now
	// (monotonic).
	Now func() time.Time
	// Hooks are interleaving points for tests; leave them nil.
	Hooks ExistenceCacheHooks
}

// ExistenceCacheHooks let tests stop the cache at the point where the race
// happens. Each runs on the goroutine that reaches the point, with no lock
// held. Production code leaves them nil.
type ExistenceCacheHooks struct {
	// AfterQuery runs on a cache miss after GetReferencedBlob found the
	// reference and before the answer may enter the cache.
	AfterQuery func(repository string, d blobplane.Digest)
}

// ExistenceCacheStats reports the existence cache's counters, for
// metrics; an entry is a (repository, digest) pair.
func (s *Store) ExistenceCacheStats() CacheStats { return s.existenceCache.Load().cache().Stats() }

// invalidateExistenceCache empties this process's existence cache after a
// write through this Store that can make a cached answer wrong (a
// reference deleted), so the caller's next HEAD sees it without waiting
// for the notification (which every other process waits for). It is
// called whether or not the write reported success: an error may hide a
// commit, and a spurious clear costs one query per cached pair.
func (s *Store) invalidateExistenceCache() { s.existenceCache.Load().cache().Invalidate() }

// existenceCache is the positive existence cache behind ReferencedBlob:
// (repository, digest) → size, only for found rows (a reference to a live
// blob), in a notifycache.Cache emptied by every notification on
// RefsChannel. Absence is never cached, so pending or refused content can
// never appear from it, and publishing needs no notification. Why an entry
// never outlives a deletion it missed (beyond the milliseconds until the
// notification arrives) is argued on notifycache.Cache.
//
// Its methods accept a nil receiver (no cache running): lookup misses
// without counting and insert does nothing, so ReferencedBlob reads the
// same either way.
type existenceCache notifycache.Cache[existenceKey, int64]

// existenceKey is what the existence cache answers for: a repository (or
// a read scope standing in for one, ReadScope.cacheKey) and a digest.
type existenceKey struct {
	repository string
	digest     blobplane.Digest
}

var existenceBounds = cacheBounds{defTTL: DefaultExistenceCacheTTL, maxTTL: MaxExistenceCacheTTL, defEntries: DefaultExistenceCacheMaxEntries}

func newExistenceCache(opts ExistenceCacheOptions) *existenceCache {
	var afterQuery func(existenceKey)
	if h := opts.Hooks.AfterQuery; h != nil {
		afterQuery = func(k existenceKey) { h(k.repository, k.digest) }
	}
	o := cacheOptions(existenceBounds, opts.TTL, opts.MaxEntries, opts.Now, afterQuery)
	return (*existenceCache)(notifycache.New[existenceKey, int64](o))
}

// cache is c as the generic cache it is (nil when c is).
func (c *existenceCache) cache() *notifycache.Cache[existenceKey, int64] {
	return (*notifycache.Cache[existenceKey, int64])(c)
}

// lookup answers whether repository references live d, with its size, when
// the cache can (hit). On a miss, the ticket is what insert needs; take it
// before the query.
func (c *existenceCache) lookup(repository string, d blobplane.Digest) (size int64, hit bool, t notifycache.Ticket) {
	return c.cache().Get(existenceKey{repository, d})
}

// insert caches a found (repository, d) of size, read under ticket t,
// unless the cache was emptied since.
func (c *existenceCache) insert(t notifycache.Ticket, repository string, d blobplane.Digest, size int64) {
	c.cache().Put(t, existenceKey{repository, d}, size)
}
