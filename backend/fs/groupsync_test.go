package fs

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
)

// heldSync is a sync func that reports each call on entered and returns
// only when the test sends its result on release.
type heldSync struct {
	entered chan struct{}
	release chan error
}

func newHeldSync() *heldSync {
	return &heldSync{entered: make(chan struct{}), release: make(chan error)}
}

func (h *heldSync) sync() error {
	h.entered <- struct{}{}
	return <-h.release
}

// recv returns the next value of c, failing the test if none comes.
func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s", what)
		panic("unreachable")
	}
}

// waitWaiters returns once n callers are inside g.Sync.
func waitWaiters(t *testing.T, g *groupSyncer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.waiters() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers in Sync, want %d", g.waiters(), n)
		}
		runtime.Gosched()
	}
}

// TestGroupSyncSharesOneSync: the callers that arrive while a sync runs
// are not satisfied by it (it may have started before their writes) and
// all share the next one.
func TestGroupSyncSharesOneSync(t *testing.T) {
	h := newHeldSync()
	g := newGroupSyncer(h.sync)

	first := make(chan error, 1)
	go func() { first <- g.Sync() }()
	recv(t, h.entered, "sync 1") // runs, held

	const n = 8
	later := make(chan error, n)
	for range n {
		go func() { later <- g.Sync() }()
	}
	waitWaiters(t, g, n+1)

	h.release <- nil // sync 1 returns
	if err := recv(t, first, "return of the first caller"); err != nil {
		t.Fatalf("first caller: %v", err)
	}
	if len(later) != 0 {
		t.Fatal("a caller that arrived during sync 1 returned with it")
	}
	recv(t, h.entered, "sync 2") // started by one of the later callers, held
	if len(later) != 0 {
		t.Fatal("a caller that arrived during sync 1 returned before sync 2 did")
	}
	h.release <- nil
	for range n {
		if err := recv(t, later, "return of a later caller"); err != nil {
			t.Fatalf("later caller: %v", err)
		}
	}
	if got := g.syncs(); got != 2 {
		t.Fatalf("%d syncs for %d callers, want 2", got, n+1)
	}
	// Nothing running: the next caller starts its own.
	go func() { first <- g.Sync() }()
	recv(t, h.entered, "sync 3")
	h.release <- nil
	if err := recv(t, first, "return of the lone caller"); err != nil || g.syncs() != 3 {
		t.Fatalf("lone caller: %v after %d syncs", err, g.syncs())
	}
}

// TestGroupSyncErrorIsSticky: a failed sync fails its callers, the ones
// waiting for the next sync (their writes' errors may have been reported
// to it) and every later caller, without another sync.
func TestGroupSyncErrorIsSticky(t *testing.T) {
	h := newHeldSync()
	g := newGroupSyncer(h.sync)
	first := make(chan error, 1)
	go func() { first <- g.Sync() }()
	recv(t, h.entered, "sync 1")
	waiting := make(chan error, 1)
	go func() { waiting <- g.Sync() }()
	waitWaiters(t, g, 2)

	eio := errors.New("input/output error")
	h.release <- eio
	for _, c := range []chan error{first, waiting} {
		if err := recv(t, c, "return of a caller"); !errors.Is(err, eio) {
			t.Fatalf("caller got %v, want the sync's error", err)
		}
	}
	if err := g.Sync(); !errors.Is(err, eio) {
		t.Fatalf("a later caller got %v, want the sticky error", err)
	}
	if !errors.Is(g.failed(), eio) || g.syncs() != 1 {
		t.Fatalf("failed() = %v after %d syncs, want the error after 1", g.failed(), g.syncs())
	}
}

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.44-fc-v669":      true,
		"5.8.0":                true,
		"5.10.0-28-amd64":      true,
		"5.7.19":               false,
		"4.19.0-27-amd64":      false,
		"5.8":                  true,
		"5.8-rc1":              true,
		"5.15.153.1-microsoft": true,
		"6":                    false,
		"":                     false,
		"x.y":                  false,
	} {
		if got := kernelAtLeast(release, 5, 8); got != want {
			t.Errorf("kernelAtLeast(%q, 5, 8) = %v, want %v", release, got, want)
		}
	}
}

func TestPickSyncMode(t *testing.T) {
	supported := syncfsSupported() == nil
	got, err := pickSyncMode("")
	if want := map[bool]backend.SyncMode{true: backend.SyncFilesystem, false: backend.SyncFile}[supported]; err != nil || got != want {
		t.Fatalf(`pickSyncMode("") = %q, %v; want %q (syncfs supported: %v)`, got, err, want, supported)
	}
	if got, err := pickSyncMode(backend.SyncFile); err != nil || got != backend.SyncFile {
		t.Fatalf("pickSyncMode(file) = %q, %v", got, err)
	}
	if got, err := pickSyncMode(backend.SyncFilesystem); supported != (err == nil) || supported && got != backend.SyncFilesystem {
		t.Fatalf("pickSyncMode(filesystem) = %q, %v (syncfs supported: %v)", got, err, supported)
	}
	if _, err := pickSyncMode("always"); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("pickSyncMode(always): %v, want invalid", err)
	}
}
