package osagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/agent"
	"bcd/internal/testlog"
)

func TestRoleAndParseCmdline(t *testing.T) {
	tests := []struct {
		cmdline  string
		role     string
		metadata string
		wantErr  string
	}{
		{"console=ttyS0 bcd.role=os", "os", "", ""},
		{"bcd.role=os bcd.metadata=http://10.0.0.1:8080/metadata bcd.other=x", "os", "http://10.0.0.1:8080/metadata", ""},
		{"bcd.role=os bcd.metadata=https://[fd00::1]/md", "os", "https://[fd00::1]/md", ""},
		{"console=ttyS0", "", "", "bcd.role=os is required"},
		{"bcd.role=ramdisk", "ramdisk", "", "bcd.role=os is required"},
		{"bcd.role=os bcd.role=os", "os", "", "given twice"},
		{"bcd.role=os bcd.metadata=ftp://x/y", "os", "", "http or https"},
		{"bcd.role=os bcd.metadata=", "os", "", "1..1024"},
		{"bcd.role=os bcd.metadata=http://user@h/m", "os", "", "no user info"},
		{"bcd.role=os bcd.metadata=/metadata", "os", "", "http or https"},
		{"bcd.role=os bcd.state=disk", "os", "", "bcd.state must be partition or ram"},
		{"bcd.role=os " + strings.Repeat("x", 5000), "os", "", "at most 4096"},
	}
	for _, tt := range tests {
		if got := Role(tt.cmdline); got != tt.role {
			t.Errorf("Role(%.60q) = %q, want %q", tt.cmdline, got, tt.role)
		}
		p, err := ParseCmdline(tt.cmdline)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseCmdline(%.60q) err = %v, want %q", tt.cmdline, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "user@") {
				t.Errorf("the error echoes the URL: %v", err)
			}
			continue
		}
		if err != nil || p.MetadataURL != tt.metadata {
			t.Errorf("ParseCmdline(%.60q) = %+v, %v; want metadata %q", tt.cmdline, p, err, tt.metadata)
		}
	}
}

func TestParseCmdlineState(t *testing.T) {
	for cmdline, want := range map[string]bool{
		"bcd.role=os":                     false,
		"bcd.role=os bcd.state=ram":       false,
		"bcd.role=os bcd.state=partition": true,
	} {
		p, err := ParseCmdline(cmdline)
		if err != nil || p.KeepIdentity != want {
			t.Errorf("ParseCmdline(%q) = %+v, %v; want KeepIdentity %t", cmdline, p, err, want)
		}
	}
}

func TestMetadataURL(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	tests := []struct {
		p       Params
		servers []netip.Addr
		want    string
		wantErr bool
	}{
		{Params{MetadataURL: "http://x:8080/m"}, []netip.Addr{v4}, "http://x:8080/m", false},
		{Params{}, []netip.Addr{v4}, "http://10.0.0.1:80/metadata", false},
		{Params{}, []netip.Addr{{}, netip.IPv4Unspecified(), v6}, "http://[fd00::1]:80/metadata", false},
		{Params{}, []netip.Addr{netip.MustParseAddr("::ffff:10.0.0.1")}, "http://10.0.0.1:80/metadata", false},
		{Params{}, nil, "", true},
		{Params{}, []netip.Addr{{}}, "", true},
	}
	for _, tt := range tests {
		got, err := MetadataURL(tt.p, tt.servers)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("MetadataURL(%+v, %v) = %q, %v; want %q (err %t)", tt.p, tt.servers, got, err, tt.want, tt.wantErr)
		}
	}
}

func testCA(t *testing.T) string {
	t.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return string(ca.CertPEM())
}

