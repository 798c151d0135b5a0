package redistest

import (
	"os"
	"syscall"
)

// freezeSignals returns the signals that stop and resume a node
// (Node.Freeze, Node.Thaw).
func freezeSignals() (stop, cont os.Signal) { return syscall.SIGSTOP, syscall.SIGCONT }

// sysProcAttr has the kernel kill a redis-server when the test binary
// dies without running its cleanups (a panic, a -timeout), so no server
// outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
