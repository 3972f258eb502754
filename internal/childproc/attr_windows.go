package childproc

import "syscall"

// SysProcAttr starts a child in a new process group, so a Ctrl-C in the
// console reaches only its parent, which stops it in order.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: syscall.CREATE_NEW_PROCESS_GROUP}
}
