package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	"bcd/internal/metal"
	"bcd/internal/site"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// An operator's console, end to end without QEMU: the API's stream on a real server, the
// engine's bmc.console command taken by a real site agent, the gateway's console stream checked
// against the command's row, IPMI Serial-over-LAN to the virtual BMC bridged to a machine's
// serial port, while the node's enroll workflow drives the same BMC. Closing the stream ends
// the command with its counts, and the session is in the node's events.
func TestConsoleEndToEnd(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) { consoleEndToEnd(t, e) })
	}
}

func consoleEndToEnd(t *testing.T, e store.Engine) {
	env := startSiteEnv(t, e)
	env.startAgent("a1", env.srv.GatewayURL(), 0, site.PollConfig{}, env.ramdisk)

	const ipmiPass = "console-ipmi-pw" // IPMI passwords are at most 20 bytes
	typed := make(chan string, 4)
	b, err := ipmibmc.New(ipmibmc.Config{Addr: "127.0.0.1:0", Username: bmcUser, Password: ipmiPass, Serial: vbmc.FakeSerial("m2 login: ", typed), Logger: env.log}, vbmc.NewFakeMachine())
	if err != nil {
		t.Fatal(err)
	}
	bctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- b.Serve(bctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("ipmi bmc: %v", err)
		}
	})
	admin := auth.Principal{Name: "test", Role: auth.Admin}
	n, err := env.srv.Service().Enroll(env.ctx, admin, metal.EnrollInput{Name: "m2", Pool: "default", MACs: []string{"52:54:00:00:0c:02"},
		BMC: metal.BMCInput{Driver: "ipmi", Address: b.Addr().String(), Username: bmcUser, Password: ipmiPass}})
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(env.ctx, 90*time.Second)
	defer cancel()
	nodes := bcdv1connect.NewNodeServiceClient(http.DefaultClient, env.srv.URL())
	req := connect.NewRequest(&bcdv1.ConsoleRequest{Node: "m2", Reason: "watch the enrollment"})
	req.Header().Set("Authorization", "Bearer "+env.srv.FirstAdminToken())
	sctx, closeConsole := context.WithCancel(ctx)
	defer closeConsole()
	s, err := nodes.Console(sctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var out strings.Builder
	until := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			if !s.Receive() {
				c, cerr := env.st.Command(env.ctx, id)
				t.Fatalf("console ended before %q (got %q): %v; its command: %s target %q attempts %d error %q (%v)", want, out.String(), s.Err(), c.State, c.TargetAgent, c.Attempts, c.Error, cerr)
			}
			m := s.Msg()
			if m.SessionId != "" {
				id = m.SessionId
			}
			if m.Status != "" {
				out.WriteString("[" + m.Status + "]")
			}
			out.Write(m.Data)
		}
	}
	until("[connected through site agent ")
	until("m2 login: ")
	in := connect.NewRequest(&bcdv1.ConsoleInputRequest{SessionId: id, Data: []byte("root\r")})
	in.Header().Set("Authorization", "Bearer "+env.srv.FirstAdminToken())
	if _, err := nodes.ConsoleInput(ctx, in); err != nil {
		t.Fatal(err)
	}
	until("typed: root")
	if got := <-typed; got != "root\r" {
		t.Errorf("the machine got %q", got)
	}
	closeConsole()

	// The command ends with the session's counts; both events are there.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := env.st.Command(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.State == "succeeded" {
			var res struct{ BytesIn, BytesOut int64 }
			if err := json.Unmarshal([]byte(c.Result), &res); err != nil || res.BytesIn != 5 || res.BytesOut == 0 {
				t.Errorf("result %s (%v)", c.Result, err)
			}
			if strings.Contains(c.Args, ipmiPass) {
				t.Error("the command's row holds the BMC password")
			}
			break
		}
		if c.State == "failed" || c.State == "lost" || time.Now().After(deadline) {
			t.Fatalf("console command %s: %s", c.State, c.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	evs, err := env.st.Events(ctx, store.EventFilter{NodeID: n.ID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, ev := range evs {
		kinds[ev.Kind] = true
	}
	if !kinds["node.console"] || !kinds["node.console.closed"] {
		t.Errorf("events %v: want the session opened and closed", kinds)
	}
}
