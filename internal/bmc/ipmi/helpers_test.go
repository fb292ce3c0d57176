package ipmi

import (
	"context"
	"github.com/bougou/go-ipmi/pkg/types"
	"log/slog"
	"sync"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	"bcd/internal/testlog"
)

const (
	testUser     = "admin"
	testPassword = "Sekr1t-pw-7788"
	testGUID     = "00112233-4455-6677-8899-aabbccddeeff"
)

// fakeMachine is this package's own vbmc.Machine: counts every call, changes state at once.
type fakeMachine struct {
	mu                               sync.Mutex
	on                               bool
	dev                              string
	ons, offs, shutdowns, resets, bd int
	onPoll                           func() // called in PoweredOn (inside a BMC session)
}

func (m *fakeMachine) PoweredOn(context.Context) (bool, error) {
	m.mu.Lock()
	hook := m.onPoll
	on := m.on
	m.mu.Unlock()
	if hook != nil {
		hook()
	}
	return on, nil
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
	m.bd++
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

type counts struct {
	on                           bool
	ons, offs, shutdowns, resets int
}

func (m *fakeMachine) counts() counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return counts{m.on, m.ons, m.offs, m.shutdowns, m.resets}
}

func (m *fakeMachine) device() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dev
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startBMC runs a virtual BMC on 127.0.0.1:0 for the test's duration.
func startBMC(t *testing.T, cfg ipmibmc.Config, m *fakeMachine) *ipmibmc.BMC {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Username == "" {
		cfg.Username = testUser
	}
	if cfg.Password == "" {
		cfg.Password = testPassword
	}
	if cfg.GUID == "" {
		cfg.GUID = testGUID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b, err := ipmibmc.New(cfg, m)
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

func quickOptions() Options {
	return Options{
		Pacer:         NewPacer(PacerConfig{MinInterval: -1}),
		Timeout:       500 * time.Millisecond,
		SettleTimeout: 5 * time.Second,
		PollInterval:  5 * time.Millisecond,
		Logger:        slog.New(slog.DiscardHandler),
	}
}

func newDriver(t *testing.T, b *ipmibmc.BMC, password string, opts Options) *Driver {
	t.Helper()
	d, err := New(bmc.Endpoint{Address: b.Addr().String(), Username: testUser, Password: password}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

func (s *session) readBootFlagsValue(ctx context.Context) (types.BootOptionParam_BootFlags, error) {
	var f types.BootOptionParam_BootFlags
	err := s.readBootFlags(ctx, &f)
	return f, err
}
