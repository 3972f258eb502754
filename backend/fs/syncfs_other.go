//go:build !linux

package fs

import (
	"errors"
	"os"
)

var errNoSyncfs = errors.New("syncfs(2) is Linux only")

func syncfs(*os.File) error { return errNoSyncfs }

func syncfsSupported() error { return errNoSyncfs }
