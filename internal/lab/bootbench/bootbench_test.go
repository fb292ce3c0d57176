package bootbench

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"bcd/internal/lab"
	"bcd/internal/netboot"
	"bcd/internal/site"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5}, 5},
		{[]time.Duration{9, 1, 5}, 5},
		{[]time.Duration{4, 1, 3, 2}, 2}, // (2+3)/2 in integer nanoseconds
		{[]time.Duration{10, 30}, 20},
	} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := func(srv Server, fw lab.Firmware, ready time.Duration, phases map[string]time.Duration) Sample {
		return Sample{Server: srv, Firmware: fw, Ready: ready, Phases: phases}
	}
	ph := func(ipxe time.Duration) map[string]time.Duration {
		return map[string]time.Duration{PhaseIPXE: ipxe, PhaseReady: 1}
	}
	samples := []Sample{
		s(ServerDnsmasq, lab.FirmwareBIOS, 20*time.Second, ph(2*time.Second)),
		s(ServerBCD, lab.FirmwareBIOS, 10*time.Second, ph(time.Second)),
		s(ServerBCD, lab.FirmwareBIOS, 30*time.Second, map[string]time.Duration{PhaseReady: 1}), // no iPXE line seen
		s(ServerBCD, lab.FirmwareBIOS, 14*time.Second, ph(3*time.Second)),
		s(ServerBCD, lab.FirmwareUEFI, 40*time.Second, ph(time.Second)),
	}
	r := Summarize(samples)
	want := []Summary{
		{Server: ServerBCD, Firmware: lab.FirmwareBIOS, N: 3, Median: 14 * time.Second, Min: 10 * time.Second, Max: 30 * time.Second,
			PhaseMedians: map[string]time.Duration{PhaseReady: 1}}, // iPXE missing in one sample: no median
		{Server: ServerDnsmasq, Firmware: lab.FirmwareBIOS, N: 1, Median: 20 * time.Second, Min: 20 * time.Second, Max: 20 * time.Second,
			PhaseMedians: map[string]time.Duration{PhaseIPXE: 2 * time.Second, PhaseReady: 1}},
		{Server: ServerBCD, Firmware: lab.FirmwareUEFI, N: 1, Median: 40 * time.Second, Min: 40 * time.Second, Max: 40 * time.Second,
			PhaseMedians: map[string]time.Duration{PhaseIPXE: time.Second, PhaseReady: 1}},
	}
	if !reflect.DeepEqual(r.Summaries, want) {
		t.Fatalf("summaries:\n%+v\nwant\n%+v", r.Summaries, want)
	}
	// UEFI has no dnsmasq sample: no ratio for it.
	if len(r.Ratios) != 1 || r.Ratios[0].Firmware != lab.FirmwareBIOS || r.Ratios[0].BCD != 0.7 {
		t.Fatalf("ratios: %+v", r.Ratios)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"bios      bcd      3     14.0      10.0   30.0", "bios: bcd/dnsmasq median ratio 0.70"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, b.String())
		}
	}
}

func TestScannerFindsMarkersOnCompleteLines(t *testing.T) {
	sc := newScanner(Markers)
	steps := []struct {
		in    string
		since time.Duration
		done  bool
	}{
		{"SeaBIOS\r\niP", 1, false},
		{"XE (http://ipxe.org) 00:02.0\r\n", 2, false}, // the marker completes on this line: time 2
		{"http://172.30.0.1/boot.ipxe... ok\n[    0.000000] Linux version 6.1", 3, false},
		{".0\n", 4, false},
		{"bcd-ramdisk: ready ip=eth0:172.30.0.100/24 gateway=https://x mode=join", 5, false}, // no newline yet
		{"\n", 6, true},
	}
	for i, s := range steps {
		if got := sc.feed([]byte(s.in), s.since); got != s.done {
			t.Fatalf("step %d: done = %v", i, got)
		}
	}
	want := map[string]time.Duration{PhaseIPXE: 2, PhaseScript: 3, PhaseKernel: 4, PhaseReady: 6}
	if !reflect.DeepEqual(sc.seen.At, want) || !strings.HasPrefix(sc.seen.Line, "bcd-ramdisk: ready ip=eth0:172.30.0.100/24") {
		t.Fatalf("seen %+v %q", sc.seen.At, sc.seen.Line)
	}
}

