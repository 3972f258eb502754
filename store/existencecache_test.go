package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// startExistenceCache starts s's existence cache, stops it at cleanup and
// returns once the listener is LISTENing.
func startExistenceCache(t *testing.T, s *store.Store, opts store.ExistenceCacheOptions) {
	t.Helper()
	stop := s.StartCaches(context.Background(), store.CacheOptions{Existence: &opts})
	t.Cleanup(stop)
	waitFor(t, "the existence cache listens", func() bool { return s.ExistenceCacheStats().Listening })
}

// waitExistenceInvalidated waits until s's existence cache handled an
// invalidation after the count before.
func waitExistenceInvalidated(t *testing.T, s *store.Store, before uint64) {
	t.Helper()
	waitFor(t, "the existence cache handles the notification", func() bool { return s.ExistenceCacheStats().Invalidations > before })
}

// publish admits content into repo and publishes it (this node holds the
// partition), returning its digest and size.
func publish(t *testing.T, u *uploads, repo, content string) (blobplane.Digest, int64) {
	t.Helper()
	_, req := u.admittedIn(t, repo, content)
	if _, err := u.s.Finalize(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	return req.Digest, req.Size
}

// cachedBlob asks s for (repo, d) twice, so that it is cached (the second
// call is a hit), and checks both answers are size.
func cachedBlob(t *testing.T, s *store.Store, repo string, d blobplane.Digest, size int64) {
	t.Helper()
	before := s.ExistenceCacheStats()
	for range 2 {
		got, err := s.ReferencedBlob(context.Background(), repo, d)
		if err != nil || got != size {
			t.Fatalf("ReferencedBlob(%s, %s) = %d, %v; want %d", repo, d, got, err, size)
		}
	}
	if after := s.ExistenceCacheStats(); after.Misses != before.Misses+1 || after.Hits != before.Hits+1 {
		t.Fatalf("asking twice: %+v then %+v, want one miss and one hit", before, after)
	}
}

func wantAbsent(t *testing.T, s *store.Store, repo string, d blobplane.Digest, when string) {
	t.Helper()
	if size, err := s.ReferencedBlob(context.Background(), repo, d); !isCode(err, blobplane.CodeNotFound) {
		t.Fatalf("%s: ReferencedBlob = %d, %v; want not_found", when, size, err)
	}
}

// The second HEAD of a published blob is answered from the cache. Absence
// is never cached: an unknown digest asks Postgres every time, and content
// published after a not-found answer is found at once.
func TestExistenceCacheHit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	startExistenceCache(t, u.s, store.ExistenceCacheOptions{})

	_, req := u.admitted(t, "later")
	wantAbsent(t, u.s, upRepo, req.Digest, "admitted, not published")
	if _, err := u.s.Finalize(ctx, req); err != nil {
		t.Fatal(err)
	}
	cachedBlob(t, u.s, upRepo, req.Digest, req.Size)

	d, size := publish(t, u, upRepo, "hello")
	cachedBlob(t, u.s, upRepo, d, size)
	if st := u.s.ExistenceCacheStats(); st.Entries != 2 || st.Invalidations != 0 {
		t.Fatalf("after caching two blobs: %+v (publishing must not empty the cache)", st)
	}

	unknown, _ := contentOf([]byte("never published"))
	for _, c := range []struct {
		repo string
		d    blobplane.Digest
	}{{upRepo, unknown}, {"team/other", d}} {
		before := u.s.ExistenceCacheStats()
		wantAbsent(t, u.s, c.repo, c.d, "absent")
		wantAbsent(t, u.s, c.repo, c.d, "absent, asked again")
		if after := u.s.ExistenceCacheStats(); after.Misses != before.Misses+2 || after.Hits != before.Hits || after.Entries != 2 {
			t.Fatalf("absent (%s, %s): %+v then %+v, want two misses and nothing cached", c.repo, c.d, before, after)
		}
	}
}

