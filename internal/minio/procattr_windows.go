package minio

import "syscall"

// sysProcAttr starts the server in a new process group, away from the
// console's Ctrl-C.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: syscall.CREATE_NEW_PROCESS_GROUP}
}
