//go:build linux

package lab

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"bcd/internal/bmc"
	bmcipmi "bcd/internal/bmc/ipmi"
	bmcredfish "bcd/internal/bmc/redfish"
	"bcd/internal/dhcp"
	"bcd/internal/netboot"
	"bcd/internal/tftp"
)

// firstSeen records, per MAC, the first time an event was seen; waiters get a channel.
type firstSeen struct {
	mu    sync.Mutex
	at    map[string]time.Time
	extra map[string]string
	ch    map[string]chan struct{}
}

func newFirstSeen() *firstSeen {
	return &firstSeen{at: map[string]time.Time{}, extra: map[string]string{}, ch: map[string]chan struct{}{}}
}

func (f *firstSeen) waiter(mac string) chan struct{} {
	c, ok := f.ch[mac]
	if !ok {
		c = make(chan struct{})
		f.ch[mac] = c
	}
	return c
}

func (f *firstSeen) see(mac string, at time.Time, extra string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, seen := f.at[mac]; seen {
		return
	}
	f.at[mac], f.extra[mac] = at, extra
	close(f.waiter(mac))
}

// wait returns when mac was seen (its time and extra) or ctx ends.
func (f *firstSeen) wait(ctx context.Context, mac string) (time.Time, string, error) {
	f.mu.Lock()
	c := f.waiter(mac)
	f.mu.Unlock()
	select {
	case <-c:
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.at[mac], f.extra[mac], nil
	case <-ctx.Done():
		return time.Time{}, "", ctx.Err()
	}
}

// discoverConn notes every DHCPDISCOVER read by the DHCP server.
type discoverConn struct {
	net.PacketConn
	seen *firstSeen
}

func (c discoverConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := c.PacketConn.ReadFrom(b)
	if err == nil {
		if m, perr := dhcpv4.FromBytes(b[:n]); perr == nil && m.MessageType() == dhcpv4.MessageTypeDiscover {
			c.seen.see(m.ClientHWAddr.String(), time.Now(), "arch="+archOf(m)+" userclass="+strings.Join(m.UserClass(), ","))
		}
	}
	return n, a, err
}

