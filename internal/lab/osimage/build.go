package osimage

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"bcd/internal/catalog"
	"bcd/internal/ramdisk/build"
)

// Names of what Build writes into its output directory.
const (
	DiskFile       = "os.img"
	CompressedFile = "os.img.zst"
	ManifestFile   = "manifest.json"
	SignerKeyFile  = "signer.key"
	SignerPubFile  = "signer.pub"
)

// Defaults.
const (
	DefaultName   = "bcd-lab-os"
	DefaultSigner = "lab"
	// DefaultEpoch is the time stamped on every file of the image: 2024-01-01T00:00:00Z.
	DefaultEpoch = 1704067200
)

// Tools are the host files and programs the build uses (Debian: syslinux, syslinux-common,
// syslinux-efi, mtools, dosfstools).
type Tools struct {
	MBR        string // syslinux's mbr.bin
	EFIBinary  string // syslinux.efi (x86-64)
	EFILdlinux string // ldlinux.e64
	Mkfs       string // mkfs.fat
	Mmd        string // mtools' mmd
	Mcopy      string // mtools' mcopy
	Syslinux   string // the mtools-based syslinux installer
}

// DefaultTools are Debian's paths.
func DefaultTools() Tools {
	return Tools{
		MBR:        "/usr/lib/syslinux/mbr/mbr.bin",
		EFIBinary:  "/usr/lib/SYSLINUX.EFI/efi64/syslinux.efi",
		EFILdlinux: "/usr/lib/syslinux/modules/efi64/ldlinux.e64",
		Mkfs:       "mkfs.fat",
		Mmd:        "mmd",
		Mcopy:      "mcopy",
		Syslinux:   "syslinux",
	}
}

// Missing names the tools that are not installed, with the Debian package of each.
func (t Tools) Missing() []string {
	var out []string
	for _, f := range []struct{ path, pkg string }{{t.MBR, "syslinux-common"}, {t.EFIBinary, "syslinux-efi"}, {t.EFILdlinux, "syslinux-efi"}} {
		if _, err := os.Stat(f.path); err != nil {
			out = append(out, f.path+" ("+f.pkg+")")
		}
	}
	for _, p := range []struct{ name, pkg string }{{t.Mkfs, "dosfstools"}, {t.Mmd, "mtools"}, {t.Mcopy, "mtools"}, {t.Syslinux, "syslinux"}} {
		if _, err := lookPath(p.name); err != nil {
			out = append(out, p.name+" ("+p.pkg+")")
		}
	}
	return out
}

