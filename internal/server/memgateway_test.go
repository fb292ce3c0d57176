package server_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/memnet"
	"bcd/internal/server"
	"bcd/internal/sim"
)

// TestLifeOverAnInMemoryGateway is `bcd sim --gateway`: the server's gateway accepts on an
// in-memory listener, and the simulated site agent, ramdisks and installed OSes reach it through
// it (mTLS and HTTP/2 as over TCP). Every node goes through its life, no command runs twice,
// and every agent's connection was made through the listener's dial: none went to TCP.
func TestLifeOverAnInMemoryGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server and 6 simulated machines over the gateway")
	}
	ln := memnet.Listen("127.0.0.1:1") // a connection that went to TCP instead would be refused
	dir := t.TempDir()
	srv, ctx := serve(t, server.Config{DataDir: dir, GatewayListener: ln}, testLog(t)) // (serve sets GatewayListen too)
	if got := srv.GatewayURL(); got != "https://127.0.0.1:1" {
		t.Fatalf("gateway URL %q, want the in-memory listener's address", got)
	}
	var dials atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return ln.DialContext(ctx, network, addr)
	}
	h, err := sim.StartOnServer(ctx, srv, sim.Config{Seed: 5, Gateway: &sim.GatewayTarget{Dial: dial}}, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	const n = 6
	rep, err := h.RunPhases(ctx, n, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Phases {
		if p.Nodes != n || p.Failed != 0 {
			t.Errorf("%s: %d nodes, %d failed; want %d, 0", p.Name, p.Nodes, p.Failed, n)
		}
	}
	if rep.RanTwice != 0 || rep.Lost != 0 {
		t.Errorf("%d commands ran twice, %d lost", rep.RanTwice, rep.Lost)
	}
	// The site agent, then for each machine at least a ramdisk per phase and its installed OS.
	if got := dials.Load(); got < 1+4*n {
		t.Errorf("%d connections dialled through the in-memory network, want at least %d", got, 1+4*n)
	}
}