// A change committed anywhere — another API process, the collector in the
// worker, a DBA's SQL — reaches the cache through the notification, and
// the next HEAD is not found.
func TestExistenceCacheDeletion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, other *store.Store, conn *pgx.Conn, d blobplane.Digest)
	}{
		{"DeleteReference in another process", func(t *testing.T, other *store.Store, _ *pgx.Conn, d blobplane.Digest) {
			if err := other.DeleteReference(context.Background(), upRepo, d); err != nil {
				t.Fatal(err)
			}
		}},
		{"a DBA's DELETE of the reference", func(t *testing.T, _ *store.Store, conn *pgx.Conn, d blobplane.Digest) {
			if _, err := conn.Exec(context.Background(), `DELETE FROM blob_references WHERE repository = $1 AND digest = $2`, upRepo, string(d)); err != nil {
				t.Fatal(err)
			}
		}},
		{"a DBA's TRUNCATE of the references", func(t *testing.T, _ *store.Store, conn *pgx.Conn, _ blobplane.Digest) {
			if _, err := conn.Exec(context.Background(), `TRUNCATE blob_references`); err != nil {
				t.Fatal(err)
			}
		}},
		{"a DBA's obliteration", func(t *testing.T, _ *store.Store, conn *pgx.Conn, d blobplane.Digest) {
			if _, err := conn.Exec(context.Background(), `UPDATE blobs SET state = 'obliterated', updated_at = now() WHERE digest = $1`, string(d)); err != nil {
				t.Fatal(err)
			}
		}},
		{"its last copy failed (issue 29)", func(t *testing.T, other *store.Store, _ *pgx.Conn, d blobplane.Digest) {
			ps, err := other.Placements(context.Background(), d)
			if err != nil || len(ps) == 0 {
				t.Fatalf("placements: %v, %v", ps, err)
			}
			for _, p := range ps {
				if _, err := other.FailPlacement(context.Background(), p.Key, placement.DigestMismatch, p.Epoch+1); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"the blob row marked collected", func(t *testing.T, _ *store.Store, conn *pgx.Conn, d blobplane.Digest) {
			// The collector only collects unreferenced digests; the trigger
			// does not rely on that.
			if _, err := conn.Exec(context.Background(), `UPDATE blobs SET state = 'collected', updated_at = now() WHERE digest = $1`, string(d)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			u := setupUploads(t)
			other := store.New(u.pool, nil) // another API process: no cache of its own
			conn, err := pgx.Connect(ctx, u.pool.Config().ConnConfig.ConnString())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			startExistenceCache(t, u.s, store.ExistenceCacheOptions{})
			d, size := publish(t, u, upRepo, "hello")
			cachedBlob(t, u.s, upRepo, d, size)

			before := u.s.ExistenceCacheStats().Invalidations
			tc.change(t, other, conn, d)
			waitExistenceInvalidated(t, u.s, before)
			wantAbsent(t, u.s, upRepo, d, "after the change")
		})
	}

	t.Run("DeleteReference in this process applies at once", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		u := setupUploads(t)
		startExistenceCache(t, u.s, store.ExistenceCacheOptions{})
		d, size := publish(t, u, upRepo, "hello")
		cachedBlob(t, u.s, upRepo, d, size)
		if err := u.s.DeleteReference(ctx, upRepo, d); err != nil {
			t.Fatal(err)
		}
		wantAbsent(t, u.s, upRepo, d, "right after DeleteReference")
	})
}

// Publishing (a new digest, a known digest into another repository, whose
// upsert updates the blob row without changing it) and a blob row becoming
// live again notify nothing, so they do not empty every API process's
// cache.
func TestExistenceCachePublishDoesNotInvalidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	if err := u.s.CreateRepository(ctx, "team/other"); err != nil {
		t.Fatal(err)
	}
	gone, _ := publish(t, u, upRepo, "collected")
	if err := u.s.DeleteReference(ctx, upRepo, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := u.pool.Exec(ctx, `UPDATE blobs SET state = 'collected' WHERE digest = $1`, string(gone)); err != nil {
		t.Fatal(err)
	}
	// A listener of the test's own, from after those changes: it must hear
	// nothing before the barrier sent last (NOTIFY delivers in commit
	// order).
	listener, err := pgx.Connect(ctx, u.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+store.RefsChannel); err != nil {
		t.Fatal(err)
	}

	publish(t, u, upRepo, "hello")
	publish(t, u, "team/other", "hello")
	if _, err := u.pool.Exec(ctx, `UPDATE blobs SET state = 'live' WHERE digest = $1 AND state = 'collected'`, string(gone)); err != nil {
		t.Fatal(err)
	}

	if _, err := u.pool.Exec(ctx, `SELECT pg_notify($1, 'barrier')`, store.RefsChannel); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(waitCtx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "barrier" {
		t.Fatalf("a publication or revival notified %s (payload %q)", n.Channel, n.Payload)
	}
}

// The race the generation closes: a miss whose query found the reference
// before a deletion committed must not cache that answer, even though the
// deletion's notification was handled before the miss reached its insert
// (so no later clear would remove it).
func TestExistenceCacheGenerationRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	other := store.New(u.pool, nil)
	d, size := publish(t, u, upRepo, "racing")
	control, controlSize := publish(t, u, upRepo, "control")
	var paused atomic.Bool
	startExistenceCache(t, u.s, store.ExistenceCacheOptions{Hooks: store.ExistenceCacheHooks{
		AfterQuery: func(repo string, got blobplane.Digest) {
			if got != d {
				return
			}
			paused.Store(true)
			// The miss has found the reference. Delete it from another
			// process and wait until this cache has handled the
			// notification.
			before := u.s.ExistenceCacheStats().Invalidations
			if err := other.DeleteReference(ctx, repo, got); err != nil {
				t.Error(err)
				return
			}
			waitExistenceInvalidated(t, u.s, before)
		},
	}})

	// Without a change in between, an answer passing the hook is cached.
	cachedBlob(t, u.s, upRepo, control, controlSize)

	// The racing HEAD itself answers found: it read the reference before
	// the deletion committed, as an uncached HEAD would have.
	if got, err := u.s.ReferencedBlob(ctx, upRepo, d); err != nil || got != size || !paused.Load() {
		t.Fatalf("racing HEAD: %d %v (hook ran: %v)", got, err, paused.Load())
	}
	st := u.s.ExistenceCacheStats()
	if st.Entries != 0 {
		t.Fatalf("the answer read before the deletion was cached: %+v", st)
	}
	wantAbsent(t, u.s, upRepo, d, "after the deletion")
	if after := u.s.ExistenceCacheStats(); after.Hits != st.Hits || after.Misses != st.Misses+1 {
		t.Fatalf("the next HEAD did not ask Postgres: %+v then %+v", st, after)
	}
}

// Both caches share one listener connection. While it is down nothing is
// cached and every HEAD asks Postgres, so a deletion during the outage
// applies at once; once it listens again, caching resumes in both.
func TestExistenceCacheListenerLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	s := u.s
	cut, restore := startCachesWithOutage(t, s, u.pool,
		store.CacheOptions{Auth: &store.AuthCacheOptions{}, Existence: &store.ExistenceCacheOptions{}},
		func() bool { return s.ExistenceCacheStats().Listening && s.AuthCacheStats().Listening })
	dA, sizeA := publish(t, u, upRepo, "kept")
	dB, _ := publish(t, u, upRepo, "deleted during the outage")
	cachedBlob(t, s, upRepo, dA, sizeA)

	cut() // the one connection both caches share
	st := s.ExistenceCacheStats()
	if st.Listening || st.Entries != 0 || s.AuthCacheStats().Listening {
		t.Fatalf("during the outage: %+v (auth %+v), want neither cache listening and empty", st, s.AuthCacheStats())
	}
	for range 2 {
		if got, err := s.ReferencedBlob(ctx, upRepo, dA); err != nil || got != sizeA {
			t.Fatalf("during the outage: %d %v", got, err)
		}
	}
	if after := s.ExistenceCacheStats(); after.Hits != st.Hits || after.Misses != st.Misses+2 || after.Entries != 0 {
		t.Fatalf("during the outage: %+v then %+v, want two misses and nothing cached", st, after)
	}
	// A DBA's deletion during the outage: no notification reaches this
	// process, and none is needed.
	if _, err := u.pool.Exec(ctx, `DELETE FROM blob_references WHERE repository = $1 AND digest = $2`, upRepo, string(dB)); err != nil {
		t.Fatal(err)
	}
	wantAbsent(t, s, upRepo, dB, "deleted during the outage")

	restore()
	cachedBlob(t, s, upRepo, dA, sizeA)
	wantAbsent(t, s, upRepo, dB, "deleted, after recovery")
}

