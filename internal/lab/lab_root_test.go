//go:build linux

package lab

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Roles the test binary plays when started by a test (the helper-process pattern).
const (
	roleEnv        = "BCD_LAB_TEST_ROLE"
	roleSupervise  = "supervise" // the lab supervisor, inside the namespace (as `bcd lab supervise`)
	innerDirEnv    = "BCD_LAB_INNER_DIR"
	vmBootDeadline = 240 * time.Second // per VM (LAB-NOTES: allow ≥ 240 s under TCG)
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == roleSupervise {
		os.Exit(superviseHelper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// superviseHelper is `bcd lab supervise --dir DIR --ready-fd N` for the tests.
func superviseHelper(args []string) int {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	dir := fs.String("dir", "", "")
	readyFD := fs.Int("ready-fd", 0, "")
	hostFD := fs.Int("host-netns-fd", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var ready io.Writer
	if *readyFD > 2 {
		syscall.CloseOnExec(*readyFD)
		ready = os.NewFile(uintptr(*readyFD), "ready")
	}
	var hostNS *os.File
	if *hostFD > 2 {
		syscall.CloseOnExec(*hostFD)
		hostNS = os.NewFile(uintptr(*hostFD), "host-netns")
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := Supervise(ctx, *dir, log, ready, hostNS); err != nil {
		log.Error("supervisor failed", "err", err)
		return 1
	}
	return 0
}

// need fails the test under CI (CI=true) and skips it otherwise.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s (CI=true: failing instead of skipping)", what)
	}
	t.Skipf("needs %s", what)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// needLab checks what a lab with BIOS and UEFI VMs needs on the host.
func needLab(t *testing.T, tools ...string) {
	t.Helper()
	need(t, os.Geteuid() == 0, "root (network namespaces, taps)")
	for _, p := range append([]string{"ip", DefaultQEMU}, tools...) {
		_, err := exec.LookPath(p)
		need(t, err == nil, p+" (Debian: iproute2 qemu-system-x86 ipmitool redfishtool)")
	}
	for _, f := range []string{"/dev/net/tun", "/usr/lib/ipxe/qemu/pxe-virtio.rom", "/usr/lib/ipxe/qemu/efi-virtio.rom", DefaultOVMFCode, DefaultOVMFVars} {
		need(t, exists(f), f+" (Debian: ipxe-qemu, ovmf)")
	}
}

// testNetNS is a namespace name unique to this test process (at most 15 characters).
func testNetNS(tag string) string { return fmt.Sprintf("bcdt%s%d", tag, os.Getpid()%1000000) }

// upTestLab brings a lab up with the test binary as supervisor and registers its teardown,
// which asserts that nothing of the lab is left.
func upTestLab(t *testing.T, o Options) State {
	t.Helper()
	o.Dir = t.TempDir()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sup, st, err := Up(ctx, o, UpConfig{Supervisor: []string{os.Args[0]}, Env: []string{roleEnv + "=" + roleSupervise}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		start := time.Now()
		if err := Down(context.Background(), o.Dir, log); err != nil {
			t.Errorf("Down: %v", err)
		}
		select {
		case <-sup.Done():
			// A clean exit: no error, no data race (the race detector exits 66).
			if err := sup.Err(); err != nil {
				t.Errorf("supervisor exited with %v; log:\n%s", err, Tail(filepath.Join(o.Dir, SupervisorLog), 60))
			}
		case <-time.After(time.Minute):
			t.Errorf("supervisor %d still running after Down", sup.PID)
		}
		t.Logf("lab down in %s; supervisor log:\n%s", time.Since(start).Round(time.Millisecond), Tail(filepath.Join(o.Dir, SupervisorLog), 12))
		assertNothingLeft(t, st)
		if err := Down(context.Background(), o.Dir, log); err != nil {
			t.Errorf("Down of a lab already down: %v", err)
		}
		if ls, err := Status(context.Background(), o.Dir); err != nil || ls.Running || len(ls.VMs) != 0 {
			t.Errorf("Status of a lab that is down = %+v, %v", ls, err)
		}
	})
	return st
}

// assertNothingLeft checks that no process of the lab runs and its namespace is gone.
func assertNothingLeft(t *testing.T, st State) {
	t.Helper()
	for _, vm := range st.VMs {
		if processAlive(vm.PID) {
			t.Errorf("QEMU of %s (pid %d) still runs after Down", vm.Name, vm.PID)
		}
	}
	if processAlive(st.SupervisorPID) {
		t.Errorf("supervisor (pid %d) still runs after Down", st.SupervisorPID)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), st.Dir) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if processAlive(pid) {
			t.Errorf("process %d of the lab still runs: %q", pid, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if namespaceExists(st.NetNS) {
		t.Errorf("namespace %s still exists", st.NetNS)
	}
	if exists(filepath.Join(st.Dir, StateFile)) {
		t.Errorf("state.json left behind")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// inNamespace runs args inside the lab's namespace and returns the combined output.
func inNamespace(t *testing.T, st State, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := Command(ctx, st.NetNS, args[0], args[1:]...).CombinedOutput()
	return string(out), err
}

// TestLabBMCTools: Debian's ipmitool and redfishtool, run inside the namespace, drive the BMCs
// of a lab VM; from the host's namespace the BMCs cannot be reached at all.
func TestLabBMCTools(t *testing.T) {
	needLab(t, "ipmitool", "redfishtool")
	st := upTestLab(t, Options{VMs: 1, Firmware: ChoiceBIOS, NetNS: testNetNS("t"), MemoryMiB: 256})
	creds, err := ReadCredentials(st.Credentials)
	if err != nil {
		t.Fatal(err)
	}
	vm := st.VMs[0]
	cred, _ := creds.For(vm.Name)
	host, port, _ := net.SplitHostPort(vm.IPMIAddr)
	ipmitool := func(args ...string) string {
		t.Helper()
		argv := append([]string{"ipmitool", "-I", "lanplus", "-H", host, "-p", port, "-U", cred.Username, "-P", cred.Password, "-C", "17"}, args...)
		out, err := inNamespace(t, st, 30*time.Second, argv...)
		if err != nil {
			t.Fatalf("ipmitool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out := ipmitool("chassis", "power", "status"); !strings.Contains(out, "Chassis Power is off") {
		t.Fatalf("a new lab VM should be off: %s", out)
	}
	ipmitool("chassis", "bootdev", "pxe")
	if out := ipmitool("chassis", "bootparam", "get", "5"); !strings.Contains(out, "Force PXE") {
		t.Errorf("boot device read-back (gotcha 5): %s", out)
	}
	ipmitool("chassis", "power", "on")
	if out := ipmitool("chassis", "power", "status"); !strings.Contains(out, "Chassis Power is on") {
		t.Errorf("after power on: %s", out)
	}
	ls, err := Status(context.Background(), st.Dir)
	if err != nil || !ls.Running || ls.VMs[0].Power != "on" || ls.VMs[0].RunState != "running" {
		t.Errorf("lab status after power on = %+v, %v", ls, err)
	}

	rf := func(args ...string) string {
		t.Helper()
		argv := append([]string{"redfishtool", "-r", vm.RedfishAddr, "-S", "Always", "-u", cred.Username, "-p", cred.Password}, args...)
		out, err := inNamespace(t, st, 60*time.Second, argv...)
		if err != nil {
			t.Fatalf("redfishtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out := rf("Systems", "-1", "get"); !strings.Contains(out, vm.UUID) || !strings.Contains(out, `"PowerState": "On"`) {
		t.Errorf("redfishtool Systems lacks the VM's UUID or power On:\n%s", out)
	}
	rf("Systems", "-1", "reset", "ForceOff")
	ls, err = Status(context.Background(), st.Dir)
	if err != nil || ls.VMs[0].Power != "off" {
		t.Errorf("lab status after Redfish ForceOff = %+v, %v", ls, err)
	}
	if out := ipmitool("chassis", "power", "status"); !strings.Contains(out, "Chassis Power is off") {
		t.Errorf("IPMI sees the Redfish power off: %s", out)
	}

	// The BMCs listen in the namespace (the supervisor's sockets) and not in the host's: read
	// the kernel's socket tables rather than connect (nothing of a test leaves the namespace).
	ap := netip.MustParseAddrPort(vm.RedfishAddr)
	if !tcpListening(t, fmt.Sprintf("/proc/%d/net/tcp", st.SupervisorPID), ap) {
		t.Errorf("Redfish BMC %s does not listen inside the namespace", ap)
	}
	if tcpListening(t, "/proc/self/net/tcp", ap) {
		t.Errorf("Redfish BMC %s listens in the host's namespace", ap)
	}
}

// tcpListening reports whether the socket table at path (/proc/PID/net/tcp: that process's
// namespace) holds a listener on ap.
func tcpListening(t *testing.T, path string, ap netip.AddrPort) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a := ap.Addr().As4()
	// local_address is the IPv4 address as a little-endian hex word, then the port in hex.
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], ap.Port())
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[1] == want && f[3] == "0A" {
			return true
		}
	}
	return false
}

// TestLabPXE brings up a lab with a BIOS and a UEFI VM, runs DHCP (full), TFTP and the boot
// script handler on the bridge inside the namespace (the inner test), powers the VMs on through
// their BMCs (Redfish for the BIOS VM, IPMI for the UEFI VM) and waits until each VM's iPXE asks
// for /boot.ipxe with its MAC. It reports power-on → first DHCPDISCOVER and → first /boot.ipxe
// per firmware, then brings the lab down and checks nothing is left.
func TestLabPXE(t *testing.T) {
	needLab(t)
	st := upTestLab(t, Options{VMs: 2, Firmware: ChoiceMixed, NetNS: testNetNS("p"), MemoryMiB: 512})
	ctx, cancel := context.WithTimeout(context.Background(), 2*vmBootDeadline+time.Minute)
	defer cancel()
	cmd := Command(ctx, st.NetNS, os.Args[0], "-test.run=^TestLabPXEInNamespace$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), innerDirEnv+"="+st.Dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var passed bool
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		t.Log("inner: " + line)
		if strings.HasPrefix(line, "--- PASS: TestLabPXEInNamespace") {
			passed = true
		}
	}
	if err := cmd.Wait(); err != nil || !passed {
		for _, vm := range st.VMs {
			t.Logf("%s console (tail):\n%s", vm.Name, Tail(vm.Console, 25))
		}
		t.Fatalf("inner test in namespace %s failed: %v (passed=%v)", st.NetNS, err, passed)
	}
}
