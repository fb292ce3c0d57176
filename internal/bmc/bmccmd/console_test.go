package bmccmd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	"bcd/internal/testlog"
)

// `bcd bmc console` against the virtual IPMI BMC bridged to a machine's serial port: the
// machine's prompt shows, a typed line reaches it, ~. leaves with the payload released (a
// second console then opens without --take-over); Redfish is refused with the advice.
func TestConsoleAgainstVirtualBMC(t *testing.T) {
	b := startIPMI(t, vbmc.NewFakeMachine(), func(c *ipmibmc.Config) { c.Serial = vbmc.FakeSerial("lab login: ", nil) })
	conn := []string{"--driver", "ipmi", "--address", b.Addr().String()}

	for round := range 2 {
		stdinR, stdinW := io.Pipe()
		out, errb := &testlog.Buffer{}, &testlog.Buffer{}
		cmd := newCommand(testDeps(nil))
		cmd.SetArgs(args([]string{"console"}, conn, creds(t)))
		cmd.SetIn(stdinR)
		cmd.SetOut(out)
		cmd.SetErr(errb)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(ctx) }()
		waitFor := func(want string) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(out.String(), want) {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: console printed %q, waiting for %q (stderr %q)", round, out.String(), want, errb.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		waitFor("lab login: ")
		fmt.Fprint(stdinW, "root\r")
		waitFor("typed: root")
		fmt.Fprint(stdinW, "~.")
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v (stderr %q)", round, err, errb.String())
		}
		stdinW.Close()
		cancel()
		if !strings.Contains(errb.String(), "left the console") {
			t.Errorf("round %d: stderr %q", round, errb.String())
		}
		noLeak(t, out.String(), errb.String())
	}

	if _, _, err := execute(t, testDeps(nil), args([]string{"console"}, []string{"--driver", "redfish", "--address", "https://127.0.0.1:1"}, creds(t))...); err == nil || !strings.Contains(err.Error(), "use --driver ipmi") {
		t.Errorf("redfish console: %v", err)
	}
}
