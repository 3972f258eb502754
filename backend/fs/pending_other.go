//go:build !linux

package fs

import (
	"errors"
	"os"
)

// Pending writes need the group sync, which is Linux only (syncfs.go):
// elsewhere no process makes a pending directory, and none is recovered.

func tryLock(*os.File) (bool, error) { return false, nil }

func linkNoReplace(*os.File, string, *os.File, string) (bool, error) {
	return false, errors.ErrUnsupported
}

func renameAt(*os.File, string, *os.File, string) error { return errors.ErrUnsupported }