// One connection LISTENs for both caches, and a notification empties only
// the cache of its channel.
func TestCachesShareOneListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	s := u.s
	stop := s.StartCaches(ctx, store.CacheOptions{Auth: &store.AuthCacheOptions{}, Existence: &store.ExistenceCacheOptions{}})
	t.Cleanup(stop)
	waitFor(t, "the caches listen", func() bool {
		return s.ExistenceCacheStats().Listening && s.AuthCacheStats().Listening
	})
	var conns int
	if err := u.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		store.CacheListenerName).Scan(&conns); err != nil {
		t.Fatal(err)
	}
	if conns != 1 {
		t.Fatalf("%d listener connections, want 1", conns)
	}
	d, size := publish(t, u, upRepo, "hello")
	tok, _ := cachedToken(t, s, "ci", "team/*:read")
	cachedBlob(t, s, upRepo, d, size)

	// Two notifications on one channel, and waiting for the second to be
	// handled: the listener handles them in order on one goroutine, so the
	// first one's dispatch is over.
	notifyTwice := func(channel string, handled func() uint64) {
		t.Helper()
		before := handled()
		for range 2 {
			if _, err := u.pool.Exec(ctx, `SELECT pg_notify($1, '')`, channel); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "both notifications are handled", func() bool { return handled() >= before+2 })
	}

	existence := s.ExistenceCacheStats()
	notifyTwice(store.AuthChannel, func() uint64 { return s.AuthCacheStats().Invalidations })
	if after := s.ExistenceCacheStats(); after.Invalidations != existence.Invalidations || after.Entries != 1 {
		t.Fatalf("an auth notification touched the existence cache: %+v then %+v", existence, after)
	}
	if _, err := s.Authenticate(ctx, tok); err != nil { // cached again for the next check
		t.Fatal(err)
	}

	authStats := s.AuthCacheStats()
	notifyTwice(store.RefsChannel, func() uint64 { return s.ExistenceCacheStats().Invalidations })
	if after := s.AuthCacheStats(); after.Invalidations != authStats.Invalidations || after.Entries != 1 {
		t.Fatalf("a refs notification touched the auth cache: %+v then %+v", authStats, after)
	}
	if st := s.ExistenceCacheStats(); st.Entries != 0 {
		t.Fatalf("the refs notifications left entries: %+v", st)
	}
}

