package fs

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback starts writing out f's dirty pages in [off, off+n)
// without waiting for them (sync_file_range(2) SYNC_FILE_RANGE_WRITE).
// Advisory: an error changes nothing the fsync will not do anyway.
func startWriteback(f *os.File, off, n int64) {
	c, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = c.Control(func(fd uintptr) {
		_ = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}
