package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// What a lone Postgres (the tests' own) says of its replication: a
// primary, no standby named or streaming, commits waiting for none.
func TestCheckReplicationOnALonePostgres(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	r, err := st.CheckReplication(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.InRecovery || r.Synchronous() || r.SyncCommit == "" {
		t.Fatalf("a lone primary: %+v", r)
	}
	// auto: nothing replicated, nothing refused; required: refused.
	for mode, want := range map[store.SyncMode]error{store.SyncAuto: nil, store.SyncDegraded: nil, store.SyncRequired: store.ErrNotSynchronous} {
		g := &store.Guard{Store: st, Mode: mode}
		g.Check(context.Background())
		if err := g.Admit(); !errors.Is(err, want) {
			t.Errorf("%s on a lone Postgres: Admit %v, want %v", mode, err, want)
		}
	}
}

// scripted is a replication the test sets check by check.
type scripted struct {
	mu sync.Mutex
	r  store.Replication
	e  error
}

func (s *scripted) set(r store.Replication, err error) {
	s.mu.Lock()
	s.r, s.e = r, err
	s.mu.Unlock()
}

func (s *scripted) check(context.Context) (store.Replication, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r, s.e
}

var (
	syncOn  = store.Replication{StandbyNames: "ANY 1 (pgautofailover_standby_2)", SyncCommit: "on", SyncStandbys: 1, Slots: 1}
	asyncOn = store.Replication{StandbyNames: "", SyncCommit: "on", SyncStandbys: 0, Slots: 1}
)

// The guard of a replicated database: writes are admitted only with a
// synchronous standby; a write that began before the standby was lost is
// not acknowledged (its commit may have been released without it); a
// slow write is acknowledged only after a later check finds the standby.
func TestGuardWithholdsWhatTheStandbyMayNotHave(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var s scripted
	g := &store.Guard{Mode: store.SyncAuto, Interval: 20 * time.Millisecond}
	store.SetGuardCheckForTest(g, s.check)

	s.set(syncOn, nil)
	g.Check(ctx)
	if err := g.Admit(); err != nil {
		t.Fatalf("synchronous: Admit %v", err)
	}
	fast := g.Ticket()
	if err := g.Acknowledge(ctx, fast); err != nil {
		t.Fatalf("a fast write with the standby there: %v", err)
	}

	// The standby goes (pg_auto_failover empties synchronous_standby_names).
	inFlight := g.Ticket()
	s.set(asyncOn, nil)
	g.Check(ctx)
	if err := g.Admit(); !errors.Is(err, store.ErrNotSynchronous) {
		t.Fatalf("asynchronous: Admit %v, want ErrNotSynchronous", err)
	}
	if err := g.Acknowledge(ctx, inFlight); !errors.Is(err, store.ErrOutcomeUnknown) {
		t.Fatalf("a write across the loss: %v, want ErrOutcomeUnknown", err)
	}
	// It comes back: writes again; the one across the loss stays unknown.
	s.set(syncOn, nil)
	g.Check(ctx)
	if err := g.Admit(); err != nil {
		t.Fatalf("synchronous again: Admit %v", err)
	}
	if err := g.Acknowledge(ctx, inFlight); !errors.Is(err, store.ErrOutcomeUnknown) {
		t.Fatalf("a write across the loss, after the return: %v", err)
	}
	if g.Losses() != 1 {
		t.Fatalf("losses %d, want 1", g.Losses())
	}

	// A slow write (its commit waited) is answered only after a check
	// that began after it: none runs, so Acknowledge waits, then fails.
	slow := g.Ticket()
	time.Sleep(3 * 20 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- g.Acknowledge(ctx, slow) }()
	select {
	case err := <-done:
		t.Fatalf("a slow write acknowledged before any later check: %v", err)
	case <-time.After(30 * time.Millisecond):
	}
	g.Check(ctx) // a later check finds the standby: acknowledged
	if err := <-done; err != nil {
		t.Fatalf("a slow write after a later check with the standby: %v", err)
	}
	// The database unreachable counts as a loss.
	s.set(store.Replication{}, errors.New("connection refused"))
	before := g.Ticket()
	g.Check(ctx)
	if err := g.Admit(); !errors.Is(err, store.ErrNotSynchronous) {
		t.Fatalf("unreachable: Admit %v", err)
	}
	if err := g.Acknowledge(ctx, before); !errors.Is(err, store.ErrOutcomeUnknown) {
		t.Fatalf("a write across an unreachable check: %v", err)
	}

	// degraded: never refused, never withheld.
	d := &store.Guard{Mode: store.SyncDegraded, Interval: 20 * time.Millisecond}
	store.SetGuardCheckForTest(d, s.check)
	s.set(syncOn, nil)
	d.Check(ctx)
	tk := d.Ticket()
	s.set(asyncOn, nil)
	d.Check(ctx)
	if err := d.Admit(); err != nil {
		t.Fatalf("degraded: Admit %v", err)
	}
	if err := d.Acknowledge(ctx, tk); err != nil {
		t.Fatalf("degraded: Acknowledge %v", err)
	}
}

// A commit whose wait for the synchronous standby was cancelled returns
// success with only a WARNING: the store's pool counts it, and the guard
// withholds the success of every write under way meanwhile.
func TestCancelledSyncWaitIsAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t, pgtest.New(t).URL, "blobplane-test")
	var s scripted
	s.set(syncOn, nil)
	g := &store.Guard{Store: st, Mode: store.SyncAuto, Interval: time.Hour}
	store.SetGuardCheckForTest(g, s.check)
	g.Check(ctx)
	before := g.Ticket()
	store.NoticeForTest(st, "some other warning")
	if err := g.Acknowledge(ctx, before); err != nil {
		t.Fatalf("an unrelated notice: %v", err)
	}
	store.NoticeForTest(st, "canceling wait for synchronous replication due to user request")
	if err := g.Acknowledge(ctx, before); !errors.Is(err, store.ErrOutcomeUnknown) {
		t.Fatalf("a write across a cancelled wait: %v, want ErrOutcomeUnknown", err)
	}
	if err := g.Acknowledge(ctx, g.Ticket()); err != nil {
		t.Fatalf("a write begun after it: %v", err)
	}
}

