package minio

import "syscall"

// sysProcAttr makes the kernel kill MinIO if the test binary dies, so a
// crashed or killed test run leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
