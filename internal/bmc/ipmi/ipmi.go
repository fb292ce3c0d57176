// Package ipmi is the IPMI (RMCP+ / lanplus) BMC driver of the site agent. It implements
// bmc.Power, bmc.BootDeviceSetter (with read-back), bmc.Inspector, bmc.CredentialRotator and
// bmc.Consoler (Serial-over-LAN, console.go) on top of github.com/bougou/go-ipmi's client.
//
// Every operation opens one session (cipher suite 17 preferred, 3 as fallback), runs its
// commands and closes it, under a Pacer shared by the whole site agent: at most N sessions per
// BMC (default 1) and a minimum interval between commands to one BMC. A console is the
// exception: its session takes no slot (it lasts as long as the operator stays).
package ipmi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"bcd/internal/bmc"
)

// Defaults.
const (
	DefaultPort          = 623
	DefaultTimeout       = 2 * time.Second // per UDP exchange
	DefaultRetries       = 2               // retransmissions per exchange
	DefaultSettleTimeout = 60 * time.Second
	DefaultPollInterval  = time.Second
)

// DefaultCipherSuites is the preference order: 17 (HMAC-SHA256, AES-CBC-128), then 3
// (HMAC-SHA1, AES-CBC-128) for BMCs that lack 17 (OpenIPMI's ipmi_sim, older firmware).
func DefaultCipherSuites() []uint8 { return []uint8{17, 3} }

// Options tune the driver. The zero value is usable.
type Options struct {
	// CipherSuites to try, in order; empty means DefaultCipherSuites(). Only 3 and 17 (both
	// authenticated and encrypted) are accepted.
	CipherSuites []uint8
	// Pacer is shared by all clients of a site agent; nil gives this driver a private one with
	// the defaults (which then paces only this driver's calls).
	Pacer *Pacer
	// Timeout per UDP exchange (0: DefaultTimeout) and retransmissions per exchange
	// (0: DefaultRetries, negative: none).
	Timeout time.Duration
	Retries int
	// SettleTimeout bounds the wait, after on/off/cycle-from-off, for the BMC to report the new
	// power state (0: DefaultSettleTimeout); PollInterval is the time between two reads
	// (0: DefaultPollInterval).
	SettleTimeout time.Duration
	PollInterval  time.Duration
	Logger        *slog.Logger
}

// Driver talks to one BMC. It is safe for concurrent use; the Pacer serializes sessions.
type Driver struct {
	host   string // as go-ipmi dials it (IPv6 literals in brackets)
	port   int
	addr   string // host:port, the pacer key and the name in errors and logs
	user   string
	suites []types.CipherSuiteID
	opts   Options
	pacer  *Pacer
	log    *slog.Logger

	mu       sync.Mutex
	password string              // current secret; replaced after a verified rotation
	suite    types.CipherSuiteID // the suite that worked last; tried first
}

// Interface checks.
var (
	_ bmc.Power             = (*Driver)(nil)
	_ bmc.BootDeviceSetter  = (*Driver)(nil)
	_ bmc.Inspector         = (*Driver)(nil)
	_ bmc.CredentialRotator = (*Driver)(nil)
)

// New validates ep and opts. It does not contact the BMC.
func New(ep bmc.Endpoint, opts Options) (*Driver, error) {
	host, port, err := splitAddress(ep.Address)
	if err != nil {
		return nil, fmt.Errorf("creating IPMI driver: %w", err) // splitAddress quotes what it may
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	if ep.Username == "" || len(ep.Username) > 16 {
		return nil, fmt.Errorf("creating IPMI driver for %s: username must be 1 to 16 bytes", addr)
	}
	if err := checkPassword(ep.Password); err != nil {
		return nil, fmt.Errorf("creating IPMI driver for %s: %w", addr, err)
	}
	ids := opts.CipherSuites
	if len(ids) == 0 {
		ids = DefaultCipherSuites()
	}
	suites := make([]types.CipherSuiteID, 0, len(ids))
	for _, id := range ids {
		if id != 3 && id != 17 {
			return nil, fmt.Errorf("creating IPMI driver for %s: cipher suite %d not accepted: use 17 or 3 (authenticated and encrypted)", addr, id)
		}
		suites = append(suites, types.CipherSuiteID(id))
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	switch {
	case opts.Retries == 0:
		opts.Retries = DefaultRetries
	case opts.Retries < 0:
		opts.Retries = 0
	}
	if opts.SettleTimeout <= 0 {
		opts.SettleTimeout = DefaultSettleTimeout
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	pacer := opts.Pacer
	if pacer == nil {
		pacer = NewPacer(PacerConfig{})
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	dialHost := host
	if strings.Contains(host, ":") {
		dialHost = "[" + host + "]" // go-ipmi formats "%s:%d"
	}
	return &Driver{
		host: dialHost, port: port, addr: addr, user: ep.Username, suites: suites,
		opts: opts, pacer: pacer, password: ep.Password, suite: suites[0],
		log: log.With("driver", "ipmi", "bmc", addr, "user", ep.Username),
	}, nil
}

// String never shows the password.
func (d *Driver) String() string { return fmt.Sprintf("ipmi %s@%s", d.user, d.addr) }

// splitAddress accepts host, host:port, [v6]:port and a bare IPv6 literal. An address with user
// information, a path, a query or a fragment is refused without being quoted: it may hold a
// credential.
func splitAddress(a string) (string, int, error) {
	if a == "" {
		return "", 0, errors.New("empty BMC address")
	}
	if strings.ContainsAny(a, "@?#/") {
		return "", 0, errors.New("BMC address with a user, path, query or fragment ('@', '/', '?', '#'; not quoted: it may hold a credential): " +
			"want host, host:port or [ipv6]:port, and the credentials apart")
	}
	if ip := net.ParseIP(strings.Trim(a, "[]")); ip != nil && !strings.Contains(a, "]:") {
		return ip.String(), DefaultPort, nil
	}
	host, portStr, err := net.SplitHostPort(a)
	if err != nil {
		if strings.Contains(a, ":") {
			return "", 0, fmt.Errorf("BMC address %q: want host, host:port or [ipv6]:port", a)
		}
		return a, DefaultPort, nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("BMC address %q: bad port", a)
	}
	if host == "" {
		return "", 0, fmt.Errorf("BMC address %q: empty host", a)
	}
	return host, port, nil
}

// checkPassword validates an IPMI password without ever quoting it.
func checkPassword(p string) error {
	switch {
	case p == "":
		return errors.New("empty password")
	case len(p) > 20:
		return fmt.Errorf("password is %d bytes: IPMI allows at most 20", len(p))
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("password contains a NUL byte, which IPMI cannot tell from padding")
	}
	return nil
}

func (d *Driver) currentPassword() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.password
}

// ErrAuth marks a refused login (wrong username or password, or not enough privilege).
var ErrAuth = errors.New("IPMI authentication refused")

// session is one open RMCP+ session.
type session struct {
	d     *Driver
	c     *client.Client
	suite types.CipherSuiteID
	// once: go-ipmi does not retransmit the requests of this session (see withSessionOnce); its
	// reads are sent again by the driver instead.
	once bool
}

// withSession runs fn inside a session opened with the driver's current password.
func (d *Driver) withSession(ctx context.Context, op string, fn func(context.Context, *session) error) error {
	return d.withSessionAs(ctx, op, d.currentPassword(), fn)
}

func (d *Driver) withSessionAs(ctx context.Context, op, password string, fn func(context.Context, *session) error) error {
	return d.openSession(ctx, op, password, false, fn)
}

// withSessionOnce is withSession for a session that carries a command which must never reach the
// BMC twice (a power cycle, a hard reset). go-ipmi retransmits a request it got no answer to
// within Timeout; a BMC that runs the command before it answers, slower than that (LAB-NOTES
// gotcha 4), or whose answer was lost, runs it again: the machine is cycled twice. In this session
// nothing is retransmitted: the session is opened again and the reads are sent again by the
// driver (both harmless), and a command that got no answer fails saying its outcome is unknown.
func (d *Driver) withSessionOnce(ctx context.Context, op string, fn func(context.Context, *session) error) error {
	return d.openSession(ctx, op, d.currentPassword(), true, fn)
}

func (d *Driver) openSession(ctx context.Context, op, password string, once bool, fn func(context.Context, *session) error) error {
	release, err := d.pacer.Acquire(ctx, d.addr)
	if err != nil {
		return fmt.Errorf("%s on %s: %w", op, d.addr, err)
	}
	defer release()
	s, err := d.connect(ctx, password, once)
	if err != nil {
		return fmt.Errorf("%s on %s: %w", op, d.addr, err)
	}
	defer s.close(ctx)
	if err := fn(ctx, s); err != nil {
		return fmt.Errorf("%s on %s: %w", op, d.addr, err)
	}
	return nil
}

// connect opens a session, trying the cipher suites in order (the last one that worked first).
// A refused login stops at once: retrying it with another suite only risks locking the account.
// once: go-ipmi retransmits nothing in the session and each request waits Timeout × (Retries+1)
// for its answer; a login that fails otherwise than refused is made again (up to Retries times)
// before the next suite is tried.
func (d *Driver) connect(ctx context.Context, password string, once bool) (*session, error) {
	d.mu.Lock()
	first := d.suite
	d.mu.Unlock()
	order := []types.CipherSuiteID{first}
	for _, s := range d.suites {
		if s != first {
			order = append(order, s)
		}
	}
	retries, logins, timeout := d.opts.Retries, 1, d.opts.Timeout
	if once {
		// Each request waits as long for its answer as the retransmissions would have: a BMC
		// that is slow to answer a Chassis Control keeps working.
		retries, logins, timeout = 0, d.opts.Retries+1, d.opts.Timeout*time.Duration(d.opts.Retries+1)
	}
	var tried []string
	for _, suite := range order {
		var err error
		for login := 1; login <= logins; login++ {
			if err = d.pacer.Wait(ctx, d.addr); err != nil {
				return nil, err
			}
			c, cerr := client.NewClient(d.host, d.port, d.user, password)
			if cerr != nil {
				return nil, fmt.Errorf("opening session: %w", cerr)
			}
			c.WithCipherSuiteID(suite).WithTimeout(timeout).WithRetry(retries)
			c.WithMaxPrivilegeLevel(types.PrivilegeLevelAdministrator)
			start := time.Now()
			err = c.Connect(ctx)
			if err == nil {
				d.mu.Lock()
				d.suite = suite
				d.mu.Unlock()
				d.log.Debug("IPMI session open", "cipherSuite", uint8(suite), "took", time.Since(start))
				return &session{d: d, c: c, suite: suite, once: once}, nil
			}
			d.abandon(ctx, c, err)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("opening session (cipher suite %d): %w", suite, ctx.Err())
			}
			if authRefused(err) {
				d.log.Warn("IPMI login refused", "cipherSuite", uint8(suite))
				return nil, fmt.Errorf("opening session (cipher suite %d): %w: wrong username or password, or the user lacks administrator privilege (%s)", suite, ErrAuth, oneLine(err))
			}
		}
		d.log.Info("IPMI session failed; trying the next cipher suite", "cipherSuite", uint8(suite), "err", err)
		tried = append(tried, fmt.Sprintf("cipher suite %d: %s", suite, oneLine(err)))
	}
	return nil, fmt.Errorf("opening session: no cipher suite worked: %s", strings.Join(tried, "; "))
}

// oneLine flattens go-ipmi's multi-line error text.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// abandon releases a client whose Connect failed. A login that failed after the BMC activated
// the session (RAKP 3 and 4 done, then Set Session Privilege Level refused or unanswered) holds
// one of the BMC's few session slots until its inactivity timeout: that session is closed (Close
// Session, bounded by one exchange's timeout, even when ctx is done). Otherwise no session exists
// to close and only the socket is released, without waiting for an answer that cannot come.
func (d *Driver) abandon(ctx context.Context, c *client.Client, err error) {
	if !sessionActivated(err) {
		done, cancel := context.WithCancel(context.Background())
		cancel()
		_ = c.Close(done)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.Timeout)
	defer cancel()
	if cerr := c.Close(ctx); cerr != nil {
		d.log.Debug("closing the IPMI session of a failed login", "err", cerr)
	}
}

// sessionActivated reports whether a Connect that failed with err had activated a session on the
// BMC: go-ipmi's lanplus Connect fails after the RAKP exchange (which activates it) only at Set
// Session Privilege Level, and says so only in its error's text.
func sessionActivated(err error) bool {
	return err != nil && strings.Contains(err.Error(), "SetSessionPrivilegeLevel")
}

// refusalStatuses are the RMCP+ status codes of a refused login.
var refusalStatuses = []types.RmcpStatusCode{
	types.RmcpStatusCodeUnauthorizedName, types.RmcpStatusCodeInvalidRole,
	types.RmcpStatusCodeUnauthorizedRoleOfPriLevel, types.RmcpStatusCodeInvalidIntegrityCheckValue,
}

// authRefused tells a refused login from a cipher suite the BMC lacks or a BMC that is silent.
// go-ipmi flattens the per-suite errors of Connect into text (%v), so the text is checked too.
func authRefused(err error) bool {
	if errors.Is(err, client.ErrRAKPAuthentication) || strings.Contains(err.Error(), client.ErrRAKPAuthentication.Error()) {
		return true
	}
	var rs *types.RmcpStatusError
	for _, code := range refusalStatuses {
		if errors.As(err, &rs) && rs.StatusCode() == code {
			return true
		}
		if strings.Contains(err.Error(), types.NewRmcpStatusError(code).Error()) {
			return true
		}
	}
	return false
}

func (s *session) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.d.opts.Timeout)
	defer cancel()
	if err := s.c.Close(ctx); err != nil {
		s.d.log.Debug("closing IPMI session", "err", err)
	}
}

// do paces and runs one command, naming it in the error.
func (s *session) do(ctx context.Context, command string, fn func(context.Context) error) error {
	if err := s.d.pacer.Wait(ctx, s.d.addr); err != nil {
		return err
	}
	if err := fn(ctx); err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	return nil
}

// read runs a command that reads (harmless to repeat): in a session where go-ipmi retransmits
// nothing (once), the driver sends it again itself, up to Retries times, when no answer came.
func (s *session) read(ctx context.Context, command string, fn func(context.Context) error) error {
	tries := 1
	if s.once {
		tries += s.d.opts.Retries
	}
	var err error
	for try := 1; try <= tries; try++ {
		if err = s.do(ctx, command, fn); err == nil || ctx.Err() != nil || answered(err) {
			return err
		}
	}
	return err
}

// answered reports whether err is the BMC's answer (a completion code), rather than no answer.
func answered(err error) bool {
	var re *types.ResponseError
	return errors.As(err, &re)
}

func (s *session) poweredOn(ctx context.Context) (bool, error) {
	var on bool
	err := s.read(ctx, "Get Chassis Status", func(ctx context.Context) error {
		st, err := s.c.GetChassisStatus(ctx)
		if err != nil {
			return err
		}
		on = st.PowerIsOn
		return nil
	})
	return on, err
}

func stateOf(on bool) bmc.PowerState {
	if on {
		return bmc.PowerOn
	}
	return bmc.PowerOff
}

// GoString keeps %#v from printing the password.
func (d *Driver) GoString() string { return d.String() }
