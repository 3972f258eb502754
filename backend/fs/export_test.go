package fs

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