// Entries expire after the TTL (capped at a minute) on the cache's clock,
// and the cache holds at most MaxEntries pairs.
func TestExistenceCacheBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	startExistenceCache(t, u.s, store.ExistenceCacheOptions{TTL: time.Hour, MaxEntries: 2, Now: clock})

	var ds []blobplane.Digest
	for _, c := range []string{"one", "two", "three"} {
		d, _ := publish(t, u, upRepo, c)
		ds = append(ds, d)
	}
	cachedBlob(t, u.s, upRepo, ds[0], 3)
	advance(59 * time.Second)
	st := u.s.ExistenceCacheStats()
	u.s.ReferencedBlob(ctx, upRepo, ds[0])
	if after := u.s.ExistenceCacheStats(); after.Hits != st.Hits+1 {
		t.Fatalf("within the TTL: %+v then %+v, want a hit", st, after)
	}
	advance(time.Second) // a minute after loading: the TTL of an hour was capped
	st = u.s.ExistenceCacheStats()
	u.s.ReferencedBlob(ctx, upRepo, ds[0])
	if after := u.s.ExistenceCacheStats(); after.Misses != st.Misses+1 {
		t.Fatalf("after the TTL: %+v then %+v, want a miss", st, after)
	}

	for i, d := range ds {
		if _, err := u.s.ReferencedBlob(ctx, upRepo, d); err != nil {
			t.Fatal(err)
		}
		if st := u.s.ExistenceCacheStats(); st.Entries != min(i+1, 2) {
			t.Fatalf("%d entries after %d blobs, want at most 2", st.Entries, i+1)
		}
	}
}

