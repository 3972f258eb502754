package childproc

import "syscall"

// SysProcAttr puts a child in its own process group (a Ctrl-C in the
// terminal reaches only its parent, which stops it in order) and has the
// kernel kill it if the parent dies without stopping it, so a crashed or
// killed run leaves no server behind.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
