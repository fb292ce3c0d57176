//go:build linux

package inband

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DevicePaths are where the kernel's ipmi_devintf puts the first interface.
var devicePaths = []string{"/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0"}

// The kernel's IPMI user interface (include/uapi/linux/ipmi.h).
const (
	ipmiSystemInterfaceAddrType = 0x0c
	ipmiBMCChannel              = 0x0f
	ipmiResponseRecvType        = 1
)

type sysIfAddr struct {
	AddrType int32
	Channel  int16
	LUN      uint8
	_        uint8
}

type ipmiMsg struct {
	NetFn   uint8
	Cmd     uint8
	DataLen uint16
	Data    *byte
}

type ipmiReq struct {
	Addr    *byte
	AddrLen uint32
	MsgID   int
	Msg     ipmiMsg
}

type ipmiRecv struct {
	RecvType int32
	Addr     *byte
	AddrLen  uint32
	MsgID    int
	Msg      ipmiMsg
}

// ioctl numbers: _IOR('i', 13, struct ipmi_req) and _IOWR('i', 11, struct ipmi_recv).
func ioc(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | uintptr('i')<<8 | nr }

var (
	ipmictlSendCommand     = ioc(2, 13, unsafe.Sizeof(ipmiReq{}))
	ipmictlReceiveMsgTrunc = ioc(3, 11, unsafe.Sizeof(ipmiRecv{}))
)

// Device is the host's IPMI system interface (/dev/ipmi0). One exchange at a time.
type Device struct {
	f       *os.File
	msgID   int
	Timeout time.Duration // per exchange; 0: 5 s
}

// OpenDevice opens the first IPMI device the kernel made (ipmi_si and ipmi_devintf loaded).
func OpenDevice() (*Device, error) {
	var errs []error
	for _, p := range devicePaths {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			return &Device{f: f}, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("opening the host's IPMI interface (is there a BMC with a KCS/BT/SSIF interface, and are ipmi_si and ipmi_devintf loaded?): %w", errors.Join(errs...))
}

// Close closes the device.
func (d *Device) Close() error { return d.f.Close() }

// Exchange sends one request to the BMC and waits for its response.
func (d *Device) Exchange(ctx context.Context, netFn, cmd byte, data []byte) (byte, []byte, error) {
	d.msgID++
	addr := sysIfAddr{AddrType: ipmiSystemInterfaceAddrType, Channel: ipmiBMCChannel}
	req := ipmiReq{Addr: (*byte)(unsafe.Pointer(&addr)), AddrLen: uint32(unsafe.Sizeof(addr)), MsgID: d.msgID,
		Msg: ipmiMsg{NetFn: netFn, Cmd: cmd, DataLen: uint16(len(data))}}
	if len(data) > 0 {
		req.Msg.Data = &data[0]
	}
	fd := int(d.f.Fd())
	err := ioctl(fd, ipmictlSendCommand, unsafe.Pointer(&req))
	runtime.KeepAlive(&addr)
	runtime.KeepAlive(data)
	if err != nil {
		return 0, nil, fmt.Errorf("sending netfn %#02x cmd %#02x: %w", netFn, cmd, err)
	}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	buf := make([]byte, 1024)
	for {
		wait := time.Until(deadline)
		if wait <= 0 {
			return 0, nil, fmt.Errorf("netfn %#02x cmd %#02x: no response from the BMC within %s", netFn, cmd, timeout)
		}
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(min(wait, 200*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return 0, nil, fmt.Errorf("waiting for the response to netfn %#02x cmd %#02x: %w", netFn, cmd, err)
		}
		if n == 0 {
			continue
		}
		var raddr sysIfAddr
		recv := ipmiRecv{Addr: (*byte)(unsafe.Pointer(&raddr)), AddrLen: uint32(unsafe.Sizeof(raddr)),
			Msg: ipmiMsg{Data: &buf[0], DataLen: uint16(len(buf))}}
		err = ioctl(fd, ipmictlReceiveMsgTrunc, unsafe.Pointer(&recv))
		runtime.KeepAlive(&raddr)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			return 0, nil, fmt.Errorf("receiving the response to netfn %#02x cmd %#02x: %w", netFn, cmd, err)
		}
		if recv.RecvType != ipmiResponseRecvType || recv.MsgID != d.msgID {
			continue // an event or a stale response
		}
		return DecodeResponse(buf[:recv.Msg.DataLen])
	}
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}