// lookPath finds a program in PATH or in the sbin directories (mkfs.fat lives in /usr/sbin,
// which a non-root PATH may lack).
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if !strings.Contains(name, "/") {
		for _, d := range []string{"/usr/sbin", "/sbin"} {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s: not found", name)
}

// Config says what to build.
type Config struct {
	Kernel  build.TarSource // the Debian kernel package (the ramdisk's)
	Binary  string          // the static bcd that becomes /init
	Modules []string        // module roots; nil: build.DefaultModules()
	OutDir  string
	Name    string // catalog name; default DefaultName
	Cmdline string // appended to BaseCmdline
	// PartitionType is the MBR type of the FAT partition; default TypeESP.
	PartitionType byte
	Epoch         int64 // timestamps inside the image; default DefaultEpoch
	Tools         Tools // zero: DefaultTools()
	// Signer names the catalog signer; its key pair is OutDir/signer.key and .pub, made on the
	// first build and kept. Default DefaultSigner.
	Signer string
	// URL, when set, is where the compressed image will be served: the manifest then carries a
	// catalog signature over it (the signature covers the URL).
	URL string
}

// Manifest is what `bcd image add` needs, written as OutDir/manifest.json.
type Manifest struct {
	Name        string `json:"name"`
	File        string `json:"file"`        // the artifact to serve: os.img.zst
	Format      string `json:"format"`      // raw
	Compression string `json:"compression"` // zstd
	// Size is the disk image's size once written (the bytes deploy.image checks it wrote).
	Size int64 `json:"size"`
	// SHA256 is the digest of the served file (os.img.zst): what deploy.image verifies while
	// streaming.
	SHA256          string `json:"sha256"`
	FileSize        int64  `json:"fileSize"` // bytes of os.img.zst
	DiskFile        string `json:"diskFile"` // os.img (uncompressed, for booting it directly)
	DiskSHA256      string `json:"diskSha256"`
	KernelRelease   string `json:"kernelRelease"`
	Cmdline         string `json:"cmdline"`
	PartitionType   string `json:"partitionType"`
	Signer          string `json:"signer"`
	SignerKeyFile   string `json:"signerKeyFile"`   // relative to the manifest
	SignerPubFile   string `json:"signerPubFile"`   // idem
	SignerPublic    string `json:"signerPublicKey"` // base64, as bcd signer keygen writes it
	URL             string `json:"url,omitempty"`
	Signature       string `json:"signature,omitempty"` // base64 catalog signature, with url
	PartitionOffset int64  `json:"partitionOffset"`     // bytes from the disk's start to the FAT partition
}

// Build makes the initramfs, the FAT partition and the disk, compresses it, and writes the
// manifest (and the signer's key pair when absent).
func Build(ctx context.Context, log *slog.Logger, cfg Config) (Manifest, error) {
	if cfg.Kernel == nil || cfg.Binary == "" || cfg.OutDir == "" {
		return Manifest{}, errors.New("building the lab OS image: kernel package, binary and output directory are required")
	}
	cfg.Name = cmp.Or(cfg.Name, DefaultName)
	cfg.Signer = cmp.Or(cfg.Signer, DefaultSigner)
	if cfg.PartitionType == 0 {
		cfg.PartitionType = TypeESP
	}
	if cfg.Epoch == 0 {
		cfg.Epoch = DefaultEpoch
	}
	if cfg.Epoch < 315532800 { // DOS dates start in 1980
		return Manifest{}, fmt.Errorf("building the lab OS image: epoch %d is before 1980 (FAT cannot store it)", cfg.Epoch)
	}
	if cfg.Tools == (Tools{}) {
		cfg.Tools = DefaultTools()
	}
	if m := cfg.Tools.Missing(); len(m) > 0 {
		return Manifest{}, fmt.Errorf("building the lab OS image: missing %s (apt-get install --no-install-recommends syslinux syslinux-common syslinux-efi mtools dosfstools)", strings.Join(m, ", "))
	}
	if strings.ContainsAny(cfg.Cmdline, "\n\r") {
		return Manifest{}, errors.New("building the lab OS image: the extra command line must be one line")
	}
	bin, err := os.ReadFile(cfg.Binary)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: reading the binary: %w", err)
	}
	if err := build.CheckStatic(bin); err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: binary %s: %w", cfg.Binary, err)
	}
	roots := cfg.Modules
	if roots == nil {
		roots = build.DefaultModules()
	}
	k, err := build.ReadKernel(ctx, cfg.Kernel, roots)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	a, err := build.Initramfs(bin, k)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	var initrd bytes.Buffer
	if err := build.WriteGzip(&initrd, a); err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	work, err := os.MkdirTemp(cfg.OutDir, ".build-*")
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	defer os.RemoveAll(work)

	efi, err := os.ReadFile(cfg.Tools.EFIBinary)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	efiLd, err := os.ReadFile(cfg.Tools.EFILdlinux)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	marker, _ := json.Marshal(map[string]string{"name": cfg.Name, "kernelRelease": k.Release,
		"stateDir": "/" + StateDir})
	files := []fatFile{
		{KernelPath, k.Vmlinuz},
		{InitrdPath, initrd.Bytes()},
		{ConfigPath, []byte(SyslinuxConfig(cfg.Cmdline))},
		{EFIBootPath, efi},
		{EFILdlinuxPath, efiLd},
		{MarkerPath, append(marker, '\n')},
	}
	var payload int64 = 256 << 10 // ldlinux.sys + ldlinux.c32
	for _, f := range files {
		payload += int64(len(f.data))
	}
	partMiB := PartitionMiB(payload)
	part := filepath.Join(work, "part.img")
	if err := makeFAT(ctx, cfg, part, partMiB, work, files); err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	mbrCode, err := os.ReadFile(cfg.Tools.MBR)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	if len(mbrCode) > mbrBootCodeSize {
		mbrCode = mbrCode[:mbrBootCodeSize]
	}
	sectors := uint32(partMiB << 20 / SectorSize)
	mbr, err := MBR(mbrCode, Partition{Active: true, Type: cfg.PartitionType, StartLBA: PartitionStart, Sectors: sectors})
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	diskTmp := filepath.Join(work, DiskFile)
	diskSum, diskSize, err := assemble(diskTmp, mbr, part)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	zstTmp := filepath.Join(work, CompressedFile)
	zSum, zSize, err := compress(ctx, diskTmp, zstTmp)
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	pub, key, err := EnsureSigner(filepath.Join(cfg.OutDir, SignerKeyFile), filepath.Join(cfg.OutDir, SignerPubFile))
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	m := Manifest{
		Name: cfg.Name, File: CompressedFile, Format: "raw", Compression: "zstd",
		Size: diskSize, SHA256: zSum, FileSize: zSize, DiskFile: DiskFile, DiskSHA256: diskSum,
		KernelRelease: k.Release, Cmdline: strings.TrimSpace(BaseCmdline + " " + strings.TrimSpace(cfg.Cmdline)),
		PartitionType: fmt.Sprintf("0x%02X", cfg.PartitionType),
		Signer:        cfg.Signer, SignerKeyFile: SignerKeyFile, SignerPubFile: SignerPubFile,
		SignerPublic: base64.StdEncoding.EncodeToString(pub), PartitionOffset: PartitionStart * SectorSize,
	}
	if cfg.URL != "" {
		img := m.CatalogImage(cfg.URL)
		if err := catalog.Check(img); err != nil {
			return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
		}
		m.URL = cfg.URL
		m.Signature = base64.StdEncoding.EncodeToString(catalog.Sign(img, key))
	}
	mj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	mjTmp := filepath.Join(work, ManifestFile)
	if err := os.WriteFile(mjTmp, append(mj, '\n'), 0o644); err != nil {
		return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
	}
	for _, name := range []string{DiskFile, CompressedFile, ManifestFile} {
		if err := os.Rename(filepath.Join(work, name), filepath.Join(cfg.OutDir, name)); err != nil {
			return Manifest{}, fmt.Errorf("building the lab OS image: %w", err)
		}
	}
	log.InfoContext(ctx, "lab OS image built", "dir", cfg.OutDir, "kernel", k.Release, "disk_bytes", diskSize,
		"zst_bytes", zSize, "sha256", zSum, "disk_sha256", diskSum)
	return m, nil
}

