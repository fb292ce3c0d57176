package inventory

import "golang.org/x/sys/unix"

// EthtoolFirmware is a NIC's firmware version as `ethtool -i NAME` prints it (the driver's
// ETHTOOL_GDRVINFO answer), for Options.NICFirmware: "" when the driver reports none ("N/A" is
// what some drivers say for none) or the ioctl fails.
func EthtoolFirmware(name string) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, name)
	if err != nil {
		return ""
	}
	return firmwareVersion(info.Fw_version[:])
}
