//go:build !linux

package main

// newSleeper returns time.Sleep where no finer sleep is at hand.
func newSleeper() sleeper { return goSleeper{} }