// CatalogImage is the catalog entry of the image served at url.
func (m Manifest) CatalogImage(url string) catalog.Image {
	return catalog.Image{Name: m.Name, URL: url, Size: m.Size, Format: m.Format, Compression: m.Compression,
		SHA256: m.SHA256, Signer: m.Signer}
}

// fatFile is one file to put on the partition (path without a leading slash).
type fatFile struct {
	path string
	data []byte
}

// makeFAT formats path as FAT16 (fixed volume id, label, hidden sectors = the partition's
// start), copies files in with fixed timestamps and installs BIOS syslinux.
func makeFAT(ctx context.Context, cfg Config, path string, mib int64, work string, files []fatFile) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.Truncate(mib << 20); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	t := cfg.Tools
	env := append(os.Environ(), "MTOOLS_SKIP_CHECK=1", "TZ=UTC", "SOURCE_DATE_EPOCH="+strconv.FormatInt(cfg.Epoch, 10))
	run := func(name string, args ...string) error {
		p, err := lookPath(name)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, p, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
		}
		return nil
	}
	if err := run(t.Mkfs, "--invariant", "-F", "16", "-i", fmt.Sprintf("%08x", VolumeID), "-n", VolumeLabel,
		"-h", strconv.Itoa(PartitionStart), path); err != nil {
		return err
	}
	img := "-i" + path
	if err := run(t.Mmd, img, "::/"+SyslinuxDir, "::/EFI", "::/"+EFIDir); err != nil {
		return err
	}
	stamp := time.Unix(cfg.Epoch, 0)
	staging := filepath.Join(work, "files")
	for _, fl := range files {
		src := filepath.Join(staging, filepath.FromSlash(fl.path))
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(src, fl.data, 0o644); err != nil {
			return err
		}
		if err := os.Chtimes(src, stamp, stamp); err != nil {
			return err
		}
		if err := run(t.Mcopy, "-m", img, src, "::/"+fl.path); err != nil {
			return err
		}
	}
	return run(t.Syslinux, "--install", "--directory", "/"+SyslinuxDir, path)
}

