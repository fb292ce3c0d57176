package build

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"strings"
)

// DefaultModules are the modules the ramdisk loads (their dependencies come along): virtio
// devices of QEMU and clouds (virtio_rng too: without RDRAND or a hardware RNG the kernel's
// random pool may take minutes to fill, and key generation waits for it), the disk controllers
// of most servers (a wipe must see every disk: disk.wipe refuses while a mass-storage controller
// has no driver), the NICs of most servers, IPMI, and the FAT filesystem with the code pages
// Debian's kernel mounts it with by default (codepage 437, iocharset ascii; utf8) so that
// kexec can read a boot partition (the NLS modules are loaded by name at mount time, which
// needs no modprobe when they are already loaded).
// Disk controllers: AHCI and legacy-mode (ata_piix) SATA, NVMe and NVMe behind Intel VMD,
// Broadcom/LSI SAS HBAs and tri-mode controllers (mpt3sas, mpi3mr), MegaRAID (megaraid_sas),
// Microchip/Adaptec SmartRAID and HBA (smartpqi, aacraid), HPE Smart Array (hpsa), USB disks
// and SD/eMMC (xhci/ehci with usb-storage and uas; mmc_block with sdhci). Every one is a module
// of Debian 12's kernel; a driver whose hardware is absent loads and stays idle, and one that
// fails to load is logged and skipped.
// scsi_mod, libata, fat and friends are pulled in through depends=.
func DefaultModules() []string {
	return []string{
		"virtio_pci", "virtio_net", "virtio_blk", "virtio_scsi", "virtio_rng",
		"sd_mod", "ahci", "ata_piix", "nvme", "vmd",
		"mpt3sas", "mpi3mr", "megaraid_sas", "smartpqi", "aacraid", "hpsa",
		"xhci_pci", "ehci_pci", "usb_storage", "uas",
		"mmc_block", "sdhci_pci", "sdhci_acpi",
		"e1000", "e1000e", "igb", "ixgbe", "i40e",
		"ipmi_si", "ipmi_devintf",
		"vfat", "nls_cp437", "nls_ascii", "nls_utf8",
	}
}

// TarSource opens the file-system tarball of a kernel package (what `dpkg-deb --fsys-tarfile`
// prints). Each call starts a fresh stream.
type TarSource interface {
	Open(ctx context.Context) (io.ReadCloser, error)
}

// DebPackage reads a Debian binary package through dpkg-deb.
type DebPackage struct{ Path string }

// Open starts `dpkg-deb --fsys-tarfile` on the package.
func (d DebPackage) Open(ctx context.Context) (io.ReadCloser, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", d.Path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.Path, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("reading %s: starting dpkg-deb: %w", d.Path, err)
	}
	return &cmdReader{ReadCloser: out, cmd: cmd, stderr: &stderr, path: d.Path}, nil
}

type cmdReader struct {
	io.ReadCloser
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	path   string
}

// Close drains nothing: it closes the pipe and waits; an early close kills dpkg-deb with
// SIGPIPE, which is not an error of the package.
func (c *cmdReader) Close() error {
	_ = c.ReadCloser.Close()
	err := c.cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) && !exit.Exited() {
		return nil // killed by SIGPIPE after we stopped reading
	}
	if err != nil {
		return fmt.Errorf("reading %s: dpkg-deb: %w: %s", c.path, err, strings.TrimSpace(c.stderr.String()))
	}
	return nil
}

// Module is a kernel module taken from the package.
type Module struct {
	Name    string
	Depends []string
	Data    []byte
}

// Kernel is what the ramdisk needs from a kernel package: the bzImage and the modules to
// load, in load order.
type Kernel struct {
	Release string // e.g. 6.1.0-57-amd64
	Vmlinuz []byte
	Modules []Module
}

// ReadKernel takes the kernel image and the modules named by roots (with everything their
// depends= fields name) out of a kernel package. It reads the tarball twice: once to learn
// every module's dependencies, once to keep only the modules needed.
func ReadKernel(ctx context.Context, src TarSource, roots []string) (*Kernel, error) {
	k := &Kernel{}
	deps := map[string][]string{}
	paths := map[string]string{}
	err := walkTar(ctx, src, func(name string, r io.Reader) error {
		switch {
		case strings.HasPrefix(name, "boot/vmlinuz-"):
			if k.Vmlinuz != nil {
				return fmt.Errorf("two kernel images in the package: %s", name)
			}
			k.Release = strings.TrimPrefix(name, "boot/vmlinuz-")
			data, err := io.ReadAll(r)
			if err != nil {
				return fmt.Errorf("reading %s: %w", name, err)
			}
			k.Vmlinuz = data
		case strings.HasPrefix(name, "lib/modules/") && strings.HasSuffix(name, ".ko"):
			data, err := io.ReadAll(r)
			if err != nil {
				return fmt.Errorf("reading %s: %w", name, err)
			}
			mi, err := ParseModinfo(bytes.NewReader(data))
			if err != nil {
				return fmt.Errorf("module %s: %w", name, err)
			}
			n := mi.Name
			if n == "" {
				n = ModuleName(name)
			}
			if other, dup := paths[n]; dup {
				return fmt.Errorf("module %s found twice: %s and %s", n, other, name)
			}
			deps[n] = mi.Depends
			paths[n] = name
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if k.Vmlinuz == nil {
		return nil, errors.New("reading kernel package: no boot/vmlinuz-* in it")
	}
	order, err := LoadOrder(deps, roots)
	if err != nil {
		return nil, fmt.Errorf("resolving module load order: %w", err)
	}
	for _, n := range order {
		if rel := moduleRelease(paths[n]); rel != k.Release {
			return nil, fmt.Errorf("module %s is for kernel %s, the image is %s", n, rel, k.Release)
		}
	}
	want := map[string]string{} // path → name
	for _, n := range order {
		want[paths[n]] = n
	}
	data := map[string][]byte{}
	err = walkTar(ctx, src, func(name string, r io.Reader) error {
		n, ok := want[name]
		if !ok {
			return nil
		}
		b, err := io.ReadAll(r)
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		data[n] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, n := range order {
		if data[n] == nil {
			return nil, fmt.Errorf("module %s vanished between two reads of the package", n)
		}
		k.Modules = append(k.Modules, Module{Name: n, Depends: deps[n], Data: data[n]})
	}
	return k, nil
}

// moduleRelease returns <release> of lib/modules/<release>/….
func moduleRelease(p string) string {
	rest := strings.TrimPrefix(p, "lib/modules/")
	rel, _, _ := strings.Cut(rest, "/")
	return rel
}

func walkTar(ctx context.Context, src TarSource, fn func(name string, r io.Reader) error) (err error) {
	rc, err := src.Open(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := rc.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	tr := tar.NewReader(rc)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reading kernel package: %w", err)
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading kernel package tarball: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if err := fn(name, tr); err != nil {
			return err
		}
	}
}
