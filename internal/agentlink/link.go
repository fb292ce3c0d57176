package agentlink

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// Link is a running connection to the gateway.
type Link struct {
	cfg Config
	h   Handler
	// id is the current identity: a renewal replaces it (renew.go).
	id atomic.Pointer[identity]
	j  *journal
	// wire is the transport and client of the calls to the gateway: a renewal replaces it, so
	// that the next connection presents the renewed certificate (a connection keeps its
	// handshake's).
	wire atomic.Pointer[wire]
	// conns are the connections of every wire the link had: closed when it ends.
	conns *connSet
	log   *slog.Logger

	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	err    error
	cmds   sync.WaitGroup // running commands
	bg     sync.WaitGroup // the renewal loop
	sem    chan struct{}

	out     outbox
	mu      sync.Mutex
	running map[string]*run // commands running in this process
	// awaiting holds the commands journaled and acknowledged whose AckResult has not arrived:
	// they run once the server says it recorded the ack, never before (see receive).
	awaiting map[string]Command
	// cancelled holds the commands of awaiting the server cancelled before it answered their
	// ack: the Cancel may come first (the gateway sends it once the ack is recorded, on the same
	// stream as the answer), and such a command must not start when the answer comes.
	cancelled map[string]bool
	// changed is closed and replaced whenever a command stops running or a final update is
	// confirmed (Drain waits on it).
	changed  chan struct{}
	sessions atomic.Int64
	// connected: a stream is open and the gateway has answered on it (Connected).
	connected atomic.Bool
	crashed   atomic.Bool
	draining  atomic.Bool
	// renewed is signalled when a renewal stored a new certificate: the stream, whose
	// connection presented the old one at its handshake, ends and reconnects on a new
	// connection (see session).
	renewed chan struct{}
	// renewNow wakes the renewal loop before the certificate is due: the control plane's CAs
	// differ from the agent's (a rotation of the agent CA; carotation.go).
	renewNow chan struct{}
	// caAsked is the last CA mismatch (checkCA) that woke the renewal loop, and when.
	caAsked   string
	caAskedAt time.Time
	// mark is the newest watermark of the store the gateway told (watermark.go), named in
	// every Hello; markFailed: keeping it in DataDir failed (logged once).
	mark       atomic.Pointer[storeMark]
	markFailed atomic.Bool
}

type run struct {
	cancel   context.CancelFunc
	progress Progress
	// ended: the handler returned. The command stays in running until its final update is
	// journaled (see start), but a new stream no longer reports it running (resume).
	ended bool
}

