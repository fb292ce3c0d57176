package ramdiskcmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"bcd/internal/ramdisk/wipe"
)

// TestSecureWipeInQEMU runs the retire's wipe (mode secure) through the ramdisk's own code path
// and the real kernel interfaces on QEMU's three kinds of disk: NVMe (admin pass-through:
// Identify, and sanitize / format where the controller offers them), virtio-blk (discard, write
// zeroes) and AHCI (ATA IDENTIFY / security over SG_IO). Each disk image is filled with a pattern
// first; afterwards every disk's result must have passed its read-back, and the host reads each
// image file whole: every byte must be zero. The methods each disk fell through are logged.
func TestSecureWipeInQEMU(t *testing.T) {
	ctx, qemu, root, kernel, initrd := qemuAndRamdisk(t)
	dir := t.TempDir()
	probeInitrd := withProbe(ctx, t, root, initrd, dir, "wipeprobe")
	pattern := bytes.Repeat([]byte("bcd-secure-wipe!"), 1<<16) // 1 MiB, no zero byte
	disk := func(name string, size int64) string {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		for off := int64(0); off < size; off += int64(len(pattern)) {
			if _, err := f.WriteAt(pattern, off); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	disks := map[string]string{ // the kernel's name → the image behind it
		"nvme0n1": disk("nvme.img", 48<<20),
		"vda":     disk("virtio.img", 32<<20),
		"sda":     disk("sata.img", 32<<20),
	}
	vm := exec.CommandContext(ctx, qemu, "-machine", "q35", "-accel", "tcg", "-m", "512", "-nographic",
		"-no-reboot", "-nodefaults", "-serial", "stdio", "-monitor", "none",
		"-kernel", kernel, "-initrd", probeInitrd,
		"-append", fmt.Sprintf("console=ttyS0 panic=-1 bcd.probe.wipe=secure bcd.probe.disks=%d", len(disks)),
		"-drive", "file="+disks["nvme0n1"]+",if=none,id=nvm,format=raw",
		"-device", "nvme,serial=BCDSECURE1,drive=nvm",
		"-drive", "file="+disks["vda"]+",if=none,id=vblk,format=raw",
		"-device", "virtio-blk-pci,drive=vblk",
		"-drive", "file="+disks["sda"]+",if=none,id=sata,format=raw",
		"-device", "ide-hd,drive=sata,bus=ide.0")
	start := time.Now()
	out, err := vm.CombinedOutput() // the probe powers the VM off
	console := string(out)
	if err != nil {
		t.Fatalf("QEMU: %v; console:\n%s", err, console)
	}
	t.Logf("probe ran in %.1fs (TCG)", time.Since(start).Seconds())
	probed := probeLines(t, console)
	if e := probed["wipe"]; len(e) > 0 {
		t.Errorf("the wipe failed: %s", e)
	}
	seen := map[string]bool{}
	for _, line := range probed["result"] {
		var r wipe.Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("result %q: %v", line, err)
		}
		name := filepath.Base(r.Device)
		seen[name] = true
		var tried []string
		for _, a := range r.Attempts {
			tried = append(tried, fmt.Sprintf("%s(ok=%t notSupported=%t %s)", a.Method, a.OK, a.NotSupported, a.Error))
		}
		t.Logf("%s: method %s, zero fill %q, host wrote %d bytes, flushed %t, %d bytes read back; tried %v; capabilities %+v",
			name, r.Method, r.ZeroFill, r.BytesWritten, r.Flushed, r.Verification.BytesChecked, tried, r.Capabilities)
		if r.Mode != wipe.ModeSecure || !r.Passed() {
			t.Errorf("%s: mode %s, passed %t, error %q, verification %+v", name, r.Mode, r.Passed(), r.Error, r.Verification)
		}
	}
	for name, img := range disks {
		if !seen[name] {
			t.Errorf("no wipe result for %s; console:\n%s", name, console)
			continue
		}
		b, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range b {
			if c != 0 {
				t.Errorf("%s: byte %d of its image is %#x after the secure wipe, want every byte zero", name, i, c)
				break
			}
		}
	}
}
