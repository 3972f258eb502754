//go:build !linux

package fs

import "os"

// renameNoReplace reports that it linked nothing where renameat2(2) does
// not exist: Write then renames its file once it is durable.
func renameNoReplace(*os.File, string, string) (bool, error) { return false, nil }
