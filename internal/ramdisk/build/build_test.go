package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseModinfoSection(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Modinfo
	}{
		{"none", "license=GPL\x00", Modinfo{}},
		{"empty depends", "depends=\x00name=e1000\x00vermagic=6.1.0 SMP\x00", Modinfo{Name: "e1000", Vermagic: "6.1.0 SMP"}},
		{"one", "name=virtio\x00depends=virtio_ring\x00", Modinfo{Name: "virtio", Depends: []string{"virtio_ring"}}},
		{"many, dashes normalised, padding", "\x00\x00depends=virtio_ring,virtio,net-failover\x00\x00name=virtio_net\x00",
			Modinfo{Name: "virtio_net", Depends: []string{"virtio_ring", "virtio", "net_failover"}}},
		{"no equals ignored", "garbage\x00name=x\x00", Modinfo{Name: "x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := parseModinfoSection([]byte(tc.in))
			if got.Name != tc.want.Name || got.Vermagic != tc.want.Vermagic || !slices.Equal(got.Depends, tc.want.Depends) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// fakeModule is a minimal ELF64 relocatable object with a .modinfo section, as far as
// debug/elf needs to read it.
func fakeModule(t *testing.T, modinfo string) []byte {
	t.Helper()
	shstr := "\x00.modinfo\x00.shstrtab\x00"
	const ehsize, shentsize = 64, 64
	info := []byte(modinfo)
	infoOff := uint64(ehsize)
	strOff := infoOff + uint64(len(info))
	shOff := (strOff + uint64(len(shstr)) + 7) &^ 7
	var b bytes.Buffer
	le := binary.LittleEndian
	ident := [16]byte{0x7f, 'E', 'L', 'F', 2, 1, 1}
	b.Write(ident[:])
	binary.Write(&b, le, uint16(1))  // ET_REL
	binary.Write(&b, le, uint16(62)) // EM_X86_64
	binary.Write(&b, le, uint32(1))
	binary.Write(&b, le, uint64(0)) // entry
	binary.Write(&b, le, uint64(0)) // phoff
	binary.Write(&b, le, shOff)
	binary.Write(&b, le, uint32(0))
	binary.Write(&b, le, uint16(ehsize))
	binary.Write(&b, le, uint16(0)) // phentsize
	binary.Write(&b, le, uint16(0)) // phnum
	binary.Write(&b, le, uint16(shentsize))
	binary.Write(&b, le, uint16(3)) // shnum
	binary.Write(&b, le, uint16(2)) // shstrndx
	b.Write(info)
	b.WriteString(shstr)
	b.Write(make([]byte, int(shOff)-b.Len()))
	section := func(name, typ uint32, off, size uint64) {
		binary.Write(&b, le, name)
		binary.Write(&b, le, typ)
		binary.Write(&b, le, uint64(0)) // flags
		binary.Write(&b, le, uint64(0)) // addr
		binary.Write(&b, le, off)
		binary.Write(&b, le, size)
		binary.Write(&b, le, uint32(0))
		binary.Write(&b, le, uint32(0))
		binary.Write(&b, le, uint64(1))
		binary.Write(&b, le, uint64(0))
	}
	section(0, 0, 0, 0)
	section(1, 1, infoOff, uint64(len(info)))  // PROGBITS .modinfo
	section(10, 3, strOff, uint64(len(shstr))) // STRTAB .shstrtab
	return b.Bytes()
}

func TestParseModinfoELF(t *testing.T) {
	mi, err := ParseModinfo(bytes.NewReader(fakeModule(t, "name=virtio_pci\x00depends=virtio_ring,virtio\x00")))
	if err != nil {
		t.Fatal(err)
	}
	if mi.Name != "virtio_pci" || !slices.Equal(mi.Depends, []string{"virtio_ring", "virtio"}) {
		t.Fatalf("got %+v", mi)
	}
	if _, err := ParseModinfo(bytes.NewReader([]byte("not an ELF file at all........................................................"))); err == nil {
		t.Fatal("a non-ELF file parsed")
	}
}

func TestLoadOrder(t *testing.T) {
	virtio := map[string][]string{
		"virtio_ring": nil, "virtio": {"virtio_ring"}, "virtio_pci_legacy_dev": nil, "virtio_pci_modern_dev": nil,
		"virtio_pci": {"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio"},
		"failover":   nil, "net_failover": {"failover"}, "virtio_net": {"virtio_ring", "virtio", "net_failover"},
		"ipmi_msghandler": nil, "ipmi_si": {"ipmi_msghandler"}, "ipmi_devintf": {"ipmi_msghandler"},
	}
	tests := []struct {
		name    string
		deps    map[string][]string
		roots   []string
		want    []string
		wantErr string
	}{
		{"virtio and ipmi", virtio, []string{"virtio_pci", "virtio-net", "ipmi_si", "ipmi_devintf"},
			[]string{"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio", "virtio_pci",
				"failover", "net_failover", "virtio_net", "ipmi_msghandler", "ipmi_si", "ipmi_devintf"}, ""},
		{"root repeated", virtio, []string{"virtio", "virtio"}, []string{"virtio_ring", "virtio"}, ""},
		{"no roots", virtio, nil, nil, ""},
		{"missing root", virtio, []string{"e1000"}, nil, "module e1000: not found"},
		{"missing dependency", map[string][]string{"a": {"b"}}, []string{"a"}, nil, "module b (needed by a): not found"},
		{"cycle", map[string][]string{"a": {"b"}, "b": {"c"}, "c": {"a"}}, []string{"a"}, nil, "cycle: a -> b -> c -> a"},
		{"self cycle", map[string][]string{"a": {"a"}}, []string{"a"}, nil, "cycle: a -> a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadOrder(tc.deps, tc.roots)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	a := NewArchive(0)
	must(t, a.AddFile("init", 0o755, []byte("#!binary")))
	must(t, a.AddFile("lib/modules/6.1.0/x.ko", 0o644, []byte{1, 2, 3}))
	must(t, a.AddSymlink("bin/bcd", "/init"))
	must(t, a.AddCharDev("dev/console", 0o600, 5, 1))
	must(t, a.AddDir("tmp", 0o1777))
	must(t, a.AddFile("empty", 0o644, nil))
	if err := a.AddFile("/init", 0o644, nil); err == nil {
		t.Fatal("duplicate accepted")
	}
	if err := a.AddFile("init/under-a-file", 0o644, nil); err == nil {
		t.Fatal("file under a file accepted")
	}
	if err := a.AddFile("../..", 0o644, nil); err == nil {
		t.Fatal("root accepted")
	}
	var buf bytes.Buffer
	if _, err := a.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Fatalf("archive length %d not 4-aligned", buf.Len())
	}
	got, err := ReadArchive(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		mode uint32
		data string
	}{
		{"bin", TypeDir | 0o755, ""},
		{"bin/bcd", TypeSymlink | 0o777, "/init"},
		{"dev", TypeDir | 0o755, ""},
		{"dev/console", TypeCharDev | 0o600, ""},
		{"empty", TypeRegular | 0o644, ""},
		{"init", TypeRegular | 0o755, "#!binary"},
		{"lib", TypeDir | 0o755, ""},
		{"lib/modules", TypeDir | 0o755, ""},
		{"lib/modules/6.1.0", TypeDir | 0o755, ""},
		{"lib/modules/6.1.0/x.ko", TypeRegular | 0o644, "\x01\x02\x03"},
		{"tmp", TypeDir | 0o1777, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.name || g.Mode != w.mode || string(g.Data) != w.data {
			t.Errorf("entry %d = %s %o %q, want %s %o %q", i, g.Name, g.Mode, g.Data, w.name, w.mode, w.data)
		}
	}
	if c := got[3]; c.Major != 5 || c.Minor != 1 {
		t.Errorf("console device %d:%d, want 5:1", c.Major, c.Minor)
	}

	// Cross-check with GNU cpio when it is installed.
	if cpio, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command(cpio, "-t", "--quiet")
		cmd.Stdin = bytes.NewReader(buf.Bytes())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("cpio -t: %v: %s", err, out)
		}
		names := strings.Fields(string(out))
		if len(names) != len(want) || names[0] != "bin" {
			t.Fatalf("cpio -t listed %v", names)
		}
	}
}

func TestGzipDeterministic(t *testing.T) {
	build := func(order []string) []byte {
		a := NewArchive(0)
		for _, n := range order {
			must(t, a.AddFile(n, 0o644, []byte("content of "+n)))
		}
		var buf bytes.Buffer
		must(t, WriteGzip(&buf, a))
		return buf.Bytes()
	}
	one := build([]string{"a/b", "c", "a/d"})
	two := build([]string{"c", "a/d", "a/b"})
	if sha256.Sum256(one) != sha256.Sum256(two) {
		t.Fatal("same entries added in another order gave different bytes")
	}
	zr, err := gzip.NewReader(bytes.NewReader(one))
	must(t, err)
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Fatalf("gzip header carries mtime %v name %q", zr.ModTime, zr.Name)
	}
	entries, err := ReadArchive(zr)
	must(t, err)
	if len(entries) != 4 {
		t.Fatalf("got %d entries", len(entries))
	}
}

// memTar is a TarSource over an in-memory kernel package.
type memTar struct {
	files map[string][]byte
	opens int
}

func (m *memTar) Open(context.Context) (io.ReadCloser, error) {
	m.opens++
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(m.files))
	for n := range m.files {
		names = append(names, n)
	}
	slices.Sort(names)
	_ = tw.WriteHeader(&tar.Header{Name: "./lib/", Typeflag: tar.TypeDir, Mode: 0o755})
	for _, n := range names {
		_ = tw.WriteHeader(&tar.Header{Name: "./" + n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(m.files[n]))})
		_, _ = tw.Write(m.files[n])
	}
	_ = tw.Close()
	return io.NopCloser(&buf), nil
}

