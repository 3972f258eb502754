package fs

import "time"

// SetSyncHook makes b call hook before every directory fsync with the
// directory's path relative to the root; an error from hook fails the sync.
func SetSyncHook(b *Backend, hook func(dir string) error) { b.syncHook = hook }

// SetObjectSyncHook makes b call hook before the fsync of each new object
// file, with the file's temp path relative to the root; an error from
// hook fails the sync.
func SetObjectSyncHook(b *Backend, hook func(name string) error) { b.objectSyncHook = hook }

// SetSyncBeforeLink makes every write of b wait for its file's fsync
// before the rename (the path of a name found taken), to measure against.
func SetSyncBeforeLink(b *Backend, on bool) { b.syncBeforeLink = on }

// SetGroupSyncHook makes b call hook before every syncfs of its group
// sync (backend.SyncFilesystem); an error from hook fails the sync.
func SetGroupSyncHook(b *Backend, hook func() error) { b.groupSyncHook = hook }

// GroupSyncs reports how many group syncs b has started.
func GroupSyncs(b *Backend) uint64 {
	if b.group == nil {
		return 0
	}
	return b.group.syncs()
}

// GroupMax is the largest write the group sync makes durable.
const GroupMax = groupMax

// SetDirectMin makes every write of b of at least n content bytes go past
// the page cache (O_DIRECT); a negative n turns that off.
func SetDirectMin(b *Backend, n int64) {
	if n < 0 {
		n = never
	}
	b.directMin = n
}

// DirectBufSize is the size of each aligned buffer of a direct write.
const DirectBufSize = directBufSize

// SetDirectHook makes b call hook before each write past the page cache,
// with its file offset; an error from hook is taken as the write's.
func SetDirectHook(b *Backend, hook func(off int64) error) { b.directHook = hook }

// SetSettleMax sets how long a pending name waits for a writer's group
// sync before the settler runs one of its own.
func SetSettleMax(b *Backend, d time.Duration) { b.settleMax = d }

// Settle removes the pending names a completed group sync covers, after
// running one when force is set, and returns how many remain.
func Settle(b *Backend, force bool) int { return b.settle(force) }

// PendingDir returns b's pending directory relative to its root, "" when
// it has none.
func PendingDir(b *Backend) string {
	if b.pending == nil {
		return ""
	}
	return "pending/" + b.pending.id
}

// Crash drops b as a killed process would: no settling, every
// descriptor closed (its lock with them), its files left as they are.
func Crash(b *Backend) {
	if p := b.pending; p != nil {
		close(p.stop)
		<-p.done
		_ = p.root.Close()
		_ = p.dir.Close()
		b.pending = nil
	}
	_ = b.Close()
}

// SetPending turns b's pending writes (pending.go) off or back on; off,
// small writes in backend.SyncFilesystem are linked first and synced
// after, to measure against.
func SetPending(b *Backend, on bool) { b.noPending = !on }
