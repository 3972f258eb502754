package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// startAuthCache starts s's authentication cache, stops it at cleanup and
// returns once the listener is LISTENing.
func startAuthCache(t *testing.T, s *store.Store, opts store.AuthCacheOptions) {
	t.Helper()
	stop := s.StartCaches(context.Background(), store.CacheOptions{Auth: &opts})
	t.Cleanup(stop)
	waitFor(t, "the auth cache listens", func() bool { return s.AuthCacheStats().Listening })
}

// waitFor polls cond until it holds or fails the test at a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond) // poll interval, not a wait for the race
	}
}

// waitInvalidated waits until s's cache handled an invalidation after the
// count before.
func waitInvalidated(t *testing.T, s *store.Store, before uint64) {
	t.Helper()
	waitFor(t, "the auth cache handles the notification", func() bool { return s.AuthCacheStats().Invalidations > before })
}

// issue creates a token through s and, while s's cache listens, waits
// until the cache has handled the notification of the creation, so that it
// cannot empty the cache in the middle of what the test does next.
func issue(t *testing.T, s *store.Store, principal string, gs ...string) (tok, id string) {
	t.Helper()
	before := s.AuthCacheStats()
	tok, id, err := s.CreateToken(context.Background(), principal, grants(t, gs...))
	if err != nil {
		t.Fatal(err)
	}
	if before.Listening {
		waitInvalidated(t, s, before.Invalidations)
	}
	return tok, id
}

