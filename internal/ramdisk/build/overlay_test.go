package build

import (
	"bytes"
	"compress/gzip"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// tree writes files (name → content; a trailing "/" makes a directory, "->target" a symlink)
// under a new directory, with modes.
func tree(t *testing.T, files map[string]string, modes map[string]fs.FileMode) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(name, "/")))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		switch {
		case strings.HasSuffix(name, "/"):
			must(t, os.MkdirAll(p, 0o755))
		case strings.HasPrefix(content, "->"):
			must(t, os.Symlink(strings.TrimPrefix(content, "->"), p))
		default:
			must(t, os.WriteFile(p, []byte(content), 0o644))
		}
	}
	for name, m := range modes {
		must(t, os.Chmod(filepath.Join(root, filepath.FromSlash(name)), m))
	}
	return root
}

func entriesOf(t *testing.T, a *Archive) map[string]Entry {
	t.Helper()
	var buf bytes.Buffer
	_, err := a.WriteTo(&buf)
	must(t, err)
	entries, err := ReadArchive(&buf)
	must(t, err)
	out := map[string]Entry{}
	for _, e := range entries {
		out[e.Name] = e
	}
	return out
}

const rel = "6.1.0-99-amd64"

func baseArchive(t *testing.T) *Archive {
	t.Helper()
	a, err := Initramfs([]byte("ELF"), &Kernel{Release: rel, Modules: []Module{{Name: "virtio", Data: []byte("ko")}}})
	must(t, err)
	return a
}

