package ipmibmc

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"
)

const (
	testUser     = "admin"
	testPassword = "Sekr1t-pw-7788"
	testGUID     = "00112233-4455-6677-8899-aabbccddeeff"
)

// fakeMachine is this package's own vbmc.Machine.
type fakeMachine struct {
	mu                           sync.Mutex
	on                           bool
	dev                          string
	ons, offs, shutdowns, resets int
}

type counts struct{ ons, offs, shutdowns, resets int }

func (m *fakeMachine) PoweredOn(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on, nil
}
func (m *fakeMachine) PowerOn(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ons++
	m.on = true
	return nil
}
func (m *fakeMachine) PowerOff(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.offs++
	m.on = false
	return nil
}
func (m *fakeMachine) Shutdown(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shutdowns++
	m.on = false
	return nil
}
func (m *fakeMachine) Reset(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resets++
	return nil
}
func (m *fakeMachine) SetBootDevice(_ context.Context, dev string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dev = dev
	return nil
}
func (m *fakeMachine) BootDevice(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dev, nil
}
func (m *fakeMachine) InsertMedia(context.Context, string) error { return nil }
func (m *fakeMachine) EjectMedia(context.Context) error          { return nil }
func (m *fakeMachine) counts() counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return counts{m.ons, m.offs, m.shutdowns, m.resets}
}
func (m *fakeMachine) device() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dev
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func start(t *testing.T, cfg Config, m *fakeMachine) *BMC {
	t.Helper()
	cfg.Addr, cfg.Username, cfg.Password, cfg.GUID = "127.0.0.1:0", testUser, testPassword, testGUID
	cfg.Logger = slog.New(slog.DiscardHandler)
	b, err := New(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return b
}

func connect(t *testing.T, port int) *client.Client {
	t.Helper()
	c, err := client.NewClient("127.0.0.1", port, testUser, testPassword)
	if err != nil {
		t.Fatal(err)
	}
	c.WithTimeout(time.Second).WithRetry(1).WithCipherSuiteID(types.CipherSuiteID17)
	if err := c.Connect(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// dupProxy relays UDP between one client and the BMC on loopback and sends every in-session
// IPMI request twice: a retransmission the BMC cannot tell from the original.
type dupProxy struct {
	conn      *net.UDPConn
	up        *net.UDPConn
	dups      atomic.Int64
	responses atomic.Int64
}

func startDupProxy(t *testing.T, bmcAddr *net.UDPAddr) *dupProxy {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp", nil, bmcAddr)
	if err != nil {
		t.Fatal(err)
	}
	p := &dupProxy{conn: conn, up: up}
	var clientAddr atomic.Pointer[net.UDPAddr]
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			clientAddr.Store(from)
			pkt := buf[:n]
			_, _ = up.Write(pkt)
			if inSessionIPMI(pkt) {
				_, _ = up.Write(pkt)
				p.dups.Add(1)
			}
		}
	})
	wg.Go(func() {
		buf := make([]byte, 4096)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			if inSessionIPMI(buf[:n]) {
				p.responses.Add(1)
			}
			if to := clientAddr.Load(); to != nil {
				_, _ = conn.WriteToUDP(buf[:n], to)
			}
		}
	})
	t.Cleanup(func() {
		conn.Close()
		up.Close()
		wg.Wait()
	})
	return p
}

// inSessionIPMI: RMCP class IPMI, RMCP+ format, payload type IPMI, session ID not zero.
func inSessionIPMI(p []byte) bool {
	return len(p) >= 10 && p[3]&0x1f == 0x07 && p[4] == 0x06 && p[5]&0x3f == 0x00 &&
		(p[6]|p[7]|p[8]|p[9]) != 0
}

// TestRetransmittedCycleRunsOnce sends a power cycle through a proxy that duplicates every
// in-session request. With deduplication the machine is cycled once; without (the control case,
// proving the duplicate really reaches the BMC) twice.
func TestRetransmittedCycleRunsOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		cycles int
	}{
		{"dedupe", 0, 1},
		{"no dedupe (control)", -1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// go-ipmi's server sometimes drops the duplicate before any handler sees it; such
			// an attempt exercises nothing, so it is made again with a fresh BMC.
			var m *fakeMachine
			var b *BMC
			var c *client.Client
			var p *dupProxy
			for attempt := 0; ; attempt++ {
				m = &fakeMachine{on: true}
				b = start(t, Config{DedupeWindow: tc.window}, m)
				p = startDupProxy(t, b.Addr())
				c = connect(t, p.conn.LocalAddr().(*net.UDPAddr).Port)
				before := p.responses.Load()
				if _, err := c.ChassisControl(t.Context(), chassis.ChassisControlPowerCycle); err != nil {
					t.Fatal(err)
				}
				// Both copies answered (answered ones were queued before the answer)…
				eventually(t, "both answers", func() bool { return p.responses.Load() >= before+2 })
				// …and every queued action run.
				eventually(t, "worker idle", func() bool { return b.done.Load() == b.queued.Load() })
				if b.arrivals.Load() == 2 {
					break
				}
				if attempt == 9 {
					t.Fatalf("in 10 attempts the duplicate never reached the BMC's handlers (arrivals %d)", b.arrivals.Load())
				}
			}
			if got, want := m.counts(), (counts{ons: tc.cycles, offs: tc.cycles}); got != want {
				t.Fatalf("machine calls %+v, want %+v", got, want)
			}
			if p.dups.Load() == 0 {
				t.Fatal("proxy duplicated nothing")
			}
			// A new session may cycle again: dedupe never crosses sessions.
			if tc.window == 0 {
				c2 := connect(t, b.Addr().Port)
				if _, err := c2.ChassisControl(t.Context(), chassis.ChassisControlPowerCycle); err != nil {
					t.Fatal(err)
				}
				eventually(t, "second cycle", func() bool { return m.counts() == counts{ons: 2, offs: 2} })
			}
		})
	}
}