// Dial joins if DataDir holds no certificate (or DataDir is empty), then keeps a Connect
// stream up in the background until ctx ends or the gateway refuses the agent's certificate.
// Join errors are returned at once.
func Dial(ctx context.Context, cfg Config, h Handler) (*Link, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("creating agent data directory: %w", err)
		}
	}
	id, ok, err := loadIdentity(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var expired *identity
	if ok && id.expired(time.Now()) && cfg.token() != "" {
		// Stopped for longer than its certificate lives, and given a new token: join again,
		// keeping the data dir (journal, caches, leases) and, for a retried join, the key.
		cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "the agent's certificate has expired: joining again with the token given",
			slog.String("agent", id.id.String()), slog.Time("not_after", id.tls.Leaf.NotAfter))
		if err := os.Rename(filepath.Join(cfg.DataDir, CertFile), filepath.Join(cfg.DataDir, CertFile+".expired")); err != nil {
			return nil, fmt.Errorf("setting the expired certificate aside: %w", err)
		}
		expired, ok = id, false
	}
	if !ok {
		if cfg.Key == nil && cfg.DataDir != "" {
			// The key is on disk before the join: when the control plane records the join but
			// its answer is lost (it crashed, the link dropped), the next attempt joins with
			// the same key, which the control plane accepts again for its retry window.
			if cfg.Key, err = pendingJoinKey(cfg.DataDir); err != nil {
				return nil, err
			}
		}
		if id, err = join(ctx, &cfg); err != nil {
			if expired != nil {
				// Put it back: the clock may be wrong, not the certificate.
				if rerr := os.Rename(filepath.Join(cfg.DataDir, CertFile+".expired"), filepath.Join(cfg.DataDir, CertFile)); rerr != nil {
					err = errors.Join(err, fmt.Errorf("restoring the expired certificate: %w", rerr))
				}
				return nil, fmt.Errorf("the agent's certificate expired on %s, and joining again failed (%s): %w",
					expired.tls.Leaf.NotAfter.UTC().Format(time.RFC3339), rejoinAdvice(cfg.Kind), err)
			}
			return nil, err
		}
		if err := id.store(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	j, err := openJournal(cfg.DataDir, cfg.JournalRetain)
	if err != nil {
		return nil, err
	}
	l := &Link{
		cfg: cfg, h: h, j: j, conns: newConnSet(),
		log:     cfg.Logger.With(slog.String("agent", id.id.String())),
		done:    make(chan struct{}),
		sem:     make(chan struct{}, cfg.MaxConcurrent),
		running: map[string]*run{}, awaiting: map[string]Command{}, cancelled: map[string]bool{}, changed: make(chan struct{}),
		renewed: make(chan struct{}, 1), renewNow: make(chan struct{}, 1),
	}
	l.id.Store(id)
	mark := loadMark(cfg.DataDir, l.log)
	l.mark.Store(&mark)
	if err := l.rewire(); err != nil {
		_ = j.close()
		return nil, err
	}
	l.out.init()
	l.ctx, l.cancel = context.WithCancelCause(ctx)
	if err := l.recoverJournal(); err != nil {
		_ = j.close()
		return nil, err
	}
	if id.expired(time.Now()) {
		l.log.LogAttrs(ctx, slog.LevelError, "the agent's certificate has expired: the gateway will refuse it, and the agent must join again with a new token",
			slog.Time("not_after", id.tls.Leaf.NotAfter))
	}
	l.bg.Add(1)
	go l.renewLoop()
	go l.loop()
	return l, nil
}

// Identity is the agent's certified identity.
func (l *Link) Identity() pki.Identity { return l.id.Load().id }

// Key is the agent's private key (for pki.DecryptAsAgent).
func (l *Link) Key() crypto.Signer { return l.id.Load().key }

// CertDER is the agent's certificate (the renewed one after a renewal).
func (l *Link) CertDER() []byte { return slices.Clone(l.id.Load().certDER) }

// DataDir is where the link keeps its files ("" in RAM).
func (l *Link) DataDir() string { return l.cfg.DataDir }

// Sessions counts the Connect streams opened so far.
func (l *Link) Sessions() int { return int(l.sessions.Load()) }

// Connected says whether a stream to the gateway is open and the gateway has answered on it
// (false between streams, while the link backs off or waits to reconnect).
func (l *Link) Connected() bool { return l.connected.Load() }

// SetStatus sends a status report now and again at the start of every stream. A report not yet
// handed to a stream when the next is set is replaced by it (StatusPending tells).
func (l *Link) SetStatus(s Status) { l.out.setStatus(s) }

// StatusPending says whether the last status report set is not yet handed to a stream (none is
// open, or the sender has not reached it): one set now would replace it unsent.
func (l *Link) StatusPending() bool { return l.out.statusPending() }

// Wait blocks until the link stopped and every command it started returned. It returns nil
// when the link's context ended, ErrRefused when the gateway refused the agent, or the
// journal's error.
func (l *Link) Wait() error {
	<-l.done
	return l.err
}

// recoverJournal takes over the commands a previous run recorded and did not finish. Those that
// may have run are reported interrupted, never run again. Those that never started are
// acknowledged again on the first stream and run if the server answers that they are still
// this agent's (it refuses a command it gave to another agent or declared lost meanwhile).
func (l *Link) recoverJournal() error {
	ran, never := l.j.unfinished()
	for _, c := range ran {
		u := Update{CommandID: c.ID, State: StateInterrupted, Error: "interrupted: the agent stopped while the command was in progress; not run again (at most once)"}
		if err := l.j.finish(u); err != nil {
			return err
		}
		l.log.LogAttrs(l.ctx, slog.LevelWarn, "command interrupted by a restart", slog.String("command", c.ID), slog.String("kind", c.Kind))
	}
	l.mu.Lock()
	for _, c := range never {
		l.awaiting[c.ID] = c
	}
	l.mu.Unlock()
	if len(never) > 0 {
		l.log.LogAttrs(l.ctx, slog.LevelInfo, "commands received before a restart and never started: asking the control plane whether they are still ours", slog.Int("commands", len(never)))
	}
	return nil
}

func (l *Link) loop() {
	defer close(l.done)
	attempt := 0
	for {
		established, err := l.session()
		if l.ctx.Err() != nil {
			break
		}
		stale := errors.Is(err, ErrRefused) && l.staleConnection(err)
		stop := errors.Is(err, errJournalCorrupt) || l.j.failed() != nil || errors.Is(err, ErrRefused) && !stale
		switch {
		case stop:
			l.err = err
			l.log.LogAttrs(l.ctx, slog.LevelError, "agent link stopped", slog.Any("error", err))
			l.cancel(err)
		case errors.Is(err, errRenewed) || stale:
			// The connection presented a certificate this agent has since renewed: the next
			// stream must be on a new one (a connection's certificate is its handshake's).
			if err := l.rewire(); err != nil {
				l.log.LogAttrs(l.ctx, slog.LevelError, "making a new connection to the gateway", slog.Any("error", err))
			}
		}
		if stop {
			break
		}
		if errors.Is(err, errRenewed) {
			attempt = 0
			l.log.LogAttrs(l.ctx, slog.LevelInfo, "reconnecting with the renewed certificate")
			continue
		}
		if established {
			attempt = 0
		}
		d := backoff(l.cfg.MinBackoff, l.cfg.MaxBackoff, attempt)
		attempt++
		msg := "gateway stream ended; reconnecting"
		if UntrustedGateway(err) {
			msg = "the gateway's certificate is from a CA this agent does not trust (the agent CA was rotated while this agent was away?): reconnecting; if it persists, join this agent again with a new token"
		}
		l.log.LogAttrs(l.ctx, slog.LevelWarn, msg, slog.Any("error", err), slog.Duration("after", d))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.ctx.Done():
			t.Stop()
		}
		if l.ctx.Err() != nil {
			break
		}
	}
	l.cancel(nil)
	l.cmds.Wait()
	l.bg.Wait()
	if l.crashed.Load() {
		l.err = ErrCrashed
	}
	if l.err == nil {
		l.err = l.j.failed()
	}
	if err := l.j.close(); err != nil && l.err == nil {
		l.err = err
	}
	l.wire.Load().tr.CloseIdleConnections()
	l.conns.closeAll() // (the stream's, and calls of replaced wires still open)
}

