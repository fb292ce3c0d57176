// Package labcmd is `bcd lab`: up, down, status, exec, and the hidden supervise that `up` starts
// inside the lab's network namespace. The work is in package lab.
package labcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"bcd/internal/lab"
	"bcd/internal/lab/osimage"
	"bcd/internal/lab/scenario"
)

// DefaultDir is where a lab lives unless --dir says otherwise: `down` and `status` from another
// shell find it there.
const DefaultDir = "/var/tmp/bcdlab"

// Command returns `lab` and its subcommands.
func Command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "QEMU VMs with virtual BMCs on a private bridge in a network namespace",
		Long: `bcd lab runs VMs that network-boot like bare metal, with a Redfish (HTTPS) and an IPMI
BMC each, all inside a network namespace: nothing touches the host's networks.

'up' starts a supervisor process in the namespace (in its own session, logging to
DIR/supervisor.log) and returns once the lab is ready; 'down' stops it from any shell.
DIR/state.json lists BMC addresses, MACs, console logs; DIR/credentials.json (0600) the BMC
passwords. Run site services in the namespace: bcd lab exec -- bcd site ...`,
	}
	cmd.AddCommand(upCmd(), downCmd(), statusCmd(), execCmd(), superviseCmd(), osimage.Command(), demoCmd(), demoDownCmd(), benchBootCmd())
	return cmd
}

func absDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("lab directory %q: %w", dir, err)
	}
	return abs, nil
}

func logger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// supervisorArgv is the command line that reaches `lab supervise` in this binary, wherever the
// lab command is mounted in the command tree.
func supervisorArgv(cmd *cobra.Command) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the bcd binary: %w", err)
	}
	var sup *cobra.Command
	for _, c := range cmd.Parent().Commands() {
		if c.Name() == "supervise" {
			sup = c
		}
	}
	if sup == nil {
		return nil, errors.New("lab supervise command not found")
	}
	var path []string
	for c := sup; c.HasParent(); c = c.Parent() {
		path = append(path, c.Name())
	}
	slices.Reverse(path)
	return append([]string{exe}, path...), nil
}