// assemble writes the MBR, the gap up to the partition and the partition into path and
// returns its digest and size.
func assemble(path string, mbr []byte, partPath string) (string, int64, error) {
	out, err := os.Create(path)
	if err != nil {
		return "", 0, err
	}
	defer out.Close()
	h := sha256.New()
	w := io.MultiWriter(out, h)
	head := make([]byte, PartitionStart*SectorSize)
	copy(head, mbr)
	if _, err := w.Write(head); err != nil {
		return "", 0, fmt.Errorf("writing %s: %w", path, err)
	}
	part, err := os.Open(partPath)
	if err != nil {
		return "", 0, err
	}
	defer part.Close()
	n, err := io.Copy(w, part)
	if err != nil {
		return "", 0, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		return "", 0, fmt.Errorf("writing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), int64(len(head)) + n, nil
}

// compress writes src zstd-compressed (one encoder goroutine: the output depends only on the
// input) to dst and returns the digest and size of the compressed file.
func compress(ctx context.Context, src, dst string) (string, int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return "", 0, err
	}
	defer out.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedBetterCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return "", 0, fmt.Errorf("compressing: %w", err)
	}
	if _, err := io.Copy(zw, ctxReader{ctx, in}); err != nil {
		zw.Close()
		return "", 0, fmt.Errorf("compressing %s: %w", src, err)
	}
	if err := zw.Close(); err != nil {
		return "", 0, fmt.Errorf("compressing %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return "", 0, fmt.Errorf("writing %s: %w", dst, err)
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// EnsureSigner returns the Ed25519 key pair in keyPath/pubPath (base64, as `bcd signer keygen`
// writes them), making it first when keyPath does not exist.
func EnsureSigner(keyPath, pubPath string) (ed25519.PublicKey, ed25519.PrivateKey, error) {
	b, err := os.ReadFile(keyPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		pub, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, nil, fmt.Errorf("making the lab signer: %w", err)
		}
		if err := os.WriteFile(keyPath, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, nil, fmt.Errorf("making the lab signer: %w", err)
		}
		if err := os.WriteFile(pubPath, []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o644); err != nil {
			return nil, nil, fmt.Errorf("making the lab signer: %w", err)
		}
		return pub, key, nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading the lab signer: %w", err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != ed25519.PrivateKeySize {
		return nil, nil, fmt.Errorf("lab signer %s: expected base64 of %d bytes (as bcd signer keygen writes)", keyPath, ed25519.PrivateKeySize)
	}
	key := ed25519.PrivateKey(raw)
	pub := key.Public().(ed25519.PublicKey)
	// Keep the .pub in step with the key (rewritten when missing or different).
	want := base64.StdEncoding.EncodeToString(pub) + "\n"
	if cur, err := os.ReadFile(pubPath); err != nil || string(cur) != want {
		if err := os.WriteFile(pubPath, []byte(want), 0o644); err != nil {
			return nil, nil, fmt.Errorf("writing the lab signer's public key: %w", err)
		}
	}
	return pub, key, nil
}
