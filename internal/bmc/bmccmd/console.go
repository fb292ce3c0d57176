package bmccmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"bcd/internal/bmc"
	"bcd/internal/bmc/ipmi"
	"bcd/internal/console"
)

// consoleCmd is `bcd bmc console`: the machine's serial console over IPMI Serial-over-LAN, in
// the terminal, with the site agent's driver. --timeout bounds the session only when given.
func consoleCmd(f *flags, d deps) *cobra.Command {
	var takeOver bool
	cmd := &cobra.Command{
		Use:           "console [--take-over]",
		Short:         "Attach to the machine's serial console (IPMI Serial-over-LAN); ~. at a line's start leaves",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := f.parse(d.getenv, d.readFile)
			if err != nil {
				return fmt.Errorf("bmc console: %w", err)
			}
			if t.driver != DriverIPMI {
				return errors.New("bmc console: Serial-over-LAN is IPMI's: use --driver ipmi (a Redfish BMC's host usually serves it on port 623)")
			}
			ctx := cmd.Context()
			if cmd.Flags().Changed("timeout") {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, t.timeout)
				defer cancel()
			}
			o := d.ipmi
			o.Logger = newLogger(cmd.ErrOrStderr(), f.logLevel, t.ep.Password)
			drv, err := ipmi.New(t.ep, o)
			if err != nil {
				return fmt.Errorf("bmc console at %s: %w", bmc.ShownAddress(t.ep.Address), redact(oneLine(err), t.ep.Password))
			}
			stdin := cmd.InOrStdin()
			restore := console.RawTerminal(stdin)
			defer restore()
			fmt.Fprintf(cmd.ErrOrStderr(), "[bcd] console of %s: type ~. at the start of a line to leave\r\n", bmc.ShownAddress(t.ep.Address))
			err = drv.Console(ctx, console.NewEscapeReader(stdin), cmd.OutOrStdout(), bmc.ConsoleOptions{TakeOver: takeOver})
			if err != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("bmc console at %s: %w", bmc.ShownAddress(t.ep.Address), redact(oneLine(err), t.ep.Password))
			}
			fmt.Fprint(cmd.ErrOrStderr(), "[bcd] left the console\r\n")
			return nil
		},
	}
	cmd.Flags().BoolVar(&takeOver, "take-over", false, "end another client's session on the console first")
	return cmd
}
