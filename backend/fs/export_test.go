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
