// Package ramdiskcmd is the `bcd ramdisk` command: `init` (PID 1 of the ramdisk) and `build`
// (make the kernel + initramfs from a Debian kernel package).
//
// The kernel starts /init with argv[0] "/init" and no arguments: main should pass its
// arguments through InitArgs so that invocation becomes `ramdisk init`.
package ramdiskcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bcd/internal/osagent"
	"bcd/internal/ramdisk/agent"
	"bcd/internal/ramdisk/build"
	"bcd/internal/ramdisk/initsys"
)

// InitArgs returns args (os.Args[1:]) unchanged, except when the process is PID 1 started as
// "init" (argv[0] "/init", "init" or ".../init"): then it returns ["ramdisk", "init"] unless the
// arguments already name a ramdisk subcommand. The kernel hands init every command-line word it
// does not know (with iPXE's EFI loader the first is the kernel's file name, "vmlinuz"): those
// are not bcd subcommands.
func InitArgs(argv0 string, pid int, args []string) []string {
	if pid == 1 && path.Base(argv0) == "init" && (len(args) == 0 || args[0] != "ramdisk") {
		return []string{"ramdisk", "init"}
	}
	return args
}

// Command returns `ramdisk` with its subcommands.
func Command() *cobra.Command {
	cmd := &cobra.Command{Use: "ramdisk", Short: "The ramdisk agent: PID 1 inside the ramdisk, and its builder"}
	cmd.AddCommand(initCmd(), buildCmd())
	return cmd
}

func initCmd() *cobra.Command {
	var fatalDelay time.Duration
	var reboot bool
	c := &cobra.Command{
		Use:   "init",
		Short: "Run as PID 1 of the ramdisk (the kernel starts it as /init)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Getpid() != 1 {
				return errors.New("ramdisk init runs only as PID 1 inside the ramdisk (it mounts, loads modules and powers off)")
			}
			// The caller's context may end on SIGINT/SIGTERM; PID 1 must not.
			ctx := context.WithoutCancel(cmd.Context())
			cfg := initsys.Config{FatalDelay: fatalDelay, FatalReboot: reboot, Agent: runAgent}
			initsys.Run(ctx, initsys.Linux{}, cfg, initsys.NewReaper())
			return nil // not reached: ctx never ends
		},
	}
	c.Flags().DurationVar(&fatalDelay, "fatal-delay", 60*time.Second, "how long a fatal error stays on the console before power-off")
	c.Flags().BoolVar(&reboot, "fatal-reboot", false, "reboot instead of powering off after a fatal error")
	return c
}

// runAgent is the agent as PID 1 runs it: start-up, join through the gateway named on the
// kernel command line, then the command loop (agent.Run) on the real machine. With bcd.role=os
// on the command line (the lab OS image) it is the installed OS's agent instead (osagent.Run).
func runAgent(ctx context.Context, console io.Writer, log *slog.Logger) error {
	cmdline := func() (string, error) {
		b, err := os.ReadFile("/proc/cmdline")
		return strings.TrimSpace(string(b)), err
	}
	if line, err := cmdline(); err == nil && osagent.Role(line) == osagent.RoleOS {
		return osagent.Run(ctx, console, log, osagent.Config{
			Cmdline: cmdline,
			Net:     agent.LinuxNet{},
			DHCP:    agent.UDPClient{},
			State:   osagent.PartitionState{Wait: 15 * time.Second},
		})
	}
	return agent.Run(ctx, console, log, agent.Config{
		Cmdline: cmdline,
		Net:     agent.LinuxNet{},
		DHCP:    agent.UDPClient{},
		SysFS:   os.DirFS("/sys"),
	})
}

func buildCmd() *cobra.Command {
	var deb, binary, out string
	var modules, overlays []string
	c := &cobra.Command{
		Use:   "build --kernel-deb FILE --binary FILE --out DIR",
		Short: "Build the ramdisk (vmlinuz + initramfs.cpio.gz) from a Debian kernel package and a static bcd",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if deb == "" || binary == "" || out == "" {
				return errors.New("--kernel-deb, --binary and --out are required")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			cfg := build.Config{Kernel: build.DebPackage{Path: deb}, Binary: binary, OutDir: out, Overlays: overlays}
			if len(modules) > 0 {
				cfg.Modules = modules
			}
			res, err := build.Build(cmd.Context(), log, cfg)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "kernel     %s  %s (%s)\n", res.KernelSHA256, res.KernelPath, res.Release)
			fmt.Fprintf(w, "initramfs  %s  %s (%d bytes)\n", res.InitramfsSHA256, res.InitramfsPath, res.InitramfsSize)
			fmt.Fprintf(w, "modules    %s\n", strings.Join(res.Modules, " "))
			return nil
		},
	}
	c.Flags().StringVar(&deb, "kernel-deb", "", "Debian linux-image-*-amd64 package")
	c.Flags().StringVar(&binary, "binary", "", "static bcd binary (CGO_ENABLED=0) that becomes /init")
	c.Flags().StringVar(&out, "out", "", "output directory")
	c.Flags().StringSliceVar(&modules, "module", nil, "module to include (repeatable; dependencies follow); default: the built-in list")
	c.Flags().StringArrayVar(&overlays, "overlay", nil, "directory whose tree is added to the initramfs (repeatable): files, directories and symlinks, modes kept; never replaces /init, /bin/bcd or a file already there, except that its lib/modules/RELEASE/load-order is appended to the ramdisk's (e.g. DCGM and the NVIDIA driver)")
	return c
}