// wire is a transport to the gateway and the client over it.
type wire struct {
	tr *http.Transport
	cl agentv1connect.GatewayServiceClient
}

// client is the gateway client of the current wire.
func (l *Link) client() agentv1connect.GatewayServiceClient { return l.wire.Load().cl }

// rewire replaces the wire with a new transport, whose connections present the certificate
// current at their handshake, and closes the old one's idle connections (calls in flight on it
// end as they would have; its connections close once idle).
func (l *Link) rewire() error {
	tr, err := transport(&l.cfg, l.id.Load().caPEM, func() tls.Certificate { return l.id.Load().tls }, l.conns)
	if err != nil {
		return fmt.Errorf("dialing gateway: %w", err)
	}
	cl := agentv1connect.NewGatewayServiceClient(&http.Client{Transport: tr}, l.cfg.GatewayURL, connect.WithReadMaxBytes(l.cfg.MaxMessageBytes))
	if old := l.wire.Swap(&wire{tr: tr, cl: cl}); old != nil {
		old.tr.CloseIdleConnections()
	}
	return nil
}

// backoff is min·2^attempt capped at max, with jitter: a uniform draw from its upper half.
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	d := hi
	if attempt < 32 && lo<<attempt < hi && lo<<attempt > 0 {
		d = lo << attempt
	}
	return d/2 + rand.N(d/2+1)
}

// errServerClosed: the gateway ended the stream cleanly.
const errServerClosed Error = "gateway closed the stream"

// errRenewed: the agent ended its stream to reconnect with its renewed certificate.
const errRenewed Error = "certificate renewed"

