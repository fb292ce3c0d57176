package agent

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"bcd/internal/ramdisk/initsys"
)

// LinuxNet configures interfaces on the running kernel: IFF_UP by ioctl, addresses and routes
// by rtnetlink, carrier from sysfs.
type LinuxNet struct{}

// Interfaces lists the interfaces with a hardware address (not lo).
func (LinuxNet) Interfaces() ([]NIC, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []NIC
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || len(i.HardwareAddr) != 6 {
			continue
		}
		out = append(out, NIC{Name: i.Name, Index: i.Index, MAC: i.HardwareAddr})
	}
	return out, nil
}

// LinkUp sets the interface up.
func (LinuxNet) LinkUp(name string) error { return initsys.SetLinkUp(name) }

// Carrier reads /sys/class/net/<name>/carrier.
func (LinuxNet) Carrier(name string) (bool, error) {
	b, err := os.ReadFile("/sys/class/net/" + name + "/carrier")
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// AddAddress adds (or replaces) an IPv4 address on the interface.
func (LinuxNet) AddAddress(index int, p netip.Prefix) error {
	ip := p.Addr().As4()
	msg := unix.IfAddrmsg{Family: unix.AF_INET, Prefixlen: uint8(p.Bits()), Scope: unix.RT_SCOPE_UNIVERSE, Index: uint32(index)}
	body := structBytes(&msg)
	body = appendAttr(body, unix.IFA_LOCAL, ip[:])
	body = appendAttr(body, unix.IFA_ADDRESS, ip[:])
	if p.Bits() < 31 {
		bc := broadcast(p)
		body = appendAttr(body, unix.IFA_BROADCAST, bc[:])
	}
	if err := rtnetlink(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, body); err != nil {
		return fmt.Errorf("adding address %s: %w", p, err)
	}
	return nil
}

// AddDefaultRoute adds (or replaces) the IPv4 default route via gw on the interface.
func (LinuxNet) AddDefaultRoute(index int, gw netip.Addr) error {
	g := gw.As4()
	msg := unix.RtMsg{Family: unix.AF_INET, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_DHCP,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST}
	body := structBytes(&msg)
	body = appendAttr(body, unix.RTA_GATEWAY, g[:])
	body = appendAttr(body, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index)))
	if err := rtnetlink(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, body); err != nil {
		return fmt.Errorf("adding default route via %s: %w", gw, err)
	}
	return nil
}

func broadcast(p netip.Prefix) [4]byte {
	a := p.Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	var out [4]byte
	binary.BigEndian.PutUint32(out[:], v)
	return out
}

func structBytes[T any](v *T) []byte {
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))...)
}

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// rtnetlink sends one request and waits for its acknowledgement.
func rtnetlink(typ, flags uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	const seq = 1
	hdr := unix.NlMsghdr{Len: uint32(unix.SizeofNlMsghdr + len(body)), Type: typ,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK | flags, Seq: seq}
	msg := append(structBytes(&hdr), body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("netlink parse: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return fmt.Errorf("netlink: short error message")
			}
			if errno := int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
				return unix.Errno(-errno)
			}
			return nil
		}
	}
}