// What a DCGM overlay looks like: binaries, libraries with their version links, the driver's
// modules, a setuid helper; directories the ramdisk has keep their modes.
func TestOverlayAddsTheTree(t *testing.T) {
	dcgm := tree(t, map[string]string{
		"usr/bin/dcgmi":                              "dcgmi",
		"usr/bin/nv-hostengine":                      "hostengine",
		"usr/lib/x86_64-linux-gnu/libdcgm.so.4":      "lib",
		"usr/lib/x86_64-linux-gnu/libdcgm.so":        "->libdcgm.so.4",
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "->/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.1",
		"usr/libexec/datacenter-gpu-manager-4/":      "",
		"usr/sbin/helper":                            "suid",
		"etc/dcgm.conf":                              "conf",
		"tmp/":                                       "",
		"lib/modules/" + rel + "/updates/nvidia.ko":  "nvidia",
	}, map[string]fs.FileMode{"usr/bin/dcgmi": 0o755, "usr/sbin/helper": 0o755 | fs.ModeSetuid, "etc": 0o700, "tmp": 0o755, "usr/libexec/datacenter-gpu-manager-4": 0o750})
	driver := tree(t, map[string]string{"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.1": "nvml"}, nil)
	a := baseArchive(t)
	must(t, AddOverlay(a, dcgm))
	must(t, AddOverlay(a, driver)) // a second overlay adds into the same directories
	got := entriesOf(t, a)
	for _, c := range []struct {
		name string
		mode uint32
		data string
	}{
		{"usr/bin/dcgmi", TypeRegular | 0o755, "dcgmi"},
		{"usr/bin/nv-hostengine", TypeRegular | 0o644, "hostengine"},
		{"usr/lib/x86_64-linux-gnu/libdcgm.so", TypeSymlink | 0o777, "libdcgm.so.4"},
		{"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", TypeSymlink | 0o777, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.1"},
		{"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.1", TypeRegular | 0o644, "nvml"},
		{"usr/libexec/datacenter-gpu-manager-4", TypeDir | 0o750, ""},
		{"usr/sbin/helper", TypeRegular | 0o4755, "suid"},
		{"etc", TypeDir | 0o755, ""},  // the ramdisk's
		{"tmp", TypeDir | 0o1777, ""}, // the ramdisk's
		{"etc/dcgm.conf", TypeRegular | 0o644, "conf"},
		{"lib/modules/" + rel + "/updates/nvidia.ko", TypeRegular | 0o644, "nvidia"},
		{"init", TypeRegular | 0o755, "ELF"},
		{"lib/modules/" + rel + "/load-order", TypeRegular | 0o644, "virtio.ko\n"},
	} {
		e, ok := got[c.name]
		if !ok {
			t.Errorf("%s missing", c.name)
			continue
		}
		if e.Mode != c.mode || string(e.Data) != c.data {
			t.Errorf("%s: mode %o data %q, want %o %q", c.name, e.Mode, e.Data, c.mode, c.data)
		}
	}
	// Deterministic: the same overlays give the same bytes.
	b := baseArchive(t)
	must(t, AddOverlay(b, dcgm))
	must(t, AddOverlay(b, driver))
	var x, y bytes.Buffer
	_, err := a.WriteTo(&x)
	must(t, err)
	_, err = b.WriteTo(&y)
	must(t, err)
	if !bytes.Equal(x.Bytes(), y.Bytes()) {
		t.Error("the same overlays gave different archives")
	}
	// A root given through a symlink is the directory it names.
	link := filepath.Join(t.TempDir(), "dcgm")
	must(t, os.Symlink(driver, link))
	c := baseArchive(t)
	must(t, AddOverlay(c, link))
	if e := entriesOf(t, c)["usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.1"]; string(e.Data) != "nvml" {
		t.Errorf("overlay through a symlink: %+v", e)
	}
}

func TestOverlayRefusals(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"the bcd binary", map[string]string{"init": "evil"}, "init: would replace the ramdisk's /init (the bcd binary)"},
		{"a directory in place of /init", map[string]string{"init/x": "x"}, "init: would replace the ramdisk's /init"},
		{"the link to bcd", map[string]string{"bin/bcd": "evil"}, "bin/bcd: would replace /bin/bcd"},
		{"the link to bcd as a link", map[string]string{"bin/bcd": "->/usr/bin/other"}, "bin/bcd: would replace /bin/bcd"},
		{"the console", map[string]string{"dev/console": "x"}, "dev/console: already in the ramdisk"},
		{"a load order naming a module the overlay lacks", map[string]string{"lib/modules/" + rel + "/load-order": "nvidia.ko\n"}, "lib/modules/" + rel + "/load-order: module nvidia.ko is not in the overlay (put the file at lib/modules/" + rel + "/nvidia.ko)"},
		{"a load order listing a module twice", map[string]string{"lib/modules/" + rel + "/load-order": "virtio.ko\n"}, "load-order: module virtio.ko is listed already"},
		{"a load order with a path", map[string]string{"lib/modules/" + rel + "/load-order": "updates/nvidia.ko\n", "lib/modules/" + rel + "/updates/nvidia.ko": "x"}, `load order line 1: "updates/nvidia.ko" is not a module file name`},
		{"a load order as a link", map[string]string{"lib/modules/" + rel + "/load-order": "->/etc/order"}, "load-order: already in the ramdisk"},
		{"a built-in module", map[string]string{"lib/modules/" + rel + "/virtio.ko": "x"}, "virtio.ko: already in the ramdisk"},
		{"a directory over a file", map[string]string{"lib/modules/" + rel + "/load-order/x": "x"}, "load-order: already in the ramdisk"},
		{"bin made a link", map[string]string{"bin": "->/usr/bin"}, "bin: already in the ramdisk"},
		{"a link climbing out", map[string]string{"usr/lib/x": "->../../../etc/shadow"}, `usr/lib/x: symlink to "../../../etc/shadow" points outside the ramdisk's root`},
		{"a link to the parent of the root", map[string]string{"up": "->.."}, `up: symlink to ".." points outside`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := tree(t, c.files, nil)
			err := AddOverlay(baseArchive(t), root)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "overlay "+root) {
				t.Fatalf("%v, want %q", err, c.want)
			}
		})
	}
	t.Run("the same file in two overlays", func(t *testing.T) {
		a := baseArchive(t)
		must(t, AddOverlay(a, tree(t, map[string]string{"usr/bin/dcgmi": "one"}, nil)))
		err := AddOverlay(a, tree(t, map[string]string{"usr/bin/dcgmi": "two"}, nil))
		if err == nil || !strings.Contains(err.Error(), "usr/bin/dcgmi: already in the ramdisk (built in, or from an earlier overlay)") {
			t.Fatal(err)
		}
	})
	t.Run("special files", func(t *testing.T) {
		root := t.TempDir()
		must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600))
		if err := AddOverlay(baseArchive(t), root); err == nil || !strings.Contains(err.Error(), "fifo: is a FIFO: an overlay holds only files, directories and symlinks") {
			t.Fatalf("fifo: %v", err)
		}
		root = t.TempDir()
		l, err := net.Listen("unix", filepath.Join(root, "sock"))
		must(t, err)
		defer l.Close()
		if err := AddOverlay(baseArchive(t), root); err == nil || !strings.Contains(err.Error(), "sock: is a socket") {
			t.Fatalf("socket: %v", err)
		}
		root = t.TempDir()
		if err := syscall.Mknod(filepath.Join(root, "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
			t.Logf("no device node made (%v): the character device case is covered by typeName", err)
		} else if err := AddOverlay(baseArchive(t), root); err == nil || !strings.Contains(err.Error(), "null: is a character device") {
			t.Fatalf("device: %v", err)
		}
	})
	t.Run("not a directory", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		must(t, os.WriteFile(f, nil, 0o644))
		for _, root := range []string{f, filepath.Join(t.TempDir(), "absent")} {
			if err := AddOverlay(baseArchive(t), root); err == nil || !strings.Contains(err.Error(), "overlay "+root) {
				t.Errorf("%s: %v", root, err)
			}
		}
	})
}

