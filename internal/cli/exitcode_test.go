package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"bcd/internal/agentlink"
)

// TestExitCodeOfEveryAPICode: every Connect code ends with the exit code the table in
// docs/cli.md gives it; an API code no row names ends with 1.
func TestExitCodeOfEveryAPICode(t *testing.T) {
	want := map[connect.Code]int{
		connect.CodeCanceled:           1,
		connect.CodeUnknown:            1,
		connect.CodeInvalidArgument:    2,
		connect.CodeDeadlineExceeded:   6,
		connect.CodeNotFound:           3,
		connect.CodeAlreadyExists:      4,
		connect.CodePermissionDenied:   5,
		connect.CodeResourceExhausted:  2,
		connect.CodeFailedPrecondition: 4,
		connect.CodeAborted:            4,
		connect.CodeOutOfRange:         4,
		connect.CodeUnimplemented:      1,
		connect.CodeInternal:           1,
		connect.CodeUnavailable:        6,
		connect.CodeDataLoss:           1,
		connect.CodeUnauthenticated:    5,
	}
	// Connect's codes are 1 to 16; one beyond is a code this build does not know.
	for c := connect.Code(1); c <= 17; c++ {
		t.Run(c.String(), func(t *testing.T) {
			w, ok := want[c]
			if !ok {
				if c <= 16 {
					t.Fatalf("code %d has no expected exit code in this test", c)
				}
				w = 1
			}
			err := connect.NewError(c, errors.New("x"))
			if got := exitCode(err); got != w {
				t.Errorf("exitCode(%s) = %d, want %d", c, got, w)
			}
			// Wrapped with what was being done, as commands return them.
			if got := exitCode(fmt.Errorf("listing sites: %w", err)); got != w {
				t.Errorf("exitCode(wrapped %s) = %d, want %d", c, got, w)
			}
		})
	}
	// Each API code is in one row at most.
	seen := map[connect.Code]int{}
	for _, r := range exitTable() {
		for _, c := range r.connect {
			if prev, ok := seen[c]; ok {
				t.Errorf("%s is in the rows of %d and %d", c, prev, r.code)
			}
			seen[c] = r.code
		}
	}
}

// TestExitCodeOfOtherErrors: errors that are not the API's.
func TestExitCodeOfOtherErrors(t *testing.T) {
	verify := &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"plain error", errors.New("reading key file: permission denied"), 1},
		{"usage", usagef("--ttl 30s: accepted are 1m to 168h"), 2},
		{"usage, wrapped", fmt.Errorf("bmc power: %w", usagef("--timeout: bad")), 2},
		{"a command's own deadline", fmt.Errorf("bmc power at x: %w", context.DeadlineExceeded), 6},
		{"interrupted", context.Canceled, 1},
		{"nothing listens (outside the API's calls)", &url.Error{Op: "Get", URL: "http://x/metrics", Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}, 6},
		{"cannot listen", fmt.Errorf("listening on :7480: %w", &net.OpError{Op: "listen", Net: "tcp", Err: errors.New("address already in use")}), 1},
		{"server certificate not trusted", connect.NewError(connect.CodeUnavailable, &url.Error{Op: "Post", URL: "https://x", Err: verify}), 5},
		{"https to a plain HTTP server", connect.NewError(connect.CodeUnavailable, &url.Error{Op: "Post", URL: "https://x", Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}), 2},
		{"https to a plain HTTP server (Go's own error)", connect.NewError(connect.CodeUnavailable, &url.Error{Op: "Post", URL: "https://x", Err: http.ErrSchemeMismatch}), 2},
		{"http to a TLS server", connect.NewError(connect.CodeUnavailable, &url.Error{Op: "Post", URL: "http://x", Err: plainToTLSError{}}), 2},
		{"site agent's join token refused", fmt.Errorf("site agent: %w: %w", agentlink.ErrRefused, connect.NewError(connect.CodeUnauthenticated, errors.New("join token refused"))), 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// TestUsageExitCodes: command lines bcd refuses end with 2 before any call (nothing listens at
// the server given); help asked for ends with 0.
func TestUsageExitCodes(t *testing.T) {
	env := map[string]string{"BCD_SERVER": "http://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want int
		msg  string // in stderr
	}{
		{[]string{"frob"}, 2, `unknown command "frob" for "bcd"`},
		{[]string{"node", "frob"}, 2, `unknown command "frob" for "bcd node" (bcd node --help lists its commands)`},
		{[]string{"batch", "approvals", "frob", "x"}, 2, `unknown command "frob" for "bcd batch approvals"`},
		{[]string{"node", "get"}, 2, "bcd node get takes NODE; 0 given"},
		{[]string{"node", "get", "a", "b"}, 2, "bcd node get takes NODE; 2 given"},
		{[]string{"server", "extra"}, 2, `unknown command "extra" for "bcd server"`},
		{[]string{"node", "list", "--stat", "ready"}, 2, "unknown flag: --stat"},
		{[]string{"events", "--after", "abc"}, 2, `invalid argument "abc" for "--after" flag`},
		{[]string{"node", "list", "-o", "yaml"}, 2, "accepted are table and json"},
		{[]string{"node", "list", "--server", "127.0.0.1:7480"}, 2, "use http://HOST:PORT or https://HOST:PORT"},
		{[]string{"node", "list", "--ca-file", "ca.pem"}, 2, `--ca-file is for a server at https://…; --server is "http://127.0.0.1:1"`},
		{[]string{"server", "--fast-track-window", "48h"}, 2, "--fast-track-window 48h0m0s: use a duration from 0s (off) to 24h0m0s"},
		{[]string{"server", "--api-tls-cert", "api.pem"}, 2, "--api-tls-cert and --api-tls-key go together"},
		{[]string{"server", "--log-level", "loud"}, 2, `--log-level "loud": accepted are debug, info, warn, error`},
		{[]string{"node"}, 0, ""},
		{[]string{"--help"}, 0, ""},
		{[]string{"node", "get", "--help"}, 0, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := run(t, env, tc.args...)
			if code != tc.want || !strings.Contains(errs, tc.msg) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, tc.want, tc.msg)
			}
			if tc.want == 2 && out != "" {
				t.Errorf("a refused command line printed to stdout:\n%s", out)
			}
			if tc.want == 0 && !strings.Contains(out, "Usage:") {
				t.Errorf("no help printed:\n%s", out)
			}
		})
	}
}

