package main

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// timerfdSleeper sleeps on a timerfd read through Go's netpoller. Go's own
// timers wake an otherwise idle process up to a millisecond late (the
// netpoller's epoll_wait takes whole milliseconds), which the open loop
// would report as latency; a timerfd becomes readable on time, waking
// epoll_wait at once, and the waiting goroutine holds no thread.
type timerfdSleeper struct {
	fd int
	f  *os.File
}

// newSleeper returns the pacer's sleeper: a timerfd, or time.Sleep when
// the kernel offers none.
func newSleeper() sleeper {
	const clockMonotonic = 1
	fd, _, errno := syscall.RawSyscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return goSleeper{}
	}
	// A non-blocking descriptor: os.File reads it through the netpoller.
	return &timerfdSleeper{fd: int(fd), f: os.NewFile(fd, "timerfd")}
}

// itimerspec is struct itimerspec of timerfd_settime(2).
type itimerspec struct {
	interval syscall.Timespec
	value    syscall.Timespec
}

func (s *timerfdSleeper) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	spec := itimerspec{value: syscall.NsecToTimespec(int64(d))}
	_, _, errno := syscall.RawSyscall6(syscall.SYS_TIMERFD_SETTIME, uintptr(s.fd), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	if errno != 0 {
		time.Sleep(d)
		return
	}
	var expirations [8]byte
	if _, err := s.f.Read(expirations[:]); err != nil {
		time.Sleep(d)
	}
}

func (s *timerfdSleeper) close() { s.f.Close() }

// childAttr has the kernel kill a process the load test starts should
// the load test die without stopping it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