// cachedToken issues a token for principal and authenticates it twice, so
// that it is cached (the second call is a hit).
func cachedToken(t *testing.T, s *store.Store, principal string, gs ...string) (tok, id string) {
	t.Helper()
	ctx := context.Background()
	tok, id = issue(t, s, principal, gs...)
	before := s.AuthCacheStats()
	for range 2 {
		if _, err := s.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if after := s.AuthCacheStats(); after.Misses != before.Misses+1 || after.Hits != before.Hits+1 {
		t.Fatalf("authenticating twice: %+v then %+v, want one miss and one hit", before, after)
	}
	return tok, id
}

// The second authentication of a token is answered from the cache; the
// answer is the same principal, and a caller changing it changes nothing.
// A wrong secret for a cached id is refused from the cache as well.
func TestAuthCacheHit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	startAuthCache(t, s, store.AuthCacheOptions{})
	tok, id := issue(t, s, "ci", "team/*:write", "shared/base:read")
	first, err := s.Authenticate(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.AuthCacheStats(); st.Misses != 1 || st.Hits != 0 || st.Entries != 1 {
		t.Fatalf("after the first authentication: %+v", st)
	}
	first.Grants[0] = auth.Grant{Pattern: auth.AllRepositories, Permission: auth.Admin} // must not reach the cache
	second, err := s.Authenticate(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.AuthCacheStats(); st.Misses != 1 || st.Hits != 1 {
		t.Fatalf("the second authentication queried: %+v", st)
	}
	if second.Name != "ci" || second.TokenID != id || len(second.Grants) != 2 ||
		!second.Allowed("team/app", auth.Write) || second.Allowed("other/app", auth.Read) {
		t.Fatalf("cached principal %+v", second)
	}

	parsed, _ := auth.ParseToken(tok)
	wrong := auth.Token{ID: parsed.ID, Secret: auth.NewToken().Secret}.String()
	unknown := auth.Token{ID: auth.NewToken().ID, Secret: parsed.Secret}.String()
	_, errWrong := s.Authenticate(ctx, wrong)
	if !isCode(errWrong, blobplane.CodeUnauthorized) {
		t.Fatalf("wrong secret for a cached id: %v", errWrong)
	}
	if st := s.AuthCacheStats(); st.Misses != 1 || st.Hits != 2 {
		t.Fatalf("a wrong secret for a cached id should be refused from the cache: %+v", st)
	}
	_, errUnknown := s.Authenticate(ctx, unknown)
	if blobplane.ErrorMessage(errWrong) != blobplane.ErrorMessage(errUnknown) {
		t.Fatalf("cached wrong secret %q and unknown id %q answer differently", errWrong, errUnknown)
	}
	if _, err := s.Authenticate(ctx, tok); err != nil {
		t.Fatalf("the right secret after a wrong one: %v", err)
	}
	// Failures are never cached: the unknown token queries every time.
	before := s.AuthCacheStats().Misses
	s.Authenticate(ctx, unknown)
	if st := s.AuthCacheStats(); st.Misses != before+1 || st.Entries != 1 {
		t.Fatalf("unknown token: %+v", st)
	}
}

// A change committed anywhere — another API process, a DBA's SQL — reaches
// the cache through the notification, and the next authentication sees it.
func TestAuthCacheRevocation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, other *store.Store, conn *pgx.Conn, id string)
		want   string
	}{
		{"RevokeToken in another process", func(t *testing.T, other *store.Store, _ *pgx.Conn, id string) {
			if err := other.RevokeToken(context.Background(), id); err != nil {
				t.Fatal(err)
			}
		}, "token revoked"},
		{"a DBA's UPDATE", func(t *testing.T, _ *store.Store, conn *pgx.Conn, id string) {
			if _, err := conn.Exec(context.Background(), `UPDATE tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`, id); err != nil {
				t.Fatal(err)
			}
		}, "token revoked"},
		{"a DBA's DELETE", func(t *testing.T, _ *store.Store, conn *pgx.Conn, id string) {
			if _, err := conn.Exec(context.Background(), `DELETE FROM tokens WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
		}, "invalid token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := pgtest.New(t)
			s := store.New(d.Pool, nil)
			other := store.New(d.Pool, nil) // another API process: no cache of its own
			conn, err := pgx.Connect(ctx, d.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			startAuthCache(t, s, store.AuthCacheOptions{})
			tok, id := cachedToken(t, s, "ci", "team/*:write")

			before := s.AuthCacheStats().Invalidations
			tc.change(t, other, conn, id)
			waitInvalidated(t, s, before)
			_, err = s.Authenticate(ctx, tok)
			if !isCode(err, blobplane.CodeUnauthorized) || blobplane.ErrorMessage(err) != tc.want {
				t.Fatalf("after the change: %v, want unauthorized %q", err, tc.want)
			}
		})
	}

	t.Run("RevokeToken in this process applies at once", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := pgtest.NewStore(t)
		startAuthCache(t, s, store.AuthCacheOptions{})
		tok, id := cachedToken(t, s, "ci", "team/*:write")
		if err := s.RevokeToken(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Authenticate(ctx, tok); !isCode(err, blobplane.CodeUnauthorized) {
			t.Fatalf("right after RevokeToken: %v", err)
		}
	})

	t.Run("principal grants", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		d := pgtest.New(t)
		s := store.New(d.Pool, nil)
		other := store.New(d.Pool, nil)
		startAuthCache(t, s, store.AuthCacheOptions{})
		before := s.AuthCacheStats().Invalidations
		if err := other.GrantPrincipal(ctx, "ci", grants(t, "ops/*:admin")); err != nil {
			t.Fatal(err)
		}
		waitInvalidated(t, s, before)
		tok, _ := cachedToken(t, s, "ci", "team/*:write")
		if p, _ := s.Authenticate(ctx, tok); !p.Allowed("ops/db", auth.Admin) {
			t.Fatalf("principal grant missing: %+v", p)
		}
		before = s.AuthCacheStats().Invalidations
		if err := other.RevokePrincipalGrants(ctx, "ci", grants(t, "ops/*:admin")); err != nil {
			t.Fatal(err)
		}
		waitInvalidated(t, s, before)
		p, err := s.Authenticate(ctx, tok)
		if err != nil || p.Allowed("ops/db", auth.Read) || !p.Allowed("team/app", auth.Write) {
			t.Fatalf("after removing the principal grant: %+v %v", p, err)
		}

		before = s.AuthCacheStats().Invalidations
		if err := other.GrantPrincipal(ctx, "ci", grants(t, "audit/*:read")); err != nil {
			t.Fatal(err)
		}
		waitInvalidated(t, s, before)
		if p, err := s.Authenticate(ctx, tok); err != nil || !p.Allowed("audit/log", auth.Read) {
			t.Fatalf("after a new principal grant: %+v %v", p, err)
		}
	})
}

// The race the generation closes: a miss whose query read the token before
// a revocation committed must not cache that result, even though the
// revocation's notification was handled before the miss reached its
// insert (so no later clear would remove it).
func TestAuthCacheGenerationRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	other := store.New(d.Pool, nil)
	tok, id, err := s.CreateToken(ctx, "ci", grants(t, "team/*:write"))
	if err != nil {
		t.Fatal(err)
	}
	control, _, err := s.CreateToken(ctx, "ci", grants(t, "team/*:read"))
	if err != nil {
		t.Fatal(err)
	}
	var paused atomic.Bool
	startAuthCache(t, s, store.AuthCacheOptions{Hooks: store.AuthCacheHooks{
		AfterQuery: func(tokenID string) {
			if tokenID != id {
				return
			}
			paused.Store(true)
			// The miss has read the valid row. Revoke from another process
			// and wait until this cache has handled the notification.
			before := s.AuthCacheStats().Invalidations
			if err := other.RevokeToken(ctx, id); err != nil {
				t.Error(err)
				return
			}
			waitInvalidated(t, s, before)
		},
	}})

	// Without a change in between, a result passing the hook is cached.
	if _, err := s.Authenticate(ctx, control); err != nil {
		t.Fatal(err)
	}
	if st := s.AuthCacheStats(); st.Entries != 1 {
		t.Fatalf("control token not cached: %+v", st)
	}

	// The racing request itself succeeds: it read the token before the
	// revocation committed, as an uncached request would have.
	if _, err := s.Authenticate(ctx, tok); err != nil || !paused.Load() {
		t.Fatalf("racing authentication: %v (hook ran: %v)", err, paused.Load())
	}
	st := s.AuthCacheStats()
	if st.Entries != 0 {
		t.Fatalf("the result read before the revocation was cached: %+v", st)
	}
	_, err = s.Authenticate(ctx, tok)
	if !isCode(err, blobplane.CodeUnauthorized) {
		t.Fatalf("after the revocation: %v", err)
	}
	if after := s.AuthCacheStats(); after.Hits != st.Hits || after.Misses != st.Misses+1 {
		t.Fatalf("the next authentication did not ask Postgres: %+v then %+v", st, after)
	}
}

// startCachesWithOutage starts s's caches opts (on pool's database) with
// the listener's first reconnect held, waits until listening holds, and
// returns cut, which terminates the listener's one connection and returns
// once it noticed, and restore, which lets it reconnect and waits until
// listening holds again.
func startCachesWithOutage(t *testing.T, s *store.Store, pool *pgxpool.Pool, opts store.CacheOptions, listening func() bool) (cut, restore func()) {
	t.Helper()
	var connects atomic.Int32
	outage, release := make(chan struct{}), make(chan struct{})
	opts.Hooks.BeforeConnect = func(ctx context.Context) error {
		if connects.Add(1) != 2 { // hold the first reconnect until released
			return nil
		}
		close(outage)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t.Cleanup(s.StartCaches(context.Background(), opts))
	waitFor(t, "the caches listen", listening)
	cut = func() {
		t.Helper()
		var terminated int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database()`, store.CacheListenerName).Scan(&terminated); err != nil {
			t.Fatal(err)
		}
		if terminated != 1 {
			t.Fatalf("terminated %d listener backends, want the 1 the caches share", terminated)
		}
		select {
		case <-outage:
		case <-time.After(15 * time.Second):
			t.Fatal("the listener did not notice it was terminated")
		}
	}
	restore = func() {
		t.Helper()
		close(release)
		waitFor(t, "the listener is back", listening)
	}
	return cut, restore
}

// While the listener is down nothing is cached and every authentication
// asks Postgres, so a revocation during the outage applies at once; once it
// listens again, caching resumes.
func TestAuthCacheListenerLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	cut, restore := startCachesWithOutage(t, s, d.Pool, store.CacheOptions{Auth: &store.AuthCacheOptions{}},
		func() bool { return s.AuthCacheStats().Listening })
	tokB, idB := issue(t, s, "ci", "team/*:read")
	tokA, _ := cachedToken(t, s, "ci", "team/*:write") // last: issuing empties the cache
	if st := s.AuthCacheStats(); st.Entries != 1 {
		t.Fatalf("before the outage: %+v, want token A cached", st)
	}

	cut()
	st := s.AuthCacheStats()
	if st.Listening || st.Entries != 0 {
		t.Fatalf("during the outage: %+v, want not listening and empty", st)
	}
	for range 2 {
		if _, err := s.Authenticate(ctx, tokA); err != nil {
			t.Fatal(err)
		}
	}
	if after := s.AuthCacheStats(); after.Hits != st.Hits || after.Misses != st.Misses+2 || after.Entries != 0 {
		t.Fatalf("during the outage: %+v then %+v, want two misses and nothing cached", st, after)
	}
	// A DBA's revocation during the outage: no notification reaches this
	// process, and none is needed.
	if _, err := d.Pool.Exec(ctx, `UPDATE tokens SET revoked_at = now() WHERE id = $1`, idB); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, tokB); !isCode(err, blobplane.CodeUnauthorized) {
		t.Fatalf("revoked during the outage: %v", err)
	}

	restore()
	st = s.AuthCacheStats()
	for range 2 {
		if _, err := s.Authenticate(ctx, tokA); err != nil {
			t.Fatal(err)
		}
	}
	if after := s.AuthCacheStats(); after.Hits != st.Hits+1 || after.Misses != st.Misses+1 {
		t.Fatalf("after recovery: %+v then %+v, want one miss then one hit", st, after)
	}
	if _, err := s.Authenticate(ctx, tokB); !isCode(err, blobplane.CodeUnauthorized) {
		t.Fatalf("revoked token after recovery: %v", err)
	}
}

