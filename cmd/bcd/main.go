// Command bcd is the one binary of bcd: control plane, site agent, ramdisk agent and CLI.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"bcd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, cli.Env{Args: os.Args[1:], Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}
