package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/testlog"
)

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

// waitConsole polls the console until it contains want.
func waitConsole(t *testing.T, c *syncBuffer, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(c.String(), want) < n {
		if time.Now().After(deadline) {
			t.Fatalf("no %q (x%d) on the console:\n%s", want, n, c.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runDone is Run's outcome: wait blocks until it returned.
type runDone struct {
	ch  chan struct{}
	err error
}

func (r *runDone) wait() error {
	<-r.ch
	return r.err
}

func (r *runDone) returned() bool {
	select {
	case <-r.ch:
		return true
	default:
		return false
	}
}

// startRun runs the agent until the test cancels it.
func startRun(t *testing.T, cmdline string, cmds *Commands) (*syncBuffer, context.CancelFunc, *runDone) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	console := &syncBuffer{}
	done := &runDone{ch: make(chan struct{})}
	cfg := Config{
		Cmdline:      func() (string, error) { return cmdline, nil },
		Net:          twoNICs(),
		DHCP:         &fakeDHCP{fails: map[string]int{}, calls: map[string]int{}},
		RetryDelay:   5 * time.Millisecond,
		DecisionPoll: 10 * time.Millisecond,
		Commands:     cmds,
		Link: func(c *agentlink.Config) {
			c.MinBackoff, c.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
		},
	}
	go func() {
		defer close(done.ch)
		done.err = Run(ctx, console, slog.New(slog.DiscardHandler), cfg)
	}()
	t.Cleanup(func() {
		cancel()
		_ = done.wait()
	})
	return console, cancel, done
}

func TestRunAgainstGateway(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
	disk := fileDisk(t, "nvme0n1", 4*mib)
	inv := inventory.Inventory{
		DMI:   inventory.DMI{ProductUUID: "4c4c4544-0042"},
		NICs:  []inventory.NIC{{Name: "eno1", MAC: "52:54:00:AA:00:01"}},
		Disks: []inventory.Disk{disk},
	}
	token := env.Identities.NodeToken("n1", time.Hour)
	cmdline := "console=ttyS0 bcd.gateway=" + env.URL + " bcd.token=" + token + " bcd.ca=" + EncodeCA(env.CA.CertPEM()) + " bcd_site=http://10.0.0.1:8080"
	cmds := NewCommands(testDeps(t, inv))
	console, cancel, done := startRun(t, cmdline, cmds)
	waitConsole(t, console, MarkerJoined+" node=n1", 1)
	// boot.kexec's default guestSite is the command line's site URL.
	cmds.mu.Lock()
	site := cmds.site
	cmds.mu.Unlock()
	if site != "http://10.0.0.1:8080" {
		t.Errorf("the commands' site URL is %q, want the command line's", site)
	}

	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}
	env.Queue.Enqueue(node,
		gateway.Command{ID: "inv-1", Kind: KindInventory, NodeID: "n1", Generation: 1},
		gateway.Command{ID: "wipe-1", Kind: KindWipe, NodeID: "n1", Generation: 1, Args: []byte(`{"mode":"quick"}`)},
		gateway.Command{ID: "odd-1", Kind: "bmc.power", NodeID: "n1", Generation: 1})
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	if err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool { return c.Final >= 3 }); err != nil {
		t.Fatalf("waiting for the results: %v", err)
	}

	if h := env.Identities.Hints("n1"); h.ProductUUID != "4c4c4544-0042" || strings.Join(h.MACs, ",") != "52:54:00:aa:00:01" {
		t.Errorf("join hints %+v", h)
	}
	e, _ := env.Queue.Get("inv-1")
	var ir InventoryResult
	if err := json.Unmarshal(e.Final.Result, &ir); e.State != gatewaytest.Succeeded || err != nil ||
		ir.SystemUUID != "4c4c4544-0042" || len(ir.MACs) != 1 || len(ir.Disks) != 1 {
		t.Fatalf("inventory %s: %s (%v)", e.State, e.Final.Result, err)
	}
	if e.Final.NodeSig != nil {
		t.Error("inventory.refresh was signed: it is not attested")
	}

	w, _ := env.Queue.Get("wipe-1")
	if w.State != gatewaytest.Succeeded {
		t.Fatalf("wipe %s: %s", w.State, w.Final.Error)
	}
	var wr struct {
		Disks []wipeDisk `json:"disks"`
	}
	if err := json.Unmarshal(w.Final.Result, &wr); err != nil || len(wr.Disks) != 1 || !wr.Disks[0].Verified || wr.Disks[0].Device != disk.Path {
		t.Fatalf("wipe result %s (%v)", w.Final.Result, err)
	}
	st := pki.Statement{CommandID: "wipe-1", NodeID: "n1", Kind: KindWipe, Generation: 1, ResultSHA256: pki.ResultDigest(w.Final.Result)}
	if err := pki.VerifyStatement(env.CA, w.Final.SignerCertDER, st, w.Final.NodeSig, 1, time.Now()); err != nil {
		t.Fatalf("the wipe is not attested: %v", err)
	}
	if err := pki.VerifyStatement(env.CA, w.Final.SignerCertDER, st, w.Final.NodeSig, 2, time.Now()); !errors.Is(err, pki.ErrIdentityRevoked) {
		t.Errorf("verified against a newer generation: %v", err)
	}

	o, _ := env.Queue.Get("odd-1")
	if o.State != gatewaytest.Failed || !strings.Contains(o.Final.Error, "this ramdisk runs") {
		t.Errorf("unknown kind: %s %q", o.State, o.Final.Error)
	}
	if strings.Contains(console.String(), token) {
		t.Error("the token is on the console")
	}

	cancel()
	if err := done.wait(); err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
}

func TestRunRetriesUnreachableGateway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cmdline := "bcd.gateway=https://" + addr + " bcd.token=" + tok + " bcd.ca=" + EncodeCA(testCA(t))
	console, cancel, done := startRun(t, cmdline, NewCommands(testDeps(t, inventory.Inventory{})))
	waitConsole(t, console, "gateway not reachable yet", 3)
	cancel()
	if err := done.wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want the cancellation", err)
	}
	if strings.Contains(console.String(), MarkerJoined) {
		t.Fatalf("joined nothing:\n%s", console)
	}
}

