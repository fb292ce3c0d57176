package initsys

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Linux is the real System: syscalls on the running kernel. Only PID 1 of the ramdisk uses it.
type Linux struct{}

var _ System = Linux{}

// Mount creates the mount point and mounts; EBUSY (already mounted) is success.
func (Linux) Mount(m Mount) error {
	if err := os.MkdirAll(m.Target, m.Perm); err != nil {
		return fmt.Errorf("creating mount point: %w", err)
	}
	err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data)
	if errors.Is(err, unix.EBUSY) {
		return nil
	}
	return err
}

// LoadModule loads a module file with finit_module and its parameters; a module already
// loaded is success.
func (Linux) LoadModule(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), params, 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("finit_module: %w", err)
	}
	return nil
}

// Console opens /dev/console and makes it fds 0, 1 and 2.
func (Linux) Console() (io.Writer, error) {
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	for _, std := range []int{0, 1, 2} {
		if err := unix.Dup3(fd, std, 0); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("dup onto fd %d: %w", std, err)
		}
	}
	unix.Close(fd)
	return os.Stdout, nil
}

// SetHostname sets the kernel's host name.
func (Linux) SetHostname(name string) error { return unix.Sethostname([]byte(name)) }

// LinkUp sets IFF_UP on an interface.
func (Linux) LinkUp(name string) error { return SetLinkUp(name) }

// SetLinkUp sets IFF_UP on an interface through SIOCSIFFLAGS.
func SetLinkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading flags of %s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

// KernelRelease is uname -r.
func (Linux) KernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// ReadFile reads a file.
func (Linux) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// PowerOff syncs and powers off or reboots.
func (Linux) PowerOff(reboot bool) error {
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if reboot {
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	return unix.Reboot(cmd)
}
