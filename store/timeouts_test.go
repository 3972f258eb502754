package store_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// show returns the value of a run-time parameter on one pool connection.
func show(t *testing.T, st *store.Store, name string) string {
	t.Helper()
	var v string
	if err := st.Pool().QueryRow(context.Background(), "SHOW "+name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Issue 26 point 5: a statement that never ends, a wait for a lock that is
// never released, or a transaction left open hold a pool connection (and
// what they locked) for ever. Every connection of the pool now starts with
// a limit on each.
func TestAttackSessionHoldsConnectionForever(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t) // d.Pool has no limits: it plays the other session
	ctx := context.Background()
	st, err := store.OpenWith(ctx, d.URL, nil, store.Timeouts{Statement: 200 * time.Millisecond, Lock: 150 * time.Millisecond, IdleInTransaction: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	for name, want := range map[string]string{"statement_timeout": "200ms", "lock_timeout": "150ms", "idle_in_transaction_session_timeout": "300ms"} {
		if got := show(t, st, name); got != want {
			t.Errorf("SHOW %s = %q on a pool connection, want %q", name, got, want)
		}
	}

	t.Run("statement", func(t *testing.T) {
		_, err := st.Pool().Exec(ctx, "SELECT pg_sleep(30)")
		if sqlState(err) != "57014" { // query_canceled
			t.Fatalf("a 30 s statement: %v, want statement_timeout (57014)", err)
		}
	})

	t.Run("lock wait", func(t *testing.T) {
		holder, err := d.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx)
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_xact_lock(26)"); err != nil {
			t.Fatal(err)
		}
		_, err = st.Pool().Exec(ctx, "SELECT pg_advisory_xact_lock(26)")
		if sqlState(err) != "55P03" { // lock_not_available
			t.Fatalf("waiting for a held lock: %v, want lock_timeout (55P03)", err)
		}
	})

	t.Run("idle in transaction", func(t *testing.T) {
		tx, err := st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var pid int32
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		// The transaction now does nothing; the server ends its session.
		deadline := time.Now().Add(15 * time.Second)
		for {
			var n int
			if err := d.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a transaction left idle still holds its session")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); sqlState(err) != "25P03" { // idle_in_transaction_session_timeout
			t.Fatalf("the transaction left idle: %v, want its session terminated (25P03)", err)
		}
	})

	t.Run("a long sweep raises its own", func(t *testing.T) {
		tx, err := st.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := store.RaiseTimeouts(ctx, tx, store.Timeouts{Statement: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.4)"); err != nil {
			t.Fatalf("a 400 ms statement under a raised limit: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// SET LOCAL: the connection goes back to the pool's limit.
		if got := show(t, st, "statement_timeout"); got != "200ms" {
			t.Fatalf("after the transaction: statement_timeout %q", got)
		}
	})
}

// Open's defaults, and a parameter in DATABASE_URL winning over them.
func TestSessionTimeoutDefaults(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := context.Background()
	st, err := store.Open(ctx, d.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for name, want := range map[string]string{"statement_timeout": "30s", "lock_timeout": "10s", "idle_in_transaction_session_timeout": "1min"} {
		if got := show(t, st, name); got != want {
			t.Errorf("SHOW %s = %q, want %q", name, got, want)
		}
	}

	u, err := url.Parse(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("statement_timeout", "1234")
	u.RawQuery = q.Encode()
	fromURL, err := store.Open(ctx, u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fromURL.Close()
	if got := show(t, fromURL, "statement_timeout"); got != "1234ms" {
		t.Errorf("statement_timeout from DATABASE_URL: %q", got)
	}
	// Zero leaves the server's setting.
	none, err := store.OpenWith(ctx, d.URL, nil, store.Timeouts{})
	if err != nil {
		t.Fatal(err)
	}
	defer none.Close()
	if got := show(t, none, "statement_timeout"); got != "0" {
		t.Errorf("statement_timeout with no limit: %q", got)
	}
}
