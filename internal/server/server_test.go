package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/server"
	"bcd/internal/sim"
	"bcd/internal/store"
)

// TestLifecycleOverTheGateway runs the whole lifecycle with agents that speak the real gateway
// protocol: a site agent that joined with a bootstrap token and decrypts BMC credentials sent
// to it as JWE, ramdisks that join with their boot entry's one-time token and whose attested
// results agentlink signs, and the installed OS rejoining with its instance token.
// serve starts a server on loopback with cfg (its addresses and data dir filled in) and runs
// it until the test ends, when it must stop cleanly. ctx ends with the test.
func serve(t *testing.T, cfg server.Config, log *slog.Logger) (*server.Server, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Listen, cfg.GatewayListen = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	srv, err := server.New(ctx, cfg, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return srv, ctx
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(logSink(t), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestLifecycleOverTheGateway(t *testing.T) {
	dir := t.TempDir()
	srv, ctx := serve(t, server.Config{DataDir: dir}, testLog(t))
	st := srv.Service().Store()
	site, err := st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	s := sim.New(sim.Config{SiteID: site.ID, Gateway: &sim.GatewayTarget{URL: srv.GatewayURL(), CAPEM: srv.CAPEM(), DataDir: filepath.Join(dir, "os")}}, srv.Engine())
	tok, err := srv.CreateSiteJoinToken(ctx, site.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgents := context.WithCancel(ctx)
	link, err := s.RunSiteAgentOverGateway(agentCtx, tok, filepath.Join(dir, "site-agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopAgents(); link.Wait(); s.Wait() }()

	admin := auth.Principal{Name: "test", Role: auth.Admin}
	if err := sim.SeedImages(ctx, srv.Service(), admin, "debian-12"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 2 {
		mac, uuid := fmt.Sprintf("02:aa:00:00:00:%02x", i), fmt.Sprintf("0000000%d-1111-4222-8333-444444444444", i)
		n, err := srv.Service().Enroll(ctx, admin, metal.EnrollInput{Name: fmt.Sprintf("gw-%d", i), Pool: "default", MACs: []string{mac}, ProductUUID: uuid,
			BMC: metal.BMCInput{Address: "https://10.20.0.1", Username: "root", Password: "gateway-test-password"}})
		if err != nil {
			t.Fatal(err)
		}
		s.Add(&sim.Machine{NodeID: n.ID, UUID: uuid, MACs: []string{mac}})
		ids = append(ids, n.ID)
	}
	// A node enrolled by product UUID alone (IPMI): its MAC is learned from the site agent's
	// status report (PXE boot under the UUID, here in the other SMBIOS byte order) through the
	// gateway, and bound at once in a pool that trusts its provisioning network.
	if _, err := srv.Service().CreatePool(ctx, admin, "trusted", "default", store.PoolPolicy{HardwareProfile: "redfish", TrustProvisioningNetwork: true}); err != nil {
		t.Fatal(err)
	}
	n, err := srv.Service().Enroll(ctx, admin, metal.EnrollInput{Name: "gw-uuid", Pool: "trusted", ProductUUID: "00112233-4455-4677-8899-aabbccddeeff",
		BMC: metal.BMCInput{Address: "https://10.20.0.9", Username: "root", Password: "gateway-test-password"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Add(&sim.Machine{NodeID: n.ID, UUID: n.ProductUUID, PXEUUID: "33221100-5544-7746-8899-aabbccddeeff", MACs: []string{"02:aa:00:00:00:99"}, NoOOBMACs: true})
	ids = append(ids, n.ID)
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			done := 0
			for _, id := range ids {
				n, _ := st.Node(ctx, id, "")
				if n.State == want && n.TargetState == "" {
					done++
				}
				if n.State == "failed" {
					t.Fatalf("node %s failed: %s %s", n.Name, n.FaultCode, n.FaultMsg)
				}
			}
			if done == len(ids) {
				return
			}
			select {
			case err := <-s.Errors():
				t.Fatalf("simulated agent: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				for _, id := range ids {
					n, _ := st.Node(ctx, id, "")
					wfs, _ := st.Workflows(ctx, id, 1)
					for _, w := range wfs {
						t.Logf("%s %s: %s %s step %d cmd %s fault %s %s", n.Name, n.State, w.Profile, w.State, w.StepIndex, w.CurrentCommand, w.FaultCode, w.Error)
					}
					cmds, _ := st.Commands(ctx, id, 100)
					for _, c := range cmds {
						t.Logf("   %s %s agent=%s err=%s", c.Kind, c.State, c.TargetAgent, c.Error)
					}
				}
				t.Fatalf("nodes not %s after 60 s", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("ready")
	if n, _ := st.Node(ctx, n.ID, ""); len(n.MACs) != 1 || n.MACs[0] != "02:aa:00:00:00:99" {
		t.Fatalf("the MAC-less node's MACs: %v", n.MACs)
	}
	for _, id := range ids {
		if _, _, err := srv.Service().Apply(ctx, admin, provision.VerbDeploy, metal.VerbInput{Node: id, Image: "debian-12"}); err != nil {
			t.Fatal(err)
		}
	}
	wait("deployed")
	for _, id := range ids {
		if _, _, err := srv.Service().Apply(ctx, admin, provision.VerbUndeploy, metal.VerbInput{Node: id}); err != nil {
			t.Fatal(err)
		}
	}
	wait("ready")
	for id, n := range s.Executions() {
		if n != 1 {
			t.Errorf("command %s ran %d times", id, n)
		}
	}
	// /metrics tells how long the commands and workflows took: every node's two wipes and its
	// release, each counted once.
	for series, want := range map[string]int{
		`bcd_command_duration_seconds_count{kind="disk.wipe",state="succeeded"}`:         2 * len(ids),
		`bcd_workflow_duration_seconds_count{profile="metal-release",state="succeeded"}`: len(ids),
		// Each wipe waited for a ramdisk to acknowledge it: a wait apiece.
		`bcd_command_queue_wait_seconds_count{kind="disk.wipe"}`: 2 * len(ids),
	} {
		if got := counter(t, srv.Addr(), series); got != want {
			t.Errorf("%s = %d, want %d", series, got, want)
		}
	}
	// The SQLite writer's work shows in /metrics.
	if got := counter(t, srv.Addr(), "bcd_store_writes_total"); got == 0 {
		t.Error("bcd_store_writes_total is 0 after a lifecycle")
	}
	counter(t, srv.Addr(), "bcd_store_writer_busy_seconds_total")
	counter(t, srv.Addr(), "bcd_store_wal_restarts_total")
	counter(t, srv.Addr(), "bcd_store_wal_restarts_waited_total")
	counter(t, srv.Addr(), "bcd_store_writer_reruns_total")
	if n := counter(t, srv.Addr(), "bcd_store_wal_flushes_total"); n < 1 {
		t.Errorf("bcd_store_wal_flushes_total = %v after writes, want at least 1", n)
	}
	counter(t, srv.Addr(), "bcd_store_wal_flush_seconds_total")
	// The joins' certificates and the attested results went through the CPU gate.
	if n := counter(t, srv.Addr(), "bcd_engine_cpu_gate_admissions_total"); n < len(ids) {
		t.Errorf("bcd_engine_cpu_gate_admissions_total = %d after %d nodes' lifecycles, want at least one a node", n, len(ids))
	}
	if n := counter(t, srv.Addr(), "bcd_engine_cpu_gate_slots"); n < 1 {
		t.Errorf("bcd_engine_cpu_gate_slots = %d, want at least 1", n)
	}
	counter(t, srv.Addr(), "bcd_engine_cpu_gate_wait_seconds_total")
	counter(t, srv.Addr(), "bcd_engine_cpu_gate_busy_seconds_total")
	// A command of a site without an agent waits, and /metrics says how many and how long.
	quiet, err := srv.Service().CreateSite(ctx, admin, "quiet", "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, func(tx *store.Tx) error {
		return tx.InsertCommand(ctx, &store.Command{SiteID: quiet.ID, Kind: "bmc.power", Subject: "x", Args: "{}", RunsOn: "site"})
	}); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, srv.Addr(), `bcd_commands_queued{runs_on="site",site_id="`+quiet.ID+`"}`); n != 1 {
		t.Errorf("commands queued for the quiet site's agents: %d, want 1", n)
	}
	counter(t, srv.Addr(), `bcd_commands_queued_oldest_seconds{runs_on="site",site_id="`+quiet.ID+`"}`)
	// The release's wipe was attested by the node key through the gateway, unaltered.
	cmds, _ := st.Commands(ctx, ids[0], 200)
	wipes := 0
	for _, c := range cmds {
		if c.Kind == "disk.wipe" && c.State == "succeeded" {
			wipes++
			if len(c.ResultSig) == 0 || len(c.SignerCert) == 0 {
				t.Errorf("wipe %s stored without signature", c.ID)
			}
		}
	}
	if wipes != 2 {
		t.Errorf("%d attested wipes, want 2 (commission and release)", wipes)
	}
	// nodeSignedResults: the stored row verifies; a result altered after the fact (as a gateway
	// or a database writer could), a forged signature, or a revoked generation does not.
	var wipe store.Command
	for _, c := range cmds {
		if c.Kind == "disk.wipe" && c.State == "succeeded" {
			wipe = c
		}
	}
	// The release revoked the identity of the lease first: its wipe was made, and signed, for
	// the generation after the commissioning's.
	if wipe.Generation != 2 {
		t.Errorf("the release's wipe was made for generation %d, want 2 (the release begins by revoking 1)", wipe.Generation)
	}
	gen := wipe.Generation
	if err := srv.Engine().NodeSignedResult(wipe, gen); err != nil {
		t.Fatalf("honest wipe result: %v", err)
	}
	altered := wipe
	altered.Result = strings.Replace(wipe.Result, `"verified":true`, `"verified":false`, 1)
	if altered.Result == wipe.Result {
		altered.Result = wipe.Result + " "
	}
	forged := wipe
	forged.ResultSig = append([]byte(nil), wipe.ResultSig...)
	forged.ResultSig[len(forged.ResultSig)-1] ^= 1
	for name, c := range map[string]store.Command{"altered result": altered, "forged signature": forged} {
		if err := srv.Engine().NodeSignedResult(c, gen); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if err := srv.Engine().NodeSignedResult(wipe, gen+1); err == nil {
		t.Error("a result signed under a revoked identity generation accepted")
	}
	checkAttestations(t, ctx, srv, ids[0], 2)

	// BMC password rotation: the new password reaches the site agent only as a JWE to its key;
	// agentlink signs the result; the engine verifies it as a site statement before the new
	// version becomes current.
	before, _ := st.Node(ctx, ids[0], "")
	rot, err := srv.Service().RotateBmcCredential(ctx, admin, ids[0], "test")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		vs, _ := st.CredentialVersions(ctx, ids[0])
		if len(vs) == 2 && vs[0].State != store.CredPending {
			if vs[0].State != store.CredCurrent {
				t.Fatalf("rotation over the gateway: %s (%s)", vs[0].State, vs[0].Error)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rotation over the gateway did not finish")
		}
		time.Sleep(20 * time.Millisecond)
	}
	after, _ := st.Node(ctx, ids[0], "")
	c, _ := st.Command(ctx, rot.CommandID)
	if after.BMCPasswordRef == before.BMCPasswordRef || len(c.ResultSig) == 0 || strings.Contains(c.Args, "credentials") {
		t.Fatalf("after rotation: ref changed=%v signed=%v args=%s", after.BMCPasswordRef != before.BMCPasswordRef, len(c.ResultSig) > 0, c.Args)
	}
}

func logSink(t *testing.T) io.Writer {
	if p := os.Getenv("BCD_TEST_LOG"); p != "" {
		f, err := os.Create(p)
		if err == nil {
			t.Cleanup(func() { f.Close() })
			return f
		}
	}
	return io.Discard
}

// A second server on a running server's SQLite store is refused at start, naming the first;
// once the first stops, a server starts on it again.
func TestOneServerPerSQLiteStore(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := server.Config{DataDir: dir, Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0"}
	first, err := server.New(ctx, cfg, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- first.Serve(ctx) }()
	if _, err := server.New(ctx, cfg, testLog(t)); err == nil || !strings.Contains(err.Error(), "in use by another bcd server") {
		t.Fatalf("a second server on the same SQLite store: %v", err)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	again, err := server.New(context.Background(), cfg, testLog(t))
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := again.Serve(ctx2); err != nil {
		t.Fatal(err)
	}
}
