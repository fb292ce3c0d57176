package ramdiskcmd

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/ramdisk/agent"
	"bcd/internal/ramdisk/build"
	"bcd/internal/ramdisk/initsys"
)

func TestInitArgs(t *testing.T) {
	tests := []struct {
		argv0 string
		pid   int
		args  []string
		want  []string
	}{
		{"/init", 1, nil, []string{"ramdisk", "init"}},
		{"init", 1, []string{}, []string{"ramdisk", "init"}},
		{"/init", 1, []string{"ramdisk", "build"}, []string{"ramdisk", "build"}},
		{"/init", 1, []string{"vmlinuz"}, []string{"ramdisk", "init"}},
		{"/init", 1, []string{"vmlinuz", "quiet"}, []string{"ramdisk", "init"}},
		{"/init", 42, nil, nil},
		{"/usr/bin/bcd", 1, nil, nil},
		{"bcd", 1000, []string{"server"}, []string{"server"}},
	}
	for _, tc := range tests {
		if got := InitArgs(tc.argv0, tc.pid, tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("InitArgs(%q, %d, %v) = %v, want %v", tc.argv0, tc.pid, tc.args, got, tc.want)
		}
	}
}

// requirement fails the test under CI and skips it elsewhere.
func requirement(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI requirement missing: "+format, args...)
	}
	t.Skipf(format, args...)
}

// TestBootQEMU builds the ramdisk from the Debian kernel package (downloaded into out/cache
// on first use) and the current code, boots it under QEMU (TCG, user-mode network with
// restrict=on: its DHCP server lives inside the QEMU process) and waits for the init and
// ready markers.
func TestBootQEMU(t *testing.T) {
	ctx, qemu, _, kernel, initrd := qemuAndRamdisk(t)

	const token = "TestToken-0123456789abcdef"
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// No gateway listens there (restrict=on): the agent must keep retrying, not fail.
	cmdline := "console=ttyS0 panic=-1 bcd.gateway=https://10.0.2.2:8443/ bcd.token=" + token + " bcd.ca=" + agent.EncodeCA(ca.CertPEM())
	vm := exec.CommandContext(ctx, qemu, "-machine", "q35", "-accel", "tcg", "-m", "512", "-nographic",
		"-no-reboot", "-nodefaults", "-serial", "stdio", "-monitor", "none",
		"-kernel", kernel, "-initrd", initrd, "-append", cmdline,
		"-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0",
		"-device", "virtio-rng-pci")
	out, err := vm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	vm.Stderr = vm.Stdout
	console := &strings.Builder{}
	start := time.Now()
	if err := vm.Start(); err != nil {
		t.Fatalf("starting QEMU: %v", err)
	}
	waited := make(chan error, 1)
	stop := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		_ = vm.Process.Kill()
		<-waited
	})

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
			}
		}
		close(lines)
		waited <- vm.Wait()
	}()
	marks := []string{"Run /init as init process", initsys.MarkerInitOK, agent.MarkerReady}
	at := map[string]time.Duration{}
	afterInit := false
	for len(at) < len(marks) {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("QEMU exited before %v; console:\n%s", marks[len(at)], console)
			}
			console.WriteString(line + "\n")
			if afterInit && strings.Contains(line, token) {
				t.Errorf("the ramdisk printed its token: %q", line)
			}
			if strings.Contains(line, initsys.MarkerFatal) {
				t.Fatalf("fatal error in the ramdisk; console:\n%s", console)
			}
			for _, m := range marks {
				if _, seen := at[m]; !seen && strings.Contains(line, m) {
					at[m] = time.Since(start)
					if m == initsys.MarkerInitOK {
						afterInit = true
					}
				}
			}
			if strings.Contains(line, agent.MarkerReady) && !strings.Contains(line, "ip=eth0:10.0.2.15/24") {
				t.Errorf("ready line without QEMU's DHCP address: %q", line)
			}
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %v; console:\n%s", marks[len(at)], console)
		}
	}
	// With no gateway to reach, the agent keeps trying: nothing fatal for a while after ready.
	quiet := time.NewTimer(5 * time.Second)
	defer quiet.Stop()
	for watching := true; watching; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("QEMU exited after ready; console:\n%s", console)
			}
			console.WriteString(line + "\n")
			if strings.Contains(line, initsys.MarkerFatal) || strings.Contains(line, token) {
				t.Fatalf("after ready: %q; console:\n%s", line, console)
			}
		case <-quiet.C:
			watching = false
		case <-ctx.Done():
			t.Fatalf("timed out after ready; console:\n%s", console)
		}
	}
	t.Logf("boot to PID 1 %.1fs, to %q %.1fs, to %q %.1fs (TCG)", at[marks[0]].Seconds(),
		marks[1], at[marks[1]].Seconds(), marks[2], at[marks[2]].Seconds())
	if !strings.Contains(console.String(), "modules loaded") {
		t.Errorf("no module report on the console:\n%s", console)
	}
}

// qemuAndRamdisk is what a test that boots the ramdisk needs: a context bounding the test (280 s),
// QEMU's path, the repository's root, and the ramdisk built (buildRamdisk). It skips under
// -short, and without QEMU outside CI.
func qemuAndRamdisk(t *testing.T) (ctx context.Context, qemu, root, kernel, initrd string) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		requirement(t, "qemu-system-x86_64 not installed (apt-get install --no-install-recommends qemu-system-x86)")
	}
	if root, err = filepath.Abs("../../.."); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 280*time.Second)
	t.Cleanup(cancel)
	kernel, initrd = buildRamdisk(ctx, t, root)
	return ctx, qemu, root, kernel, initrd
}

// buildRamdisk builds vmlinuz + initramfs into a temporary directory from the kernel package
// in out/cache (fetched by scripts/ramdisk/kernel-deb when absent), or falls back to
// out/ramdisk when the package cannot be had.
func buildRamdisk(ctx context.Context, t *testing.T, root string) (string, string) {
	t.Helper()
	fetch := exec.CommandContext(ctx, filepath.Join(root, "scripts/ramdisk/kernel-deb"), filepath.Join(root, "out/cache"))
	fetch.Stderr = os.Stderr
	debOut, err := fetch.Output()
	deb := strings.TrimSpace(string(debOut))
	if err != nil || deb == "" {
		k, i := filepath.Join(root, "out/ramdisk", build.KernelFile), filepath.Join(root, "out/ramdisk", build.InitramfsFile)
		if _, kerr := os.Stat(k); kerr == nil {
			if _, ierr := os.Stat(i); ierr == nil {
				t.Logf("no kernel package (%v): booting the existing out/ramdisk", err)
				return k, i
			}
		}
		requirement(t, "no Debian kernel package and no out/ramdisk: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd-ramdisk")
	gb := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", bin, "./cmd/bcd")
	gb.Dir = root
	gb.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := gb.CombinedOutput(); err != nil {
		t.Fatalf("building the ramdisk binary: %v\n%s", err, out)
	}
	// Run the builder as the (non-race) binary: parsing every module of the package under the
	// race detector takes minutes.
	t0 := time.Now()
	out := filepath.Join(dir, "out")
	bc := exec.CommandContext(ctx, bin, "ramdisk", "build", "--kernel-deb", deb, "--binary", bin, "--out", out)
	report, err := bc.CombinedOutput()
	if err != nil {
		t.Fatalf("building the ramdisk: %v\n%s", err, report)
	}
	t.Logf("ramdisk built in %.1fs:\n%s", time.Since(t0).Seconds(), report)
	return filepath.Join(out, build.KernelFile), filepath.Join(out, build.InitramfsFile)
}
