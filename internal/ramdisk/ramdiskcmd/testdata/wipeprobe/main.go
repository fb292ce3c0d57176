// Command wipeprobe is PID 1 of a test ramdisk (TestSecureWipeInQEMU): it starts as the
// ramdisk's init does, wipes every disk of the VM in the mode the kernel command line names
// (bcd.probe.wipe=secure) with the ramdisk's own code path (wipe.WipeAll over the real block
// devices, NVMe and ATA pass-through included), prints each disk's result on the console as a
// "PROBE result …" line, and powers the VM off.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"bcd/internal/ramdisk/initsys"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/wipe"
)

func main() {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	console, _, err := initsys.Init(ctx, initsys.Linux{}, initsys.Config{}, log)
	if console == nil {
		console = os.Stdout
	}
	if err != nil {
		fmt.Fprintln(console, "PROBE error init:", err)
	}
	probe(ctx, console, log)
	fmt.Fprintln(console, "PROBE done")
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func probe(ctx context.Context, console io.Writer, log *slog.Logger) {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		fmt.Fprintln(console, "PROBE error cmdline:", err)
		return
	}
	var mode wipe.Mode
	var want int
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, "bcd.probe.wipe="); ok {
			if mode, err = wipe.ParseMode(v); err != nil {
				fmt.Fprintln(console, "PROBE error mode:", err)
				return
			}
		}
		if v, ok := strings.CutPrefix(f, "bcd.probe.disks="); ok {
			fmt.Sscan(v, &want)
		}
	}
	// The disks appear as their drivers probe them, after the modules load.
	var inv inventory.Inventory
	for range 120 {
		inv, err = inventory.Collect(ctx, inventory.Roots{}, inventory.Options{})
		if err == nil && len(inv.Disks) >= want {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintln(console, "PROBE error inventory:", err)
		return
	}
	results, err := wipe.WipeAll(ctx, log, inv.Disks, wipe.LinuxOpener{}, wipe.Request{Mode: mode}, nil)
	if err != nil {
		fmt.Fprintln(console, "PROBE wipe error:", err)
	}
	for _, r := range results {
		b, _ := json.Marshal(r)
		fmt.Fprintf(console, "PROBE result %s\n", b)
	}
}
