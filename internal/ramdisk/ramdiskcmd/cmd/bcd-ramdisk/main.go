// Command bcd-ramdisk is `bcd ramdisk` on its own, for building and booting the ramdisk before
// the ramdisk command is wired into bcd's CLI root. The kernel runs it as /init.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"bcd/internal/ramdisk/ramdiskcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := ramdiskcmd.Command()
	cmd.Use = "bcd-ramdisk"
	args := ramdiskcmd.InitArgs(os.Args[0], os.Getpid(), os.Args[1:])
	if len(args) > 0 && args[0] == "ramdisk" {
		args = args[1:] // this binary's root already is `ramdisk`
	}
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bcd-ramdisk:", err)
		os.Exit(1)
	}
}