// TestExitCodesAgainstServer: what a script sees from a real server, one call per exit code.
func TestExitCodesAgainstServer(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw"}
	if code, _, errs := run(t, env, "node", "enroll", "x1", "--bmc-address", "https://10.0.0.2", "--bmc-username", "root", "--mac", "52:54:00:00:00:b1"); code != 0 {
		t.Fatalf("enroll: %d %s", code, errs)
	}
	code, out, errs := run(t, env, "token", "create", "looker", "--role", "viewer")
	if code != 0 {
		t.Fatalf("token create: %d %s", code, errs)
	}
	viewer := ""
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "bcd") && len(f) > 20 {
			viewer = f
		}
	}
	if viewer == "" {
		t.Fatalf("no token in %q", out)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want int
		msg  string
	}{
		{"success", env, []string{"node", "get", "x1"}, 0, ""},
		{"not found", env, []string{"node", "get", "nosuch"}, 3, "not_found"},
		{"refused in this state", env, []string{"node", "manage", "x1"}, 4, "failed_precondition"},
		{"already exists", env, []string{"site", "create", "default"}, 4, "already_exists"},
		{"refused value", env, []string{"node", "deploy", "x1", "--image", "debian"}, 2, "invalid_argument"},
		{"no token", map[string]string{"BCD_SERVER": url}, []string{"node", "list"}, 5, "BCD_TOKEN"},
		{"unknown token", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": "bcd_nosuchtoken"}, []string{"node", "list"}, 5, ""},
		{"role too weak", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": viewer}, []string{"node", "abort", "x1"}, 5, "permission_denied"},
		{"nothing listens", map[string]string{"BCD_SERVER": "http://127.0.0.1:1", "BCD_TOKEN": token}, []string{"node", "list"}, 6, "is bcd server running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := run(t, tc.env, tc.args...)
			if code != tc.want || !strings.Contains(errs, tc.msg) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, tc.want, tc.msg)
			}
		})
	}
}

// TestExitCodesDocumented: docs/cli.md's table is exitTable, row for row.
func TestExitCodesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Exit codes\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []string
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| Code") {
			rows = append(rows, l)
		}
	}
	table := exitTable()
	if len(rows) != len(table) {
		t.Errorf("docs/cli.md has %d exit code rows, the table %d", len(rows), len(table))
	}
	for i, r := range table {
		want := fmt.Sprintf("| %d | %s |", r.code, r.meaning)
		if i >= len(rows) || rows[i] != want {
			t.Errorf("docs/cli.md row %d: want\n%s", i, want)
		}
	}
}