// staleConnection says whether err, a refusal, is the gateway's answer to a certificate past
// its end while the agent's current one is valid: the connection predates a renewal (or the
// two clocks differ), so a new connection may be admitted where the agent stopping would not
// help. A refusal of an expired current certificate stops the link: it must join again.
func (l *Link) staleConnection(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Meta().Get(pki.RefusalHeader) != pki.RefusalCertExpired {
		return false
	}
	leaf := l.id.Load().tls.Leaf
	if l.id.Load().expired(time.Now()) {
		return false
	}
	l.log.LogAttrs(l.ctx, slog.LevelWarn, "the gateway refused the certificate of this connection as expired; the agent's own is valid: reconnecting on a new connection (if this repeats, compare the two hosts' clocks)",
		slog.Time("not_after", leaf.NotAfter))
	return true
}

// errSilent: nothing arrived for three heartbeat intervals.
const errSilent Error = "gateway silent for three heartbeat intervals"

// session runs one Connect stream; established reports that the gateway answered on it.
func (l *Link) session() (established bool, _ error) {
	ctx, cancel := context.WithCancelCause(l.ctx)
	defer cancel(nil)
	stream := l.client().Connect(ctx)
	defer func() {
		_ = stream.CloseRequest()
		_ = stream.CloseResponse()
	}()
	l.sessions.Add(1)
	defer l.connected.Store(false)
	mark := *l.mark.Load()
	hello := &agentv1.Hello{AgentVersion: l.cfg.AgentVersion, Capabilities: l.cfg.Capabilities, Drivers: l.cfg.Drivers,
		ResumeAfter: resumeAfter(mark, l.j), StoreWatermark: mark.proto(), CaSha256: pki.BundleFingerprints(l.id.Load().caPEM)}
	if err := stream.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: hello}}); err != nil {
		return false, classify(fmt.Errorf("sending hello: %w", err))
	}
	l.resume()

	var lastRecv atomic.Int64
	var answered atomic.Bool
	lastRecv.Store(time.Now().UnixNano())
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			m, err := stream.Receive()
			if err != nil {
				cancel(classify(err))
				return
			}
			lastRecv.Store(time.Now().UnixNano())
			answered.Store(true)
			l.connected.Store(true)
			if err := l.handle(m); err != nil {
				cancel(err)
				return
			}
		}
	}()
	go func() {
		select {
		case <-l.renewed:
			cancel(errRenewed)
		case <-ctx.Done():
		}
	}()
	err := l.send(ctx, stream, &lastRecv)
	cancel(err)
	_ = stream.CloseRequest()
	<-recvDone
	return answered.Load(), context.Cause(ctx)
}

// classify marks the gateway's refusals of the agent's credentials.
// UntrustedGateway says whether err is the gateway's certificate failing verification against
// the agent's CAs (the agent CA rotated without the agent, or a wrong bcd.ca / --ca-file).
func UntrustedGateway(err error) bool {
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &verify)
}

func classify(err error) error {
	switch c := connect.CodeOf(err); {
	case errors.Is(err, errServerClosed), err == nil:
		return err
	case c == connect.CodeUnauthenticated || c == connect.CodePermissionDenied:
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.Is(err, io.EOF):
		return errServerClosed
	default:
		return err
	}
}

// resume queues what a new stream must carry: the acks the server has not answered (it may
// have recorded them and no longer offer the commands), unconfirmed final updates, the state of
// running commands and the latest status.
func (l *Link) resume() {
	l.out.dropAcks() // the last stream's: queued again below, each once
	l.mu.Lock()
	for id := range l.awaiting {
		l.out.ack(id)
	}
	l.mu.Unlock()
	for _, u := range l.j.unconfirmed() {
		l.out.update(u)
	}
	l.mu.Lock()
	for id, r := range l.running {
		if !r.ended {
			l.out.update(Update{CommandID: id, State: StateRunning, Progress: r.progress})
		}
	}
	l.mu.Unlock()
	l.out.resendStatus()
}

