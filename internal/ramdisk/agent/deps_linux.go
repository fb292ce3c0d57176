package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"bcd/internal/ramdisk/diag"
	"bcd/internal/ramdisk/image"
	"bcd/internal/ramdisk/inband"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/kexec"
	"bcd/internal/ramdisk/wipe"

	"golang.org/x/sys/unix"
)

// Directories the ramdisk's commands use (the initramfs root is writable RAM).
const (
	kexecMountDir = "/run/bcd/kexec"
	imageTempDir  = "/run/bcd/image"
)

// LinuxDeps are the real side effects: sysfs inventory, block devices opened O_EXCL,
// kexec_file_load and reboot, dcgmi on PATH.
func LinuxDeps(log *slog.Logger) Deps {
	return Deps{
		Log: log,
		Inventory: func(ctx context.Context) (inventory.Inventory, error) {
			return inventory.Collect(ctx, inventory.Roots{}, inventory.Options{NICFirmware: inventory.EthtoolFirmware})
		},
		Wipe: wipe.LinuxOpener{},
		OpenTarget: func(_ context.Context, path string) (ImageTarget, error) {
			// Buffered writes: the image pipeline's buffers are not aligned for O_DIRECT.
			return wipe.Open(path, wipe.OpenOptions{NoDirect: true})
		},
		OpenDisk: func(_ context.Context, path string) (DiskDevice, error) {
			return wipe.Open(path, wipe.OpenOptions{NoDirect: true})
		},
		Image:       image.Options{TempDir: imageTempDir},
		KexecConfig: kexec.Config{MountDir: kexecMountDir},
		Mounter:     kexec.SyscallMounter{},
		Kexec:       kexec.SyscallKexec{},
		Rebooter:    kexec.SyscallRebooter{},
		Diag:        diag.ExecRunner{},
		PowerOff:    SyscallPowerOff{},
		IPMI: func(context.Context) (inband.Transport, io.Closer, error) {
			d, err := inband.OpenDevice()
			if err != nil {
				return nil, nil, err
			}
			return d, d, nil
		},
	}
}

// SyscallPowerOff powers the machine off: sync, then reboot(LINUX_REBOOT_CMD_POWER_OFF).
type SyscallPowerOff struct{}

// PowerOff implements PowerOffer.
func (SyscallPowerOff) PowerOff(context.Context) error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		return fmt.Errorf("reboot(POWER_OFF): %w", err)
	}
	return nil
}