// stop ends the listener and closes its connection; ReferencedBlob goes on
// uncached. With no cache chosen, StartCaches opens no connection.
func TestExistenceCacheStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	listeners := func() int {
		var n int
		if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
			store.CacheListenerName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	s.StartCaches(ctx, store.CacheOptions{})()
	if n := listeners(); n != 0 {
		t.Fatalf("StartCaches without caches opened %d listener connections", n)
	}

	stop := s.StartCaches(ctx, store.CacheOptions{Existence: &store.ExistenceCacheOptions{}})
	waitFor(t, "the existence cache listens", func() bool { return s.ExistenceCacheStats().Listening })
	stop()
	stop() // idempotent
	if st := s.ExistenceCacheStats(); st != (store.CacheStats{}) {
		t.Fatalf("stats after stop: %+v", st)
	}
	unknown, _ := contentOf([]byte("unknown"))
	wantAbsent(t, s, "team/app", unknown, "after stop")
	waitFor(t, "the listener connection is gone", func() bool { return listeners() == 0 })
	// A new cache may start once the old one stopped.
	startExistenceCache(t, s, store.ExistenceCacheOptions{})
}

// A read under store.Fresh (one presenting a position token,
// X-Min-Position, ZBP-5-R107) asks the ledger, not the cache: a deletion
// whose notification has not reached this process yet is seen at once.
// Here the notification never comes (the DBA's DELETE runs with the
// table's triggers off), the deterministic form of one still in flight;
// the plain read still answers from the cache, and so shows what Fresh
// is for.
func TestAFreshReadSkipsTheExistenceCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	conn, err := pgx.Connect(ctx, u.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	startExistenceCache(t, u.s, store.ExistenceCacheOptions{})
	d, size := publish(t, u, upRepo, "fresh")
	cachedBlob(t, u.s, upRepo, d, size)
	if got, err := u.s.ReferencedBlob(store.Fresh(ctx), upRepo, d); err != nil || got != size {
		t.Fatalf("a fresh read of a published blob: %d, %v", got, err)
	}

	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `DELETE FROM blob_references WHERE repository = $1 AND digest = $2`, upRepo, string(d)); err != nil {
		t.Fatal(err)
	}
	if got, err := u.s.ReferencedBlob(ctx, upRepo, d); err != nil || got != size {
		t.Fatalf("a plain read before any notification: %d, %v; want the cached %d", got, err, size)
	}
	if got, err := u.s.ReferencedBlob(store.Fresh(ctx), upRepo, d); !isCode(err, blobplane.CodeNotFound) {
		t.Fatalf("a fresh read after the deletion: %d, %v; want not_found", got, err)
	}
}
