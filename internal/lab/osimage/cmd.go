package osimage

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"bcd/internal/ramdisk/build"
)

// Command returns `image` (mounted under `bcd lab`) with its `build` subcommand.
func Command() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "The lab OS image that deployments write and the lab VMs boot"}
	cmd.AddCommand(buildCmd())
	return cmd
}

func buildCmd() *cobra.Command {
	var cfg Config
	var deb, ptype string
	c := &cobra.Command{
		Use:   "build --kernel-deb FILE --out DIR [--binary FILE] [--url URL]",
		Short: "Build the lab OS image (os.img, os.img.zst, manifest.json; signer.key/.pub made once)",
		Long: `Builds a raw disk image with an MBR and one FAT partition (syslinux for BIOS and UEFI, one
syslinux.cfg) holding Debian's kernel and an initramfs whose /init is a static bcd started with
bcd.role=os: the installed OS of the lab, which rejoins the control plane as its node.

Writes DIR/os.img, DIR/os.img.zst (what the catalog serves) and DIR/manifest.json (name, format,
compression, size, sha256 for 'bcd image add'); makes the lab signer DIR/signer.key and
DIR/signer.pub on the first build and keeps them. With --url, the manifest also carries the
catalog signature over that URL. The same inputs give the same bytes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if deb == "" || cfg.OutDir == "" {
				return errors.New("--kernel-deb and --out are required")
			}
			if cfg.Binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("finding this binary for /init: %w", err)
				}
				cfg.Binary = exe
			}
			switch ptype {
			case "esp", "0xef", "0xEF":
				cfg.PartitionType = TypeESP
			case "fat32", "0x0c", "0x0C", "0xc":
				cfg.PartitionType = TypeFAT32LBA
			default:
				n, err := strconv.ParseUint(ptype, 0, 8)
				if err != nil || n == 0 {
					return fmt.Errorf("--partition-type %q: accepted are esp (0xEF), fat32 (0x0C) or a byte", ptype)
				}
				cfg.PartitionType = byte(n)
			}
			cfg.Kernel = build.DebPackage{Path: deb}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			m, err := Build(cmd.Context(), log, cfg)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "image      %s/%s  %d bytes  sha256 %s\n", cfg.OutDir, m.File, m.FileSize, m.SHA256)
			fmt.Fprintf(w, "disk       %s/%s  %d bytes  sha256 %s\n", cfg.OutDir, m.DiskFile, m.Size, m.DiskSHA256)
			fmt.Fprintf(w, "manifest   %s/%s\n", cfg.OutDir, ManifestFile)
			fmt.Fprintf(w, "add it     bcd image add %s --url URL/%s --format %s --compression %s --size %d --sha256 %s --signer %s --sign-key %s/%s\n",
				m.Name, m.File, m.Format, m.Compression, m.Size, m.SHA256, m.Signer, cfg.OutDir, m.SignerKeyFile)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&deb, "kernel-deb", "", "Debian linux-image-*-amd64 package (the ramdisk's: scripts/ramdisk/kernel-deb)")
	f.StringVar(&cfg.Binary, "binary", "", "static bcd binary (CGO_ENABLED=0) that becomes /init; default: this binary")
	f.StringVar(&cfg.OutDir, "out", "", "output directory")
	f.StringVar(&cfg.Name, "name", DefaultName, "catalog name of the image")
	f.StringVar(&cfg.Cmdline, "cmdline", "", "extra kernel arguments (after "+BaseCmdline+")")
	f.StringVar(&ptype, "partition-type", "esp", "MBR type of the FAT partition: esp (0xEF) or fat32 (0x0C)")
	f.StringVar(&cfg.Signer, "signer", DefaultSigner, "catalog signer name")
	f.StringVar(&cfg.URL, "url", "", "URL the image will be served at: the manifest then carries the catalog signature")
	f.StringSliceVar(&cfg.Modules, "module", nil, "kernel module to include (repeatable); default: the ramdisk's list")
	return c
}
