package fs

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// tryLock takes an exclusive flock(2) on d without waiting; ok is false
// when another open file holds one (in this process or another).
func tryLock(d *os.File) (ok bool, err error) {
	c, err := d.SyscallConn()
	if err != nil {
		return false, err
	}
	var lerr error
	if err := c.Control(func(fd uintptr) { lerr = unix.Flock(int(fd), unix.LOCK_EX|unix.LOCK_NB) }); err != nil {
		return false, err
	}
	if errors.Is(lerr, unix.EWOULDBLOCK) {
		return false, nil
	}
	if lerr != nil {
		return false, &os.PathError{Op: "flock", Path: d.Name(), Err: lerr}
	}
	return true, nil
}

// dirOp runs op with the descriptors of the directories from and to.
func dirOp(from, to *os.File, op func(fromFd, toFd int) error) error {
	fc, err := from.SyscallConn()
	if err != nil {
		return err
	}
	tc, err := to.SyscallConn()
	if err != nil {
		return err
	}
	var oerr error
	if err := fc.Control(func(ffd uintptr) {
		if err := tc.Control(func(tfd uintptr) { oerr = op(int(ffd), int(tfd)) }); err != nil {
			oerr = err
		}
	}); err != nil {
		return err
	}
	return oerr
}

// linkNoReplace hard-links fromName in the directory from at toName in
// the directory to; linked is false, with no error, when toName exists.
func linkNoReplace(from *os.File, fromName string, to *os.File, toName string) (linked bool, err error) {
	err = dirOp(from, to, func(ffd, tfd int) error { return unix.Linkat(ffd, fromName, tfd, toName, 0) })
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EEXIST):
		return false, nil
	}
	return false, &os.LinkError{Op: "linkat", Old: fromName, New: toName, Err: err}
}

// renameAt renames fromName in the directory from to toName in the
// directory to, replacing it.
func renameAt(from *os.File, fromName string, to *os.File, toName string) error {
	err := dirOp(from, to, func(ffd, tfd int) error { return unix.Renameat(ffd, fromName, tfd, toName) })
	if err != nil {
		return &os.LinkError{Op: "renameat", Old: fromName, New: toName, Err: err}
	}
	return nil
}
