// Command bcd is the one binary of bcd: control plane, site agent, ramdisk agent and CLI.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"bcd/internal/cli"
	"bcd/internal/ramdisk/ramdiskcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// As /init of the ramdisk the kernel starts bcd with no arguments: that means `ramdisk init`.
	args := ramdiskcmd.InitArgs(os.Args[0], os.Getpid(), os.Args[1:])
	code := cli.Run(ctx, cli.Env{Args: args, Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}
