package s3

// SetCopyLimits shrinks the server-side copy limits so tests exercise the
// part-by-part copy without 5 GiB objects.
func SetCopyLimits(b *Backend, limit, part int64) { b.copyLimit, b.copyPartSize = limit, part }

// Client exposes the SDK client for assertions on raw bucket state.
func (b *Backend) Client() any { return b.client }