// A GPU driver's modules load after the ramdisk's: the overlay's load order is appended to the
// ramdisk's for that kernel release, in the overlay's order; one for another release is a file.
func TestOverlayLoadOrderAppends(t *testing.T) {
	a := baseArchive(t)
	must(t, AddOverlay(a, tree(t, map[string]string{
		"lib/modules/" + rel + "/nvidia.ko":     "nvidia",
		"lib/modules/" + rel + "/nvidia-uvm.ko": "uvm",
		"lib/modules/" + rel + "/load-order":    "# the driver\nnvidia.ko\n\nnvidia-uvm.ko\n",
		"lib/modules/6.12.0-1-amd64/load-order": "other.ko\n",
		"lib/modules/6.12.0-1-amd64/other.ko":   "x",
	}, nil)))
	got := entriesOf(t, a)
	if o := got["lib/modules/"+rel+"/load-order"]; string(o.Data) != "virtio.ko\nnvidia.ko\nnvidia-uvm.ko\n" || o.Mode != TypeRegular|0o644 {
		t.Errorf("load order %q mode %o", o.Data, o.Mode)
	}
	if o := got["lib/modules/6.12.0-1-amd64/load-order"]; string(o.Data) != "other.ko\n" {
		t.Errorf("another release's load order %q", o.Data)
	}
	// A second overlay appends after the first's; what it lists again is refused.
	must(t, AddOverlay(a, tree(t, map[string]string{"lib/modules/" + rel + "/load-order": "nvidia-drm.ko\n", "lib/modules/" + rel + "/nvidia-drm.ko": "drm"}, nil)))
	if o := entriesOf(t, a)["lib/modules/"+rel+"/load-order"]; string(o.Data) != "virtio.ko\nnvidia.ko\nnvidia-uvm.ko\nnvidia-drm.ko\n" {
		t.Errorf("after two overlays: %q", o.Data)
	}
	err := AddOverlay(a, tree(t, map[string]string{"lib/modules/" + rel + "/load-order": "nvidia.ko\n"}, nil))
	if err == nil || !strings.Contains(err.Error(), "module nvidia.ko is listed already") {
		t.Errorf("listed twice: %v", err)
	}
	for name, want := range map[string]bool{
		"lib/modules/" + rel + "/load-order": true, "lib/modules/load-order": false, "lib/modules/a/b/load-order": false,
		"load-order": false, "lib/modules/" + rel + "/load-order.d": false, "x/lib/modules/r/load-order": false,
	} {
		if isLoadOrder(name) != want {
			t.Errorf("isLoadOrder(%q) = %v", name, !want)
		}
	}
}

func TestTypeName(t *testing.T) {
	for m, want := range map[fs.FileMode]string{
		fs.ModeDevice | fs.ModeCharDevice: "character device",
		fs.ModeDevice:                     "block device",
		fs.ModeNamedPipe:                  "FIFO",
		fs.ModeSocket:                     "socket",
		fs.ModeIrregular:                  "special file",
	} {
		if got := typeName(m); !strings.HasPrefix(got, want) {
			t.Errorf("typeName(%v) = %q, want %q", m, got, want)
		}
	}
}

// Build adds the overlays (bcd ramdisk build --overlay) and stops at a refused one.
func TestBuildWithOverlays(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "./testdata/static")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static binary: %v: %s", err, out)
	}
	one := tree(t, map[string]string{"usr/bin/dcgmi": "dcgmi"}, map[string]fs.FileMode{"usr/bin/dcgmi": 0o755})
	two := tree(t, map[string]string{"usr/bin/nv-hostengine": "he"}, nil)
	res, err := Build(t.Context(), discardLog(), Config{Kernel: fakePackage(t), Binary: bin, Modules: []string{"virtio_net"},
		OutDir: filepath.Join(dir, "out"), Overlays: []string{one, two}})
	must(t, err)
	f, err := os.Open(res.InitramfsPath)
	must(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	must(t, err)
	entries, err := ReadArchive(zr)
	must(t, err)
	got := map[string]Entry{}
	for _, e := range entries {
		got[e.Name] = e
	}
	if e := got["usr/bin/dcgmi"]; e.Mode != TypeRegular|0o755 || string(e.Data) != "dcgmi" {
		t.Errorf("dcgmi %+v", e)
	}
	if e := got["usr/bin/nv-hostengine"]; string(e.Data) != "he" {
		t.Errorf("nv-hostengine %+v", e)
	}
	bad := tree(t, map[string]string{"init": "not bcd"}, nil)
	_, err = Build(t.Context(), discardLog(), Config{Kernel: fakePackage(t), Binary: bin, Modules: []string{"virtio_net"},
		OutDir: filepath.Join(dir, "bad"), Overlays: []string{one, bad}})
	if err == nil || !strings.Contains(err.Error(), "building ramdisk: overlay "+bad+": init: would replace the ramdisk's /init") {
		t.Fatalf("overlay replacing /init: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "bad", InitramfsFile)); !os.IsNotExist(err) {
		t.Errorf("a refused build wrote %s: %v", InitramfsFile, err)
	}
}
