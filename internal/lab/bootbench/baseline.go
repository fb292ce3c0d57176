package bootbench

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Baseline is the hand-built network boot: dnsmasq for DHCP, a static iPXE script and the
// ramdisk files served by a plain HTTP server.
type Baseline struct {
	Interface  string       // the bridge
	Subnet     netip.Prefix // e.g. 172.30.0.1/24 (the server's address and its subnet)
	Start, End netip.Addr   // DHCP range
	LeaseFile  string
	ScriptURL  string // http://172.30.0.1/boot.ipxe
}

// DnsmasqArgs is dnsmasq's command line for b, as a user writes it: DHCP only (no DNS), on the
// bridge, a range, and the usual iPXE chain: a client whose user class is "iPXE" gets the script
// URL as its boot file. (QEMU's NIC ROMs are iPXE already, so no TFTP stage is needed.) Pure.
func DnsmasqArgs(b Baseline) []string {
	return []string{
		"--keep-in-foreground", "--conf-file=/dev/null", "--log-facility=-",
		"--port=0", "--user=root", "--pid-file=",
		"--interface=" + b.Interface, "--bind-interfaces", "--except-interface=lo",
		"--dhcp-authoritative",
		"--dhcp-range=" + b.Start.String() + "," + b.End.String() + "," + netmask(b.Subnet.Bits()) + ",1h",
		"--dhcp-leasefile=" + b.LeaseFile,
		"--dhcp-userclass=set:ipxe,iPXE",
		"--dhcp-boot=tag:ipxe," + b.ScriptURL,
	}
}

func netmask(bits int) string {
	var m [4]byte
	for i := range bits {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(m).String()
}

// KernelLine finds the kernel line of a bcd boot script and returns its command line (what
// follows the kernel URL, without iPXE's "|| goto" tail). Pure.
func KernelLine(script string) (string, error) {
	for _, l := range strings.Split(script, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "kernel" {
			continue
		}
		f = f[1:]
		if len(f) >= 2 && f[0] == "--name" {
			f = f[2:]
		}
		if len(f) == 0 {
			return "", errors.New("kernel line without a URL")
		}
		args := f[1:]
		for i, a := range args {
			if a == "||" {
				args = args[:i]
				break
			}
		}
		return strings.Join(args, " "), nil
	}
	return "", errors.New("boot script has no kernel line")
}

// StaticScript is the iPXE script of the baseline: the kernel and initrd from base (a plain
// HTTP server's root) with cmdline, then boot. Pure.
func StaticScript(base, kernel, initrd, cmdline string) string {
	return fmt.Sprintf("#!ipxe\nkernel --name %s %s/%s %s\ninitrd --name %s %s/%s\nboot\n",
		kernel, base, kernel, cmdline, initrd, base, initrd)
}
