package netboot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/engine"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/metal"
	"bcd/internal/netboot"
	"bcd/internal/provision"
	"bcd/internal/server"
	"bcd/internal/sim"
	siteagent "bcd/internal/site"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// e2eUserData is the operator's user-data of the end-to-end tests; the token in it must never
// leave the sealed secret, the gateway's encrypted command and the site agent's memory.
const (
	e2eUserSecret = "e2e-UserData-Secret-3b7d1"
	e2eUserData   = "#cloud-config\nssh_authorized_keys: [\"ssh-ed25519 AAAAC3Nz " + e2eUserSecret + "\"]\n"
	e2eMAC        = "52:54:00:ee:00:01"
)

// cloudProfile is a deploy profile for a cloud image on site base: no ramdisk boot (the test's
// node is at rest in the ramdisk already) and no image write, then the instance and its kexec.
func cloudProfile(base string) string {
	return `{"steps": [{"use": "boot.prepareInstance"},
		{"use": "boot.kexec", "args": {"guest": "cloud-init", "guestSite": "` + base + `"}}]}`
}

// getFrom GETs url from the local address from (a loopback address: the node's, or another).
func getFrom(t *testing.T, from, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s from %s: %v", url, from, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestUserDataReachesTheMachine: operator user-data given to the deploy verb through the public
// API travels sealed in the store, as a reference in the command row, encrypted to the site
// agent over the mTLS gateway, and is served at /cloud-init/user-data exactly as given, to the
// node's bound address only (another address and the time before the instance is prepared get
// 404). The node shows only its size and digest; the rejoin (bcd's vendor-data script, POST
// /rejoin from the node's address) completes the deploy; the text appears in no API answer,
// event, command row or log line of the control plane and site agent.
func TestUserDataReachesTheMachine(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", DataDir: t.TempDir(),
		StoreDSN: storetest.DSN(t, store.SQLite), Engine: engine.Config{Poll: 20 * time.Millisecond}}, log.With("process", "server"))
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
	st := srv.Service().Store()
	siteRow, err := st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}

	// Real site agents: DHCP off, boot binding none (an address is the node's once it fetched
	// its MAC's script).
	type agent struct {
		*siteagent.Agent
		base, dir string
		stop      func()
	}
	startAgent := func(name string) agent {
		t.Helper()
		tok, err := srv.CreateSiteJoinToken(ctx, siteRow.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := agent{base: "http://" + ln.Addr().String(), dir: filepath.Join(t.TempDir(), name)}
		if a.Agent, err = siteagent.New(siteagent.Config{GatewayURL: srv.GatewayURL(), Site: siteRow.ID, JoinToken: tok, DataDir: a.dir,
			CAPEM: srv.CAPEM(), HTTPListener: ln, HTTPBaseURL: a.base, IPXEDir: t.TempDir(), RetryAfter: time.Second, DrainTimeout: -1,
			LeaseTTL: 15 * time.Second, HeartbeatInterval: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Logger: log.With("process", "site-"+name)}); err != nil {
			t.Fatal(err)
		}
		agCtx, agStop := context.WithCancel(ctx)
		agDone := make(chan error, 1)
		go func() { agDone <- a.Run(agCtx) }()
		var once sync.Once
		a.stop = func() { once.Do(func() { agStop(); <-agDone }) }
		t.Cleanup(a.stop)
		return a
	}
	first := startAgent("a")
	base := first.base
	waitFor(t, "the site agent to hold the boot lease", 30*time.Second, first.HoldsBootLease)

	// A node at rest, ready, with its MAC (the lifecycle up to here is tested elsewhere).
	pools, err := st.Pools(ctx, "", "")
	if err != nil || len(pools) == 0 {
		t.Fatalf("pools: %v %v", pools, err)
	}
	node := store.Node{ID: store.NewID(time.Now()), TenantID: siteRow.TenantID, SiteID: siteRow.ID, PoolID: pools[0].ID, Name: "cloud-1",
		State: string(provision.Ready), MACs: []string{e2eMAC}}
	if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertNode(ctx, &node) }); err != nil {
		t.Fatal(err)
	}
	admin := auth.Principal{Name: "test", Role: auth.Admin}
	if err := srv.Service().PutDeployProfile(ctx, admin, "cloud", cloudProfile(base)); err != nil {
		t.Fatal(err)
	}

	// The deploy, through the public API.
	api := bcdv1connect.NewNodeServiceClient(http.DefaultClient, srv.URL())
	call := func(req interface{ Header() http.Header }) {
		req.Header().Set("Authorization", "Bearer "+srv.FirstAdminToken())
	}
	if err := sim.SeedImages(ctx, srv.Service(), admin, "img"); err != nil {
		t.Fatal(err)
	}
	dreq := connect.NewRequest(&bcdv1.DeployRequest{Node: "cloud-1", Image: "img", Profile: "cloud", UserData: []byte(e2eUserData)})
	call(dreq)
	resp, err := api.Deploy(ctx, dreq)
	if err != nil {
		t.Fatal(err)
	}
	if n := resp.Msg.Node; n.UserDataSize != int64(len(e2eUserData)) || len(n.UserDataSha256) != 64 {
		t.Fatalf("deployed node shows user-data size %d sha %q", n.UserDataSize, n.UserDataSha256)
	}

	// Before the instance is prepared: 404 (nothing published for any address).
	if code, _ := getFrom(t, "127.0.0.1", base+netboot.CloudInitPath+"user-data"); code != http.StatusNotFound {
		t.Fatalf("user-data before the instance was prepared: %d, want 404", code)
	}
	waitFor(t, "boot.prepareInstance to succeed on the site agent", 30*time.Second, func() bool {
		cmds, _ := st.Commands(ctx, node.ID, 100)
		for _, c := range cmds {
			if c.Kind == "boot.prepareInstance" && c.State == "succeeded" {
				return true
			}
		}
		return false
	})
	// The machine boots: its script request binds 127.0.0.1 to its MAC.
	if code, body := getFrom(t, "127.0.0.1", base+netboot.ScriptPath+"?mac="+e2eMAC+"&arch=x86_64"); code != http.StatusOK {
		t.Fatalf("boot script: %d %s", code, body)
	}
	code, body := getFrom(t, "127.0.0.1", base+netboot.CloudInitPath+"user-data")
	if code != http.StatusOK || body != e2eUserData {
		t.Fatalf("user-data from the node's address: %d\n%s\nwant exactly:\n%s", code, body, e2eUserData)
	}
	if code, body := getFrom(t, "127.0.0.2", base+netboot.CloudInitPath+"user-data"); code != http.StatusNotFound {
		t.Fatalf("user-data from another address: %d %s, want 404", code, body)
	}
	if code, body := getFrom(t, "127.0.0.1", base+netboot.CloudInitPath+"vendor-data"); code != http.StatusOK || !strings.Contains(body, netboot.CloudInitScriptPath) {
		t.Fatalf("vendor-data (the rejoin script) beside the operator's user-data: %d\n%s", code, body)
	}

	// The ramdisk takes boot.kexec (the machine leaves for the image) and the OS rejoins through
	// the site agent: the deploy completes.
	ramdisk := engine.Agent{ID: "node:" + node.ID, Kind: "node", SiteID: node.SiteID, NodeID: node.ID, Generation: node.IdentityGeneration, ConnID: "c1"}
	waitFor(t, "boot.kexec for the ramdisk", 30*time.Second, func() bool {
		cmds, err := srv.Engine().Claim(ctx, ramdisk, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			if _, err := srv.Engine().AckAll(ctx, ramdisk, []string{c.ID}); err != nil {
				t.Fatal(err)
			}
			if c.Kind == "boot.kexec" {
				return true
			}
		}
		return false
	})
	_, md := getFrom(t, "127.0.0.1", base+netboot.MetadataPath)
	var m struct {
		InstanceToken string `json:"instanceToken"`
	}
	if err := json.Unmarshal([]byte(md), &m); err != nil || m.InstanceToken == "" {
		t.Fatalf("metadata: %v %s", err, md)
	}
	rejoin, _ := http.NewRequestWithContext(ctx, "POST", base+netboot.RejoinPath, nil)
	rejoin.Header.Set("Authorization", "Bearer "+m.InstanceToken)
	rc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}).DialContext}}
	rresp, err := rc.Do(rejoin)
	if err != nil {
		t.Fatal(err)
	}
	rresp.Body.Close()
	if rresp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /rejoin: %d", rresp.StatusCode)
	}
	waitFor(t, "the node to be deployed", 30*time.Second, func() bool {
		n, err := st.Node(ctx, node.ID, "")
		return err == nil && n.State == string(provision.Deployed)
	})

	// The entries go with the boot lease: a standby that takes it (the holder stopped) is
	// pushed the node's user-data, encrypted to it, and serves it. Neither agent wrote it to
	// its data dir.
	second := startAgent("b")
	first.stop()
	waitFor(t, "the standby to take the boot lease", 30*time.Second, second.HoldsBootLease)
	if code, body := getFrom(t, "127.0.0.1", second.base+netboot.ScriptPath+"?mac="+e2eMAC+"&arch=x86_64"); code != http.StatusOK {
		t.Fatalf("boot script from the new holder: %d %s", code, body)
	}
	if code, body := getFrom(t, "127.0.0.1", second.base+netboot.CloudInitPath+"user-data"); code != http.StatusOK || body != e2eUserData {
		t.Fatalf("user-data from the new holder: %d\n%s\nwant exactly:\n%s", code, body, e2eUserData)
	}
	for _, dir := range []string{first.dir, second.dir} {
		b, err := os.ReadFile(filepath.Join(dir, siteagent.EntriesFile))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), e2eUserSecret) || !strings.Contains(string(b), resp.Msg.Node.UserDataSha256) {
			t.Fatalf("%s holds the user-data, or not its digest:\n%s", siteagent.EntriesFile, b)
		}
	}

	// Nothing shows the text: the API's node, list and events, the command rows, the logs.
	greq := connect.NewRequest(&bcdv1.GetNodeRequest{Node: "cloud-1"})
	call(greq)
	got, err := api.Get(ctx, greq)
	if err != nil {
		t.Fatal(err)
	}
	lreq := connect.NewRequest(&bcdv1.ListNodesRequest{})
	call(lreq)
	list, err := api.List(ctx, lreq)
	if err != nil {
		t.Fatal(err)
	}
	ereq := connect.NewRequest(&bcdv1.ListEventsRequest{Node: "cloud-1"})
	call(ereq)
	evs, err := api.Events(ctx, ereq)
	if err != nil {
		t.Fatal(err)
	}
	cmds, _ := st.Commands(ctx, node.ID, 100)
	if got.Msg.Node.UserDataSha256 != resp.Msg.Node.UserDataSha256 {
		t.Errorf("GetNode shows user-data %q, the deploy answered %q", got.Msg.Node.UserDataSha256, resp.Msg.Node.UserDataSha256)
	}
	for what, text := range map[string]string{"GetNode": got.Msg.String(), "ListNodes": list.Msg.String(), "ListEvents": evs.Msg.String(),
		"commands": fmt.Sprintf("%+v", cmds), "logs": logs.String()} {
		if strings.Contains(text, e2eUserSecret) {
			t.Errorf("the user-data appears in the %s", what)
		}
	}
	if !strings.Contains(evs.Msg.String(), resp.Msg.Node.UserDataSha256) {
		t.Error("the deploy event does not carry the user-data's digest")
	}
}

