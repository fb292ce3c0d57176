//go:build !linux

package store

import "time"

// threadCPU is the CPU time the calling OS thread has used: not read on this platform.
func threadCPU() (time.Duration, bool) { return 0, false }