// handle acts on one frame from the gateway.
func (l *Link) handle(m *agentv1.ServerMessage) error {
	var b agentv1.ServerBatch
	switch x := m.GetMsg().(type) {
	case *agentv1.ServerMessage_Command:
		b.Commands = []*agentv1.Command{x.Command}
	case *agentv1.ServerMessage_UpdateAck:
		b.UpdateAcks = []*agentv1.UpdateAck{x.UpdateAck}
	case *agentv1.ServerMessage_Cancel:
		b.Cancels = []*agentv1.Cancel{x.Cancel}
	case *agentv1.ServerMessage_AckResult:
		b.AckResults = []*agentv1.AckResult{x.AckResult}
	case *agentv1.ServerMessage_Batch:
		b.Commands, b.UpdateAcks, b.Cancels, b.AckResults = x.Batch.GetCommands(), x.Batch.GetUpdateAcks(), x.Batch.GetCancels(), x.Batch.GetAckResults()
	case *agentv1.ServerMessage_HeartbeatAck:
		if w := x.HeartbeatAck.GetStoreWatermark(); w != nil {
			l.saw(w)
		}
		l.checkCA(x.HeartbeatAck.GetCaSha256(), x.HeartbeatAck.GetActiveCaSha256())
		return nil
	}
	if len(b.Commands) > 0 {
		if err := l.receive(b.Commands); err != nil {
			return err
		}
	}
	for _, r := range b.AckResults {
		l.acknowledged(r.GetCommandId(), r.GetError())
	}
	for _, a := range b.UpdateAcks {
		if a.GetError() != "" {
			l.log.LogAttrs(l.ctx, slog.LevelWarn, "gateway refused an update", slog.String("command", a.GetCommandId()), slog.String("error", a.GetError()))
		}
		l.j.confirm(a.GetCommandId())
	}
	if len(b.UpdateAcks) > 0 {
		l.mu.Lock()
		l.pokeLocked()
		l.mu.Unlock()
	}
	for _, c := range b.Cancels {
		id := c.GetCommandId()
		l.mu.Lock()
		if r, ok := l.running[id]; ok {
			r.cancel()
		} else if _, ok := l.awaiting[id]; ok {
			l.cancelled[id] = true // its ack's answer has not come: it must not start on it
		}
		l.mu.Unlock()
	}
	return nil
}

// receive journals new commands and acknowledges them; each starts when the server answers its
// ack (acknowledged). Commands already in the journal are acknowledged again with their recorded
// final update, never run again.
func (l *Link) receive(ms []*agentv1.Command) error {
	cmds := make([]Command, 0, len(ms))
	for _, m := range ms {
		if m.GetId() == "" {
			continue
		}
		c := Command{ID: m.GetId(), Kind: m.GetKind(), NodeID: m.GetNodeId(), Generation: m.GetGeneration(), Args: m.GetArgsJson(), Attest: m.GetAttest()}
		if ms := m.GetDeadlineUnixMs(); ms != 0 {
			c.Deadline = time.UnixMilli(ms)
		}
		cmds = append(cmds, c)
	}
	if l.cfg.Received != nil {
		l.cfg.Received(l, cmds)
		if l.crashed.Load() {
			return ErrCrashed
		}
	}
	var fresh []Command
	var known []jentry
	if l.draining.Load() {
		known = l.j.known(cmds) // new commands are left alone: unacknowledged, they go to another agent
	} else {
		var err error
		if fresh, known, err = l.j.receive(cmds, *l.mark.Load()); err != nil {
			return err
		}
	}
	for _, e := range known {
		l.out.ack(e.cmd.ID)
		if e.final != nil {
			l.out.update(*e.final)
		}
	}
	l.mu.Lock()
	for _, c := range fresh {
		l.awaiting[c.ID] = c
	}
	l.mu.Unlock()
	for _, c := range fresh {
		l.out.ack(c.ID)
	}
	return nil
}

// acknowledged acts on the server's answer to an ack: a command recorded as this agent's
// starts; one refused never runs and is forgotten, without a report (the server would refuse
// that too): should the server offer it again, it is this agent's then.
func (l *Link) acknowledged(id, refusal string) {
	l.mu.Lock()
	c, ok := l.awaiting[id]
	if ok && refusal == "" && l.draining.Load() {
		l.mu.Unlock()
		return // a draining link starts nothing: the next start asks about it again
	}
	delete(l.awaiting, id)
	cancelled := l.cancelled[id]
	delete(l.cancelled, id)
	l.mu.Unlock()
	switch {
	case !ok:
		return // answered before (a re-sent ack), or running
	case refusal == "":
		l.start(c, cancelled)
		return
	}
	l.log.LogAttrs(l.ctx, slog.LevelWarn, "the control plane refused a command's acknowledgement; not running it", slog.String("command", id), slog.String("kind", c.Kind), slog.String("error", refusal))
	l.j.forget(id)
}

// pokeLocked wakes Drain. Called with l.mu held.
func (l *Link) pokeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Drain stops taking commands and waits, until ctx ends, for the commands running to finish and
// for the gateway to confirm their results. It starts nothing more: commands the gateway offers
// meanwhile are neither journaled nor acknowledged (the control plane gives them to another
// agent of the site once this one has gone), and those acknowledged but not yet answered stay
// in the journal, never started, for the next start to ask about. The link stays up: end the
// context it was dialed with to stop it. Drain returns ctx's error when ctx ended first.
func (l *Link) Drain(ctx context.Context) error {
	l.draining.Store(true)
	for {
		l.mu.Lock()
		running := len(l.running)
		changed := l.changed
		l.mu.Unlock()
		unconfirmed := len(l.j.unconfirmed())
		if running == 0 && unconfirmed == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("draining the agent link (%d commands running, %d results unconfirmed): %w", running, unconfirmed, ctx.Err())
		case <-l.done:
			return fmt.Errorf("draining the agent link: it stopped with %d commands running, %d results unconfirmed", running, unconfirmed)
		}
	}
}

// Crash ends the link as a killed process ends: the stream is cut, and nothing more is sent or
// journaled. Results of commands still running are dropped; what the journal holds stays (a
// link dialed again with the same DataDir reports the commands that had started as
// interrupted, and asks about the others). Wait returns ErrCrashed. bcd sim uses it to kill
// agents.
func (l *Link) Crash() {
	l.crashed.Store(true)
	l.cancel(ErrCrashed)
}

// start runs a journaled command in its own goroutine; one the server cancelled already is
// reported failed, not started.
func (l *Link) start(c Command, cancelled bool) {
	ctx, cancel := context.WithCancel(l.ctx)
	if !c.Deadline.IsZero() {
		ctx, cancel = context.WithDeadline(l.ctx, c.Deadline)
	}
	if cancelled {
		cancel()
	}
	r := &run{cancel: cancel}
	l.mu.Lock()
	l.running[c.ID] = r
	l.mu.Unlock()
	l.cmds.Go(func() {
		defer cancel()
		// The command leaves running only once its final update is journaled (and queued):
		// Drain returns when nothing runs and every final update is confirmed, and must never
		// see a command in neither, before its result is even recorded.
		defer func() {
			l.mu.Lock()
			delete(l.running, c.ID)
			l.pokeLocked()
			l.mu.Unlock()
		}()
		u, ended := l.execute(ctx, c, r)
		l.mu.Lock()
		r.ended = true
		l.mu.Unlock()
		if l.crashed.Load() || !ended {
			return // a dead process records and reports nothing; a stopping one runs it at its next start
		}
		if err := l.j.finish(u); err != nil {
			l.log.LogAttrs(l.ctx, slog.LevelError, "recording a command's result", slog.String("command", c.ID), slog.Any("error", err))
			l.cancel(err)
			return
		}
		l.out.update(u)
	})
}