func upCmd() *cobra.Command {
	var (
		o          lab.Options
		dir, fw    string
		disk       string
		foreground bool
		output     string
		site       lab.SiteOptions
		shareDir   string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the namespace, bridge, VMs and BMCs; return when ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Dir, err = absDir(dir); err != nil {
				return err
			}
			o.Firmware, o.DiskBus = lab.FirmwareChoice(fw), lab.DiskBus(disk)
			argv, err := supervisorArgv(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			log := logger(cmd.ErrOrStderr())
			cfg := lab.UpConfig{Supervisor: argv, Log: log}
			if site.Site != "" {
				if site.Binary, err = os.Executable(); err != nil {
					return fmt.Errorf("finding the bcd binary: %w", err)
				}
				for _, p := range []*string{&shareDir, &site.CAFile, &site.JoinTokenFile} {
					if *p, err = absDir(*p); err != nil {
						return err
					}
				}
				cfg.Site, cfg.ShareDir = &site, shareDir
			}
			sup, _, err := lab.Up(ctx, o, cfg)
			if err != nil {
				return err
			}
			if err := printStatus(ctx, cmd.OutOrStdout(), o.Dir, output); err != nil {
				return err
			}
			if !foreground {
				return nil
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "lab running; Ctrl-C brings it down")
			select {
			case <-ctx.Done():
			case <-sup.Done():
				log.Error("lab supervisor exited", "err", sup.Err())
			}
			return lab.Down(context.WithoutCancel(ctx), o.Dir, log)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.VMs, "vms", 2, "number of VMs (1 to "+strconv.Itoa(lab.MaxVMs)+")")
	f.StringVar(&fw, "firmware", string(lab.ChoiceMixed), "bios, uefi, or mixed (even VMs BIOS, odd VMs UEFI)")
	f.StringVar(&dir, "dir", DefaultDir, "lab directory (disks, consoles, state.json, credentials.json)")
	f.StringVar(&o.NetNS, "netns", lab.DefaultNetNS, "network namespace name")
	f.IntVar(&o.MemoryMiB, "memory", lab.DefaultMemoryMiB, "MiB of memory per VM (128 to 1024)")
	f.StringVar(&disk, "disk-bus", string(lab.DiskVirtio), "virtio, nvme or mixed (even VMs virtio, odd VMs NVMe)")
	f.BoolVar(&foreground, "foreground", false, "stay in the foreground and bring the lab down on Ctrl-C")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.StringVar(&site.Site, "site", "", "run a site agent for this site inside the lab (needs the flags below)")
	f.IntVar(&site.GatewayPort, "gateway-port", 7443, "the control plane's gateway port on the host's 127.0.0.1 (uplinked at the bridge)")
	f.StringVar(&site.CAFile, "ca-file", "", "the control plane's CA certificate (PEM)")
	f.StringVar(&site.JoinTokenFile, "join-token-file", "", "file (0600) holding the site agent's one-time join token")
	f.StringVar(&shareDir, "share-dir", "", "directory served to the lab over HTTP at bridge:8081 (ramdisk, OS images)")
	f.StringVar(&site.Kernel, "ramdisk-kernel", "vmlinuz", "ramdisk kernel: file name in --share-dir")
	f.StringVar(&site.Initrd, "ramdisk-initrd", "initramfs.cpio.gz", "ramdisk initramfs: file name in --share-dir")
	f.StringSliceVar(&site.RamdiskArgs, "ramdisk-arg", nil, "extra kernel argument of ramdisk entries (repeatable)")
	f.BoolVar(&site.DiscoveryBoot, "discovery-boot", false, "the site agent boots machines with no entry into the ramdisk in discovery mode (acceptance flow: bcd node pending|accept|reject)")
	return cmd
}

func downCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the VMs and BMCs and delete the namespace",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := absDir(dir)
			if err != nil {
				return err
			}
			return lab.Down(cmd.Context(), d, logger(cmd.ErrOrStderr()))
		},
	}
	cmd.Flags().StringVar(&dir, "dir", DefaultDir, "lab directory")
	return cmd
}

func statusCmd() *cobra.Command {
	var dir, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the lab's VMs: firmware, MAC, power, BMC addresses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := absDir(dir)
			if err != nil {
				return err
			}
			return printStatus(cmd.Context(), cmd.OutOrStdout(), d, output)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", DefaultDir, "lab directory")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func printStatus(ctx context.Context, w io.Writer, dir, output string) error {
	if output != "table" && output != "json" {
		return fmt.Errorf("output %q: accepted are table, json", output)
	}
	st, err := lab.Status(ctx, dir)
	if err != nil {
		return err
	}
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return WriteTable(w, st)
}

// WriteTable prints a lab status for people.
func WriteTable(w io.Writer, st lab.LabStatus) error {
	state := "down"
	if st.Running {
		state = fmt.Sprintf("running (supervisor pid %d)", st.SupervisorPID)
	}
	fmt.Fprintf(w, "lab %s: %s, netns %s, bridge %s, credentials %s\n", st.Dir, state, st.NetNS, st.Bridge, st.Credentials)
	if len(st.VMs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFIRMWARE\tMAC\tPOWER\tREDFISH\tIPMI\tCONSOLE")
	for _, vm := range st.VMs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", vm.Name, vm.Firmware, vm.MAC, vm.Power, vm.RedfishURL, vm.IPMIAddr, vm.Console)
	}
	return tw.Flush()
}

func execCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "exec -- COMMAND [ARG...]",
		Short: "Run a command inside the lab's network namespace (e.g. bcd site, ipmitool)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := absDir(dir)
			if err != nil {
				return err
			}
			spec, err := lab.ReadSpec(d)
			if err != nil {
				return err
			}
			c := lab.Command(cmd.Context(), spec.NetNS, args[0], args[1:]...)
			c.Stdin, c.Stdout, c.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			if err := c.Run(); err != nil {
				return fmt.Errorf("running %s in namespace %s: %w", args[0], spec.NetNS, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", DefaultDir, "lab directory")
	return cmd
}

func superviseCmd() *cobra.Command {
	var (
		dir             string
		readyFD, hostFD int
	)
	cmd := &cobra.Command{
		Use:    "supervise",
		Short:  "Run a lab (started by 'lab up' inside the lab's namespace)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Supervise(cmd.Context(), dir, readyFD, hostFD, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "lab directory")
	cmd.Flags().IntVar(&readyFD, "ready-fd", 0, "file descriptor to write \"ready\" to (0: none)")
	cmd.Flags().IntVar(&hostFD, "host-netns-fd", 0, "file descriptor of the host's network namespace, for uplinks (0: none)")
	return cmd
}

// Supervise runs lab.Supervise with JSON logs to logw, reporting readiness on readyFD (0: none).
func Supervise(ctx context.Context, dir string, readyFD, hostFD int, logw io.Writer) error {
	var hostNS *os.File
	if hostFD > 2 {
		syscall.CloseOnExec(hostFD)
		hostNS = os.NewFile(uintptr(hostFD), "host-netns")
		defer hostNS.Close()
	}
	var ready io.Writer
	if readyFD > 2 {
		// Not inherited by the VMs: only the supervisor reports readiness.
		syscall.CloseOnExec(readyFD)
		f := os.NewFile(uintptr(readyFD), "ready")
		if f == nil {
			return fmt.Errorf("supervising lab: bad ready descriptor %d", readyFD)
		}
		defer f.Close()
		ready = f
	}
	log := slog.New(slog.NewJSONHandler(logw, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := lab.Supervise(ctx, dir, log, ready, hostNS); err != nil {
		log.Error("lab supervisor failed", "err", err)
		return err
	}
	return nil
}

// DefaultDemoDir is where `bcd lab demo` keeps everything.
const DefaultDemoDir = "/var/tmp/bcddemo"

func demoCmd() *cobra.Command {
	d := scenario.Demo{}
	var fw string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start a control plane and a lab with a site agent, and take the VMs from enroll to deployed",
		Long: `bcd lab demo starts bcd server (SQLite, in DIR/server), a lab of VMs with a site agent in a
network namespace, registers the signed lab OS image, enrolls every VM by its virtual BMC
(Redfish for even VMs, IPMI for odd ones) and drives them enroll → ready → deploy → deployed,
showing each node's state, step and progress. Everything keeps running afterwards;
'bcd lab demo-down' (make demo-down) stops it. Needs root, make ramdisk and make lab-image.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if d.Binary, err = os.Executable(); err != nil {
				return fmt.Errorf("finding the bcd binary: %w", err)
			}
			if d.Dir, err = absDir(d.Dir); err != nil {
				return err
			}
			d.Firmware = lab.FirmwareChoice(fw)
			d.Out = cmd.OutOrStdout()
			if f, ok := d.Out.(*os.File); ok {
				if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
					d.Terminal = true
				}
			}
			d.Log = logger(cmd.ErrOrStderr())
			return d.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&d.Dir, "dir", DefaultDemoDir, "demo directory (server data, lab, logs)")
	f.StringVar(&d.RamdiskDir, "ramdisk", "out/ramdisk", "make ramdisk's output directory")
	f.StringVar(&d.ImageDir, "image", "out/lab", "make lab-image's output directory")
	f.IntVar(&d.VMs, "vms", 2, "number of VMs")
	f.StringVar(&fw, "firmware", string(lab.ChoiceMixed), "bios, uefi, or mixed (even VMs BIOS, odd VMs UEFI)")
	f.StringVar(&d.APIListen, "listen", "127.0.0.1:7480", "the server's API address")
	f.IntVar(&d.GWPort, "gateway-port", 7443, "the server's gateway port on 127.0.0.1")
	return cmd
}

func demoDownCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "demo-down",
		Short: "Stop what bcd lab demo started: the lab, its site agent and the server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := absDir(dir)
			if err != nil {
				return err
			}
			return scenario.DemoDown(cmd.Context(), d, logger(cmd.ErrOrStderr()))
		},
	}
	cmd.Flags().StringVar(&dir, "dir", DefaultDemoDir, "demo directory")
	return cmd
}