func fakePackage(t *testing.T) *memTar {
	const rel = "6.1.0-99-amd64"
	mod := func(name, deps string) []byte {
		return fakeModule(t, "name="+name+"\x00depends="+deps+"\x00vermagic="+rel+" SMP mod_unload\x00")
	}
	d := "lib/modules/" + rel + "/kernel/drivers/"
	return &memTar{files: map[string][]byte{
		"boot/vmlinuz-" + rel:                                 []byte("bzImage"),
		"boot/config-" + rel:                                  []byte("CONFIG_X=y"),
		d + "virtio/virtio_ring.ko":                           mod("virtio_ring", ""),
		d + "virtio/virtio.ko":                                mod("virtio", "virtio_ring"),
		d + "net/virtio_net.ko":                               mod("virtio_net", "virtio,virtio_ring,net_failover"),
		d + "net/net_failover.ko":                             mod("net_failover", "failover"),
		"lib/modules/" + rel + "/kernel/net/core/failover.ko": mod("failover", ""),
		d + "gpu/huge.ko":                                     mod("huge", ""),
	}}
}

func TestReadKernelAndInitramfs(t *testing.T) {
	pkg := fakePackage(t)
	k, err := ReadKernel(t.Context(), pkg, []string{"virtio_net"})
	must(t, err)
	if k.Release != "6.1.0-99-amd64" || string(k.Vmlinuz) != "bzImage" {
		t.Fatalf("kernel %q %q", k.Release, k.Vmlinuz)
	}
	var names []string
	for _, m := range k.Modules {
		names = append(names, m.Name)
	}
	if want := []string{"virtio_ring", "virtio", "failover", "net_failover", "virtio_net"}; !slices.Equal(names, want) {
		t.Fatalf("modules %v, want %v in dependency order", names, want)
	}
	if pkg.opens != 2 {
		t.Fatalf("package read %d times, want 2", pkg.opens)
	}
	if _, err := ReadKernel(t.Context(), pkg, []string{"nvme"}); err == nil || !strings.Contains(err.Error(), "module nvme: not found") {
		t.Fatalf("missing root: %v", err)
	}

	a, err := Initramfs([]byte("ELF"), k)
	must(t, err)
	var buf bytes.Buffer
	_, err = a.WriteTo(&buf)
	must(t, err)
	entries, err := ReadArchive(&buf)
	must(t, err)
	byName := map[string]Entry{}
	for _, e := range entries {
		byName[e.Name] = e
	}
	order := byName["lib/modules/6.1.0-99-amd64/load-order"]
	if string(order.Data) != "virtio_ring.ko\nvirtio.ko\nfailover.ko\nnet_failover.ko\nvirtio_net.ko\n" {
		t.Fatalf("load-order = %q", order.Data)
	}
	if _, ok := byName["lib/modules/6.1.0-99-amd64/huge.ko"]; ok {
		t.Fatal("a module nobody asked for is in the initramfs")
	}
	if byName["init"].Mode != TypeRegular|0o755 || byName["dev/console"].Mode != TypeCharDev|0o600 || byName["tmp"].Mode != TypeDir|0o1777 {
		t.Fatalf("init %o console %o tmp %o", byName["init"].Mode, byName["dev/console"].Mode, byName["tmp"].Mode)
	}
}