func TestWatchReadsFromTheOffset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	// An earlier boot's lines must not count.
	if err := os.WriteFile(path, []byte("bcd-ramdisk: ready ip=old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	off, err := Offset(path)
	if err != nil || off == 0 {
		t.Fatalf("offset %d %v", off, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		s   Seen
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := Watch(ctx, path, off, time.Now(), Markers, time.Millisecond)
		done <- result{s, err}
	}()
	f.WriteString("iPXE 1.0\n")
	f.WriteString("bcd-ramdisk: ready ip=new\n")
	r := <-done
	if r.err != nil || r.s.Line != "bcd-ramdisk: ready ip=new" || r.s.At[PhaseIPXE] == 0 {
		t.Fatalf("watch: %+v %v", r.s, r.err)
	}
	// A console that never shows the line: the watch ends with ctx, as an error.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := Watch(short, path, off+1000, time.Now(), Markers, time.Millisecond); err == nil {
		t.Fatal("watch without the ready line succeeded")
	}
	// Offset of a console not yet created is 0.
	if off, err := Offset(filepath.Join(t.TempDir(), "none")); off != 0 || err != nil {
		t.Fatalf("missing console: %d %v", off, err)
	}
}

func TestDnsmasqArgs(t *testing.T) {
	got := DnsmasqArgs(Baseline{Interface: "bcdbr0", Subnet: netip.MustParsePrefix("172.30.0.1/24"),
		Start: netip.MustParseAddr("172.30.0.100"), End: netip.MustParseAddr("172.30.0.199"),
		LeaseFile: "/d/l", ScriptURL: "http://172.30.0.1/boot.ipxe"})
	for _, w := range []string{"--port=0", "--interface=bcdbr0", "--bind-interfaces", "--dhcp-range=172.30.0.100,172.30.0.199,255.255.255.0,1h",
		"--dhcp-leasefile=/d/l", "--dhcp-userclass=set:ipxe,iPXE", "--dhcp-boot=tag:ipxe,http://172.30.0.1/boot.ipxe", "--keep-in-foreground"} {
		found := false
		for _, a := range got {
			found = found || a == w
		}
		if !found {
			t.Errorf("dnsmasq args lack %q: %v", w, got)
		}
	}
	for bits, want := range map[int]string{0: "0.0.0.0", 16: "255.255.0.0", 23: "255.255.254.0", 32: "255.255.255.255"} {
		if got := netmask(bits); got != want {
			t.Errorf("netmask(%d) = %s, want %s", bits, got, want)
		}
	}
}

// TestBaselineScriptHasBCDsCommandLine renders bcd's script for a ramdisk entry and checks that
// the static script boots the same kernel arguments from the plain server.
func TestBaselineScriptHasBCDsCommandLine(t *testing.T) {
	ca, err := throwawayCA()
	if err != nil {
		t.Fatal(err)
	}
	sum := strings.Repeat("ab", 32)
	entry, err := site.RamdiskEntry(site.RamdiskConfig{
		Kernel:     netboot.Artifact{Name: kernelName, URL: "http://172.30.0.1:8081/vmlinuz", SHA256: sum},
		Initrd:     netboot.Artifact{Name: initrdName, URL: "http://172.30.0.1:8081/initramfs.cpio.gz", SHA256: strings.Repeat("cd", 32)},
		GatewayURL: "https://172.30.0.1:7443", ExtraArgs: []string{"console=ttyS0"}, CAPEM: ca}, strings.Repeat("t", 32))
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("02:bc:d1:ab:00:00")
	script, err := netboot.Script(&entry, netboot.Request{MAC: mac, Arch: "x86_64"}, netboot.ScriptParams{BaseURL: "http://172.30.0.1", RetryAfter: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cmdline, err := KernelLine(script)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"initrd=initramfs.cpio.gz", "bcd.gateway=https://172.30.0.1:7443", "bcd.token=" + strings.Repeat("t", 32), "bcd.ca=", "console=ttyS0",
		netboot.CmdlineSiteKey + "=http://172.30.0.1"} {
		if !strings.Contains(cmdline, w) {
			t.Errorf("command line %q lacks %q", cmdline, w)
		}
	}
	if strings.Contains(cmdline, "||") || strings.Contains(cmdline, netboot.ArtifactPath) {
		t.Errorf("command line %q carries more than the arguments", cmdline)
	}
	static := StaticScript("http://172.30.0.1", kernelName, initrdName, cmdline)
	want := "#!ipxe\nkernel --name vmlinuz http://172.30.0.1/vmlinuz " + cmdline + "\ninitrd --name initramfs.cpio.gz http://172.30.0.1/initramfs.cpio.gz\nboot\n"
	if static != want {
		t.Fatalf("static script:\n%s\nwant\n%s", static, want)
	}
	if got, err := KernelLine(static); err != nil || got != cmdline {
		t.Fatalf("static script's command line %q %v", got, err)
	}
	for _, bad := range []string{"#!ipxe\necho hi\n", "#!ipxe\nkernel --name x\n"} {
		if _, err := KernelLine(bad); err == nil {
			t.Errorf("KernelLine(%q) found a command line", bad)
		}
	}
}

func TestParseLists(t *testing.T) {
	fws, err := ParseFirmwares([]string{"uefi", " bios", "uefi"})
	if err != nil || !reflect.DeepEqual(fws, []lab.Firmware{lab.FirmwareUEFI, lab.FirmwareBIOS}) {
		t.Fatalf("firmwares %v %v", fws, err)
	}
	for _, bad := range [][]string{nil, {"mixed"}, {"bios", "arm"}} {
		if _, err := ParseFirmwares(bad); err == nil {
			t.Errorf("firmwares %v accepted", bad)
		}
	}
	srvs, err := ParseServers([]string{"dnsmasq", "bcd"})
	if err != nil || !reflect.DeepEqual(srvs, []Server{ServerDnsmasq, ServerBCD}) {
		t.Fatalf("servers %v %v", srvs, err)
	}
	for _, bad := range [][]string{nil, {"kea"}} {
		if _, err := ParseServers(bad); err == nil {
			t.Errorf("servers %v accepted", bad)
		}
	}
	args := InnerArgs(Config{Dir: "/d", RamdiskDir: "/r", Runs: 2, Firmwares: fws, Servers: srvs})
	want := []string{"--inner", "--dir", "/d", "--ramdisk", "/r", "--runs", "2", "--firmware", "uefi,bios", "--server", "dnsmasq,bcd"}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("inner args %v", args)
	}
	if got := reversed([]Server{ServerBCD, ServerDnsmasq}); !reflect.DeepEqual(got, []Server{ServerDnsmasq, ServerBCD}) {
		t.Fatalf("reversed %v", got)
	}
}

func TestSamplesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	in := []Sample{{Server: ServerBCD, Firmware: lab.FirmwareUEFI, Run: 1, VM: "lab-1", Ready: 3 * time.Second,
		Phases: map[string]time.Duration{PhaseReady: 3 * time.Second}, Line: "bcd-ramdisk: ready"}}
	if err := WriteSamples(dir, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadSamples(dir)
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip %+v %v", out, err)
	}
	if _, err := ReadSamples(t.TempDir()); err == nil {
		t.Fatal("missing samples read")
	}
}