func TestOneTimeBootFlagsAreConsumedByABoot(t *testing.T) {
	m := &fakeMachine{}
	b := start(t, Config{}, m)
	c := connect(t, b.Addr().Port)
	ctx := t.Context()
	flags := &types.BootOptionParam_BootFlags{BootFlagsValid: true, BootDeviceSelector: types.BootDeviceSelectorForcePXE, BIOSBootType: types.BIOSBootTypeEFI}
	// go-ipmi's client wraps the write in set-in-progress / set-complete (parameter 0).
	if err := c.SetBootParamBootFlags(ctx, flags); err != nil {
		t.Fatal(err)
	}
	if m.device() != "pxe" {
		t.Fatalf("machine device %q", m.device())
	}
	got := &types.BootOptionParam_BootFlags{}
	if err := c.GetSystemBootOptionsParamFor(ctx, got); err != nil {
		t.Fatal(err)
	}
	if !got.BootFlagsValid || got.Persist || got.BootDeviceSelector != types.BootDeviceSelectorForcePXE || got.BIOSBootType != types.BIOSBootTypeEFI {
		t.Fatalf("read back %+v", got)
	}
	if _, err := c.ChassisControl(ctx, chassis.ChassisControlPowerUp); err != nil {
		t.Fatal(err)
	}
	eventually(t, "power on", func() bool { return b.done.Load() == 1 })
	if err := c.GetSystemBootOptionsParamFor(ctx, got); err != nil {
		t.Fatal(err)
	}
	if got.BootFlagsValid || got.BootDeviceSelector != types.BootDeviceSelectorForcePXE {
		t.Fatalf("after boot: %+v, want the valid bit cleared", got)
	}
	// Persistent flags survive a boot.
	flags.Persist = true
	if err := c.SetBootDevice(ctx, types.BootDeviceSelectorForceHardDrive, types.BIOSBootTypeLegacy, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ChassisControl(ctx, chassis.ChassisControlHardReset); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reset", func() bool { return b.done.Load() == 2 })
	if err := c.GetSystemBootOptionsParamFor(ctx, got); err != nil {
		t.Fatal(err)
	}
	if !got.BootFlagsValid || !got.Persist || got.BootDeviceSelector != types.BootDeviceSelectorForceHardDrive {
		t.Fatalf("persistent flags after reset: %+v", got)
	}
	if m.counts().resets != 1 || m.device() != "disk" {
		t.Fatalf("machine %+v, device %q", m.counts(), m.device())
	}
}

func TestBMCResetAndGUIDs(t *testing.T) {
	m := &fakeMachine{on: true}
	b := start(t, Config{DeviceGUID: "11111111-2222-3333-4444-555555555555"}, m)
	c := connect(t, b.Addr().Port)
	ctx := t.Context()
	if err := c.ColdReset(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WarmReset(ctx); err != nil {
		t.Fatal(err)
	}
	if b.queued.Load() != 0 || m.counts() != (counts{}) {
		t.Fatalf("BMC reset touched the machine: %+v", m.counts())
	}
	sys, err := c.GetSystemGUID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := types.ParseGUID(sys.GUID[:], types.GUIDModeSMBIOS)
	if err != nil || u.String() != testGUID {
		t.Fatalf("system GUID %v, %v", u, err)
	}
	dev, err := c.GetDeviceGUID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := types.ParseGUID(dev.GUID[:], types.GUIDModeSMBIOS); u.String() != "11111111-2222-3333-4444-555555555555" {
		t.Fatalf("device GUID %v", u)
	}
}

func TestSetInProgressStateMachine(t *testing.T) {
	m := &fakeMachine{}
	b := start(t, Config{}, m)
	c := connect(t, b.Addr().Port)
	ctx := t.Context()
	if err := c.SetBootParamSetInProgress(ctx, types.SetInProgress_SetInProgress); err != nil {
		t.Fatal(err)
	}
	err := c.SetBootParamSetInProgress(ctx, types.SetInProgress_SetInProgress)
	if err == nil {
		t.Fatal("second set-in-progress accepted")
	}
	if err := c.SetBootParamSetInProgress(ctx, types.SetInProgress_SetComplete); err != nil {
		t.Fatal(err)
	}
}

func TestNewValidates(t *testing.T) {
	m := &fakeMachine{}
	for name, cfg := range map[string]Config{
		"no user":       {Addr: "127.0.0.1:0", Password: "pw"},
		"long password": {Addr: "127.0.0.1:0", Username: "u", Password: "012345678901234567890"},
		"bad GUID":      {Addr: "127.0.0.1:0", Username: "u", Password: "pw", GUID: "nope"},
		"bad suite":     {Addr: "127.0.0.1:0", Username: "u", Password: "pw", CipherSuites: []uint8{99}},
		"bad address":   {Addr: "127.0.0.1:notaport", Username: "u", Password: "pw"},
	} {
		if b, err := New(cfg, m); err == nil {
			b.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(Config{Addr: "127.0.0.1:0", Username: "u"}, nil); err == nil {
		t.Error("nil machine accepted")
	}
}