// execute runs c once it has a slot. ended is false when the link stopped, or began draining,
// before c started: c stays in the journal, never started, for the next start to ask about.
func (l *Link) execute(ctx context.Context, c Command, r *run) (_ Update, ended bool) {
	if !slices.Contains(l.cfg.Sessions, c.Kind) {
		select {
		case l.sem <- struct{}{}:
			defer func() { <-l.sem }()
		case <-ctx.Done():
		}
	}
	// Checked again after taking the slot: when a slot frees as the link shuts down, select
	// may pick the slot, and a command must not start once the link is stopping.
	if l.ctx.Err() != nil || l.draining.Load() {
		return Update{}, false
	}
	if ctx.Err() != nil { // cancelled by the server, or past its deadline
		return Update{CommandID: c.ID, State: StateFailed, Error: "not started: " + context.Cause(ctx).Error()}, true
	}
	if err := l.j.start(c.ID); err != nil {
		return Update{CommandID: c.ID, State: StateFailed, Error: "not started: recording its start: " + err.Error()}, true
	}
	l.out.update(Update{CommandID: c.ID, State: StateRunning})
	report := func(p Progress) {
		l.mu.Lock()
		r.progress = p
		l.mu.Unlock()
		l.out.update(Update{CommandID: c.ID, State: StateRunning, Progress: p})
	}
	result, err := l.h.Run(ctx, c, report)
	u := Update{CommandID: c.ID, State: StateSucceeded, Result: result}
	switch {
	case err != nil && l.ctx.Err() != nil:
		// Cut short by the agent's stop: it may have taken effect in part.
		u.State, u.Error = StateInterrupted, "interrupted: the agent stopped while the command was in progress ("+err.Error()+"); not run again (at most once)"
	case err != nil:
		u.State, u.Error = StateFailed, err.Error()
	}
	if c.Attest {
		id := l.id.Load()
		sig, serr := pki.SignStatement(id.key, pki.Statement{
			CommandID: c.ID, NodeID: c.NodeID, Kind: c.Kind, Generation: c.Generation,
			ResultSHA256: pki.ResultDigest(result),
		})
		if serr != nil {
			return Update{CommandID: c.ID, State: StateFailed, Result: result, Error: fmt.Sprintf("signing the result: %v", serr)}, true
		}
		u.NodeSig, u.SignerCertDER = sig, slices.Clone(id.certDER)
	}
	return u, true
}

// currentSigners gives the signed results in m the agent's current certificate when the one
// they were signed under was renewed since: a renewal keeps the key, so the signature still
// verifies, and a certificate of a CA retired since (a rotation of the agent CA finished while
// the result waited in the journal) would have it refused.
func (l *Link) currentSigners(m *agentv1.AgentMessage) {
	ups := m.GetBatch().GetUpdates()
	if u := m.GetUpdate(); u != nil {
		ups = append(ups, u)
	}
	var id *identity
	for _, u := range ups {
		if len(u.GetSignerCertDer()) == 0 {
			continue
		}
		if id == nil {
			id = l.id.Load()
		}
		if bytes.Equal(u.SignerCertDer, id.certDER) {
			continue
		}
		if old, err := x509.ParseCertificate(u.SignerCertDer); err == nil && id.tls.Leaf != nil &&
			bytes.Equal(old.RawSubjectPublicKeyInfo, id.tls.Leaf.RawSubjectPublicKeyInfo) {
			u.SignerCertDer = slices.Clone(id.certDER)
		}
	}
}

// send is the stream's only writer: hello is sent; then acks, updates, status and heartbeats.
func (l *Link) send(ctx context.Context, stream *connect.BidiStreamForClient[agentv1.AgentMessage, agentv1.ServerMessage], lastRecv *atomic.Int64) error {
	hb := time.NewTicker(l.cfg.HeartbeatInterval)
	defer hb.Stop()
	for {
		for {
			m, status := l.out.take()
			if m == nil && status == nil {
				break
			}
			if status != nil {
				if err := stream.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: status}}); err != nil {
					return classify(fmt.Errorf("sending status: %w", err))
				}
			}
			if m != nil {
				l.currentSigners(m)
				if err := stream.Send(m); err != nil {
					return classify(fmt.Errorf("sending to gateway: %w", err))
				}
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-l.out.signal:
		case <-hb.C:
			if time.Since(time.Unix(0, lastRecv.Load())) > 3*l.cfg.HeartbeatInterval {
				return errSilent
			}
			if err := stream.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{SentUnixMs: time.Now().UnixMilli()}}}); err != nil {
				return classify(fmt.Errorf("sending heartbeat: %w", err))
			}
		}
	}
}

// rejoinAdvice is what gives an agent of kind k whose certificate expired a token to join
// again with. Pure.
func rejoinAdvice(k Kind) string {
	if k == KindSite {
		return "mint a new token: bcd site join-token SITE"
	}
	// A node's token is its boot entry's (a ramdisk) or its instance's (an installed OS).
	return "the node needs a new token: boot it again through the site (a ramdisk), or prepare its instance again (an installed OS)"
}
