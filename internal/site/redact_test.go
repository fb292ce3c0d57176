package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
	"bcd/internal/testlog"
)

// A BMC address written with user information or a query (the control plane refuses both, the
// agent does not count on it) never shows them in an AttemptsError: neither where the error
// names the BMC nor in a driver's error that quotes the address.
func TestAttemptsErrorRedactsTheBMCAddress(t *testing.T) {
	careless := func(_ context.Context, ep bmc.Endpoint) (any, error) {
		return nil, fmt.Errorf("dial %q (%s): refused", ep.Address, ep.Address)
	}
	reg := builtinDrivers(redfish.Options{}, ipmi.Options{}, ipmi.NewPacer(ipmi.PacerConfig{}))
	reg["careless"] = careless
	cases := []struct {
		driver, address, shown string
		secrets                []string
	}{
		// The real IPMI driver refuses it without dialling; its error used to quote it.
		{DriverIPMI, "admin:addr-pw-1@10.0.0.5:623", "10.0.0.5:623", []string{"addr-pw-1", "admin:"}},
		{"careless", "admin:addr-pw-1@10.0.0.5:623", "10.0.0.5:623", []string{"addr-pw-1", "admin:"}},
		{"careless", "https://root:p%40ss-2@10.0.0.6/redfish/v1/Systems/1?token=tok-secret-3#frag-4", "https://10.0.0.6/redfish/v1/Systems/1",
			[]string{"p%40ss-2", "p@ss-2", "root:", "tok-secret-3", "frag-4"}},
		{"careless", "10.0.0.7?password=qs-pw-5", "10.0.0.7", []string{"qs-pw-5", "password="}},
		{"careless", "user@pw-with-@-6@10.0.0.8", "10.0.0.8", []string{"pw-with", "-6"}},
	}
	for _, c := range cases {
		ep := bmc.Endpoint{Address: c.address, Username: "admin", Password: "ep-password-0"}
		err := withDriver(context.Background(), reg, c.driver, ep, "get power", capGetPower, func(ctx context.Context, drv any) error {
			_, err := drv.(bmc.PowerGetter).GetPower(ctx)
			return err
		})
		var ae *AttemptsError
		if !errors.As(err, &ae) || len(ae.Attempts) != 1 {
			t.Fatalf("%s %s: %v, want an AttemptsError", c.driver, c.address, err)
		}
		if ae.Attempts[0].Address != c.shown {
			t.Errorf("%s %s: attempt address %q, want %q", c.driver, c.address, ae.Attempts[0].Address, c.shown)
		}
		msg := err.Error()
		if !strings.Contains(msg, "at "+c.shown+":") {
			t.Errorf("%s %s: %q does not name the BMC as %s", c.driver, c.address, msg, c.shown)
		}
		for _, s := range append(c.secrets, ep.Password) {
			if strings.Contains(msg, s) {
				t.Errorf("%s %s: %q shows %q", c.driver, c.address, msg, s)
			}
		}
	}
}

// The poller's log of a failed read names the BMC without the user information or query of its
// address.
func TestPollFailureLogRedactsTheBMCAddress(t *testing.T) {
	probe := func(context.Context, BMCRef, string) (bmc.PowerState, error) { return "", errors.New("timeout") }
	r := &reports{got: map[string][]bmc.PowerState{}, failures: map[string][]int{}, ch: make(chan struct{}, 1)}
	var logs testlog.Buffer
	p := newPoller(PollConfig{Interval: 20 * time.Millisecond, MaxInterval: time.Second}, probe, newBMCLocks(), r,
		slog.New(slog.NewTextHandler(&logs, nil)), time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	p.Watch("n1", BMCRef{Driver: "ipmi", Address: "admin:poll-pw-1@10.0.0.5:623?token=poll-tok-2"}, "jwe")
	deadline := time.After(10 * time.Second)
	for len(r.failuresOf("n1")) == 0 || !strings.Contains(logs.String(), "power poll failed") {
		select {
		case <-r.ch:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no failed read logged: %s", logs.String())
		}
	}
	cancel()
	<-done
	out := logs.String()
	if !strings.Contains(out, "ipmi|10.0.0.5:623") {
		t.Errorf("the log does not name the BMC: %s", out)
	}
	for _, s := range []string{"poll-pw-1", "poll-tok-2", "admin:"} {
		if strings.Contains(out, s) {
			t.Errorf("the log shows %q: %s", s, out)
		}
	}
}
