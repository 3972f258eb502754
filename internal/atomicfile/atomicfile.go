// Package atomicfile creates small private files (secrets, keys) whole or
// not at all, and never over one that exists.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Create makes path hold data with mode 0600: a temp file in the same
// directory is written and synced, then linked to path — which, unlike a
// rename, never replaces a file another process created meanwhile
// (os.ErrExist then: read that one instead) — and the directory synced.
// No reader ever sees path short.
func Create(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
