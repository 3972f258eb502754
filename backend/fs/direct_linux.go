package fs

import (
	"os"

	"golang.org/x/sys/unix"
)

// oDirect is the open flag of a write past the page cache.
const oDirect = unix.O_DIRECT

// setDirect turns O_DIRECT on or off for f.
func setDirect(f *os.File, on bool) error {
	c, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := c.Control(func(fd uintptr) {
		var flags int
		if flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0); ferr != nil {
			return
		}
		if on {
			flags |= unix.O_DIRECT
		} else {
			flags &^= unix.O_DIRECT
		}
		_, ferr = unix.FcntlInt(fd, unix.F_SETFL, flags)
	}); err != nil {
		return err
	}
	return ferr
}
