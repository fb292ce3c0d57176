// Command hiddenprobe is PID 1 of a test ramdisk (TestHiddenCapacityInQEMU): it starts as the
// ramdisk's init does (mounts, the modules with their command-line parameters), runs the wipe's
// checks for capacity the kernel does not show against the VM's real disks, prints what they
// found on the console as "PROBE …" lines, and powers the VM off.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"bcd/internal/ramdisk/initsys"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/wipe"
)

func main() {
	ctx := context.Background()
	console, _, err := initsys.Init(ctx, initsys.Linux{}, initsys.Config{}, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if console == nil {
		console = os.Stdout
	}
	if err != nil {
		fmt.Fprintln(console, "PROBE error init:", err)
	}
	probe(ctx, console)
	fmt.Fprintln(console, "PROBE done")
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func probe(ctx context.Context, console io.Writer) {
	say := func(what string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(console, "PROBE %s %s\n", what, b)
	}
	// The disks appear as their drivers probe them, after the modules load.
	var inv inventory.Inventory
	var err error
	for range 80 {
		inv, err = inventory.Collect(ctx, inventory.Roots{}, inventory.Options{})
		if err == nil && len(inv.Disks) >= 2 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintln(console, "PROBE error inventory:", err)
		return
	}
	say("disks", inv.Disks)
	nv, err := wipe.LinuxOpener{}.InspectNVMe(ctx, inv.Disks)
	if err != nil {
		fmt.Fprintln(console, "PROBE error nvme:", err)
	} else {
		say("findings", wipe.NVMeHidden(nv))
	}
	for _, d := range inv.Disks {
		dev, err := wipe.LinuxOpener{}.Open(ctx, d.Path)
		if err != nil {
			fmt.Fprintln(console, "PROBE error open:", d.Name, err)
			continue
		}
		if p, ok := dev.(wipe.HiddenCapacityProber); ok {
			h, err := p.HiddenCapacity(ctx)
			if err != nil {
				fmt.Fprintln(console, "PROBE error hidden:", d.Name, err)
			} else {
				say("hidden:"+d.Name, h)
			}
		}
		dev.Close()
	}
	if p, err := os.ReadFile("/sys/module/libata/parameters/ignore_hpa"); err == nil {
		fmt.Fprintf(console, "PROBE libata.ignore_hpa=%s\n", p)
	} else {
		fmt.Fprintln(console, "PROBE error libata:", err)
	}
}
