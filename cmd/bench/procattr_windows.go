package main

import "syscall"

// sysProcAttr starts a server in a new process group, so a Ctrl-C in the
// console reaches only the bench, which stops its servers in order.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: syscall.CREATE_NEW_PROCESS_GROUP}
}
