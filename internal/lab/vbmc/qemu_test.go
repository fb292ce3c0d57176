package vbmc_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"bcd/internal/lab/qmp/qmptest"
	"bcd/internal/lab/vbmc"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newQEMU(t *testing.T, status string) (*vbmc.QEMUMachine, *qmptest.Server) {
	t.Helper()
	s := qmptest.New(t, status, "nic0", "disk0", "cd0")
	m, err := vbmc.NewQEMUMachine(vbmc.QEMUConfig{QMPSocket: s.Path, NICDevice: "nic0", DiskDevice: "disk0", CDDevice: "cd0"},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, s
}

func TestPoweredOnStatus(t *testing.T) {
	on := []string{"running", "guest-panicked", "suspended", "debug", "inmigrate", "postmigrate", "finish-migrate",
		"save-vm", "restore-vm", "watchdog", "io-error", "internal-error", "colo"}
	off := []string{"shutdown", "paused", "prelaunch", "", "unknown"}
	for _, s := range on {
		if !vbmc.PoweredOnStatus(s) {
			t.Errorf("PoweredOnStatus(%q) = false, want true", s)
		}
	}
	for _, s := range off {
		if vbmc.PoweredOnStatus(s) {
			t.Errorf("PoweredOnStatus(%q) = true, want false", s)
		}
	}
}

// commandsAfterHandshake drops qmp_capabilities and query-status, leaving the actions.
func actions(s *qmptest.Server) []string {
	var out []string
	for _, c := range s.Commands() {
		if c != "qmp_capabilities" && c != "query-status" {
			out = append(out, c)
		}
	}
	return out
}

func TestQEMUPower(t *testing.T) {
	tests := []struct {
		name    string
		start   string
		act     func(*vbmc.QEMUMachine, context.Context) error
		actions []string
		end     string
	}{
		{"on from shutdown", "shutdown", (*vbmc.QEMUMachine).PowerOn, []string{"system_reset", "cont"}, "running"},
		{"on from prelaunch", "prelaunch", (*vbmc.QEMUMachine).PowerOn, []string{"system_reset", "cont"}, "running"},
		{"on from paused", "paused", (*vbmc.QEMUMachine).PowerOn, []string{"system_reset", "cont"}, "running"},
		{"on when on is a no-op", "running", (*vbmc.QEMUMachine).PowerOn, nil, "running"},
		{"off", "running", (*vbmc.QEMUMachine).PowerOff, []string{"stop"}, "paused"},
		{"off when off is a no-op", "shutdown", (*vbmc.QEMUMachine).PowerOff, nil, "shutdown"},
		{"shutdown", "running", (*vbmc.QEMUMachine).Shutdown, []string{"system_powerdown"}, "running"},
		{"shutdown when off is a no-op", "paused", (*vbmc.QEMUMachine).Shutdown, nil, "paused"},
		{"reset", "running", (*vbmc.QEMUMachine).Reset, []string{"system_reset"}, "running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			m, s := newQEMU(t, tt.start)
			if err := tt.act(m, ctx); err != nil {
				t.Fatal(err)
			}
			if got := actions(s); !slices.Equal(got, tt.actions) {
				t.Fatalf("actions = %v, want %v", got, tt.actions)
			}
			if s.Status() != tt.end {
				t.Fatalf("status = %s, want %s", s.Status(), tt.end)
			}
			on, err := m.PoweredOn(ctx)
			if err != nil || on != (tt.end == "running") {
				t.Fatalf("PoweredOn = %v, %v; want %v", on, err, tt.end == "running")
			}
		})
	}
}

func TestQEMUBootDevice(t *testing.T) {
	tests := []struct {
		dev           string
		nic, disk, cd float64
	}{
		{"pxe", 1, 2, 3},
		{"disk", 2, 1, 3},
		{"cd", 2, 3, 1},
	}
	for _, tt := range tests {
		t.Run(tt.dev, func(t *testing.T) {
			ctx := context.Background()
			m, s := newQEMU(t, "running")
			if err := m.SetBootDevice(ctx, tt.dev); err != nil {
				t.Fatal(err)
			}
			got := []any{s.Prop("nic0", "bootindex"), s.Prop("disk0", "bootindex"), s.Prop("cd0", "bootindex")}
			want := []any{tt.nic, tt.disk, tt.cd}
			if !slices.Equal(got, want) {
				t.Fatalf("bootindex nic/disk/cd = %v, want %v", got, want)
			}
			if d, _ := m.BootDevice(ctx); d != tt.dev {
				t.Fatalf("BootDevice = %s, want %s", d, tt.dev)
			}
		})
	}
	m, _ := newQEMU(t, "running")
	if err := m.SetBootDevice(context.Background(), "floppy"); err == nil {
		t.Fatal("unknown boot device accepted")
	}
}

func TestQEMUBootDeviceMissing(t *testing.T) {
	s := qmptest.New(t, "running", "nic0")
	m, err := vbmc.NewQEMUMachine(vbmc.QEMUConfig{QMPSocket: s.Path, NICDevice: "nic0"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.SetBootDevice(context.Background(), "cd"); err == nil {
		t.Fatal("boot from an absent CD-ROM accepted")
	}
	if err := m.InsertMedia(context.Background(), "/x.iso"); err == nil {
		t.Fatal("media inserted into an absent CD-ROM")
	}
	if _, err := vbmc.NewQEMUMachine(vbmc.QEMUConfig{}, nil); err == nil {
		t.Fatal("machine without a QMP socket accepted")
	}
}

func TestQEMUMedia(t *testing.T) {
	ctx := context.Background()
	m, s := newQEMU(t, "running")
	if err := m.InsertMedia(ctx, "/images/a.iso"); err != nil {
		t.Fatal(err)
	}
	if s.Medium("cd0") != "/images/a.iso" {
		t.Fatalf("medium = %q", s.Medium("cd0"))
	}
	if err := m.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Medium("cd0") != "" {
		t.Fatalf("medium after eject = %q", s.Medium("cd0"))
	}
}

func TestQEMUErrorsAndReconnect(t *testing.T) {
	ctx := context.Background()
	m, s := newQEMU(t, "shutdown")
	s.FailNext("cont", "boom")
	err := m.PowerOn(ctx)
	if err == nil || !errorsContains(err, "boom") || !errorsContains(err, s.Path) {
		t.Fatalf("PowerOn error = %v, want QEMU's message and the socket", err)
	}
	// QEMU drops the connection (e.g. restarted): the machine dials again.
	s.Close()
	if _, err := m.PoweredOn(ctx); err == nil {
		t.Fatal("PoweredOn succeeded with QEMU gone")
	}
}

func errorsContains(err error, s string) bool { return strings.Contains(err.Error(), s) }

func TestQEMUConcurrent(t *testing.T) {
	ctx := context.Background()
	m, s := newQEMU(t, "shutdown")
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if err := m.PowerOn(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if s.Resets() != 1 {
		t.Fatalf("10 concurrent power-ons reset the VM %d times, want 1", s.Resets())
	}
}