func TestCheckStatic(t *testing.T) {
	self, err := os.Executable()
	must(t, err)
	bin, err := os.ReadFile(self)
	must(t, err)
	// The test binary links the race runtime or cgo net code on some builds; only assert
	// that an ELF is recognised and that garbage is refused.
	_ = CheckStatic(bin)
	if err := CheckStatic([]byte("#!/bin/sh\n")); err == nil {
		t.Fatal("a shell script passed as a static binary")
	}
	if sh, err := os.ReadFile("/bin/sh"); err == nil {
		if err := CheckStatic(sh); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Fatalf("/bin/sh: %v", err)
		}
	}
}

// TestBuildReproducible builds twice from the same inputs and compares the digests.
func TestBuildReproducible(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "./testdata/static")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static binary: %v: %s", err, out)
	}
	var sums [2]string
	for i := range sums {
		res, err := Build(t.Context(), discardLog(), Config{Kernel: fakePackage(t), Binary: bin,
			Modules: []string{"virtio_net"}, OutDir: filepath.Join(dir, "out", string(rune('a'+i)))})
		must(t, err)
		sums[i] = res.InitramfsSHA256
		data, err := os.ReadFile(res.InitramfsPath)
		must(t, err)
		if got := sha256.Sum256(data); hexString(got[:]) != res.InitramfsSHA256 || int64(len(data)) != res.InitramfsSize {
			t.Fatal("result does not describe the file written")
		}
	}
	if sums[0] != sums[1] {
		t.Fatalf("two builds of the same inputs: %s and %s", sums[0], sums[1])
	}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func hexString(b []byte) string { return hex.EncodeToString(b) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
