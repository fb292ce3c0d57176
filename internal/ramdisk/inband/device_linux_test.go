//go:build linux && amd64

package inband

import "testing"

// The ioctl numbers of include/uapi/linux/ipmi.h on x86-64 (as ipmitool and OpenIPMI use them).
func TestIoctlNumbers(t *testing.T) {
	if ipmictlSendCommand != 0x8028690d {
		t.Errorf("IPMICTL_SEND_COMMAND = %#x, want 0x8028690d", ipmictlSendCommand)
	}
	if ipmictlReceiveMsgTrunc != 0xc030690b {
		t.Errorf("IPMICTL_RECEIVE_MSG_TRUNC = %#x, want 0xc030690b", ipmictlReceiveMsgTrunc)
	}
}
