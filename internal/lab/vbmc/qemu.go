package vbmc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"bcd/internal/lab/qmp"
)

// Boot devices a Machine understands.
const (
	DevicePXE  = "pxe"
	DeviceDisk = "disk"
	DeviceCD   = "cd"
)

// QEMUConfig names a VM's QMP socket and the QEMU device ids (-device …,id=X) that boot
// overrides and virtual media act on. An empty id means the VM has no such device.
type QEMUConfig struct {
	QMPSocket  string
	NICDevice  string // e.g. "nic0"
	DiskDevice string // e.g. "disk0"
	CDDevice   string // e.g. "cd0"
	// BootDevice is the device the VM boots from before any override ("pxe" when empty).
	BootDevice string
}

// QEMUMachine drives a QEMU started with -no-shutdown through QMP. Off is a VM that is not
// running (shutdown, paused after our stop, prelaunch); on is system_reset + cont.
type QEMUMachine struct {
	cfg QEMUConfig
	log *slog.Logger

	mu   sync.Mutex // guards conn and boot; serialises actions so they stay idempotent
	conn *qmp.Client
	boot string
}

// NewQEMUMachine returns a machine for cfg; it connects to QMP on first use and reconnects
// after QEMU dropped the connection.
func NewQEMUMachine(cfg QEMUConfig, log *slog.Logger) (*QEMUMachine, error) {
	if cfg.QMPSocket == "" {
		return nil, errors.New("creating QEMU machine: no QMP socket path")
	}
	boot := cfg.BootDevice
	if boot == "" {
		boot = DevicePXE
	}
	m := &QEMUMachine{cfg: cfg, log: log, boot: boot}
	if _, err := m.bootOrder(boot); err != nil {
		return nil, fmt.Errorf("creating QEMU machine: %w", err)
	}
	return m, nil
}

var _ Machine = (*QEMUMachine)(nil)

// Close drops the QMP connection.
func (m *QEMUMachine) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.conn == nil {
		return nil
	}
	err := m.conn.Close()
	m.conn = nil
	return err
}

// client returns a live connection; m.mu must be held.
func (m *QEMUMachine) client(ctx context.Context) (*qmp.Client, error) {
	if m.conn != nil {
		select {
		case <-m.conn.Done():
			_ = m.conn.Close()
			m.conn = nil
		default:
			return m.conn, nil
		}
	}
	c, err := qmp.Dial(ctx, m.cfg.QMPSocket)
	if err != nil {
		return nil, err
	}
	m.conn = c
	return c, nil
}

// PoweredOnStatus decides power from QEMU's run state: only a VM whose CPUs run, or that ran into
// a guest panic (the machine is on, its OS crashed), is on.
func PoweredOnStatus(status string) bool {
	switch status {
	case qmp.StatusRunning, qmp.StatusGuestPanicked, "suspended", "debug", "inmigrate", "postmigrate",
		"finish-migrate", "save-vm", "restore-vm", "watchdog", "io-error", qmp.StatusInternalError, "colo":
		return true
	}
	return false // shutdown, paused, prelaunch
}

func (m *QEMUMachine) status(ctx context.Context) (*qmp.Client, bool, error) {
	c, err := m.client(ctx)
	if err != nil {
		return nil, false, err
	}
	st, err := c.QueryStatus(ctx)
	if err != nil {
		return nil, false, err
	}
	return c, PoweredOnStatus(st.Status), nil
}

// PoweredOn reports whether the VM runs.
func (m *QEMUMachine) PoweredOn(ctx context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, on, err := m.status(ctx)
	if err != nil {
		return false, fmt.Errorf("reading power of VM %s: %w", m.cfg.QMPSocket, err)
	}
	return on, nil
}

// PowerOn resets the VM (so boot order changes apply and a shut-down guest starts afresh) and
// lets it run; a running VM is left alone.
func (m *QEMUMachine) PowerOn(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, on, err := m.status(ctx)
	if err == nil && !on {
		err = c.SystemReset(ctx)
		if err == nil {
			err = waitResetDone(ctx, c)
		}
		if err == nil {
			err = c.Cont(ctx)
		}
		if err == nil {
			m.log.InfoContext(ctx, "vm powered on", "qmp", m.cfg.QMPSocket, "boot", m.boot)
		}
	}
	if err != nil {
		return fmt.Errorf("powering on VM %s: %w", m.cfg.QMPSocket, err)
	}
	return nil
}

// waitResetDone polls until QEMU has processed a reset request (it runs asynchronously in QEMU's
// main loop): a VM still in "shutdown" refuses cont.
func waitResetDone(ctx context.Context, c *qmp.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := c.QueryStatus(ctx)
		if err != nil {
			return fmt.Errorf("waiting for reset: %w", err)
		}
		if st.Status != qmp.StatusShutdown && st.Status != qmp.StatusGuestPanicked {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for reset: still %s: %w", st.Status, ctx.Err())
		case <-tick.C:
		}
	}
}

