package fs

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// syncfs is syncfs(2) of the filesystem holding f.
func syncfs(f *os.File) error {
	c, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := c.Control(func(fd uintptr) { serr = unix.Syncfs(int(fd)) }); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "syncfs", Path: f.Name(), Err: serr}
	}
	return nil
}

// syncfsSupported reports why syncfs cannot stand in for per-file fsyncs
// here, or nil: before Linux 5.8 it did not report writeback errors.
func syncfsSupported() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	release := unix.ByteSliceToString(u.Release[:])
	if !kernelAtLeast(release, 5, 8) {
		return fmt.Errorf("kernel %s: syncfs reports writeback errors from Linux 5.8 on", release)
	}
	return nil
}