func TestParseMetadata(t *testing.T) {
	ca := testCA(t)
	const tok = "bcdi_0123456789abcdefSECRET"
	doc := func(m map[string]any) []byte {
		base := map[string]any{"nodeId": "n1", "gateway": "https://10.0.0.1:8443", "instanceToken": tok, "ca": ca}
		for k, v := range m {
			if v == nil {
				delete(base, k)
			} else {
				base[k] = v
			}
		}
		b, _ := json.Marshal(base)
		return b
	}
	tests := []struct {
		name    string
		doc     []byte
		wantErr string
	}{
		{"good", doc(nil), ""},
		{"not JSON", []byte("<html>"), "not a JSON object"},
		{"no node", doc(map[string]any{"nodeId": nil}), "nodeId"},
		{"node with slash", doc(map[string]any{"nodeId": "a/b"}), "nodeId"},
		// The node id is printed on the console: no terminal escape, no line of its own.
		{"node with an escape sequence", doc(map[string]any{"nodeId": "\x1b[2J\x1b[Hn1"}), "nodeId"},
		{"node with a NUL", doc(map[string]any{"nodeId": "n1\x00"}), "nodeId"},
		{"node with a line separator", doc(map[string]any{"nodeId": "n1\u2028n2"}), "nodeId"},
		{"node with a vertical tab", doc(map[string]any{"nodeId": "n1\vx"}), "nodeId"},
		{"discovery token", doc(map[string]any{"instanceToken": "bcdn_0123456789abcdef"}), "not an instance token"},
		{"no token", doc(map[string]any{"instanceToken": nil}), "instanceToken"},
		{"http gateway", doc(map[string]any{"gateway": "http://10.0.0.1:8443"}), "https"},
		{"no CA", doc(map[string]any{"ca": nil}), "the site agent must publish the CA"},
		{"CA garbage", doc(map[string]any{"ca": "hello"}), "outside the PEM"},
		{"CA key block", doc(map[string]any{"ca": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}), "not a CERTIFICATE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseMetadata(tt.doc)
			if tt.wantErr == "" {
				if err != nil || m.NodeID != "n1" || m.InstanceToken != tok || m.CA != ca {
					t.Fatalf("%+v %v", m, err)
				}
				if strings.Contains(m.String(), "SECRET") || strings.Contains(slog.AnyValue(m).String(), "SECRET") {
					t.Error("the token shows in String or LogValue")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Errorf("the error echoes the token: %v", err)
			}
		})
	}
}

func TestFetchMetadata(t *testing.T) {
	ca := testCA(t)
	good, _ := json.Marshal(map[string]string{"nodeId": "n1", "gateway": "https://gw:8443", "instanceToken": "bcdi_0123456789abcdef", "ca": ca})
	tests := []struct {
		name    string
		status  int
		body    []byte
		wantErr error
		errText string
	}{
		{"ok", 200, good, nil, ""},
		{"not yet", 404, []byte("404 page not found"), ErrNotPublished, ""},
		{"server error", 500, nil, nil, "HTTP 500"},
		{"too big", 200, bytes.Repeat([]byte(" "), maxMetadata+10), nil, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = w.Write(tt.body)
			}))
			defer srv.Close()
			m, err := FetchMetadata(t.Context(), srv.Client(), srv.URL+"/metadata")
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.errText != "":
				if err == nil || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("err = %v, want %q", err, tt.errText)
				}
			case err != nil || m.NodeID != "n1":
				t.Fatalf("%+v %v", m, err)
			}
		})
	}
}

