package fs

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// renameNoReplace renames from to to, both names in the directory d, only
// if to does not exist (renameat2(2) RENAME_NOREPLACE). linked is false,
// with no error, when to exists or the filesystem cannot decide it
// atomically (EINVAL); the caller then renames the way it would without
// this call.
func renameNoReplace(d *os.File, from, to string) (linked bool, err error) {
	c, err := d.SyscallConn()
	if err != nil {
		return false, err
	}
	var rerr error
	if err := c.Control(func(fd uintptr) {
		rerr = unix.Renameat2(int(fd), from, int(fd), to, unix.RENAME_NOREPLACE)
	}); err != nil {
		return false, err
	}
	switch {
	case rerr == nil:
		return true, nil
	case errors.Is(rerr, unix.EEXIST), errors.Is(rerr, unix.EINVAL), errors.Is(rerr, unix.ENOSYS), errors.Is(rerr, unix.EOPNOTSUPP):
		return false, nil
	}
	return false, &os.LinkError{Op: "renameat2", Old: from, New: to, Err: rerr}
}
