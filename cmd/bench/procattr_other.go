//go:build !linux && !windows

package main

import "syscall"

// sysProcAttr puts a server in its own process group; a Ctrl-C in the
// terminal reaches only the bench, which stops its servers in order.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