// Refreshing last_used_at (TouchToken, at most once a minute) notifies
// nothing, so it does not empty every API process's cache; and a cache hit
// never writes last_used_at.
func TestAuthCacheTouchDoesNotInvalidate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	startAuthCache(t, s, store.AuthCacheOptions{})
	tok, id := issue(t, s, "ci", "team/*:write")
	// A listener of the test's own, from after the token was issued: it
	// must hear nothing before the barrier sent last (NOTIFY delivers in
	// commit order).
	listener, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+store.AuthChannel); err != nil {
		t.Fatal(err)
	}

	if _, err := s.Authenticate(ctx, tok); err != nil { // a miss: touches the unused token
		t.Fatal(err)
	}
	var used bool
	if err := d.Pool.QueryRow(ctx, `SELECT last_used_at IS NOT NULL FROM tokens WHERE id = $1`, id).Scan(&used); err != nil || !used {
		t.Fatalf("last_used_at not recorded: %v", err)
	}
	// A stale last_used_at is not refreshed by a hit.
	if _, err := d.Pool.Exec(ctx, `UPDATE tokens SET last_used_at = now() - interval '1 hour' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	st := s.AuthCacheStats()
	if _, err := s.Authenticate(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if after := s.AuthCacheStats(); after.Hits != st.Hits+1 || after.Invalidations != st.Invalidations {
		t.Fatalf("after the touches: %+v then %+v, want a hit", st, after)
	}
	var stale bool
	if err := d.Pool.QueryRow(ctx, `SELECT last_used_at < now() - interval '59 minutes' FROM tokens WHERE id = $1`, id).Scan(&stale); err != nil || !stale {
		t.Fatalf("a cache hit wrote last_used_at: %v", err)
	}

	if _, err := d.Pool.Exec(ctx, `SELECT pg_notify($1, 'barrier')`, store.AuthChannel); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(waitCtx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "barrier" {
		t.Fatalf("a last_used_at update notified %s (payload %q)", n.Channel, n.Payload)
	}
}

// Entries expire after the TTL (capped at a minute) on the cache's clock,
// and the cache holds at most MaxEntries tokens.
func TestAuthCacheBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	startAuthCache(t, s, store.AuthCacheOptions{TTL: time.Hour, MaxEntries: 2, Now: clock})

	tok, _ := cachedToken(t, s, "ci", "team/*:write")
	advance(59 * time.Second)
	st := s.AuthCacheStats()
	s.Authenticate(ctx, tok)
	if after := s.AuthCacheStats(); after.Hits != st.Hits+1 {
		t.Fatalf("within the TTL: %+v then %+v, want a hit", st, after)
	}
	advance(time.Second) // a minute after loading: the TTL of an hour was capped
	st = s.AuthCacheStats()
	s.Authenticate(ctx, tok)
	if after := s.AuthCacheStats(); after.Misses != st.Misses+1 {
		t.Fatalf("after the TTL: %+v then %+v, want a miss", st, after)
	}

	// Issuing a token empties the cache, so issue first, then authenticate.
	toks := []string{tok}
	for _, g := range []string{"team/*:read", "other/*:read"} {
		tok, _ := issue(t, s, "ci", g)
		toks = append(toks, tok)
	}
	for i, tok := range toks {
		if _, err := s.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
		if st := s.AuthCacheStats(); st.Entries != min(i+1, 2) {
			t.Fatalf("%d entries after %d tokens, want at most 2", st.Entries, i+1)
		}
	}
}

// stop ends the listener and closes its connection; Authenticate goes on
// uncached.
func TestAuthCacheStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	stop := s.StartCaches(ctx, store.CacheOptions{Auth: &store.AuthCacheOptions{}})
	waitFor(t, "the auth cache listens", func() bool { return s.AuthCacheStats().Listening })
	tok, _ := cachedToken(t, s, "ci", "team/*:write")
	stop()
	stop() // idempotent
	if st := s.AuthCacheStats(); st != (store.CacheStats{}) {
		t.Fatalf("stats after stop: %+v", st)
	}
	if _, err := s.Authenticate(ctx, tok); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the listener connection is gone", func() bool {
		var n int
		if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
			store.CacheListenerName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	// A new cache may start once the old one stopped.
	startAuthCache(t, s, store.AuthCacheOptions{})
}
