// Package build makes the bcd ramdisk: a Debian kernel image and a reproducible initramfs
// (newc cpio, gzip) holding the static bcd binary as /init, the kernel modules the ramdisk
// needs and their load order. The same inputs always give the same bytes.
//
// Initramfs layout:
//
//	/init                               the bcd binary (PID 1 runs `bcd ramdisk init`)
//	/bin/bcd -> /init
//	/dev/console                        char 5:1, so the kernel gives /init a console
//	/proc /sys /run /tmp /root          mount points
//	/lib/modules/<release>/<name>.ko    modules
//	/lib/modules/<release>/load-order   module file names, one a line, dependencies first
//
// and whatever the --overlay directories hold (AddOverlay), added after these.
package build

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Paths inside the initramfs that the init system reads.
const (
	ModulesDir    = "lib/modules"
	LoadOrderFile = "load-order"
)

// Names of the artefacts Build writes into its output directory.
const (
	KernelFile    = "vmlinuz"
	InitramfsFile = "initramfs.cpio.gz"
)

// Config says what to build.
type Config struct {
	Kernel  TarSource // the kernel package
	Binary  string    // path of the static bcd binary that becomes /init
	Modules []string  // module roots; nil means DefaultModules()
	OutDir  string    // where vmlinuz and initramfs.cpio.gz are written
	// Overlays are directories whose trees are added to the initramfs, in order (AddOverlay):
	// what the operator brings that Debian main does not have (DCGM, the NVIDIA driver).
	Overlays []string
}

// Result describes what Build wrote.
type Result struct {
	Release         string
	KernelPath      string
	InitramfsPath   string
	KernelSHA256    string
	InitramfsSHA256 string
	InitramfsSize   int64
	Modules         []string // in load order
}

// Build reads the kernel package, assembles the initramfs and writes both artefacts.
func Build(ctx context.Context, log *slog.Logger, cfg Config) (Result, error) {
	if cfg.Kernel == nil || cfg.Binary == "" || cfg.OutDir == "" {
		return Result{}, errors.New("building ramdisk: kernel package, binary and output directory are required")
	}
	bin, err := os.ReadFile(cfg.Binary)
	if err != nil {
		return Result{}, fmt.Errorf("building ramdisk: reading binary: %w", err)
	}
	if err := CheckStatic(bin); err != nil {
		return Result{}, fmt.Errorf("building ramdisk: binary %s: %w", cfg.Binary, err)
	}
	roots := cfg.Modules
	if roots == nil {
		roots = DefaultModules()
	}
	k, err := ReadKernel(ctx, cfg.Kernel, roots)
	if err != nil {
		return Result{}, fmt.Errorf("building ramdisk: %w", err)
	}
	a, err := Initramfs(bin, k)
	if err != nil {
		return Result{}, fmt.Errorf("building ramdisk: %w", err)
	}
	for _, dir := range cfg.Overlays {
		if err := AddOverlay(a, dir); err != nil {
			return Result{}, fmt.Errorf("building ramdisk: %w", err)
		}
	}
	var gz bytes.Buffer
	if err := WriteGzip(&gz, a); err != nil {
		return Result{}, fmt.Errorf("building ramdisk: %w", err)
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return Result{}, fmt.Errorf("building ramdisk: %w", err)
	}
	res := Result{
		Release:       k.Release,
		KernelPath:    filepath.Join(cfg.OutDir, KernelFile),
		InitramfsPath: filepath.Join(cfg.OutDir, InitramfsFile),
		InitramfsSize: int64(gz.Len()),
	}
	for _, m := range k.Modules {
		res.Modules = append(res.Modules, m.Name)
	}
	if res.KernelSHA256, err = writeAtomic(res.KernelPath, k.Vmlinuz); err != nil {
		return Result{}, fmt.Errorf("building ramdisk: %w", err)
	}
	if res.InitramfsSHA256, err = writeAtomic(res.InitramfsPath, gz.Bytes()); err != nil {
		return Result{}, fmt.Errorf("building ramdisk: %w", err)
	}
	log.InfoContext(ctx, "ramdisk built", "kernel", k.Release, "modules", len(res.Modules),
		"initramfs_bytes", res.InitramfsSize, "initramfs_sha256", res.InitramfsSHA256)
	return res, nil
}

// Initramfs lays out the archive (see the package documentation).
func Initramfs(binary []byte, k *Kernel) (*Archive, error) {
	a := NewArchive(0)
	steps := []error{
		a.AddFile("init", 0o755, binary),
		a.AddSymlink("bin/bcd", "/init"),
		a.AddCharDev("dev/console", 0o600, 5, 1),
		a.AddDir("proc", 0o555),
		a.AddDir("sys", 0o555),
		a.AddDir("run", 0o755),
		a.AddDir("tmp", 0o1777),
		a.AddDir("root", 0o700),
		a.AddDir("etc", 0o755),
	}
	if err := errors.Join(steps...); err != nil {
		return nil, fmt.Errorf("laying out initramfs: %w", err)
	}
	if k == nil {
		return a, nil
	}
	if k.Release == "" || strings.ContainsAny(k.Release, "/\n") {
		return nil, fmt.Errorf("laying out initramfs: bad kernel release %q", k.Release)
	}
	dir := ModulesDir + "/" + k.Release
	var order strings.Builder
	for _, m := range k.Modules {
		file := m.Name + ".ko"
		if err := a.AddFile(dir+"/"+file, 0o644, m.Data); err != nil {
			return nil, fmt.Errorf("laying out initramfs: %w", err)
		}
		order.WriteString(file + "\n")
	}
	if err := a.AddFile(dir+"/"+LoadOrderFile, 0o644, []byte(order.String())); err != nil {
		return nil, fmt.Errorf("laying out initramfs: %w", err)
	}
	return a, nil
}

// WriteGzip writes the archive gzip-compressed with a fixed header (no name, no mtime), so
// the output depends only on the archive.
func WriteGzip(w io.Writer, a *Archive) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return fmt.Errorf("compressing initramfs: %w", err)
	}
	if _, err := a.WriteTo(zw); err != nil {
		return fmt.Errorf("compressing initramfs: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compressing initramfs: %w", err)
	}
	return nil
}

// CheckStatic refuses anything that is not a statically linked x86-64 ELF executable: a
// dynamic binary would die at once in an initramfs with no libc.
func CheckStatic(bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("built for %s, the ramdisk is x86-64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (build it with CGO_ENABLED=0)")
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}
