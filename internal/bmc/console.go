package bmc

import (
	"context"
	"errors"
	"io"
)

// The console concern (DESIGN §5 "console"): an operator's interactive session on a machine's
// serial console through its BMC (IPMI Serial-over-LAN), relayed by the site agent. It shows a
// machine's firmware, boot loader and kernel as they run, and lets the operator type into them:
// what the operator needs when a machine does not come up.

// Consoler is the console concern.
type Consoler interface {
	// Console relays the machine's serial console until ctx ends, in reaches EOF or fails, or
	// the BMC ends the session: what the machine writes goes to out as it arrives, and what in
	// yields goes to the machine. It returns nil when ctx ended or in reached EOF (the session
	// was closed on purpose, and the BMC's payload deactivated), and an error saying why
	// otherwise (ErrConsoleInUse, the BMC taking the session away, the BMC gone silent).
	Console(ctx context.Context, in io.Reader, out io.Writer, opts ConsoleOptions) error
}

// ConsoleOptions tune one console session.
type ConsoleOptions struct {
	// TakeOver ends another client's session on the console first (ipmitool's "sol
	// deactivate"); without it, a console in use is ErrConsoleInUse.
	TakeOver bool
}

// ErrConsoleInUse says another client holds the machine's console session.
var ErrConsoleInUse = errors.New("the console is in use by another session (take it over with --take-over)")

// MaxConsoleInput bounds the bytes of one input message to a console (a paste, not a file).
const MaxConsoleInput = 4096
