package labcmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"bcd/internal/lab/bootbench"
)

// DefaultBenchDir is where `bcd lab bench-boot` keeps its lab.
const DefaultBenchDir = "/var/tmp/bcdbootbench"

// commandArgv is the command line that reaches cmd in this binary.
func commandArgv(cmd *cobra.Command) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the bcd binary: %w", err)
	}
	var path []string
	for c := cmd; c.HasParent(); c = c.Parent() {
		path = append(path, c.Name())
	}
	slices.Reverse(path)
	return append([]string{exe}, path...), nil
}

func benchBootCmd() *cobra.Command {
	var (
		c           bootbench.Config
		fws, srvs   []string
		inner       bool
		output, dir string
		ramdisk     string
	)
	cmd := &cobra.Command{
		Use:   "bench-boot",
		Short: "Benchmark power-on → ramdisk online per firmware: bcd's boot services vs. dnsmasq",
		Long: `bcd lab bench-boot brings up a lab of one BIOS and one UEFI VM in a namespace of its own and
boots each VM into the ramdisk (make ramdisk) --runs times with each server, one boot at a time:

  bcd      bcd's site boot services: full DHCP (internal/dhcp), boot.ipxe from a ramdisk boot
           entry and the kernel and initramfs from the site's artifact cache;
  dnsmasq  the hand-built baseline: dnsmasq (DHCP range, dhcp-userclass=iPXE → a static
           boot.ipxe URL) and busybox httpd serving that script with the same files and the
           same kernel command line.

It times power-on (QMP system_reset + cont) → the console's "bcd-ramdisk: ready" line and reports
median, min and max per firmware and server, and the bcd/dnsmasq ratio of medians. It fails only
if a boot never completes (240 s). Needs root, qemu-system-x86, ovmf, ipxe-qemu, dnsmasq-base
and busybox-static.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if c.Firmwares, err = bootbench.ParseFirmwares(fws); err != nil {
				return err
			}
			if c.Servers, err = bootbench.ParseServers(srvs); err != nil {
				return err
			}
			if c.Dir, err = absDir(dir); err != nil {
				return err
			}
			if c.RamdiskDir, err = absDir(ramdisk); err != nil {
				return err
			}
			ctx := cmd.Context()
			log := logger(cmd.ErrOrStderr())
			if inner {
				samples, err := bootbench.Measure(ctx, bootbench.MeasureConfig{LabDir: c.Dir, RamdiskDir: c.RamdiskDir,
					Runs: c.Runs, Firmwares: c.Firmwares, Servers: c.Servers, Log: log})
				return errors.Join(err, bootbench.WriteSamples(c.Dir, samples))
			}
			if output != "table" && output != "json" {
				return fmt.Errorf("output %q: accepted are table, json", output)
			}
			if os.Geteuid() != 0 {
				return errors.New("bench-boot needs root (network namespaces, taps)")
			}
			if c.Supervisor, err = supervisorArgv(cmd); err != nil {
				return err
			}
			if c.Inner, err = commandArgv(cmd); err != nil {
				return err
			}
			c.Stderr, c.Log = cmd.ErrOrStderr(), log
			rep, err := bootbench.Run(ctx, c)
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if eerr := enc.Encode(rep); eerr != nil {
					return errors.Join(err, eerr)
				}
			} else if werr := bootbench.WriteTable(cmd.OutOrStdout(), rep); werr != nil {
				return errors.Join(err, werr)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", DefaultBenchDir, "the benchmark lab's directory")
	f.StringVar(&c.NetNS, "netns", "bcdbootbench", "the benchmark lab's network namespace")
	f.StringVar(&ramdisk, "ramdisk", "out/ramdisk", "make ramdisk's output directory (vmlinuz, initramfs.cpio.gz)")
	f.IntVar(&c.Runs, "runs", 3, "boots per firmware and server")
	f.StringSliceVar(&fws, "firmware", []string{"bios", "uefi"}, "firmwares to boot: bios, uefi")
	f.StringSliceVar(&srvs, "server", []string{"bcd", "dnsmasq"}, "servers to compare: bcd, dnsmasq")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.BoolVar(&inner, "inner", false, "run the measurements (inside the benchmark lab's namespace)")
	_ = f.MarkHidden("inner")
	return cmd
}
