//go:build !linux

package redistest

import "syscall"

// sysProcAttr is empty where the kernel cannot kill a child with its
// parent: a test binary that dies without cleanups may leave servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }
