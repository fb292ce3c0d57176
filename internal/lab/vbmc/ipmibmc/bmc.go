// Package ipmibmc is the lab's virtual IPMI BMC: an RMCP+ (lanplus) server on UDP, built on
// go-ipmi's embeddable BMC, that drives a vbmc.Machine. It answers chassis status and control
// (on, off, cycle, hard reset, soft shutdown), Get/Set System Boot Options (parameters 0, 3, 4
// and 5, with faithful read-back), Get System GUID / Get Device GUID, and the user commands
// (Set User Password for credential rotation).
//
// With Config.SerialSocket (or Config.Serial) it serves Serial-over-LAN: activating the SOL
// payload connects to the machine's serial port (QEMU's chardev socket) and relays it both ways
// through go-ipmi's SOL engine; deactivating the payload, or closing its session, disconnects.
//
// With Config.InbandListener it also serves the host's in-band face: QEMU's ipmi-bmc-extern
// device (the guest's KCS interface) forwarded over a stream socket in OpenIPMI's VM protocol
// (go-ipmi's vmproto), dispatching into the same BMC state: a user the guest creates in-band
// with ipmitool or the ramdisk's in-band provisioning logs in over RMCP+ at once. Get LAN
// Configuration Parameters reports the RMCP+ address (IP and port) to the host.
//
// Power actions are queued and run by one worker goroutine, so a Chassis Control answers at
// once; a Chassis Control repeated within one session inside DedupeWindow (a client
// retransmission) is answered from cache and not run again (LAB-NOTES gotcha 4).
package ipmibmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	gobmc "github.com/bougou/go-ipmi/pkg/bmc"
	"github.com/bougou/go-ipmi/pkg/handlers"
	"github.com/bougou/go-ipmi/pkg/server"
	"github.com/bougou/go-ipmi/pkg/transport/udp"
	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/bougou/go-ipmi/pkg/vmproto"
	"github.com/google/uuid"

	"bcd/internal/lab/vbmc"
)

// Defaults.
const (
	DefaultDedupeWindow  = 10 * time.Second
	DefaultActionTimeout = 60 * time.Second
	// machineCallTimeout bounds the synchronous machine calls made inside a handler (power
	// state, boot device): the Machine contract says they return quickly.
	machineCallTimeout = 2 * time.Second
	actionQueueLen     = 16
	adminUserID        = 2
	lanChannel         = 1
)

// Config describes one virtual BMC.
type Config struct {
	Addr     string // UDP listen address, e.g. "127.0.0.1:0" (tests) or "10.0.0.5:623"
	Username string // at most 16 bytes
	Password string // at most 20 bytes; never logged
	// GUID is the machine's SMBIOS system UUID in canonical form; Get System GUID reports it in
	// SMBIOS byte order (first three fields little-endian), so a client decoding it as SMBIOS
	// gets the same string as dmidecode inside the machine. Empty reports all zeros ("absent").
	GUID string
	// DeviceGUID is the BMC's own GUID (Get Device GUID, RAKP 2); empty means GUID.
	DeviceGUID string
	// CipherSuites advertised (3 and 17 are implemented); empty means both.
	CipherSuites []uint8
	// DedupeWindow is how long a repeated, identical Chassis Control within one session is
	// answered from cache instead of run again. Zero means DefaultDedupeWindow; negative
	// disables deduplication (only to prove in tests that it matters).
	DedupeWindow time.Duration
	// ActionTimeout bounds one queued power action; zero means DefaultActionTimeout.
	ActionTimeout time.Duration
	Logger        *slog.Logger
	// InbandListener, when set, serves the in-band (system interface) face on it: QEMU's
	// ipmi-bmc-extern connects here (chardev socket). Serve closes it.
	InbandListener net.Listener
	// SerialSocket is the unix stream socket on which QEMU serves the machine's serial port
	// (-chardev socket,server=on). Activating the SOL payload (instance 1) connects to it and
	// relays both ways; deactivating the payload, or closing its session, disconnects.
	SerialSocket string
	// Serial opens the machine's serial port instead of SerialSocket (tests: a net.Pipe end).
	// With neither, SOL is not offered (Activate Payload answers "payload type disabled").
	Serial func(ctx context.Context) (io.ReadWriteCloser, error)
}

// BMC is one running virtual IPMI BMC.
type BMC struct {
	cfg     Config
	m       vbmc.Machine
	log     *slog.Logger
	conn    *udp.Conn
	srv     *server.Server
	gobmc   *gobmc.BMC
	vm      *vmproto.VMServer                                 // the in-band face; nil without Config.InbandListener
	serial  func(context.Context) (io.ReadWriteCloser, error) // nil: no SOL
	sysGUID [16]byte
	actions chan powerAction
	boot    bootStore
	dedupe  *dedupe

	ignorePasswords atomic.Bool
	queued, done    atomic.Int64 // power actions accepted / finished (observability, tests)
	// arrivals counts non-idempotent commands that reached the handlers (answered from the
	// dedupe cache or run), within a session (observability, tests).
	arrivals atomic.Int64

	serveOnce sync.Once
	closeOnce sync.Once
}

// New validates cfg and binds the UDP socket (so Addr is known before Serve).
func New(cfg Config, m vbmc.Machine) (*BMC, error) {
	if m == nil {
		return nil, errors.New("creating IPMI BMC: no machine")
	}
	if cfg.Username == "" || len(cfg.Username) > gobmc.MaxUserNameLen {
		return nil, fmt.Errorf("creating IPMI BMC on %s: username must be 1 to %d bytes", cfg.Addr, gobmc.MaxUserNameLen)
	}
	if len(cfg.Password) > gobmc.MaxPasswordLen {
		return nil, fmt.Errorf("creating IPMI BMC on %s: password longer than %d bytes", cfg.Addr, gobmc.MaxPasswordLen)
	}
	sysGUID, err := smbiosGUID(cfg.GUID)
	if err != nil {
		return nil, fmt.Errorf("creating IPMI BMC on %s: system GUID: %w", cfg.Addr, err)
	}
	devGUID := sysGUID
	if cfg.DeviceGUID != "" {
		if devGUID, err = smbiosGUID(cfg.DeviceGUID); err != nil {
			return nil, fmt.Errorf("creating IPMI BMC on %s: device GUID: %w", cfg.Addr, err)
		}
	}
	suites, err := cipherSuites(cfg.CipherSuites)
	if err != nil {
		return nil, fmt.Errorf("creating IPMI BMC on %s: %w", cfg.Addr, err)
	}
	serial, err := serialOpener(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating IPMI BMC on %s: %w", cfg.Addr, err)
	}
	if cfg.DedupeWindow == 0 {
		cfg.DedupeWindow = DefaultDedupeWindow
	}
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = DefaultActionTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}

	b := &BMC{
		cfg:     cfg,
		m:       m,
		serial:  serial,
		sysGUID: sysGUID,
		actions: make(chan powerAction, actionQueueLen),
		dedupe:  newDedupe(cfg.DedupeWindow, time.Now),
	}
	info := gobmc.DeviceInfo{
		DeviceID: 0x20, DeviceRevision: 1, FirmwareMajor: 1, FirmwareMinor: 0x00,
		IPMIVersion: 0x20, ManufacturerID: 0x0000, ProductID: 0x0001,
		AdditionalDeviceSupport: 0x80 | 0x01, // chassis device, sensor device
	}
	b.gobmc = gobmc.New(info, devGUID, machineHAL{b}, gobmc.WithCipherSuites(suites), gobmc.WithV15Disabled())
	if _, err := b.gobmc.Users.Add(adminUserID, cfg.Username); err != nil {
		return nil, fmt.Errorf("creating IPMI BMC on %s: adding user %q: %w", cfg.Addr, cfg.Username, err)
	}
	err = b.gobmc.Users.Update(adminUserID, func(u *gobmc.User) error {
		u.SetPassword([]byte(cfg.Password))
		u.Enabled = true
		u.ChannelAccess[lanChannel] = gobmc.UserChannelAccess{MaxPrivilege: gobmc.PrivilegeLevelAdministrator, Enabled: true}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("creating IPMI BMC on %s: configuring user %q: %w", cfg.Addr, cfg.Username, err)
	}

	conn, err := udp.Listen(cfg.Addr, udp.WithReadTimeout(time.Second))
	if err != nil {
		return nil, fmt.Errorf("creating IPMI BMC: listening on %s: %w", cfg.Addr, err)
	}
	b.conn = conn
	b.log = log.With("bmc", "ipmi", "addr", conn.LocalAddr().String())
	b.srv = server.NewServer(b.gobmc, conn, server.WithHandlerRegistry(b.registry()))
	if cfg.InbandListener != nil {
		b.vm = vmproto.NewVMServer(b.gobmc, vmproto.WithVMHandlerRegistry(b.registry()))
	}
	return b, nil
}

// Addr is the bound UDP address (with the real port when Config.Addr asked for port 0).
func (b *BMC) Addr() *net.UDPAddr { return b.conn.LocalAddr().(*net.UDPAddr) }

// String names the BMC without its password.
func (b *BMC) String() string {
	return fmt.Sprintf("ipmi-bmc %s@%s", b.cfg.Username, b.Addr())
}

// IgnoreBootWrites is a test hook imitating BMCs that accept Set System Boot Options and do not
// apply it: while on, boot writes answer success and change nothing (LAB-NOTES gotcha 5).
func (b *BMC) IgnoreBootWrites(on bool) { b.boot.setIgnore(on) }

// ActiveSessions is the number of RMCP+ sessions open (or being opened) on the BMC.
func (b *BMC) ActiveSessions() int { return b.gobmc.Sessions.Count() }

// IgnorePasswordWrites is a test hook: while on, Set User Password answers success and changes
// nothing, like a BMC that silently refuses a credential change.
func (b *BMC) IgnorePasswordWrites(on bool) { b.ignorePasswords.Store(on) }

// Serve answers IPMI until ctx is cancelled, then closes the socket. It returns nil on
// cancellation. It may be called once.
func (b *BMC) Serve(ctx context.Context) error {
	err := errors.New("serving IPMI BMC: Serve called twice")
	b.serveOnce.Do(func() { err = b.serve(ctx) })
	return err
}

func (b *BMC) serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { b.runActions(ctx) })
	if b.vm != nil {
		wg.Go(func() {
			if err := b.vm.Serve(ctx, b.cfg.InbandListener); err != nil {
				b.log.Error("in-band (VM protocol) face stopped", "err", err)
			}
		})
	}
	wg.Go(func() {
		<-ctx.Done()
		_ = b.Close()
	})
	b.log.Info("IPMI BMC serving", "user", b.cfg.Username)
	err := b.srv.Serve(ctx)
	cancel()
	wg.Wait()
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("serving IPMI BMC on %s: %w", b.Addr(), err)
	}
	return nil
}

// Close stops the server and releases the socket; Serve then returns.
func (b *BMC) Close() error {
	var err error
	b.closeOnce.Do(func() { err = b.srv.Close() })
	return err
}

// registry is go-ipmi's standard command set with our overrides and the dedupe middleware.
func (b *BMC) registry() *handlers.Registry {
	reg := handlers.NewRegistry()
	reg.Use(b.dedupe.middleware(b))
	reg.Use(b.passwordHook)
	handlers.RegisterAllHandlers(reg)
	reg.RegisterFunc(types.CommandGetSystemGUID, b.handleGetSystemGUID)
	reg.RegisterFunc(types.CommandSetSystemBootOptions, b.handleSetBootOptions)
	reg.RegisterFunc(types.CommandGetSystemBootOptions, b.handleGetBootOptions)
	// go-ipmi routes the BMC's own Cold/Warm Reset (App 02h/03h, "mc reset") to the chassis HAL,
	// which would reset the machine. Resetting a virtual BMC is a no-op.
	reg.RegisterFunc(types.CommandColdReset, b.handleBMCReset)
	reg.RegisterFunc(types.CommandWarmReset, b.handleBMCReset)
	return reg
}

// passwordHook implements IgnorePasswordWrites.
func (b *BMC) passwordHook(next handlers.Handler) handlers.Handler {
	return handlers.HandlerFunc(func(ctx context.Context, hctx *handlers.HandlerContext, req []byte) ([]byte, types.CompletionCode, error) {
		if hctx != nil && hctx.Command.NetFn == types.CommandSetUserPassword.NetFn &&
			hctx.Command.ID == types.CommandSetUserPassword.ID && b.ignorePasswords.Load() {
			b.log.Warn("Set User Password accepted and ignored (test hook)")
			return nil, types.CodeOK, nil
		}
		return next.Handle(ctx, hctx, req)
	})
}

func (b *BMC) handleGetSystemGUID(context.Context, *handlers.HandlerContext, []byte) ([]byte, types.CompletionCode, error) {
	out := b.sysGUID
	return out[:], types.CodeOK, nil
}

func (b *BMC) handleBMCReset(context.Context, *handlers.HandlerContext, []byte) ([]byte, types.CompletionCode, error) {
	b.log.Info("BMC reset requested: nothing to do for a virtual BMC")
	return nil, types.CodeOK, nil
}

// smbiosGUID parses a canonical UUID and returns it in SMBIOS byte order (DSP0134 7.2.1: the
// first three fields little-endian). Empty gives all zeros ("not present").
func smbiosGUID(s string) ([16]byte, error) {
	var out [16]byte
	if s == "" {
		return out, nil
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return out, fmt.Errorf("parsing %q: %w", s, err)
	}
	out = u
	out[0], out[1], out[2], out[3] = u[3], u[2], u[1], u[0]
	out[4], out[5] = u[5], u[4]
	out[6], out[7] = u[7], u[6]
	return out, nil
}

func cipherSuites(ids []uint8) ([]types.CipherSuiteID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out := make([]types.CipherSuiteID, 0, len(ids))
	for _, id := range ids {
		cs := types.CipherSuiteID(id)
		if !gobmc.SupportedCipherSuite(cs) {
			return nil, fmt.Errorf("cipher suite %d is not implemented (3 and 17 are)", id)
		}
		out = append(out, cs)
	}
	return out, nil
}
