package ramdiskcmd

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/ramdisk/build"
	"bcd/internal/ramdisk/wipe"
)

// TestHiddenCapacityInQEMU runs the wipe's checks for capacity the kernel does not show through
// the real ioctls, on QEMU's devices: an NVMe subsystem with one namespace attached and one
// allocated but detached (the wipe must name namespace 2), and an AHCI disk (IDENTIFY over
// SG_IO; QEMU's has no host protected area, so nothing is found). The ramdisk's /init is a
// probe (testdata/hiddenprobe) that starts as the ramdisk's init does, so the test also shows
// that libata.ignore_hpa=1 on the command line reaches the libata module.
func TestHiddenCapacityInQEMU(t *testing.T) {
	ctx, qemu, root, kernel, initrd := qemuAndRamdisk(t)

	dir := t.TempDir()
	probeInitrd := withProbe(ctx, t, root, initrd, dir, "hiddenprobe")
	disk := func(name string, size int64) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		return p
	}
	vm := exec.CommandContext(ctx, qemu, "-machine", "q35", "-accel", "tcg", "-m", "512", "-nographic",
		"-no-reboot", "-nodefaults", "-serial", "stdio", "-monitor", "none",
		"-kernel", kernel, "-initrd", probeInitrd, "-append", "console=ttyS0 panic=-1 libata.ignore_hpa=1",
		"-device", "nvme-subsys,id=subsys0,nqn=bcd-hidden-test",
		"-device", "nvme,serial=BCDHIDDEN1,subsys=subsys0,id=nvme0",
		"-drive", "file="+disk("ns1.img", 64<<20)+",if=none,id=ns1,format=raw",
		"-device", "nvme-ns,drive=ns1,bus=nvme0,nsid=1",
		"-drive", "file="+disk("ns2.img", 32<<20)+",if=none,id=ns2,format=raw",
		"-device", "nvme-ns,drive=ns2,bus=nvme0,nsid=2,detached=on",
		"-drive", "file="+disk("sata.img", 32<<20)+",if=none,id=sata,format=raw",
		"-device", "ide-hd,drive=sata,bus=ide.0")
	start := time.Now()
	out, err := vm.CombinedOutput() // the probe powers the VM off
	console := string(out)
	if err != nil {
		t.Fatalf("QEMU: %v; console:\n%s", err, console)
	}
	t.Logf("probe ran in %.1fs (TCG)", time.Since(start).Seconds())
	probed := map[string]string{}
	for k, v := range probeLines(t, console) {
		probed[k] = v[len(v)-1]
	}

	var findings []wipe.NVMeFinding
	if err := json.Unmarshal([]byte(probed["findings"]), &findings); err != nil {
		t.Fatalf("NVMe findings %q: %v", probed["findings"], err)
	}
	if len(findings) != 1 || !findings[0].Hidden.Checked || !findings[0].Hidden.Found ||
		!strings.Contains(findings[0].Hidden.Detail, "namespace(s) 2 ") || len(findings[0].Disks) != 1 || findings[0].Disks[0] != "nvme0n1" {
		t.Errorf("NVMe findings %+v, want namespace 2 found hidden beside the disk nvme0n1", findings)
	}
	var sata wipe.HiddenCapacity
	if err := json.Unmarshal([]byte(probed["hidden:sda"]), &sata); err != nil {
		t.Fatalf("the AHCI disk's check %q: %v; console:\n%s", probed["hidden:sda"], err, console)
	}
	if !sata.Checked || sata.Found {
		t.Errorf("the AHCI disk's check %+v, want checked (IDENTIFY over SG_IO) and nothing found", sata)
	}
	if got := strings.TrimSpace(probed["libata.ignore_hpa"]); got != "1" {
		t.Errorf("libata's ignore_hpa = %q, want 1: the command line's module parameter did not reach the module", got)
	}
}

// withProbe is the ramdisk initrd with testdata/NAME built as its /init: a second archive after
// the ramdisk's replaces its /init (the kernel unpacks them in order), the modules stay.
func withProbe(ctx context.Context, t *testing.T, root, initrd, dir, name string) string {
	t.Helper()
	probe := filepath.Join(dir, name)
	gb := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-o", probe, "./internal/ramdisk/ramdiskcmd/testdata/"+name)
	gb.Dir = root
	gb.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := gb.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	a := build.NewArchive(0)
	if err := a.AddFile("init", 0o755, bin); err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(initrd)
	if err != nil {
		t.Fatal(err)
	}
	var extra bytes.Buffer
	zw := gzip.NewWriter(&extra)
	if _, err := a.WriteTo(zw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name+".initrd")
	if err := os.WriteFile(out, append(base, extra.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// probeLines are a probe's console lines "PROBE KEY VALUE" (or KEY=VALUE) by key; the lines
// "PROBE error …" are test errors.
func probeLines(t *testing.T, console string) map[string][]string {
	t.Helper()
	probed := map[string][]string{}
	for _, line := range strings.Split(console, "\n") {
		line = strings.TrimRight(line, "\r")
		rest, ok := strings.CutPrefix(line, "PROBE ")
		if !ok {
			continue
		}
		if strings.HasPrefix(rest, "error") {
			t.Errorf("the probe: %s", rest)
			continue
		}
		k, v, _ := strings.Cut(rest, " ")
		if k2, v2, ok := strings.Cut(rest, "="); ok && !strings.Contains(k2, " ") {
			k, v = k2, v2
		}
		probed[k] = append(probed[k], v)
	}
	if _, ok := probed["done"]; !ok {
		t.Fatalf("the probe did not finish; console:\n%s", console)
	}
	return probed
}
