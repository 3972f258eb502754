package main

import "syscall"

// sysProcAttr puts a server in its own process group (a Ctrl-C in the
// terminal reaches only the bench, which stops its servers in order) and
// has the kernel kill it if the bench dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
