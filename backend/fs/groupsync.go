package fs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/blobplane/blobplane/backend"
)

// groupSyncer makes the objects of concurrent writes durable together
// (backend.SyncFilesystem): a writer whose object is written and linked
// calls Sync, which returns once a syncfs(2) of the backend's filesystem
// that started after the call has returned. One syncfs runs at a time;
// the writers that arrive while it runs share the next one. So N
// concurrent writes cost one device flush (and one round of writeback)
// instead of 2N fsyncs, each a flush of its own (docs/performance.md,
// item 25).
//
// A syncfs reports the writeback errors of the whole filesystem since the
// previous one on the same descriptor (Linux 5.8 and later), not those of
// one file. An error may so be reported to the group before the one whose
// file it hit; hence the first error is sticky: that group and every later
// Sync fail with it, and Write goes back to fsyncing each file, whose own
// fsync reports the errors of that file.
type groupSyncer struct {
	sync func() error // one syncfs of the filesystem

	mu        sync.Mutex
	cond      sync.Cond
	started   uint64 // syncs started
	completed uint64 // syncs returned (they run one at a time)
	running   bool
	waiting   int   // callers waiting in Sync (tests)
	err       error // the first failed sync's error, sticky
}

func newGroupSyncer(sync func() error) *groupSyncer {
	g := &groupSyncer{sync: sync}
	g.cond.L = &g.mu
	return g
}

// Sync returns when everything written to the filesystem before the call
// is durable: a sync that started after the call returned. Its error is
// the sync's, or the sticky error of an earlier failed one.
func (g *groupSyncer) Sync() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	need := g.started + 1 // a sync running now may have started before our writes
	g.waiting++
	defer func() { g.waiting-- }()
	for g.err == nil && g.completed < need {
		if g.running {
			g.cond.Wait()
			continue
		}
		g.running = true
		g.started++
		g.mu.Unlock()
		err := g.sync()
		g.mu.Lock()
		g.running = false
		g.completed++
		if err != nil && g.err == nil {
			g.err = fmt.Errorf("syncfs: %w (later writes fsync each file)", err)
		}
		g.cond.Broadcast()
	}
	return g.err
}

// failed returns the sticky error, nil while every sync succeeded.
func (g *groupSyncer) failed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// waiters reports how many callers are in Sync (tests).
func (g *groupSyncer) waiters() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// syncs reports how many syncs have started (tests).
func (g *groupSyncer) syncs() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started
}

// pickSyncMode resolves the configured mode against what this system
// supports: "" is SyncFilesystem where syncfs reports writeback errors,
// SyncFile elsewhere; SyncFilesystem asked for where it does not is an
// error.
func pickSyncMode(mode backend.SyncMode) (backend.SyncMode, error) {
	err := syncfsSupported()
	switch mode {
	case "":
		if err != nil {
			return backend.SyncFile, nil
		}
		return backend.SyncFilesystem, nil
	case backend.SyncFile:
		return mode, nil
	case backend.SyncFilesystem:
		if err != nil {
			return "", backend.Invalid("fs.Open", "sync=filesystem: %v; use sync=file", err)
		}
		return mode, nil
	}
	return "", backend.Invalid("fs.Open", "sync %q: want file or filesystem", mode)
}

// kernelAtLeast reports whether a Linux release string (uname -r, e.g.
// "6.18.44-fc-v669") is at least major.minor.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err := strconv.Atoi(parts[0])
	if err != nil {
		return false
	}
	digits := parts[1]
	if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = digits[:i]
	}
	mnr, err := strconv.Atoi(digits)
	if err != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// openSyncfs returns the syncfs of the filesystem holding root's
// directory, on a descriptor of its own kept open (its error cursor is
// what reports writeback errors), and a func closing it.
func openSyncfs(root *os.Root, hook func() error) (func() error, func() error, error) {
	d, err := root.Open(".")
	if err != nil {
		return nil, nil, err
	}
	return func() error {
		if hook != nil {
			if err := hook(); err != nil {
				return err
			}
		}
		return syncfs(d)
	}, d.Close, nil
}
