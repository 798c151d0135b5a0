package main

import "time"

// sleeper is how the open loop's pacer waits for the next due time.
type sleeper interface {
	sleep(d time.Duration)
	close()
}

// goSleeper sleeps with time.Sleep.
type goSleeper struct{}

func (goSleeper) sleep(d time.Duration) { time.Sleep(d) }
func (goSleeper) close()                {}
