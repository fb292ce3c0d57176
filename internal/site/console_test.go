package site_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"bcd/internal/console"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// readUntil reads the session's output until it holds want.
func readUntil(ctx context.Context, t *testing.T, s *console.Session, want string, logs *syncBuffer) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		b, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("console output %q, waiting for %q: %v\nlog:\n%s", got.String(), want, err, logs.String())
		}
		got.Write(b)
	}
	return got.String()
}

// An operator's console session through the real site agent, the real gateway stream and the
// IPMI driver's Serial-over-LAN, against the virtual IPMI BMC bridged to a machine's serial
// port: the machine's output reaches the session, what is typed reaches the machine, the BMC's
// other calls go on during the session, and the operator's close ends the command with its
// counts. A session the control plane does not hold fails its command.
func TestConsoleThroughTheAgent(t *testing.T) {
	hub := console.NewHub("")
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond, Consoles: gatewaytest.HubConsoles(hub)})
	logs := &syncBuffer{}
	log := logger(t, logs)
	cfg := agentConfig(t, env, "a1", t.TempDir(), log)
	// The driver's default exchange timeout: the console takes a BMC silent for Timeout ×
	// (1 + Retries) as gone, and a loaded test machine must not look like that.
	cfg.IPMIOptions.Timeout = 2 * time.Second
	ag := startAgent(t, cfg, "a1")
	cert := ag.certDER(t)

	addr := ipmiBMC(t, vbmc.NewFakeMachine(), bmcUser, bmcPass, log, func(c *ipmibmc.Config) { c.Serial = vbmc.FakeSerial("bcd-lab login: ", nil) })
	ref := map[string]any{"driver": "ipmi", "address": addr, "usernameRef": "secret://u", "passwordRef": "secret://p"}
	creds := credentials(t, cert, bmcUser, bmcPass)
	args := map[string]any{"nodeId": "n1", "bmc": ref, "credentials": creds}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := hub.Open(console.Info{ID: "console-1", NodeID: "n1", Owner: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan gateway.Update, 1)
	go func() { ended <- do(t, env, ag, "console-1", "bmc.console", "n1", args) }()
	select {
	case <-s.Attached():
	case <-ctx.Done():
		t.Fatalf("the site agent never attached; agent log:\n%s", logs.String())
	}
	if s.Agent() != "a1" {
		t.Errorf("attached agent %q", s.Agent())
	}
	readUntil(ctx, t, s, "bcd-lab login: ", logs)
	if err := s.Input(ctx, []byte("root\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(ctx, t, s, "typed: root", logs)

	// The workflows' BMC calls are not held up by the session (no BMC lock, no pacer slot).
	if u := do(t, env, ag, "power-1", "bmc.query", "n1", map[string]any{"nodeId": "n1", "bmc": ref, "credentials": creds, "query": "power"}); u.State != "succeeded" {
		t.Fatalf("power query during a console session: %s %s", u.State, u.Error)
	}

	s.Close()
	var u gateway.Update
	select {
	case u = <-ended:
	case <-ctx.Done():
		t.Fatal("the console command never ended after the operator closed the session")
	}
	var res struct {
		BytesIn, BytesOut int64
		Ended             string
	}
	if err := json.Unmarshal(u.Result, &res); u.State != "succeeded" || err != nil || res.BytesIn != 5 || res.BytesOut < int64(len("bcd-lab login: typed: root")) || res.Ended != "closed by the operator" {
		t.Fatalf("console command: %s %s %s (%v)", u.State, u.Error, u.Result, err)
	}

	// A console command whose session this control plane does not hold fails, saying so.
	if u := do(t, env, ag, "console-2", "bmc.console", "n1", args); u.State != "failed" || !strings.Contains(u.Error, "no console session") {
		t.Fatalf("console without a session: %s %q", u.State, u.Error)
	}
	if strings.Contains(logs.String(), bmcPass) {
		t.Error("the BMC password reached the logs")
	}
}