func TestRunRefusedTokenStops(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
	cmdline := "bcd.gateway=" + env.URL + " bcd.token=" + tok + " bcd.ca=" + EncodeCA(env.CA.CertPEM())
	console, _, done := startRun(t, cmdline, NewCommands(testDeps(t, inventory.Inventory{})))
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	select {
	case <-done.ch:
		if !errors.Is(done.err, agentlink.ErrRefused) {
			t.Fatalf("Run = %v, want refused", done.err)
		}
	case <-wctx.Done():
		t.Fatal("Run kept going with a refused token")
	}
	if !strings.Contains(console.String(), "refused this machine's token") || strings.Contains(console.String(), tok) {
		t.Fatalf("console:\n%s", console)
	}
}

func TestRunDiscoveryReportsAndWaits(t *testing.T) {
	inv := inventory.Inventory{
		DMI:   inventory.DMI{ProductUUID: "4c4c4544-0042"},
		NICs:  []inventory.NIC{{Name: "eno1", MAC: "52:54:00:aa:00:01"}},
		Disks: []inventory.Disk{{Name: "sda", SizeBytes: 1 << 30}},
	}
	console, cancel, done := startRun(t, "bcd.gateway=https://127.0.0.1:1/ bcd.mode=discovery", NewCommands(testDeps(t, inv)))
	waitConsole(t, console, MarkerDiscovery+" systemUuid=4c4c4544-0042 macs=52:54:00:aa:00:01 disks=sda:1073741824", 1)
	if done.returned() {
		t.Fatalf("discovery mode ended by itself: %v", done.err)
	}
	cancel()
	if err := done.wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// TestRunDiscoveryAcceptedJoins: a discovery-mode agent reports to the site and waits; once the
// site has a ramdisk entry for its boot MAC (the machine was accepted), it joins the gateway
// with that entry's token as the node, without a reboot, and runs commands.
func TestRunDiscoveryAcceptedJoins(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
	inv := inventory.Inventory{
		DMI:  inventory.DMI{ProductUUID: "4c4c4544-0042-3510-8057-b4c04f4b4d32"},
		NICs: []inventory.NIC{{Name: "eno1", MAC: "52:54:00:aa:00:01"}},
	}
	entries := &switchEntries{m: map[string]netboot.Entry{}}
	rec := &recordedDiscoveries{}
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: "http://127.0.0.1:1", Entries: entries, Discovery: rec, Artifacts: noArtifacts{}})
	if err != nil {
		t.Fatal(err)
	}
	site := httptest.NewServer(h)
	t.Cleanup(site.Close)
	const mac = "52:54:00:aa:00:01"
	cmdline := "bcd.gateway=" + env.URL + " bcd.mode=discovery bcd.report=" + site.URL + netboot.DiscoveryPath + " bcd.bootmac=" + mac
	console, cancel, done := startRun(t, cmdline, NewCommands(testDeps(t, inv)))
	waitConsole(t, console, MarkerDiscovery+" reported to the site as "+mac, 1)
	if done.returned() || strings.Contains(console.String(), MarkerJoined) {
		t.Fatalf("joined before any decision: %v\n%s", done.err, console)
	}
	token := env.Identities.NodeToken("n1", time.Hour)
	sha := strings.Repeat("b", 64)
	entries.mu.Lock()
	entries.m[mac] = netboot.Entry{Kind: netboot.KindRamdisk, Kernel: netboot.Artifact{Name: "vmlinuz", URL: "http://o.example/k", SHA256: sha},
		Initrd: netboot.Artifact{Name: "initrd.img", URL: "http://o.example/i", SHA256: sha}, GatewayURL: env.URL, Token: token, CA: EncodeCA(env.CA.CertPEM())}
	entries.mu.Unlock()
	waitConsole(t, console, MarkerJoined+" node=n1", 1)
	env.Queue.Enqueue(gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}, gateway.Command{ID: "inv-1", Kind: KindInventory, NodeID: "n1", Generation: 1})
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	if err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool { return c.Final >= 1 }); err != nil {
		t.Fatalf("waiting for the inventory: %v", err)
	}
	if e, _ := env.Queue.Get("inv-1"); e.State != gatewaytest.Succeeded {
		t.Fatalf("inventory after joining from discovery: %s %s", e.State, e.Final.Error)
	}
	if strings.Contains(console.String(), token) {
		t.Error("the token is on the console")
	}
	cancel()
	if err := done.wait(); err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
}