// TestUserDataGoesWithTheRelease: the engine's side of the secret's life. A deploy with
// user-data (a cloud-init profile, simulated machines) seals it and carries only its reference
// in boot.prepareInstance; undeploy (wipe, then ready) deletes the sealed secret and clears the
// node's user-data, with an event that says so; no event holds the text.
func TestUserDataGoesWithTheRelease(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := sim.Start(ctx, st, sim.Config{}, engine.Config{Poll: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	ids, err := h.Enroll(ctx, "u", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.WaitRest(ctx, ids, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	const profile = `{"steps": [{"use": "metal.ensureRamdisk"}, {"use": "deploy.image", "args": {"image": "$image"}},
		{"use": "boot.prepareInstance"}, {"use": "boot.kexec", "args": {"guest": "cloud-init", "guestSite": "http://10.0.0.1:8080"}}],
		"cleanup": [{"use": "boot.cleanUp"}]}`
	if err := h.Metal.PutDeployProfile(ctx, h.Admin, "cloud", profile); err != nil {
		t.Fatal(err)
	}
	before, err := st.SecretCount(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img", Profile: "cloud", UserData: []byte(e2eUserData)}); err != nil {
		t.Fatal(err)
	}
	n, err := st.Node(ctx, ids[0], "")
	if err != nil || n.UserDataRef == "" {
		t.Fatalf("node after deploy: ref %q %v", n.UserDataRef, err)
	}
	if c, _ := st.SecretCount(ctx); c != before+1 {
		t.Fatalf("%d secrets after the deploy, want %d", c, before+1)
	}
	// The sim's machines run no cloud-init: the rejoin is the BMC fallback's (power cycle into
	// the image, whose lab agent rejoins).
	rested, err := h.WaitRest(ctx, ids, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := rested[ids[0]]; got.State != string(provision.Deployed) || got.UserDataRef != n.UserDataRef {
		t.Fatalf("after the deploy: %s %s %q, ref %q (want deployed, %q)", got.State, got.FaultCode, got.FaultMsg, got.UserDataRef, n.UserDataRef)
	}
	cmds, _ := st.Commands(ctx, ids[0], 500)
	var prepared bool
	for _, c := range cmds {
		if c.Kind == "boot.prepareInstance" {
			prepared = strings.Contains(c.Args, `"userDataRef":"`+n.UserDataRef+`"`)
		}
	}
	if !prepared {
		t.Fatal("boot.prepareInstance does not name the node's user-data reference")
	}

	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	rested, err = h.WaitRest(ctx, ids, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := rested[ids[0]]
	if got.State != string(provision.Ready) || got.UserDataRef != "" || got.UserDataSHA256 != "" || got.UserDataSize != 0 {
		t.Fatalf("after undeploy: %s, user-data %q %q %d; want ready and none", got.State, got.UserDataRef, got.UserDataSHA256, got.UserDataSize)
	}
	if _, err := h.Metal.OpenSecret(ctx, n.UserDataRef); err == nil {
		t.Fatal("the sealed user-data survived the release")
	}
	if c, _ := st.SecretCount(ctx); c != before {
		t.Fatalf("%d secrets after the release, want %d", c, before)
	}
	evs, err := st.Events(ctx, store.EventFilter{NodeID: ids[0], Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	for _, e := range evs {
		if strings.Contains(e.Data, e2eUserSecret) {
			t.Fatalf("event %s holds the user-data: %s", e.Kind, e.Data)
		}
		released = released || (e.Kind == "node.complete" && e.ToState == "ready" && strings.Contains(e.Data, `"userDataDeleted":true`))
	}
	if !released {
		t.Fatal("no node.complete event to ready says the user-data was deleted")
	}
}
