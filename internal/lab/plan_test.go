package lab

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlanAllocation(t *testing.T) {
	tests := []struct {
		name     string
		o        Options
		wantErr  string
		firmware []Firmware
		check    func(t *testing.T, s Spec)
	}{
		{name: "defaults, mixed", o: Options{VMs: 3, Firmware: ChoiceMixed, Dir: "/lab"},
			firmware: []Firmware{FirmwareBIOS, FirmwareUEFI, FirmwareBIOS},
			check: func(t *testing.T, s Spec) {
				if s.NetNS != "bcdlab" || s.Bridge != "bcdbr0" || s.BridgeIPv4.String() != "172.30.0.1/24" || s.BridgeIPv6.String() != "fd62:6364:6c61::1/64" {
					t.Errorf("network = %s %s %s %s", s.NetNS, s.Bridge, s.BridgeIPv4, s.BridgeIPv6)
				}
				if s.DHCPStart.String() != "172.30.0.100" || s.DHCPEnd.String() != "172.30.0.199" {
					t.Errorf("DHCP range = %s-%s", s.DHCPStart, s.DHCPEnd)
				}
				if s.Credentials != "/lab/credentials.json" {
					t.Errorf("credentials = %s", s.Credentials)
				}
				vm := s.VMs[1]
				want := VM{Index: 1, Name: "lab-1", Firmware: FirmwareUEFI, MAC: "02:bc:d1:ab:00:01",
					UUID: "bcd1ab00-0000-4000-8000-000000000001", Serial: "BCDLAB0001", Tap: "bcdtap1",
					MemoryMiB: 1024, DiskBus: DiskVirtio, DiskSize: 4 << 30, Dir: "/lab/lab-1", Disk: "/lab/lab-1/disk.raw",
					OVMFVars: "/lab/lab-1/OVMF_VARS.fd", QMPSocket: "/lab/lab-1/qmp.sock", QMPMonitor: "/lab/lab-1/monitor.sock", InbandSocket: "/lab/lab-1/bmc-inband.sock",
					Console: "/lab/lab-1/console.log", SerialSocket: "/lab/lab-1/serial.sock", QEMULog: "/lab/lab-1/qemu.log",
					RedfishAddr: "172.30.0.1:8001", IPMIAddr: "172.30.0.1:6231"}
				if vm != want {
					t.Errorf("vm 1 =\n%+v\nwant\n%+v", vm, want)
				}
				if s.VMs[0].OVMFVars != "" {
					t.Errorf("BIOS VM has OVMF vars %q", s.VMs[0].OVMFVars)
				}
			}},
		{name: "uefi only", o: Options{VMs: 2, Firmware: ChoiceUEFI, Dir: "/x"}, firmware: []Firmware{FirmwareUEFI, FirmwareUEFI}},
		{name: "bios default", o: Options{VMs: 2, Dir: "/x"}, firmware: []Firmware{FirmwareBIOS, FirmwareBIOS}},
		{name: "custom network", o: Options{VMs: 1, Dir: "/x", NetNS: "t1", Bridge: "br-t", DiskBus: DiskNVMe, MemoryMiB: 512,
			BridgeIPv4: netip.MustParsePrefix("10.9.0.150/24"), BridgeIPv6: netip.MustParsePrefix("fd00:1::5/64")},
			firmware: []Firmware{FirmwareBIOS},
			check: func(t *testing.T, s Spec) {
				if s.DHCPStart.String() != "10.9.0.10" || s.DHCPEnd.String() != "10.9.0.90" {
					t.Errorf("DHCP range avoiding the bridge = %s-%s", s.DHCPStart, s.DHCPEnd)
				}
				if s.VMs[0].RedfishAddr != "10.9.0.150:8000" || s.VMs[0].IPMIAddr != "10.9.0.150:6230" || s.VMs[0].DiskBus != DiskNVMe || s.VMs[0].MemoryMiB != 512 {
					t.Errorf("vm = %+v", s.VMs[0])
				}
			}},
		{name: "no VMs", o: Options{VMs: 0, Dir: "/x"}, wantErr: "0 VMs"},
		{name: "too many VMs", o: Options{VMs: MaxVMs + 1, Dir: "/x"}, wantErr: "accepted are 1 to 64"},
		{name: "relative dir", o: Options{VMs: 1, Dir: "lab"}, wantErr: "absolute"},
		{name: "bad firmware", o: Options{VMs: 1, Dir: "/x", Firmware: "coreboot"}, wantErr: "firmware \"coreboot\""},
		{name: "bad disk bus", o: Options{VMs: 1, Dir: "/x", DiskBus: "ide"}, wantErr: "disk bus"},
		{name: "bad namespace", o: Options{VMs: 1, Dir: "/x", NetNS: "a/b"}, wantErr: "namespace"},
		{name: "long bridge", o: Options{VMs: 1, Dir: "/x", Bridge: "averyverylongbridge"}, wantErr: "bridge"},
		{name: "too much memory", o: Options{VMs: 1, Dir: "/x", MemoryMiB: 4096}, wantErr: "memory"},
		{name: "network address as bridge", o: Options{VMs: 1, Dir: "/x", BridgeIPv4: netip.MustParsePrefix("10.0.0.0/24")}, wantErr: "host address"},
		{name: "socket path too long", o: Options{VMs: 1, Dir: "/" + strings.Repeat("d", 100)}, wantErr: "too long"},
		{name: "v6 not /64", o: Options{VMs: 1, Dir: "/x", BridgeIPv6: netip.MustParsePrefix("fd00::1/48")}, wantErr: "/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Plan(tt.o)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Plan error = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var fw []Firmware
			for _, vm := range s.VMs {
				fw = append(fw, vm.Firmware)
			}
			if !slices.Equal(fw, tt.firmware) {
				t.Errorf("firmware = %v, want %v", fw, tt.firmware)
			}
			if tt.check != nil {
				tt.check(t, s)
			}
			again, _ := Plan(tt.o)
			if a, b := again.VMs, s.VMs; !slices.Equal(a, b) {
				t.Errorf("Plan is not deterministic")
			}
		})
	}
}

