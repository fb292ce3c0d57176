//go:build linux

package dhcp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"golang.org/x/sys/unix"
)

// TestProxyBesideDnsmasqInNetns: on a bridge the test creates, dnsmasq (Debian dnsmasq-base, in
// a namespace of its own) is the site's DHCP server and hands out the address; bcd in proxy mode
// answers the same PXE DISCOVER with the boot file only. A BIOS PXE client sees both offers:
// the address from dnsmasq, undionly.kpxe with our next-server from bcd, which never offers an
// address.
func TestProxyBesideDnsmasqInNetns(t *testing.T) {
	need(t, os.Geteuid() == 0, "root (network namespaces)")
	_, ipErr := exec.LookPath("ip")
	need(t, ipErr == nil, "the ip command (Debian iproute2)")
	dnsmasq, err := exec.LookPath("dnsmasq")
	need(t, err == nil, "dnsmasq (Debian dnsmasq-base)")

	nsM, nsD, nsC := fmt.Sprintf("bcd-pxm-%d", os.Getpid()), fmt.Sprintf("bcd-pxd-%d", os.Getpid()), fmt.Sprintf("bcd-pxc-%d", os.Getpid())
	for _, ns := range []string{nsM, nsD, nsC} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	// nsM: bridge br0 (bcd's proxy, 192.168.78.3) with two ports: d0, whose peer d1
	// (192.168.78.2, dnsmasq) lives in nsD, and c1, whose peer c0 (the client) lives in nsC. Each
	// party has its own namespace: a broadcast whose source is a local address is dropped.
	run(t, "ip", "-n", nsM, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0")
	run(t, "ip", "-n", nsM, "addr", "add", "192.168.78.3/24", "dev", "br0")
	run(t, "ip", "-n", nsM, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	run(t, "ip", "-n", nsM, "link", "set", "d1", "netns", nsD)
	run(t, "ip", "-n", nsM, "link", "add", "c0", "type", "veth", "peer", "name", "c1")
	run(t, "ip", "-n", nsM, "link", "set", "c0", "netns", nsC)
	run(t, "ip", "-n", nsC, "addr", "add", "192.168.78.200/24", "dev", "c0")
	// The client's chaddr is c0's own address: unicast replies must reach it.
	run(t, "ip", "-n", nsC, "link", "set", "c0", "address", "52:54:00:78:00:01")
	run(t, "ip", "-n", nsC, "link", "set", "c0", "up")
	for _, l := range []string{"d0", "c1"} {
		run(t, "ip", "-n", nsM, "link", "set", l, "master", "br0")
	}
	for _, l := range []string{"br0", "d0", "c1"} {
		run(t, "ip", "-n", nsM, "link", "set", l, "up")
	}
	run(t, "ip", "-n", nsD, "addr", "add", "192.168.78.2/24", "dev", "d1")
	run(t, "ip", "-n", nsD, "link", "set", "d1", "up")

	dir := t.TempDir()
	dm := exec.Command("ip", "netns", "exec", nsD, dnsmasq, "--no-daemon", "--port=0", "--interface=d1", "--bind-interfaces",
		"--dhcp-range=192.168.78.100,192.168.78.150,255.255.255.0,1h", "--dhcp-leasefile="+filepath.Join(dir, "leases"),
		"--no-ping", "--no-resolv", "--no-hosts", "--pid-file="+filepath.Join(dir, "dnsmasq.pid"), "--conf-file=/dev/null")
	logf, err := os.Create(filepath.Join(dir, "dnsmasq.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	dm.Stdout, dm.Stderr = logf, logf
	if err := dm.Start(); err != nil {
		t.Fatalf("starting dnsmasq: %v", err)
	}
	t.Cleanup(func() {
		_ = dm.Process.Signal(unix.SIGTERM)
		_ = dm.Wait()
	})

	var dhcpConn, pxeConn, client net.PacketConn
	if err := inNetns(nsM, func() error {
		var err error
		if dhcpConn, err = server4.NewIPv4UDPConn("br0", &net.UDPAddr{Port: dhcpv4.ServerPort}); err != nil {
			return err
		}
		pxeConn, err = server4.NewIPv4UDPConn("br0", &net.UDPAddr{Port: 4011})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := inNetns(nsC, func() error {
		var err error
		client, err = server4.NewIPv4UDPConn("c0", &net.UDPAddr{Port: dhcpv4.ClientPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	bound := make(chan Binding, 16)
	srv, err := New(context.Background(), Config{Mode: ModeProxy, Interface: "br0", ServerIP: netip.MustParseAddr("192.168.78.3"),
		HTTPBaseURL: "http://192.168.78.3:8080", Boot: Policy{EFIBinary: BinaryEFI}, Conn: dhcpConn, PXEConn: pxeConn,
		Observe: func(b Binding) { bound <- b }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	mac := net.HardwareAddr{0x52, 0x54, 0, 0x78, 0, 1}
	disc, err := dhcpv4.NewDiscovery(mac, append(biosPXE.mods(), dhcpv4.WithBroadcast(true))...)
	if err != nil {
		t.Fatal(err)
	}
	var fromDnsmasq, fromProxy *dhcpv4.DHCPv4
	deadline := time.Now().Add(20 * time.Second)
	buf := make([]byte, 1500)
	for (fromDnsmasq == nil || fromProxy == nil) && time.Now().Before(deadline) {
		// Resent every 2 s, as PXE ROMs do: dnsmasq may not listen yet on the first.
		if _, err := client.WriteTo(disc.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}); err != nil {
			t.Fatalf("sending DISCOVER: %v", err)
		}
		_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			n, _, err := client.ReadFrom(buf)
			if err != nil {
				break
			}
			m, err := dhcpv4.FromBytes(buf[:n])
			if err != nil || m.TransactionID != disc.TransactionID || m.MessageType() != dhcpv4.MessageTypeOffer {
				continue
			}
			switch m.ServerIdentifier().String() {
			case "192.168.78.2":
				fromDnsmasq = m
			case "192.168.78.3":
				fromProxy = m
			}
		}
	}
	if fromDnsmasq == nil || fromProxy == nil {
		log, _ := os.ReadFile(logf.Name())
		t.Fatalf("offers: dnsmasq %v, bcd proxy %v (dnsmasq log:\n%s)", fromDnsmasq != nil, fromProxy != nil, log)
	}
	if ip := fromDnsmasq.YourIPAddr.To4(); ip == nil || ip[2] != 78 || ip[3] < 100 || ip[3] > 150 {
		t.Errorf("dnsmasq offered %v, want an address of its range", fromDnsmasq.YourIPAddr)
	}
	if !fromProxy.YourIPAddr.IsUnspecified() {
		t.Errorf("the proxy offered an address (%v): it must only add boot information", fromProxy.YourIPAddr)
	}
	if fromProxy.BootFileName != "undionly.kpxe" || fromProxy.ServerIPAddr.String() != "192.168.78.3" {
		t.Errorf("proxy offer: boot file %q next-server %v, want undionly.kpxe from 192.168.78.3", fromProxy.BootFileName, fromProxy.ServerIPAddr)
	}
	if got := string(fromProxy.GetOneOption(dhcpv4.OptionClassIdentifier)); got != "PXEClient" {
		t.Errorf("proxy offer's vendor class %q, want PXEClient", got)
	}

	// The client takes dnsmasq's offer: the proxy sees the broadcast REQUEST and learns the
	// binding; dnsmasq acknowledges.
	req, err := dhcpv4.NewRequestFromOffer(fromDnsmasq, dhcpv4.WithBroadcast(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.WriteTo(req.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}); err != nil {
		t.Fatalf("sending REQUEST: %v", err)
	}
	select {
	case b := <-bound:
		if b.MAC.String() != mac.String() || b.IP.String() != fromDnsmasq.YourIPAddr.String() || !b.Expires.IsZero() {
			t.Errorf("the proxy learned %+v, want %s at %s", b, mac, fromDnsmasq.YourIPAddr)
		}
	case <-time.After(10 * time.Second):
		t.Error("the proxy did not learn the address the client requested from dnsmasq")
	}
	var ack *dhcpv4.DHCPv4
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	for ack == nil {
		n, _, err := client.ReadFrom(buf)
		if err != nil {
			break
		}
		if m, err := dhcpv4.FromBytes(buf[:n]); err == nil && m.TransactionID == req.TransactionID && m.MessageType() == dhcpv4.MessageTypeAck {
			ack = m
		}
	}
	if ack == nil || !ack.YourIPAddr.Equal(fromDnsmasq.YourIPAddr) {
		t.Errorf("dnsmasq's answer to the REQUEST: %v", ack)
	}
}
