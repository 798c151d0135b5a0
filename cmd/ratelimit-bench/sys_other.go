//go:build !linux

package main

import "syscall"

// newSleeper returns time.Sleep where no finer sleep is at hand.
func newSleeper() sleeper { return goSleeper{} }

// childAttr is nil where the kernel cannot kill orphans for us.
func childAttr() *syscall.SysProcAttr { return nil }
