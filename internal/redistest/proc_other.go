//go:build !linux

package redistest

import (
	"os"
	"syscall"
)

// freezeSignals returns nil: Node.Freeze and Node.Thaw skip their test.
func freezeSignals() (stop, cont os.Signal) { return nil, nil }

// sysProcAttr is empty where the kernel cannot kill a child with its
// parent: a test binary that dies without cleanups may leave servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }
