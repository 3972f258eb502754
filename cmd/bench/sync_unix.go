//go:build unix

package main

import "syscall"

// syncAll writes every dirty page of the system back (sync(2)).
func syncAll() { syscall.Sync() }
