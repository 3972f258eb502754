package notifycache_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store/notifycache"
)

const listenerName = "notifycache-test-listener"

// The events a recorder reports, in the order the listener drives it.
const (
	up          = "up"
	down        = "down"
	invalidated = "invalidated"
)

// recorder is a Target that reports each call as an event.
type recorder chan string

func newRecorder() recorder { return make(recorder, 100) }

func (r recorder) Invalidate() { r <- invalidated }

func (r recorder) SetListening(on bool) {
	if on {
		r <- up
	} else {
		r <- down
	}
}

// expect fails the test unless r's next events are want, in order, each
// within a deadline.
func (r recorder) expect(t *testing.T, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-r:
			if got != w {
				t.Fatalf("event %q, want %q", got, w)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("timed out waiting for event %q", w)
		}
	}
}

// expectNone fails the test if r has an event it did not expect.
func (r recorder) expectNone(t *testing.T) {
	t.Helper()
	select {
	case got := <-r:
		t.Fatalf("unexpected event %q", got)
	default:
	}
}

// listenerDB is a test's database: a pool to notify and inspect with, and
// the connection configuration a Listener uses, named listenerName.
type listenerDB struct {
	pool *pgtest.DB
	conn *pgx.ConnConfig
}

func setupListener(t *testing.T) listenerDB {
	t.Helper()
	d := pgtest.New(t)
	cfg := d.Pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = listenerName
	return listenerDB{pool: d, conn: cfg}
}

// start runs l until the test ends.
func start(t *testing.T, l *notifycache.Listener) {
	t.Helper()
	t.Cleanup(l.Start(context.Background()))
}

func (d listenerDB) notify(t *testing.T, channel string) {
	t.Helper()
	if _, err := d.pool.Pool.Exec(context.Background(), `SELECT pg_notify($1, '')`, channel); err != nil {
		t.Fatal(err)
	}
}

// listenerQueries are the last statements of the listener's connections.
func (d listenerDB) listenerQueries(t *testing.T) []string {
	t.Helper()
	rows, err := d.pool.Pool.Query(context.Background(), `SELECT query FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, listenerName)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return queries
}

// One connection LISTENs for every channel, and a notification reaches the
// targets of its channel only, every one of them.
func TestListenerDispatchesByChannel(t *testing.T) {
	t.Parallel()
	d := setupListener(t)
	a, b1, b2 := newRecorder(), newRecorder(), newRecorder()
	l := notifycache.NewListener(notifycache.Config{Conn: d.conn})
	l.Register("chan_a", "a", a)
	l.Register("chan_b", "b1", b1)
	l.Register("chan_b", "b2", b2)
	start(t, l)
	for _, r := range []recorder{a, b1, b2} {
		r.expect(t, up)
	}
	if q := d.listenerQueries(t); len(q) != 1 {
		t.Fatalf("%d listener connections, want 1", len(q))
	}

	// Handled in order on one goroutine: once chan_b's is handled, so is
	// chan_a's.
	d.notify(t, "chan_a")
	d.notify(t, "chan_b")
	b1.expect(t, invalidated)
	b2.expect(t, invalidated)
	a.expect(t, invalidated)
	for _, r := range []recorder{a, b1, b2} {
		r.expectNone(t)
	}
}

// A lost connection tells every target the listener is down; the listener
// reconnects at once, tells them it is up once LISTEN is in effect again,
// and notifications flow again. A Waker is woken each time it comes up.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := setupListener(t)
	r := newRecorder()
	woken := make(chan struct{}, 10)
	l := notifycache.NewListener(notifycache.Config{Conn: d.conn})
	l.Register("chan_a", "a", r)
	l.Register("chan_a", "waker", notifycache.Waker(func() { woken <- struct{}{} }))
	start(t, l)
	r.expect(t, up)
	received(t, woken, "coming up wakes")

	var terminated []bool
	rows, err := d.pool.Pool.Query(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, listenerName)
	if err == nil {
		terminated, err = pgx.CollectRows(rows, pgx.RowTo[bool])
	}
	if err != nil || len(terminated) != 1 || !terminated[0] {
		t.Fatalf("terminated %v (%v), want the 1 listener backend", terminated, err)
	}
	r.expect(t, down, up)
	received(t, woken, "coming back wakes: a notification may have been missed")

	d.notify(t, "chan_a")
	r.expect(t, invalidated)
	received(t, woken, "the notification wakes")
}

// received waits for a value on ch, or fails the test at a deadline.
func received(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting until %s", what)
	}
}

// A failed attempt is retried with backoff.
func TestListenerRetriesAFailedConnect(t *testing.T) {
	t.Parallel()
	d := setupListener(t)
	var attempts atomic.Int32
	r := newRecorder()
	l := notifycache.NewListener(notifycache.Config{Conn: d.conn, Hooks: notifycache.Hooks{
		BeforeConnect: func(context.Context) error {
			if attempts.Add(1) == 1 {
				return errors.New("refused by the test")
			}
			return nil
		},
	}})
	l.Register("chan_a", "a", r)
	start(t, l)
	r.expect(t, up)
	if n := attempts.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
}

// A quiet connection pings the server every keepalive period, and keeps
// listening across the pings.
func TestListenerKeepalive(t *testing.T) {
	t.Parallel()
	d := setupListener(t)
	r := newRecorder()
	l := notifycache.NewListener(notifycache.Config{Conn: d.conn, Keepalive: 10 * time.Millisecond})
	l.Register("chan_a", "a", r)
	start(t, l)
	r.expect(t, up)
	// The listener's last statement turns from its LISTEN to pgx's ping.
	tick, deadline := time.NewTicker(5*time.Millisecond), time.After(15*time.Second)
	defer tick.Stop()
	for q := d.listenerQueries(t); len(q) != 1 || q[0] != "-- ping"; q = d.listenerQueries(t) {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the listener never pinged: its connections' last statements %q", q)
		}
	}
	d.notify(t, "chan_a")
	r.expect(t, invalidated) // not down: a ping must not drop the listener
}

// stop, or the end of Start's context, ends the goroutine and closes the
// connection, and every target has been told the listener is down.
func TestListenerStop(t *testing.T) {
	t.Parallel()
	d := setupListener(t)
	for _, how := range []string{"stop", "context"} {
		t.Run(how, func(t *testing.T) {
			r := newRecorder()
			l := notifycache.NewListener(notifycache.Config{Conn: d.conn})
			l.Register("chan_a", "a", r)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := l.Start(ctx)
			r.expect(t, up)
			if how == "context" {
				cancel()
			}
			stop()
			stop() // idempotent
			r.expect(t, down)
			r.expectNone(t)
		})
	}
}

// With nothing registered, Start starts nothing.
func TestListenerNothingRegistered(t *testing.T) {
	t.Parallel()
	l := notifycache.NewListener(notifycache.Config{Hooks: notifycache.Hooks{
		BeforeConnect: func(context.Context) error { t.Error("connected with nothing registered"); return nil },
	}})
	l.Start(context.Background())()
}
