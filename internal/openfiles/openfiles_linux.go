//go:build linux

package openfiles

import "syscall"

func get() (Limit, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return Limit{}, err
	}
	return Limit{Soft: r.Cur, Hard: r.Max}, nil
}

func set(l Limit) error {
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: l.Soft, Max: l.Hard})
}