// PowerOff stops the VM's CPUs at once: a hard off.
func (m *QEMUMachine) PowerOff(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, on, err := m.status(ctx)
	if err == nil && on {
		err = c.Stop(ctx)
		if err == nil {
			m.log.InfoContext(ctx, "vm powered off", "qmp", m.cfg.QMPSocket)
		}
	}
	if err != nil {
		return fmt.Errorf("powering off VM %s: %w", m.cfg.QMPSocket, err)
	}
	return nil
}

// Shutdown presses the ACPI power button of a running VM; the guest decides the rest.
func (m *QEMUMachine) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, on, err := m.status(ctx)
	if err == nil && on {
		err = c.SystemPowerdown(ctx)
	}
	if err != nil {
		return fmt.Errorf("shutting down VM %s: %w", m.cfg.QMPSocket, err)
	}
	return nil
}

// Reset warm-resets the VM; a VM that is off stays off (its next power-on resets it anyway).
func (m *QEMUMachine) Reset(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.client(ctx)
	if err == nil {
		err = c.SystemReset(ctx)
	}
	if err != nil {
		return fmt.Errorf("resetting VM %s: %w", m.cfg.QMPSocket, err)
	}
	return nil
}

type bootIndex struct {
	device string
	index  int
}

// bootOrder returns the bootindex of every configured device with dev first. Indices are unique,
// as QEMU requires (LAB-NOTES gotcha 3).
func (m *QEMUMachine) bootOrder(dev string) ([]bootIndex, error) {
	ids := map[string]string{DevicePXE: m.cfg.NICDevice, DeviceDisk: m.cfg.DiskDevice, DeviceCD: m.cfg.CDDevice}
	id, known := ids[dev]
	if !known {
		return nil, fmt.Errorf("unknown boot device %q: accepted are pxe, disk, cd", dev)
	}
	if id == "" {
		return nil, fmt.Errorf("boot device %q: the VM has no such device", dev)
	}
	order := []bootIndex{{id, 1}}
	next := 2
	for _, d := range []string{DevicePXE, DeviceDisk, DeviceCD} {
		if d != dev && ids[d] != "" {
			order = append(order, bootIndex{ids[d], next})
			next++
		}
	}
	return order, nil
}

// SetBootDevice writes the bootindex of every device (dev first); QEMU applies it at the next
// reset. Devices are first cleared to -1 so no intermediate state repeats an index.
func (m *QEMUMachine) SetBootDevice(ctx context.Context, dev string) error {
	order, err := m.bootOrder(dev)
	if err != nil {
		return fmt.Errorf("setting boot device of VM %s: %w", m.cfg.QMPSocket, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.client(ctx)
	for _, b := range order {
		if err == nil {
			err = c.QomSet(ctx, qmp.PeripheralPath(b.device), "bootindex", -1)
		}
	}
	for _, b := range order {
		if err == nil {
			err = c.QomSet(ctx, qmp.PeripheralPath(b.device), "bootindex", b.index)
		}
	}
	if err != nil {
		return fmt.Errorf("setting boot device %s on VM %s: %w", dev, m.cfg.QMPSocket, err)
	}
	m.boot = dev
	m.log.InfoContext(ctx, "vm boot device set", "qmp", m.cfg.QMPSocket, "device", dev)
	return nil
}

// BootDevice returns the last boot device set.
func (m *QEMUMachine) BootDevice(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boot, nil
}

// InsertMedia loads the ISO at path into the CD-ROM.
func (m *QEMUMachine) InsertMedia(ctx context.Context, path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.CDDevice == "" {
		return fmt.Errorf("inserting media into VM %s: the VM has no CD-ROM", m.cfg.QMPSocket)
	}
	c, err := m.client(ctx)
	if err == nil {
		err = c.ChangeMedium(ctx, m.cfg.CDDevice, path)
	}
	if err != nil {
		return fmt.Errorf("inserting %s into VM %s: %w", path, m.cfg.QMPSocket, err)
	}
	return nil
}

// EjectMedia empties the CD-ROM.
func (m *QEMUMachine) EjectMedia(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.CDDevice == "" {
		return fmt.Errorf("ejecting media from VM %s: the VM has no CD-ROM", m.cfg.QMPSocket)
	}
	c, err := m.client(ctx)
	if err == nil {
		err = c.Eject(ctx, m.cfg.CDDevice)
	}
	if err != nil {
		return fmt.Errorf("ejecting media from VM %s: %w", m.cfg.QMPSocket, err)
	}
	return nil
}