func TestAllocationsUnique(t *testing.T) {
	s, err := Plan(Options{VMs: MaxVMs, Firmware: ChoiceMixed, Dir: "/lab"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, vm := range s.VMs {
		for kind, v := range map[string]string{"mac": vm.MAC, "uuid": vm.UUID, "serial": vm.Serial, "tap": vm.Tap,
			"redfish": vm.RedfishAddr, "ipmi": vm.IPMIAddr, "dir": vm.Dir, "name": vm.Name} {
			key := kind + " " + v
			if prev, dup := seen[key]; dup {
				t.Fatalf("%s %s used by %s and %s", kind, v, prev, vm.Name)
			}
			seen[key] = vm.Name
		}
		mac, err := net.ParseMAC(vm.MAC)
		if err != nil || len(mac) != 6 {
			t.Fatalf("MAC %q: %v", vm.MAC, err)
		}
		if mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
			t.Errorf("MAC %s must be unicast and locally administered", vm.MAC)
		}
		for _, a := range []string{vm.RedfishAddr, vm.IPMIAddr} {
			ap := netip.MustParseAddrPort(a)
			if ap.Addr() != s.BridgeIPv4.Addr() {
				t.Errorf("BMC %s is not on the bridge address", a)
			}
			if !ap.Addr().IsPrivate() {
				t.Errorf("BMC %s is not a private address", a)
			}
		}
		if !validIfName(vm.Tap) {
			t.Errorf("tap name %q invalid", vm.Tap)
		}
	}
	for _, tc := range []struct {
		i    int
		want string
	}{{0, "02:bc:d1:ab:00:00"}, {9, "02:bc:d1:ab:00:09"}, {255, "02:bc:d1:ab:00:ff"}, {256, "02:bc:d1:ab:01:00"}} {
		if got := MAC(tc.i); got != tc.want {
			t.Errorf("MAC(%d) = %s, want %s", tc.i, got, tc.want)
		}
	}
}

func TestQEMUArgs(t *testing.T) {
	s, err := Plan(Options{VMs: 2, Firmware: ChoiceMixed, Dir: "/lab"})
	if err != nil {
		t.Fatal(err)
	}
	nvme, err := Plan(Options{VMs: 1, Dir: "/lab", DiskBus: DiskNVMe, MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	mixed, err := Plan(Options{VMs: 2, Dir: "/lab", DiskBus: DiskMixed})
	if err != nil {
		t.Fatal(err)
	}
	common := []string{
		"-name lab-%d,process=bcdlab-lab-%d",
		"-machine q35,accel=tcg",
		"-nodefaults",
		"-display none",
		"-serial chardev:console",
		"-qmp unix:/lab/lab-%d/qmp.sock,server=on,wait=off",
		"-qmp unix:/lab/lab-%d/monitor.sock,server=on,wait=off",
		"-no-shutdown",
		"-S",
		"-boot strict=on",
		"-netdev tap,id=net0,ifname=bcdtap%d,script=no,downscript=no",
		"-device virtio-net-pci,netdev=net0,id=nic0,mac=02:bc:d1:ab:00:0%d,bootindex=1",
		"-drive if=none,id=disk0-drive,file=/lab/lab-%d/disk.raw,format=raw,cache=unsafe,discard=unmap",
		"-drive if=none,id=cd0-drive,media=cdrom,readonly=on",
		"-device ide-cd,drive=cd0-drive,id=cd0,bus=ide.2,bootindex=3",
		// The serial port: a socket for the IPMI BMC's SOL, logged to console.log all the same.
		"-chardev socket,id=console,path=/lab/lab-%d/serial.sock,server=on,wait=off,logfile=/lab/lab-%d/console.log,logappend=on",
		"-uuid bcd1ab00-0000-4000-8000-00000000000%d",
		// The host's KCS interface, forwarded to the VM's IPMI BMC (in-band provisioning).
		"-chardev socket,id=ipmi0,path=/lab/lab-%d/bmc-inband.sock,reconnect=1",
		"-device ipmi-bmc-extern,chardev=ipmi0,id=bmc0",
		"-device isa-ipmi-kcs,bmc=bmc0",
	}
	tests := []struct {
		name   string
		s      Spec
		vm     int
		want   []string
		absent []string
	}{
		{name: "bios", s: s, vm: 0, want: append(slices.Clone(common),
			"-m 1024",
			"-fw_cfg name=etc/sercon-port,file=/lab/sercon-port",
			"-device virtio-blk-pci,drive=disk0-drive,id=disk0,serial=BCDLAB0000-D0,bootindex=2"),
			absent: []string{"if=pflash"}},
		{name: "uefi", s: s, vm: 1, want: append(slices.Clone(common),
			"-drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
			"-drive if=pflash,format=raw,unit=1,file=/lab/lab-1/OVMF_VARS.fd",
			"-device virtio-blk-pci,drive=disk0-drive,id=disk0,serial=BCDLAB0001-D0,bootindex=2"),
			absent: []string{"sercon", "romfile"}},
		{name: "nvme", s: nvme, vm: 0, want: []string{"-m 512", "-device nvme,drive=disk0-drive,id=disk0,serial=BCDLAB0000-D0,bootindex=2"},
			absent: []string{"virtio-blk"}},
		{name: "mixed disks, even", s: mixed, vm: 0, want: []string{"-device virtio-blk-pci,drive=disk0-drive,id=disk0,serial=BCDLAB0000-D0,bootindex=2"},
			absent: []string{"-device nvme"}},
		{name: "mixed disks, odd", s: mixed, vm: 1, want: []string{"-device nvme,drive=disk0-drive,id=disk0,serial=BCDLAB0001-D0,bootindex=2"},
			absent: []string{"virtio-blk"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := QEMUArgs(tt.s, tt.s.VMs[tt.vm])
			// Options come in pairs "-opt value" or alone ("-S"): render each as one string.
			var items []string
			for i := 0; i < len(args); i++ {
				if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
					items = append(items, args[i]+" "+args[i+1])
					i++
				} else {
					items = append(items, args[i])
				}
			}
			for _, w := range tt.want {
				w = strings.ReplaceAll(w, "%d", string(rune('0'+tt.vm)))
				if !slices.Contains(items, w) {
					t.Errorf("argv lacks %q\nargv: %q", w, items)
				}
			}
			joined := strings.Join(args, " ")
			for _, a := range tt.absent {
				if strings.Contains(joined, a) {
					t.Errorf("argv holds %q: %s", a, joined)
				}
			}
			// Boot indices are unique (QEMU refuses duplicates).
			var idx []string
			for _, a := range args {
				if i := strings.Index(a, "bootindex="); i >= 0 {
					idx = append(idx, a[i:])
				}
			}
			if len(idx) != 3 || len(slices.Compact(slices.Sorted(slices.Values(idx)))) != 3 {
				t.Errorf("boot indices %v", idx)
			}
		})
	}
}

func TestNetworkSetup(t *testing.T) {
	s, err := Plan(Options{VMs: 2, Dir: "/lab", NetNS: "t", Bridge: "br9"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range NetworkSetup(s) {
		got = append(got, st.String())
	}
	want := []string{
		"ip link set lo up",
		"net/ipv6/conf/all/accept_dad=0",
		"net/ipv6/conf/default/accept_dad=0",
		"ip link add br9 type bridge forward_delay 0 stp_state 0",
		"net/ipv6/conf/br9/accept_ra=0",
		"ip addr add 172.30.0.1/24 dev br9",
		"ip addr add fd62:6364:6c61::1/64 dev br9 nodad",
		"ip link set br9 up",
		"ip tuntap add dev bcdtap0 mode tap",
		"ip link set bcdtap0 master br9",
		"ip link set bcdtap0 up",
		"ip tuntap add dev bcdtap1 mode tap",
		"ip link set bcdtap1 master br9",
		"ip link set bcdtap1 up",
	}
	if !slices.Equal(got, want) {
		t.Errorf("setup =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, st := range NetworkSetup(s) {
		// Every command acts inside the calling namespace: none names another one or the host.
		if slices.Contains(st.Argv, "netns") || slices.Contains(st.Argv, "-n") {
			t.Errorf("step %s leaves the namespace", st)
		}
	}
	var down []string
	for _, st := range NetworkTeardown(s) {
		down = append(down, st.String())
	}
	if want := []string{"ip link del bcdtap0", "ip link del bcdtap1", "ip link del br9"}; !slices.Equal(down, want) {
		t.Errorf("teardown = %q, want %q", down, want)
	}
}

func TestRouterAdvertisement(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0xbc, 0, 0, 0, 1}
	tests := []struct {
		name   string
		prefix string
		mac    net.HardwareAddr
		len    int
	}{
		{"with source link-layer address", "fd62:6364:6c61::1/64", mac, 16 + 32 + 8},
		{"without", "fd00:1:2:3::9/64", nil, 16 + 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := netip.MustParsePrefix(tt.prefix)
			b := RouterAdvertisement(p, tt.mac)
			if len(b) != tt.len {
				t.Fatalf("length %d, want %d", len(b), tt.len)
			}
			if b[0] != 134 || b[1] != 0 {
				t.Errorf("type/code = %d/%d", b[0], b[1])
			}
			if b[5]&0xc0 != 0 {
				t.Errorf("M/O flags set: %#x (ra-only wants neither)", b[5])
			}
			if lt := binary.BigEndian.Uint16(b[6:]); lt != 0 {
				t.Errorf("router lifetime %d, want 0", lt)
			}
			pi := b[16:48]
			if pi[0] != 3 || pi[1] != 4 || pi[2] != 64 || pi[3] != 0xc0 {
				t.Errorf("prefix option header % x", pi[:4])
			}
			if binary.BigEndian.Uint32(pi[4:]) == 0 || binary.BigEndian.Uint32(pi[8:]) == 0 {
				t.Error("zero lifetimes")
			}
			a := p.Masked().Addr().As16()
			if !bytes.Equal(pi[16:], a[:]) {
				t.Errorf("prefix % x, want % x", pi[16:], a)
			}
			if tt.mac != nil && (b[48] != 1 || b[49] != 1 || !bytes.Equal(b[50:], tt.mac)) {
				t.Errorf("source link-layer option % x", b[48:])
			}
		})
	}
}

func TestCredentials(t *testing.T) {
	s, err := Plan(Options{VMs: 3, Dir: "/lab"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCredentials(s)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, cr := range c.VMs {
		if cr.VM != s.VMs[i].Name || cr.Username != "admin" || len(cr.Password) != 16 || seen[cr.Password] {
			t.Errorf("credential %d: %s (len %d)", i, cr, len(cr.Password))
		}
		seen[cr.Password] = true
		if strings.Contains(cr.String(), cr.Password) {
			t.Errorf("String shows the password")
		}
	}
	if _, ok := c.For("lab-2"); !ok {
		t.Error("For(lab-2) not found")
	}
	if _, ok := c.For("lab-9"); ok {
		t.Error("For(lab-9) found")
	}
	path := filepath.Join(t.TempDir(), CredentialsFile)
	if err := writeJSON(path, c, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file mode %v (%v), want 0600", fi.Mode(), err)
	}
	back, err := ReadCredentials(path)
	if err != nil || !slices.Equal(back.VMs, c.VMs) {
		t.Fatalf("round trip: %v", err)
	}
}

func TestProcessAlive(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		want bool
	}{
		{"self", os.Getpid(), true},
		{"zero", 0, false},
		{"negative", -1, false},
		{"absent", 1 << 30, false},
	}
	for _, tt := range tests {
		if got := processAlive(tt.pid); got != tt.want {
			t.Errorf("%s: processAlive(%d) = %v, want %v", tt.name, tt.pid, got, tt.want)
		}
	}
	// A child that exited and was not yet reaped is a zombie: dead (LAB-NOTES gotcha 9).
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(cmd.Process.Pid) && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if processAlive(cmd.Process.Pid) {
		t.Errorf("exited, unreaped child %d counted alive", cmd.Process.Pid)
	}
	_ = cmd.Wait()
	if !cmdlineHas(os.Getpid(), filepath.Base(os.Args[0])) {
		t.Error("cmdlineHas(self, own name) = false")
	}
}