// TestRunDiscoveryRejectedPowersOff: a discovery-mode agent whose machine an operator rejected
// (the site answers 410) says so on the console and powers its host off.
func TestRunDiscoveryRejectedPowersOff(t *testing.T) {
	inv := inventory.Inventory{
		DMI:  inventory.DMI{ProductUUID: "4c4c4544-0042-3510-8057-b4c04f4b4d32"},
		NICs: []inventory.NIC{{Name: "eno1", MAC: "52:54:00:aa:00:01"}},
	}
	const mac = "52:54:00:aa:00:01"
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: "http://127.0.0.1:1", Entries: &switchEntries{m: map[string]netboot.Entry{}},
		Discovery: &recordedDiscoveries{}, Artifacts: noArtifacts{}, Rejections: rejections{mac: true}})
	if err != nil {
		t.Fatal(err)
	}
	site := httptest.NewServer(h)
	t.Cleanup(site.Close)
	d := testDeps(t, inv)
	off := &fakePowerOff{called: make(chan struct{}, 1)}
	d.PowerOff = off
	cmdline := "bcd.gateway=https://127.0.0.1:1/ bcd.mode=discovery bcd.report=" + site.URL + netboot.DiscoveryPath + " bcd.bootmac=" + mac
	console, cancel, done := startRun(t, cmdline, NewCommands(d))
	waitPowerOff(t, off)
	waitConsole(t, console, MarkerDiscovery+" rejected by an operator: powering off", 1)
	if strings.Contains(console.String(), MarkerJoined) {
		t.Fatalf("a rejected machine joined:\n%s", console)
	}
	cancel()
	if err := done.wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