func archOf(m *dhcpv4.DHCPv4) string {
	var s []string
	for _, a := range m.ClientArch() {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

type recorder struct{ seen *firstSeen }

func (r recorder) RecordDiscovery(_ context.Context, d netboot.Discovery) error {
	r.seen.see(d.MAC.String(), d.Time, "arch="+d.Arch+" uuid="+d.UUID)
	return nil
}

type noEntries struct{}

func (noEntries) Entry(context.Context, net.HardwareAddr) (netboot.Entry, bool) {
	return netboot.Entry{}, false
}

type noArtifacts struct{}

func (noArtifacts) Has(string) bool { return false }
func (noArtifacts) ServeArtifact(w http.ResponseWriter, r *http.Request, _ string) {
	http.NotFound(w, r)
}

// PXEResult is one VM's measurement.
type PXEResult struct {
	VM             string        `json:"vm"`
	Firmware       Firmware      `json:"firmware"`
	Via            string        `json:"via"`
	PowerOnCall    time.Duration `json:"powerOnCall"`    // the BMC client's SetPower(on)
	ToDHCPDiscover time.Duration `json:"toDhcpDiscover"` // power-on request → first DHCPDISCOVER
	ToBootScript   time.Duration `json:"toBootScript"`   // power-on request → first GET /boot.ipxe
}

// TestLabPXEInNamespace is TestLabPXE's inner half: it runs inside the lab's namespace (started
// by TestLabPXE with BCD_LAB_INNER_DIR), so every socket it makes, the site services' and the
// BMC clients', is on the lab's bridge.
func TestLabPXEInNamespace(t *testing.T) {
	dir := os.Getenv(innerDirEnv)
	if dir == "" {
		t.Skip("inner half of TestLabPXE (runs inside the lab's namespace)")
	}
	st, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkInNamespace(st.NetNS); err != nil {
		t.Fatal(err)
	}
	creds, err := ReadCredentials(st.Credentials)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	site := st.BridgeIPv4.Addr()
	baseURL := "http://" + netip.AddrPortFrom(site, 8080).String()
	dhcpSeen, bootSeen := newFirstSeen(), newFirstSeen()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// HTTP: the boot script handler, with no entries: every request is a discovery.
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: baseURL, RetryAfter: 5 * time.Second,
		Entries: noEntries{}, Discovery: recorder{bootSeen}, Artifacts: noArtifacts{}, BinaryDir: "/usr/lib/ipxe"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(site, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("HTTP: %v", err)
		}
	})
	defer hs.Close()

	// TFTP: the iPXE binaries (a firmware without iPXE in its NIC ROM would fetch them).
	route, err := tftp.NewDirRoute("/usr/lib/ipxe")
	if err != nil {
		t.Fatal(err)
	}
	defer route.Close()
	tconn, err := net.ListenPacket("udp4", netip.AddrPortFrom(site, 69).String())
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tftp.New(tftp.Config{Routes: []tftp.Route{route}, Conn: tconn})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := ts.Serve(ctx); err != nil {
			t.Errorf("TFTP: %v", err)
		}
	})

	// DHCP, full mode, on the bridge.
	uc, err := server4.NewIPv4UDPConn(st.Bridge, &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := dhcp.New(ctx, dhcp.Config{Mode: dhcp.ModeFull, Interface: st.Bridge, ServerIP: site, HTTPBaseURL: baseURL,
		Boot:   dhcp.Policy{EFIBinary: dhcp.BinaryEFI},
		Pools:  []dhcp.Pool{{Subnet: st.BridgeIPv4.Masked(), Start: st.DHCPStart, End: st.DHCPEnd}},
		Leases: dhcp.NewFileLeaseStore(filepath.Join(t.TempDir(), "leases.json")),
		Conn:   discoverConn{uc, dhcpSeen}})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := ds.Serve(ctx); err != nil {
			t.Errorf("DHCP: %v", err)
		}
	})

	// Power on through the BMCs, PXE first: Redfish for BIOS VMs, IPMI for UEFI VMs.
	powerOn := map[string]time.Time{}
	results := map[string]*PXEResult{}
	for _, vm := range st.VMs {
		cred, ok := creds.For(vm.Name)
		if !ok {
			t.Fatalf("no credential for %s", vm.Name)
		}
		ep := bmc.Endpoint{Username: cred.Username, Password: cred.Password}
		var drv interface {
			bmc.Power
			bmc.BootDeviceSetter
		}
		via := "redfish"
		if vm.Firmware == FirmwareBIOS {
			ep.Address, ep.FingerprintSHA256 = vm.RedfishURL, vm.RedfishFingerprint
			c, err := bmcredfish.New(ctx, ep, bmcredfish.Options{})
			if err != nil {
				t.Fatalf("%s: Redfish: %v", vm.Name, err)
			}
			defer c.Close(context.Background())
			drv = c
		} else {
			via = "ipmi"
			ep.Address = vm.IPMIAddr
			d, err := bmcipmi.New(ep, bmcipmi.Options{})
			if err != nil {
				t.Fatalf("%s: IPMI: %v", vm.Name, err)
			}
			drv = d
		}
		if p, err := drv.GetPower(ctx); err != nil || p != bmc.PowerOff {
			t.Fatalf("%s via %s: power before = %q, %v; want off", vm.Name, via, p, err)
		}
		if err := drv.SetBootDevice(ctx, bmc.BootPXE, bmc.BootOptions{}); err != nil {
			t.Fatalf("%s via %s: boot device: %v", vm.Name, via, err)
		}
		start := time.Now()
		if err := drv.SetPower(ctx, bmc.ActionOn); err != nil {
			t.Fatalf("%s via %s: power on: %v", vm.Name, via, err)
		}
		powerOn[vm.MAC] = start
		results[vm.MAC] = &PXEResult{VM: vm.Name, Firmware: vm.Firmware, Via: via, PowerOnCall: time.Since(start)}
		t.Logf("%s (%s) powered on via %s in %s", vm.Name, vm.Firmware, via, time.Since(start).Round(time.Millisecond))
	}

	// Each VM must reach /boot.ipxe with its MAC within vmBootDeadline of its power-on.
	for _, vm := range st.VMs {
		r := results[vm.MAC]
		wctx, wcancel := context.WithDeadline(ctx, powerOn[vm.MAC].Add(vmBootDeadline))
		at, info, err := dhcpSeen.wait(wctx, vm.MAC)
		if err != nil {
			wcancel()
			t.Fatalf("%s (%s): no DHCPDISCOVER within %s of power-on; console:\n%s", vm.Name, vm.Firmware, vmBootDeadline, Tail(vm.Console, 20))
		}
		r.ToDHCPDiscover = at.Sub(powerOn[vm.MAC])
		t.Logf("%s: first DHCPDISCOVER %s after power-on (%s)", vm.Name, r.ToDHCPDiscover.Round(time.Millisecond), info)
		at, info, err = bootSeen.wait(wctx, vm.MAC)
		wcancel()
		if err != nil {
			t.Fatalf("%s (%s): no /boot.ipxe request within %s of power-on; console:\n%s", vm.Name, vm.Firmware, vmBootDeadline, Tail(vm.Console, 20))
		}
		r.ToBootScript = at.Sub(powerOn[vm.MAC])
		t.Logf("%s: first /boot.ipxe %s after power-on (%s)", vm.Name, r.ToBootScript.Round(time.Millisecond), info)
		if !strings.Contains(info, "uuid="+vm.UUID) {
			t.Errorf("%s: discovery %q lacks the VM's SMBIOS UUID %s", vm.Name, info, vm.UUID)
		}
		wantArch := map[Firmware]string{FirmwareBIOS: "arch=i386", FirmwareUEFI: "arch=x86_64"}[vm.Firmware]
		if !strings.Contains(info, wantArch) {
			t.Errorf("%s: discovery %q, want %s", vm.Name, info, wantArch)
		}
	}
	leased := map[string]bool{}
	for _, l := range ds.Leases() {
		leased[l.MAC] = true
	}
	var list []PXEResult
	for _, vm := range st.VMs {
		if !leased[vm.MAC] {
			t.Errorf("%s has no DHCP lease (leases: %+v)", vm.Name, ds.Leases())
		}
		list = append(list, *results[vm.MAC])
	}
	b, _ := json.MarshalIndent(list, "", "  ")
	t.Logf("measurements:\n%s", b)
	if err := os.WriteFile(filepath.Join(dir, "pxe-results.json"), b, 0o644); err != nil {
		t.Error(err)
	}
}
