package fs

import (
	"errors"
	iofs "io/fs"
	"os"
	"sync"
	"syscall"
)

// os.Root reports a name that resolves outside the root (a ".." past the
// top, an absolute path, or a symlink planted in the tree pointing out) with
// an unexported sentinel, errPathEscapes, wrapped in an *os.PathError or
// *os.LinkError. The os package exports neither the sentinel nor a predicate
// for it (Go 1.26), and validating names up front cannot help: every name
// this backend passes is already derived from a validated digest or upload
// id, and the escapes that remain come from symlinks only the kernel sees
// while resolving.
//
// So instead of matching the error's text, the backend learns the sentinel's
// identity once from a root it has just opened: Lstat("..") is refused
// lexically, before any system call on the name, with that very value.
// classify then compares by identity through errors.Is, which survives a
// rewording of the message and any wrapping os adds. If a future Go changes
// how the probe fails (no *os.PathError, or an errno or fs.Err* value that
// would match unrelated failures), nothing is learned and escapes fall back
// to the generic classification; TestPathTraversal then fails loudly.
var (
	escapeOnce sync.Once
	errEscapes error // os's errPathEscapes, once learned
)

// learnEscapeError records the error root returns for a name escaping it.
// root must be open.
func learnEscapeError(root *os.Root) {
	escapeOnce.Do(func() {
		_, err := root.Lstat("..")
		var pe *iofs.PathError
		if !errors.As(err, &pe) || pe.Err == nil {
			return
		}
		var errno syscall.Errno
		if errors.As(pe.Err, &errno) {
			return
		}
		for _, generic := range []error{iofs.ErrNotExist, iofs.ErrExist, iofs.ErrPermission, iofs.ErrInvalid, iofs.ErrClosed} {
			if errors.Is(pe.Err, generic) {
				return
			}
		}
		errEscapes = pe.Err
	})
}

// escapesRoot reports whether err is os.Root refusing a path that leaves
// the root.
func escapesRoot(err error) bool {
	return errEscapes != nil && errors.Is(err, errEscapes)
}
