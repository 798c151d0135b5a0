package redistest

import "syscall"

// sysProcAttr has the kernel kill a redis-server when the test binary
// dies without running its cleanups (a panic, a -timeout), so no server
// outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