func TestPartitionState(t *testing.T) {
	sys := t.TempDir()
	for _, p := range []string{"vda", "vda1", "vda2", "vdb", "vdb1", "loop0"} {
		d := filepath.Join(sys, "class", "block", p)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.ContainsAny(p[len(p)-1:], "12") {
			if err := os.WriteFile(filepath.Join(d, "partition"), []byte("1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	parts, err := Partitions(sys)
	if err != nil || !slices.Equal(parts, []string{"vda1", "vda2", "vdb1"}) {
		t.Fatalf("Partitions = %v, %v", parts, err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	var mounted []string
	st := PartitionState{SysRoot: sys, DevRoot: "/dev", MountDir: mnt,
		Mount: func(dev, dir, fstype string) error {
			if fstype != "vfat" {
				t.Errorf("mounting %s as %s", dev, fstype)
			}
			mounted = append(mounted, dev)
			switch dev {
			case "/dev/vda1":
				return errors.New("not FAT")
			case "/dev/vdb1":
				return os.WriteFile(filepath.Join(dir, MarkerFile), []byte("{}"), 0o644)
			}
			return nil
		},
		Unmount: func(string) error { return nil },
	}
	dir, where, err := st.Dir(t.Context())
	if err != nil || dir != filepath.Join(mnt, StateDir) || where != "/dev/vdb1" {
		t.Fatalf("Dir = %q, %q, %v", dir, where, err)
	}
	if !slices.Equal(mounted, []string{"/dev/vda1", "/dev/vda2", "/dev/vdb1"}) {
		t.Errorf("mounted %v", mounted)
	}
	// No marker anywhere: an error naming the marker, after Wait.
	st.Mount = func(string, string, string) error { return nil }
	st.MountDir = filepath.Join(t.TempDir(), "mnt2")
	st.Wait = 600 * time.Millisecond
	if _, _, err := st.Dir(t.Context()); err == nil || !strings.Contains(err.Error(), MarkerFile) {
		t.Fatalf("Dir without a marker: %v", err)
	}
}

// --- Run against a real gateway (TLS, HTTP/2) with fake identities -------------------------

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

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

type oneNIC struct{}

func (oneNIC) Interfaces() ([]agent.NIC, error) {
	return []agent.NIC{{Name: "eth0", Index: 2, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}, nil
}
func (oneNIC) LinkUp(string) error                   { return nil }
func (oneNIC) Carrier(string) (bool, error)          { return true, nil }
func (oneNIC) AddAddress(int, netip.Prefix) error    { return nil }
func (oneNIC) AddDefaultRoute(int, netip.Addr) error { return nil }

// flakyDHCP fails its first attempts, then leases 10.0.2.15 from server 10.0.2.2.
type flakyDHCP struct{ calls atomic.Int32 }

func (f *flakyDHCP) Lease(_ context.Context, ifname string, _ net.HardwareAddr) (agent.Lease, error) {
	if f.calls.Add(1) <= 2 {
		return agent.Lease{}, errors.New("timeout")
	}
	return agent.Lease{Interface: ifname, Address: netip.MustParsePrefix("10.0.2.15/24"), Server: netip.MustParseAddr("10.0.2.2")}, nil
}

// metadataServer answers 404 notYet times, then doc.
func metadataServer(t *testing.T, notYet int, doc func() []byte) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if int(calls.Add(1)) <= notYet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc())
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func startRun(t *testing.T, extra string, state State) (*syncBuffer, context.CancelFunc, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	console := &syncBuffer{}
	done := make(chan error, 1)
	cfg := Config{
		Cmdline:    func() (string, error) { return "console=ttyS0 bcd.role=os " + extra, nil },
		Net:        oneNIC{},
		DHCP:       &flakyDHCP{},
		State:      state,
		RetryDelay: 5 * time.Millisecond,
		MaxDelay:   50 * time.Millisecond,
		Network:    agent.Config{DHCPAttempts: 1},
		Link: func(c *agentlink.Config) {
			c.MinBackoff, c.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
		},
	}
	go func() { done <- Run(ctx, console, slog.New(slog.DiscardHandler), cfg) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return console, cancel, done
}

func TestRunJoinsAsTheNodeAndRefusesCommands(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
	token := env.Identities.InstanceToken("n1", time.Hour)
	doc, _ := json.Marshal(Metadata{NodeID: "n1", Gateway: env.URL, InstanceToken: token, CA: string(env.CA.CertPEM())})
	md, calls := metadataServer(t, 3, func() []byte { return doc })
	stateDir := filepath.Join(t.TempDir(), "state")

	kept := "bcd.state=partition bcd.metadata=" + md.URL + "/metadata"
	console, cancel, done := startRun(t, kept, DirState(stateDir))
	waitConsole(t, console, MarkerJoined+" n1", 1)
	out := console.String()
	for _, want := range []string{MarkerStart, "identity kept in " + stateDir, "network not up yet", "network up ip=eth0:10.0.2.15/24",
		"metadata not published yet (404", "metadata: node n1, gateway " + env.URL} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, token) {
		t.Errorf("the console shows the instance token:\n%s", out)
	}
	if calls.Load() < 4 {
		t.Errorf("metadata read %d times, want the 3 404s and a success", calls.Load())
	}

	// The hello says installed OS; a command is refused, not run.
	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}
	env.Queue.Enqueue(node, gateway.Command{ID: "wipe-1", Kind: "disk.wipe", NodeID: "n1", Generation: 1, Args: []byte(`{"mode":"quick"}`)})
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	if err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool { return c.Final >= 1 }); err != nil {
		t.Fatalf("waiting for the refusal: %v", err)
	}
	e, _ := env.Queue.Get("wipe-1")
	if e.State != gatewaytest.Failed || !strings.Contains(e.Final.Error, "runs no commands") {
		t.Errorf("disk.wipe on the installed OS: %s %q", e.State, e.Final.Error)
	}
	hellos := env.Queue.Counts().Hellos
	if len(hellos) == 0 || !slices.Contains(hellos[0].Capabilities, engine.RoleOS) || hellos[0].AgentVersion != "bcd-os" {
		t.Errorf("hellos %+v", hellos)
	}

	// A reboot: the identity kept in the state directory reconnects without a token (the
	// instance token is spent: a join would be refused).
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after cancel", err)
	}
	done <- nil // for the first run's cleanup
	console2, _, _ := startRun(t, kept, DirState(stateDir))
	waitConsole(t, console2, "reconnecting as node n1 with the identity kept in "+stateDir, 1)
	if err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool {
		return c.Connected[gatewaytest.AgentKey(node)] >= 2
	}); err != nil {
		t.Fatalf("the rebooted OS did not connect: %v\n%s", err, console2)
	}
	if strings.Contains(console2.String(), "refused") {
		t.Errorf("the rebooted OS was refused:\n%s", console2)
	}
}

func TestRunKeepsRetryingARefusedToken(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
	// A well-formed instance token the gateway does not know (spent, or from another site).
	bogus, _, err := pki.NewToken(pki.InstanceTokenPrefix)
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(Metadata{NodeID: "n1", Gateway: env.URL, InstanceToken: bogus, CA: string(env.CA.CertPEM())})
	md, _ := metadataServer(t, 0, func() []byte { return doc })
	// bcd.state=partition is not asked for: the state is not even looked for.
	console, _, done := startRun(t, "bcd.metadata="+md.URL+"/metadata", stateMustNotBeUsed{t})
	waitConsole(t, console, "the gateway refused the instance token", 3)
	select {
	case err := <-done:
		t.Fatalf("Run gave up: %v", err)
	default:
	}
	if !strings.Contains(console.String(), "identity kept in RAM") || strings.Contains(console.String(), MarkerJoined) {
		t.Errorf("console:\n%s", console)
	}
}

type stateMustNotBeUsed struct{ t *testing.T }

func (s stateMustNotBeUsed) Dir(context.Context) (string, string, error) {
	s.t.Error("the state was looked for without bcd.state=partition")
	return "", "", errors.New("no")
}

func TestRunRefusesABadCmdline(t *testing.T) {
	err := Run(t.Context(), &syncBuffer{}, slog.New(slog.DiscardHandler), Config{
		Cmdline: func() (string, error) { return "bcd.role=os bcd.metadata=ftp://x/", nil }})
	if err == nil || !strings.Contains(err.Error(), "bcd.metadata") {
		t.Fatalf("err = %v", err)
	}
}
