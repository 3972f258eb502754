package notifycache

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listener timing. A LISTEN connection that hears nothing for
// DefaultKeepalive pings the server, so one that died silently (a dropped
// NAT mapping, a half-open TCP connection) is noticed within keepalive +
// ping timeout, well inside the caches' TTLs, instead of caching against a
// channel that no longer delivers.
const (
	DefaultKeepalive = 15 * time.Second
	pingTimeout      = 5 * time.Second
	dialTimeout      = 10 * time.Second
	minBackoff       = 250 * time.Millisecond
	maxBackoff       = 30 * time.Second
)

// Target is what a Listener drives: a Cache, or anything else that must
// hear of a channel's notifications and of the listener's state.
type Target interface {
	// Invalidate empties the target: a notification on its channel
	// arrived.
	Invalidate()
	// SetListening empties the target and records that the listener came
	// up (LISTEN on every channel in effect) or went down.
	SetListening(on bool)
}

var (
	_ Target = (*Cache[string, int])(nil)
	_ Target = Waker(nil)
)

// Waker is a function as a Target: called on each notification, and each
// time the listener comes up, since a notification may have been sent
// while it was not listening. For what is woken rather than emptied (a
// loop that re-reads a table when told it changed).
type Waker func()

// Invalidate calls w.
func (w Waker) Invalidate() { w() }

// SetListening calls w when the listener comes up.
func (w Waker) SetListening(on bool) {
	if on {
		w()
	}
}

// Hooks let tests hold a Listener. Production code leaves them nil.
type Hooks struct {
	// BeforeConnect runs before each attempt to open the listener
	// connection; an error fails the attempt (retried with backoff).
	BeforeConnect func(ctx context.Context) error
}

// Config is what a Listener connects and reports with.
type Config struct {
	// Conn is the connection's configuration, copied for each attempt: set
	// application_name in its RuntimeParams so DBAs can tell the listener
	// apart in pg_stat_activity.
	Conn *pgx.ConnConfig
	// Logger receives the listener's state changes; nil discards them.
	Logger *slog.Logger
	// Keepalive is how long a quiet connection waits before it pings the
	// server; zero means DefaultKeepalive.
	Keepalive time.Duration
	// Hooks are interleaving points for tests; leave them nil.
	Hooks Hooks
}

// Listener keeps one LISTEN connection for every registered channel and
// dispatches each notification to the targets registered for its channel.
// Losing the connection empties and disables all of them; once LISTEN is
// in effect again on every channel they are emptied and enabled. Register
// every target before Start.
type Listener struct {
	cfg      Config
	logger   *slog.Logger
	channels []string            // in registration order, without repeats
	names    []string            // of the targets, for logs
	targets  map[string][]Target // by channel
}

// NewListener makes a Listener with nothing registered.
func NewListener(cfg Config) *Listener {
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Listener{cfg: cfg, logger: logger, targets: map[string][]Target{}}
}

// Register has t driven by notifications on channel; name names it in
// logs. Several targets may share a channel.
func (l *Listener) Register(channel, name string, t Target) {
	if _, ok := l.targets[channel]; !ok {
		l.channels = append(l.channels, channel)
	}
	l.targets[channel] = append(l.targets[channel], t)
	l.names = append(l.names, name)
}

// Start runs the listener on a goroutine of its own until ctx ends or stop
// is called: connect, LISTEN, follow notifications, and reconnect after a
// loss (at once, then with jittered exponential backoff while attempts
// fail). stop, which may be called more than once, waits for the
// goroutine and closes the connection; every target has then been told
// the listener is down. With nothing registered nothing is started. Start
// a Listener once.
func (l *Listener) Start(ctx context.Context) (stop func()) {
	if len(l.channels) == 0 {
		return func() {}
	}
	l.logger = l.logger.With("caches", l.names)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// setListening tells every target that the listener came up or went down.
func (l *Listener) setListening(on bool) {
	for _, ch := range l.channels {
		for _, t := range l.targets[ch] {
			t.SetListening(on)
		}
	}
}

// run keeps the LISTEN connection up until ctx ends: connect, LISTEN,
// follow notifications until the connection fails, then reconnect (at
// once after a loss, then with jittered exponential backoff while attempts
// fail).
func (l *Listener) run(ctx context.Context) {
	var lostAt time.Time // zero until the listener is first lost
	failures := 0
	for {
		conn, err := l.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			delay := backoff(failures)
			l.logger.WarnContext(ctx, "cache listener: cannot listen for changes; every request asks Postgres",
				"channels", l.channels, "attempt", failures, "retry_in", delay, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		failures = 0
		l.setListening(true)
		if lostAt.IsZero() {
			l.logger.InfoContext(ctx, "cache listener: listening for changes; caches in use", "channels", l.channels)
		} else {
			l.logger.InfoContext(ctx, "cache listener: recovered; caches in use again", "channels", l.channels, "outage", time.Since(lostAt))
		}
		err = l.follow(ctx, conn)
		l.setListening(false)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		lostAt = time.Now()
		l.logger.WarnContext(ctx, "cache listener: lost; every request asks Postgres until it is back",
			"channels", l.channels, "err", err)
	}
}

// connect opens the listener connection and LISTENs on every channel.
// Once it returns, every change committed from then on is notified to it.
func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	if h := l.cfg.Hooks.BeforeConnect; h != nil {
		if err := h(ctx); err != nil {
			return nil, err
		}
	}
	dialCtx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(dialCtx, l.cfg.Conn.Copy())
	if err != nil {
		return nil, err
	}
	// One round trip; several statements in one simple query run as one
	// implicit transaction, so every LISTEN is in effect when Exec returns.
	var sql string
	for _, ch := range l.channels {
		sql += "LISTEN " + pgx.Identifier{ch}.Sanitize() + ";"
	}
	if _, err := conn.Exec(dialCtx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// follow empties the targets of each notification's channel until the
// connection fails or ctx ends. A quiet connection is pinged every
// keepalive period.
func (l *Listener) follow(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, l.cfg.Keepalive)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		if n != nil {
			l.dispatch(n.Channel)
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed() {
			return err
		}
		pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return err
		}
	}
}

// dispatch empties the targets registered for channel. A notification on
// a channel nobody registered (none is LISTENed, so none should arrive)
// empties every target: a spurious clear is cheap, a missed one is not.
func (l *Listener) dispatch(channel string) {
	for _, ch := range l.channels {
		if ch == channel || l.targets[channel] == nil {
			for _, t := range l.targets[ch] {
				t.Invalidate()
			}
		}
	}
}

// backoff is the delay before reconnect attempt n+1 after n failures:
// exponential from minBackoff to maxBackoff, with jitter so that processes
// that lost Postgres together do not return in step.
func backoff(failures int) time.Duration {
	d := maxBackoff
	if failures < 20 {
		d = min(minBackoff<<(failures-1), maxBackoff)
	}
	return d/2 + rand.N(d/2+1)
}
