package osimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"bcd/internal/catalog"
	"bcd/internal/ramdisk/kexec"
)

// requirement fails the test under CI and skips it elsewhere.
func requirement(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI requirement missing: "+format, args...)
	}
	t.Skipf(format, args...)
}

// fakeKernel is a kernel package with only a kernel image (no modules).
type fakeKernel struct{ tarball []byte }

func (f fakeKernel) Open(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(f.tarball)), nil
}

func newFakeKernel(t *testing.T, vmlinuz []byte) fakeKernel {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: "./boot/vmlinuz-6.1.0-99-amd64", Mode: 0o644, Size: int64(len(vmlinuz)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(vmlinuz); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return fakeKernel{b.Bytes()}
}

func staticBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "static")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "../../ramdisk/build/testdata/static")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static binary: %v: %s", err, out)
	}
	return bin
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestBuildLayoutAndDeterminism(t *testing.T) {
	if m := DefaultTools().Missing(); len(m) > 0 {
		requirement(t, "missing %v", m)
	}
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	bin := staticBinary(t)
	vmlinuz := bytes.Repeat([]byte("not really a kernel "), 50000) // 1 MB
	kernel := newFakeKernel(t, vmlinuz)
	cfg := func(out, url string) Config {
		return Config{Kernel: kernel, Binary: bin, Modules: []string{}, OutDir: out, URL: url, Cmdline: "bcd.metadata=http://192.0.2.1:8080/metadata"}
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	const url = "http://192.0.2.1:8080/images/os.img.zst"
	mA, err := Build(ctx, log, cfg(dirA, url))
	if err != nil {
		t.Fatal(err)
	}
	mB, err := Build(ctx, log, cfg(dirB, ""))
	if err != nil {
		t.Fatal(err)
	}

	// Same inputs, same bytes: in another directory, at another time, with another signer.
	if mA.SHA256 != mB.SHA256 || mA.DiskSHA256 != mB.DiskSHA256 || mA.Size != mB.Size {
		t.Errorf("two builds differ: %s/%s vs %s/%s", mA.SHA256, mA.DiskSHA256, mB.SHA256, mB.DiskSHA256)
	}
	img := filepath.Join(dirA, DiskFile)
	if got := fileSHA(t, img); got != mA.DiskSHA256 {
		t.Errorf("os.img sha256 %s, manifest says %s", got, mA.DiskSHA256)
	}
	if got := fileSHA(t, filepath.Join(dirA, CompressedFile)); got != mA.SHA256 {
		t.Errorf("os.img.zst sha256 %s, manifest says %s", got, mA.SHA256)
	}

	// The compressed file decompresses to the disk, and size is the disk's.
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	zf, err := os.Open(filepath.Join(dirA, CompressedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer zf.Close()
	zr, err := zstd.NewReader(zf)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := io.ReadAll(zr)
	zr.Close()
	if err != nil || !bytes.Equal(dec, raw) || int64(len(raw)) != mA.Size {
		t.Fatalf("zstd stream does not give os.img back (err %v, %d vs %d bytes, manifest %d)", err, len(dec), len(raw), mA.Size)
	}

	// Partition table: syslinux's MBR code, one active ESP at 1 MiB up to the end of the disk.
	mbrCode, err := os.ReadFile(DefaultTools().MBR)
	if err != nil {
		t.Fatal(err)
	}
	if n := min(len(mbrCode), 440); !bytes.Equal(raw[:n], mbrCode[:n]) {
		t.Error("the first sector does not start with syslinux's mbr.bin")
	}
	parts, err := ParseMBR(raw[:SectorSize])
	if err != nil {
		t.Fatal(err)
	}
	want := Partition{Active: true, Type: TypeESP, StartLBA: PartitionStart, Sectors: uint32((len(raw) - PartitionStart*SectorSize) / SectorSize)}
	if len(parts) != 1 || parts[0] != want {
		t.Fatalf("partitions %+v, want [%+v]", parts, want)
	}

	// The FAT partition, read with mtools at the partition's offset.
	at := img + "@@" + "1M"
	mt := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1", "TZ=UTC")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		return string(out)
	}
	info := mt("minfo", "-i", at)
	for _, w := range []string{"serial number: B0CD0001", `disk type="FAT16   "`, "hidden sectors: 2048"} {
		if !strings.Contains(info, w) {
			t.Errorf("minfo lacks %q:\n%s", w, info)
		}
	}
	listing := mt("mdir", "-a", "-/", "-i", at, "::/")
	for _, w := range []string{"ldlinux  sys", "ldlinux  c32", "BOOTX64  EFI", "ldlinux  e64", "syslinux cfg", "vmlinuz", "initrd   img", "bcd-os.json", "2024-01-01"} {
		if !strings.Contains(listing, w) {
			t.Errorf("partition lacks %q:\n%s", w, listing)
		}
	}

	// Copy the partition's files out and let kexec find the boot entry in them, as the ramdisk
	// does on the mounted partition.
	tree := t.TempDir()
	mt("mcopy", "-s", "-n", "-i", at, "::/vmlinuz", "::/initrd.img", "::/syslinux", "::/EFI", "::/bcd-os.json", tree)
	target, err := kexec.Find(os.DirFS(tree))
	if err != nil {
		t.Fatalf("kexec finds no entry in the image: %v", err)
	}
	if target.Source != ConfigPath || target.Kernel != KernelPath || len(target.Initrds) != 1 || target.Initrds[0] != InitrdPath ||
		target.Cmdline != BaseCmdline+" bcd.metadata=http://192.0.2.1:8080/metadata" {
		t.Errorf("kexec target %+v", target)
	}
	if got, _ := os.ReadFile(filepath.Join(tree, KernelPath)); !bytes.Equal(got, vmlinuz) {
		t.Error("the kernel on the partition is not the package's")
	}
	efiBin, _ := os.ReadFile(DefaultTools().EFIBinary)
	if got, _ := os.ReadFile(filepath.Join(tree, "EFI", "BOOT", "BOOTX64.EFI")); !bytes.Equal(got, efiBin) {
		t.Error("BOOTX64.EFI is not syslinux.efi")
	}
	initrd, err := os.ReadFile(filepath.Join(tree, InitrdPath))
	if err != nil || len(initrd) < 2 || initrd[0] != 0x1f || initrd[1] != 0x8b {
		t.Errorf("initrd.img is not gzip (%v)", err)
	}

	// Manifest on disk = returned; signed over the URL by the key kept in the directory.
	var onDisk Manifest
	b, err := os.ReadFile(filepath.Join(dirA, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &onDisk); err != nil || onDisk != mA {
		t.Fatalf("manifest file %+v (err %v), Build returned %+v", onDisk, err, mA)
	}
	if mA.Format != "raw" || mA.Compression != "zstd" || mA.Name != DefaultName || mA.Signer != DefaultSigner || mA.URL != url {
		t.Errorf("manifest %+v", mA)
	}
	pub, err := base64.StdEncoding.DecodeString(mA.SignerPublic)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.StdEncoding.DecodeString(mA.Signature)
	if err != nil {
		t.Fatal(err)
	}
	ci := mA.CatalogImage(url)
	ci.Signature = sig
	signers := []catalog.Signer{{Name: DefaultSigner, PublicKey: ed25519.PublicKey(pub)}}
	if err := catalog.Verify(ci, signers); err != nil {
		t.Errorf("the manifest's signature does not verify: %v", err)
	}
	ci.Size++
	if err := catalog.Verify(ci, signers); err == nil {
		t.Error("a changed size still verifies")
	}
	if mB.Signature != "" || mB.URL != "" {
		t.Errorf("signed without a URL: %+v", mB)
	}

	// The signer is made once and kept.
	mA2, err := Build(ctx, log, cfg(dirA, url))
	if err != nil {
		t.Fatal(err)
	}
	if mA2.SignerPublic != mA.SignerPublic || mA2.Signature != mA.Signature {
		t.Error("a second build in the same directory changed the signer or the signature")
	}
	if st, err := os.Stat(filepath.Join(dirA, SignerKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("signer.key: %v %v", st, err)
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	if m := DefaultTools().Missing(); len(m) > 0 {
		requirement(t, "missing %v", m)
	}
	log := slog.New(slog.DiscardHandler)
	script := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	k := newFakeKernel(t, []byte("K"))
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no kernel", Config{Binary: script, OutDir: t.TempDir()}, "required"},
		{"not static", Config{Kernel: k, Binary: script, OutDir: t.TempDir(), Modules: []string{}}, "not an ELF"},
		{"two-line cmdline", Config{Kernel: k, Binary: script, OutDir: t.TempDir(), Cmdline: "a\nb"}, "one line"},
		{"old epoch", Config{Kernel: k, Binary: script, OutDir: t.TempDir(), Epoch: 1}, "before 1980"},
		{"missing tools", Config{Kernel: k, Binary: script, OutDir: t.TempDir(), Tools: Tools{MBR: "/nonexistent/mbr.bin", Mkfs: "no-such-mkfs"}}, "missing /nonexistent/mbr.bin (syslinux-common)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(t.Context(), log, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
