package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/flagconfig"
)

// The exit codes of bcd: what a script tells apart without reading the message.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitRefused     = 4
	exitDenied      = 5
	exitUnavailable = 6
	exitNodeFailed  = 7
)

// exitRow is one exit code: what it means to a script and the API's codes that end with it.
type exitRow struct {
	code    int
	meaning string         // as docs/cli.md lists it
	connect []connect.Code // the API's error codes that end with this exit code
}

// exitTable is the exit codes in order; docs/cli.md lists them as they are here. An API code
// no row names ends with exitError.
func exitTable() []exitRow {
	return []exitRow{
		{exitOK, "success", nil},
		{exitError, "any other error: read the message (an internal error of the server, a file that cannot be read, a failed local step, an interrupt)",
			[]connect.Code{connect.CodeCanceled, connect.CodeUnknown, connect.CodeInternal, connect.CodeUnimplemented, connect.CodeDataLoss}},
		{exitUsage, "usage: an unknown command or flag, a wrong number of arguments, a value refused by bcd's own checks or by the server (invalid_argument; resource_exhausted: a request over 1 MiB), http:// for a server that speaks TLS or https:// for one that does not; the same command line fails again",
			[]connect.Code{connect.CodeInvalidArgument, connect.CodeResourceExhausted}},
		{exitNotFound, "not found: the node, site, pool, token, batch or image named does not exist (not_found)",
			[]connect.Code{connect.CodeNotFound}},
		{exitRefused, "refused in the current state or by a conflict (failed_precondition, already_exists, aborted, out_of_range): look at the object's state; as is, the same command is refused again",
			[]connect.Code{connect.CodeFailedPrecondition, connect.CodeAlreadyExists, connect.CodeAborted, connect.CodeOutOfRange}},
		{exitDenied, "authentication or permission: no token, an unknown, expired or revoked one, a role that does not allow the call (unauthenticated, permission_denied), or a server certificate bcd does not trust",
			[]connect.Code{connect.CodeUnauthenticated, connect.CodePermissionDenied}},
		{exitUnavailable, "the server could not be reached or did not answer in time (unavailable, deadline_exceeded, a command's own --timeout running out): worth retrying later",
			[]connect.Code{connect.CodeUnavailable, connect.CodeDeadlineExceeded}},
		{exitNodeFailed, "the node failed while --wait followed it: the message gives its fault code and message; it is in maintenance (bcd node recover); or nodes of a batch followed to its end (bcd bulk --wait, bcd batch wait) failed or were aborted: the failures are listed", nil},
	}
}

// exitCode is the exit code of a command that ended with err (exitTable).
func exitCode(err error) int {
	var ce *connect.Error
	var dial *net.OpError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, new(*nodeFailedError)), errors.As(err, new(*batchFailedError)):
		return exitNodeFailed
	case errors.As(err, new(usageError)), errors.As(err, new(*flagconfig.Error)):
		// flagconfig: a refused value of the environment or the config file of bcd site run.
		return exitUsage
	case errors.As(err, new(*tls.CertificateVerificationError)):
		// The client refused the server's certificate: retrying does not help, a CA does.
		return exitDenied
	case errors.Is(err, http.ErrSchemeMismatch), errors.As(err, new(tls.RecordHeaderError)), errors.As(err, new(plainToTLSError)):
		// https:// to a server that speaks plain HTTP, or http:// to one that speaks TLS: the
		// server is up, --server is wrong.
		return exitUsage
	case errors.As(err, &ce):
		for _, r := range exitTable() {
			if slices.Contains(r.connect, ce.Code()) {
				return r.code
			}
		}
		return exitError
	case errors.Is(err, context.DeadlineExceeded):
		return exitUnavailable
	case errors.As(err, &dial) && dial.Op == "dial":
		// Outside the API's calls (bcd sim reads /metrics): nothing answered there.
		return exitUnavailable
	}
	return exitError
}

// usageError is a command line bcd refuses before it does anything: it ends with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage marks err as a refused command line (nil stays nil).
func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err: err}
}

// usagef is a refused command line: which flag or argument, and what is accepted.
func usagef(format string, a ...any) error { return usageError{err: fmt.Errorf(format, a...)} }

// markUsage makes cobra's own refusals of c and the commands under it usage errors: their
// argument checks (wrong count, unknown subcommand) keep their messages and end with exitUsage.
// Flag errors are marked by the root's flag error function.
func markUsage(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error { return usage(check(cmd, args)) }
	}
	for _, s := range c.Commands() {
		markUsage(s)
	}
}

// unknownSubcommand is the error of a group of commands ("bcd node") given a word that is not
// one of its commands: cobra shows the group's help and succeeds, a script would not notice
// the typo.
func unknownSubcommand(cmd *cobra.Command) error {
	if cmd == nil || cmd.Runnable() || !cmd.HasSubCommands() {
		return nil
	}
	args := cmd.Flags().Args()
	if len(args) == 0 {
		return nil
	}
	return usagef("unknown command %q for %q (%s --help lists its commands)", args[0], cmd.CommandPath(), cmd.CommandPath())
}