// A pool whose connections landed on a standby (a name or proxy that
// moved with a failover, river#1225) is reset: its connections are
// closed, so the next ones go where the URL now leads, with no restart.
func TestGuardResetsAPoolOnAStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.New(t).URL
	st, other := openStore(t, url, "blobplane-test"), openStore(t, url, "blobplane-test-leases")
	for _, s := range []*store.Store{st, other} {
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var s scripted
	resets := 0
	g := &store.Guard{Store: st, Others: []*store.Store{other}, Mode: store.SyncAuto, OnReset: func() { resets++ }}
	store.SetGuardCheckForTest(g, s.check)
	s.set(syncOn, nil)
	g.Check(ctx)
	if resets != 0 || st.Pool().Stat().TotalConns() == 0 {
		t.Fatalf("a primary: %d resets, %d connections", resets, st.Pool().Stat().TotalConns())
	}
	s.set(store.Replication{InRecovery: true, SyncCommit: "on"}, nil)
	g.Check(ctx)
	if resets != 1 || st.Pool().Stat().TotalConns() != 0 || other.Pool().Stat().TotalConns() != 0 {
		t.Fatalf("on a standby: %d resets, %d and %d connections left", resets, st.Pool().Stat().TotalConns(), other.Pool().Stat().TotalConns())
	}
	if err := g.Admit(); !errors.Is(err, store.ErrNotSynchronous) {
		t.Fatalf("on a standby: Admit %v", err)
	}
	if err := st.Ping(ctx); err != nil { // the pool works again at once
		t.Fatal(err)
	}
}

// openStore opens a pool of its own on url (OpenAs: with the notice
// hook), closed at t's end.
func openStore(t *testing.T, url, name string) *store.Store {
	t.Helper()
	st, err := store.OpenAs(context.Background(), url, nil, store.DefaultTimeouts, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}
