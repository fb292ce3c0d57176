package ipmi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/transport"
	"github.com/bougou/go-ipmi/pkg/types"

	"bcd/internal/bmc"
)

// The serial console (IPMI Serial-over-LAN, IPMI v2.0 §15 and §24).
//
// A console runs in its own RMCP+ session, opened like every other (the cipher suites in order,
// the last one that worked first, a refused login not retried), but it does not take one of the
// Pacer's session slots: an operator's console lasts minutes or hours, and holding the slot that
// long would stop every power and boot command to the machine (one slot per BMC by default). The
// console is one session more on the BMC, for which the SOL payload exists. What the Pacer does
// apply is its minimum interval, to the commands that set the console up and take it down (the
// login, Activate Payload, Deactivate Payload), as in every session; the SOL data stream itself
// is not paced: one packet per poll or keystroke, acknowledged one at a time by the protocol.

// SOLPayloadInstance is the payload instance the console activates (BMCs have one).
const SOLPayloadInstance = 1

// ConsolePollInterval is the time between two SOL packets sent while the console is idle: they
// fetch what the machine wrote (latency at most this) and are the session's keep-alive (a
// session's inactivity timeout is reset by its authenticated packets, payload packets included;
// the spec's default timeout is 60 s).
const ConsolePollInterval = 100 * time.Millisecond

// Why a console ended without being asked to.
var (
	// ErrConsoleEnded: the BMC deactivated the payload (another client took the console over,
	// or the BMC closed it).
	ErrConsoleEnded = errors.New("the BMC ended the console session (another client took it over, or the BMC closed it)")
	// ErrConsoleSilent: the BMC stopped answering the console's packets.
	ErrConsoleSilent = errors.New("the BMC stopped answering the console session")
)

var _ bmc.Consoler = (*Driver)(nil)

// Console relays the machine's serial console (bmc.Consoler): it opens a session, activates the
// SOL payload (taking it from another session first with opts.TakeOver), and relays until ctx
// ends or in reaches EOF, then deactivates the payload and closes the session (nil). The BMC
// ending the payload gives ErrConsoleEnded, a BMC that no longer answers (Timeout × (1+Retries)
// without an answer) ErrConsoleSilent.
func (d *Driver) Console(ctx context.Context, in io.Reader, out io.Writer, opts bmc.ConsoleOptions) error {
	if err := d.console(ctx, in, out, opts); err != nil {
		return fmt.Errorf("serial console on %s: %w", d.addr, err)
	}
	return nil
}

func (d *Driver) console(ctx context.Context, in io.Reader, out io.Writer, opts bmc.ConsoleOptions) error {
	// No pacer.Acquire: see the comment at the top of this file. connect paces each login.
	s, err := d.connect(ctx, d.currentPassword(), false)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	if err := s.activateSOL(ctx, opts.TakeOver); err != nil {
		return err
	}
	d.log.Info("serial console open", "takeOver", opts.TakeOver)
	start := time.Now()

	src := &consoleInput{r: in}
	dst := &consoleOutput{w: out}
	err = s.c.SOLStream(ctx, src, dst, &client.SOLStreamOptions{PollInterval: ConsolePollInterval})
	err = s.consoleEnd(ctx, err, src, dst)
	if err == nil || !errors.Is(err, ErrConsoleEnded) && !errors.Is(err, ErrConsoleSilent) {
		// Ours to deactivate: not after the BMC ended it (it may be another session's by now,
		// which an administrator's Deactivate Payload would end) nor when it does not answer
		// (Close Session then ends the payload if the BMC hears it).
		s.deactivateSOL(ctx)
	}
	d.log.Info("serial console closed", "took", time.Since(start).Round(time.Millisecond), "err", err)
	return err
}

// consoleEnd says why a relay ended: nil when asked to (ctx ended, in reached EOF).
func (s *session) consoleEnd(ctx context.Context, err error, src *consoleInput, dst *consoleOutput) error {
	d := s.d
	switch {
	case err == nil, ctx.Err() != nil:
		return nil
	case src.failed(err):
		return fmt.Errorf("reading the console's input: %w", err)
	case dst.failed(err):
		return fmt.Errorf("writing the console's output: %w", err)
	case strings.Contains(err.Error(), "BMC reported SOL deactivation"): // go-ipmi says so only in text
		return ErrConsoleEnded
	case noAnswer(err):
		// A BMC that deactivated the payload may say so in a packet the client drops, and then
		// leave the session's SOL packets unanswered: ask it, in the session, whether it lives.
		if why, alive := s.payloadGone(ctx); alive {
			return fmt.Errorf("%w: %s", ErrConsoleEnded, why)
		}
		return fmt.Errorf("%w: no answer within %s (%s)", ErrConsoleSilent, d.opts.Timeout*time.Duration(d.opts.Retries+1), oneLine(err))
	}
	return fmt.Errorf("relaying the console: %s", oneLine(err))
}

// payloadGone asks the BMC, after its SOL answers stopped, whether the payload is still active:
// alive is false when the BMC does not answer that either.
func (s *session) payloadGone(ctx context.Context) (why string, alive bool) {
	ctx, cancel := context.WithTimeout(ctx, s.d.opts.Timeout*time.Duration(s.d.opts.Retries+1))
	defer cancel()
	var active bool
	err := s.do(ctx, "Get Payload Activation Status (SOL)", func(ctx context.Context) error {
		res, err := s.c.GetPayloadActivationStatus(ctx, types.PayloadTypeSOL)
		if err != nil {
			return err
		}
		active = res.Instance01Activated
		return nil
	})
	switch {
	case err != nil:
		return "", false
	case active:
		return "the payload is active in another session", true
	}
	return "the payload is no longer active", true
}

// noAnswer reports whether err is an exchange that got no answer (as opposed to an answer the
// driver could not use).
func noAnswer(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) ||
		strings.Contains(err.Error(), "no datagram matched") // go-ipmi's unexported errNoDatagramMatched
}

// activateSOL activates the SOL payload of this session, with encryption and authentication.
// A payload active in another session is ErrConsoleInUse, unless takeOver: then it is
// deactivated first (an administrator may deactivate another session's payload, §24.2).
func (s *session) activateSOL(ctx context.Context, takeOver bool) error {
	err := s.activate(ctx)
	if !consoleInUse(err) {
		return err
	}
	if !takeOver {
		return fmt.Errorf("%w (%s)", bmc.ErrConsoleInUse, oneLine(err))
	}
	s.d.log.Info("serial console in use by another session: taking it over")
	err = s.do(ctx, "Deactivate Payload (SOL, another session's)", func(ctx context.Context) error {
		_, err := s.c.DeactivatePayload(ctx, &transport.DeactivatePayloadRequest{
			PayloadType: types.PayloadTypeSOL, PayloadInstance: SOLPayloadInstance,
		})
		if completionCode(err) == types.CodeDeactivatePayloadAlreadyDeactivated {
			return nil // its owner let go meanwhile
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("taking the console over: %w", err)
	}
	if err := s.activate(ctx); err != nil {
		if consoleInUse(err) { // another client was quicker
			return fmt.Errorf("taking the console over: %w (%s)", bmc.ErrConsoleInUse, oneLine(err))
		}
		return fmt.Errorf("taking the console over: %w", err)
	}
	return nil
}

func (s *session) activate(ctx context.Context) error {
	return s.do(ctx, "Activate Payload (SOL)", func(ctx context.Context) error {
		res, err := s.c.ActivatePayload(ctx, &transport.ActivatePayloadRequest{
			PayloadType: types.PayloadTypeSOL, PayloadInstance: SOLPayloadInstance,
			EnableEncryption: true, EnableAuthentication: true,
		})
		if err != nil {
			return err
		}
		if int(res.PayloadUDPPort) != s.d.port {
			// go-ipmi carries the payload in the session's own port, as most BMCs (and BMCs
			// behind a forwarded port, which report 623) expect.
			s.d.log.Warn("BMC names another UDP port for the SOL payload; using the session's", "payloadPort", res.PayloadUDPPort)
		}
		return nil
	})
}

// deactivateSOL ends this session's payload, even when ctx is done, bounded by one exchange
// with its retransmissions.
func (s *session) deactivateSOL(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.d.opts.Timeout*time.Duration(s.d.opts.Retries+1))
	defer cancel()
	err := s.do(ctx, "Deactivate Payload (SOL)", func(ctx context.Context) error {
		_, err := s.c.DeactivatePayload(ctx, &transport.DeactivatePayloadRequest{
			PayloadType: types.PayloadTypeSOL, PayloadInstance: SOLPayloadInstance,
		})
		return err
	})
	if err != nil {
		s.d.log.Warn("deactivating the serial console (Close Session follows, which ends it too)", "err", err)
	}
}

// consoleInUse reports whether err is an Activate Payload refused because the payload is active
// elsewhere: "already active on another session" (80h), or "activation limit reached" (82h),
// which BMCs with a single SOL instance answer instead.
func consoleInUse(err error) bool {
	switch completionCode(err) {
	case types.CodeActivatePayloadAlreadyActive, types.CodeActivatePayloadActivationLimitReached:
		return true
	}
	return false
}

// completionCode is err's IPMI completion code, or 0 (OK) when err is not an answer.
func completionCode(err error) types.CompletionCode {
	var re *types.ResponseError
	if errors.As(err, &re) {
		return re.CompletionCode()
	}
	return types.CodeOK
}

// consoleInput remembers the error that ended the operator's input (EOF aside), so that it is
// told apart from the BMC's.
type consoleInput struct {
	r io.Reader

	mu  sync.Mutex
	err error
}

func (c *consoleInput) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}
	return n, err
}

func (c *consoleInput) failed(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil && errors.Is(err, c.err)
}

// consoleOutput remembers the error of a write to the operator.
type consoleOutput struct {
	w   io.Writer
	err error // written and read by SOLStream's goroutine only
}

func (c *consoleOutput) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

func (c *consoleOutput) failed(err error) bool { return c.err != nil && errors.Is(err, c.err) }
