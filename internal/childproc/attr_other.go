//go:build !linux && !windows

package childproc

import "syscall"

// SysProcAttr puts a child in its own process group: a Ctrl-C in the
// terminal reaches only its parent, which stops it in order.
func SysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
