package gateway

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// helloTimeout bounds the wait for a stream's first message.
const helloTimeout = 30 * time.Second

// nodeLaneDepth is the queue of a node agent's one lane: acks, progress and results of its few
// commands, and its status reports. Its stream's queue of control messages to send is as deep.
const nodeLaneDepth = 16

// siteQueueDepth is the queue of each of a site agent's lanes, and of its control messages.
const siteQueueDepth = 256

// maxAcksPerWrite bounds the acknowledgements recorded in one AckAll.
const maxAcksPerWrite = 256

// maxFrameArgs bounds the argument bytes packed into one command frame.
const maxFrameArgs = 4 << 20

// Connect runs one agent stream: see the package documentation.
func (s *Server) Connect(ctx context.Context, stream *connect.BidiStream[agentv1.AgentMessage, agentv1.ServerMessage]) error {
	a, err := s.admit(ctx)
	if err != nil {
		s.counts.streamsRefused.Add(1)
		return err
	}
	s.counts.streamsOpened.add(a.Kind, 1)
	s.counts.streams.add(a.Kind, 1)
	defer s.counts.streams.add(a.Kind, -1)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A site agent runs thousands of commands at once; a node's ramdisk or OS one or two. Its
	// stream gets one lane, and short queues (eight lanes with 256-deep queues were most of a
	// connected node's memory on the server).
	lanes, depth := s.cfg.Lanes, siteQueueDepth
	if a.Kind != pki.KindSiteAgent {
		lanes, depth = 1, nodeLaneDepth
	}
	ss := &session{
		s: s, a: a, stream: stream, ctx: ctx, cancel: cancel,
		log:   s.cfg.Logger.With(slog.String("agent", a.String())),
		ctl:   make(chan *agentv1.ServerMessage, depth),
		hello: make(chan *agentv1.Hello, 1),
		freed: make(chan struct{}, 1),
		lanes: make([]lane, lanes),
		seed:  maphash.MakeSeed(),
	}
	if st, _ := ctx.Value(requestStateKey{}).(*requestState); st != nil {
		ss.body = st.body
	}
	ss.lastSeen.Store(time.Now().UnixNano())
	for i := range ss.lanes {
		ss.lanes[i].ch = make(chan laneItem, depth)
	}
	// The receiver may outlive this handler by the moment it takes the server to close the
	// request body; once ctx ends it touches nothing but its own stack.
	go ss.receive()

	var hello *agentv1.Hello
	select {
	case hello = <-ss.hello:
	case <-ctx.Done():
		return ss.result()
	case <-time.After(helloTimeout):
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("no hello"))
	}
	if err := s.cfg.Queue.Connected(ctx, a, helloOf(hello)); err != nil {
		if errors.Is(err, ErrStoreBehind) {
			ss.log.LogAttrs(ctx, slog.LevelError, "agent refused: it saw a newer store than the control plane has", slog.Any("error", err))
			return connect.NewError(connect.CodeFailedPrecondition, err)
		}
		ss.log.LogAttrs(ctx, slog.LevelError, "recording agent connection", slog.Any("error", err))
		return connect.NewError(connect.CodeUnavailable, errors.New("cannot record the connection now"))
	}
	ss.log.LogAttrs(ctx, slog.LevelInfo, "agent connected", slog.String("version", hello.GetAgentVersion()))
	if ack := ss.heartbeatAck(0); ack.StoreWatermark != nil {
		// A site agent learns the store's watermark before its first command: it journals each
		// command with the store and fence it came from (what its next Hello names).
		ss.control(&agentv1.ServerMessage{Msg: &agentv1.ServerMessage_HeartbeatAck{HeartbeatAck: ack}})
	}

	ss.setLanes(lanesOpen)
	sendErr := ss.send()
	cancel(sendErr)
	ss.setLanes(lanesClosed)
	ss.laneRuns.Wait()

	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer dcancel()
	if err := s.cfg.Queue.Disconnected(dctx, a); err != nil {
		ss.log.LogAttrs(dctx, slog.LevelError, "recording agent disconnection", slog.Any("error", err))
	}
	err = ss.result()
	ss.log.LogAttrs(dctx, slog.LevelInfo, "agent disconnected", slog.Any("reason", err))
	return err
}

// recheck admits the stream's certificate again (the sender does every RecheckInterval): one
// an operator revoked since (a site agent, a node's identity generation), or one past its end,
// is the error that ends the stream. A check that cannot be made (the store out) leaves the
// stream as it is.
func (ss *session) recheck() error {
	_, err := ss.s.admit(ss.ctx)
	if c := connect.CodeOf(err); c == connect.CodePermissionDenied || c == connect.CodeUnauthenticated {
		// A node's identity generation moves on as its workflows go (metal.revokeIdentity at
		// every release, rescue and retire): the stream of the generation before ends as
		// expected, while its OS or ramdisk is still up. Anything else refused (a revoked site
		// agent, a certificate past its end) is worth an operator's look.
		level := slog.LevelWarn
		if errors.Is(err, pki.ErrIdentityRevoked) {
			level = slog.LevelInfo
		}
		ss.log.LogAttrs(ss.ctx, level, "the agent's certificate is refused now: ending its stream", slog.Any("error", err))
		return err
	}
	return nil
}

type session struct {
	s      *Server
	a      AgentRef
	stream *connect.BidiStream[agentv1.AgentMessage, agentv1.ServerMessage]
	ctx    context.Context
	cancel context.CancelCauseFunc
	log    *slog.Logger

	body     *streamBody                 // the request body, to wait on between messages (nil: Receive only)
	ctl      chan *agentv1.ServerMessage // update acks, heartbeat acks → sender
	hello    chan *agentv1.Hello
	freed    chan struct{} // the window has room again
	lanes    []lane
	seed     maphash.Seed
	lastSeen atomic.Int64 // unix ns of the last received frame

	mu   sync.Mutex
	sent map[string]string // in flight on this stream: command id → kind (made at the first)

	laneMu    sync.Mutex
	laneState int            // lanesWaiting, lanesOpen, lanesClosed (laneMu)
	laneRuns  sync.WaitGroup // lane goroutines running

	cancelled map[string]bool // cancels sent on this stream (sender only; made at the first)
}

// lane is one share of a stream's acks, updates and status reports, which a goroutine of its
// own forwards to the queue in order while it has any: an idle stream holds no such goroutine.
type lane struct {
	ch      chan laneItem
	running bool // a goroutine drains ch (session.laneMu)
}

// A stream's lanes wait for the queue to record the connection, then run until the sender ends.
const (
	lanesWaiting = iota
	lanesOpen
	lanesClosed
)

type laneItem struct {
	acks   []string // of one frame, all of this lane
	update *Update
	status *Status
}

// errAgentClosed is the cause when the agent ended the stream.
const errAgentClosed Error = "agent closed the stream"

// result is what the handler returns for the session's cause.
func (ss *session) result() error {
	cause := context.Cause(ss.ctx)
	var ce *connect.Error
	switch {
	case cause == nil, errors.Is(cause, errAgentClosed):
		return nil
	case errors.As(cause, &ce):
		return ce
	case errors.Is(cause, context.Canceled):
		return connect.NewError(connect.CodeUnavailable, errors.New("stream cancelled: the agent's connection went away, or the gateway is shutting down"))
	default:
		return connect.NewError(connect.CodeUnavailable, cause)
	}
}

// receive reads frames and routes them: acks, updates and status to lanes, heartbeats answered.
func (ss *session) receive() {
	first := true
	for {
		if ss.body != nil {
			ss.body.wait()
		}
		m, err := ss.stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errAgentClosed
			}
			ss.cancel(err)
			return
		}
		ss.lastSeen.Store(time.Now().UnixNano())
		if first {
			first = false
			h := m.GetHello()
			if h == nil {
				ss.cancel(connect.NewError(connect.CodeInvalidArgument, errors.New("the first message must be hello")))
				return
			}
			ss.hello <- h
			continue
		}
		if !ss.route(m) {
			return
		}
	}
}

// route handles one frame; false when the session ended.
func (ss *session) route(m *agentv1.AgentMessage) bool {
	switch x := m.GetMsg().(type) {
	case *agentv1.AgentMessage_Ack:
		return ss.toLane(x.Ack.GetCommandId(), laneItem{acks: []string{x.Ack.GetCommandId()}})
	case *agentv1.AgentMessage_Update:
		return ss.routeUpdate(x.Update)
	case *agentv1.AgentMessage_Batch:
		// A frame's acks go to each lane together (one write per lane, of at most maxAcksPerWrite
		// so that no frame holds the writer long), before the frame's updates, which the lanes
		// take in order after them.
		byLane := make([][]string, len(ss.lanes))
		for _, a := range x.Batch.GetAcks() {
			i := ss.laneOf(a.GetCommandId())
			byLane[i] = append(byLane[i], a.GetCommandId())
		}
		for i, ids := range byLane {
			for len(ids) > 0 {
				n := min(len(ids), maxAcksPerWrite)
				if !ss.toLaneAt(i, laneItem{acks: ids[:n]}) {
					return false
				}
				ids = ids[n:]
			}
		}
		for _, u := range x.Batch.GetUpdates() {
			if !ss.routeUpdate(u) {
				return false
			}
		}
		return true
	case *agentv1.AgentMessage_Status:
		st := statusOf(x.Status)
		return ss.toLane("", laneItem{status: &st})
	case *agentv1.AgentMessage_Heartbeat:
		return ss.control(&agentv1.ServerMessage{Msg: &agentv1.ServerMessage_HeartbeatAck{HeartbeatAck: ss.heartbeatAck(x.Heartbeat.GetSentUnixMs())}})
	case *agentv1.AgentMessage_Hello:
		ss.cancel(connect.NewError(connect.CodeInvalidArgument, errors.New("hello sent twice")))
		return false
	default:
		return true // a message type this gateway does not know: ignored
	}
}

func (ss *session) routeUpdate(m *agentv1.CommandUpdate) bool {
	u := updateOf(m)
	if u.CommandID == "" || u.State == "" {
		ss.cancel(connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("update for command %q with state %v", u.CommandID, m.GetState())))
		return false
	}
	if reason := ss.refuseUpdate(u); reason != "" {
		ss.log.LogAttrs(ss.ctx, slog.LevelWarn, "update refused", slog.String("command", u.CommandID), slog.String("reason", reason))
		return !u.Final() || ss.control(updateAck(u, reason))
	}
	return ss.toLane(u.CommandID, laneItem{update: &u})
}

// refuseUpdate is the gateway's own rule on updates: a node-tenant identity never attests, so
// it may neither send a signature nor report on an attested command.
func (ss *session) refuseUpdate(u Update) string {
	if ss.a.Kind != pki.KindNodeTenant {
		return ""
	}
	if len(u.NodeSig) > 0 || len(u.SignerCertDER) > 0 {
		return "a node-tenant identity cannot attest results"
	}
	ss.mu.Lock()
	kind, ok := ss.sent[u.CommandID]
	ss.mu.Unlock()
	if ok && ss.s.cfg.Attested(kind) {
		return "a node-tenant identity cannot report on an attested command"
	}
	return ""
}

func updateAck(u Update, errText string) *agentv1.ServerMessage {
	st := agentv1.CommandState_COMMAND_STATE_FAILED
	switch u.State {
	case StateSucceeded:
		st = agentv1.CommandState_COMMAND_STATE_SUCCEEDED
	case StateLost:
		st = agentv1.CommandState_COMMAND_STATE_INTERRUPTED
	}
	return &agentv1.ServerMessage{Msg: &agentv1.ServerMessage_UpdateAck{
		UpdateAck: &agentv1.UpdateAck{CommandId: u.CommandID, State: st, Error: errText}}}
}

// laneOf is the lane of everything about key (a command id): its ack and updates, in order.
func (ss *session) laneOf(key string) int {
	if len(ss.lanes) == 1 {
		return 0
	}
	return int(maphash.String(ss.seed, key) % uint64(len(ss.lanes)))
}

func (ss *session) toLane(key string, it laneItem) bool { return ss.toLaneAt(ss.laneOf(key), it) }

func (ss *session) toLaneAt(i int, it laneItem) bool {
	select {
	case ss.lanes[i].ch <- it:
		ss.runLane(i)
		return true
	case <-ss.ctx.Done():
		return false
	}
}

// setLanes moves the lanes to state: open, each starts on what it holds; closed, none starts
// again (the sender ended: what they hold is dropped, as the stream's cause says).
func (ss *session) setLanes(state int) {
	ss.laneMu.Lock()
	ss.laneState = state
	ss.laneMu.Unlock()
	if state == lanesOpen {
		for i := range ss.lanes {
			ss.runLane(i)
		}
	}
}

// runLane starts lane i's goroutine if the lanes are open, the lane holds something and none
// runs.
func (ss *session) runLane(i int) {
	l := &ss.lanes[i]
	ss.laneMu.Lock()
	defer ss.laneMu.Unlock()
	if ss.laneState != lanesOpen || l.running || len(l.ch) == 0 {
		return
	}
	l.running = true
	ss.laneRuns.Go(func() { ss.lane(l) })
}

// idle ends lane l's goroutine if l holds nothing: true when it ended.
func (ss *session) idle(l *lane) bool {
	ss.laneMu.Lock()
	defer ss.laneMu.Unlock()
	if len(l.ch) > 0 {
		return false
	}
	l.running = false
	return true
}

// heartbeatAck answers a heartbeat sent at sent (unix ms), with the store's watermark for site
// agents only: they are the store's witnesses (a node's agents may be a lessee's).
func (ss *session) heartbeatAck(sent int64) *agentv1.HeartbeatAck {
	// The CAs trusted and the one signing now: an agent that differs renews (agent CA rotation).
	ack := &agentv1.HeartbeatAck{SentUnixMs: sent, CaSha256: ss.s.cfg.CA.Trusted(), ActiveCaSha256: ss.s.cfg.CA.Fingerprint()}
	if s := ss.s.cfg.Watermark; s != nil && ss.a.Kind == pki.KindSiteAgent {
		if w, ok := s(); ok {
			ack.StoreWatermark = &agentv1.StoreWatermark{StoreId: w.StoreID, Fences: w.Fences, Beats: w.Beats}
		}
	}
	return ack
}

func (ss *session) control(m *agentv1.ServerMessage) bool {
	select {
	case ss.ctl <- m:
		return true
	case <-ss.ctx.Done():
		return false
	}
}

// lane forwards what lane l holds to the queue, in order, until it holds nothing or the session
// ends. Only one goroutine at a time runs it for a lane (lane.running).
func (ss *session) lane(l *lane) {
	for {
		select {
		case it := <-l.ch:
			if !ss.forward(it) {
				return
			}
		case <-ss.ctx.Done():
			return
		default:
			if ss.idle(l) {
				return
			}
		}
	}
}

// forward records one lane item and queues the answer the agent waits for; false when the
// session ended.
func (ss *session) forward(it laneItem) bool {
	q := ss.s.cfg.Queue
	switch {
	case len(it.acks) > 0:
		refused, err := q.AckAll(ss.ctx, ss.a, it.acks)
		if err != nil {
			ss.cancel(fmt.Errorf("recording acks of %d commands (%s…): %w", len(it.acks), it.acks[0], err))
			return false
		}
		// The agent runs a command only on this answer: an ack it never hears about may
		// not have been recorded, and such a command can go to another agent.
		results := make([]*agentv1.AckResult, 0, len(it.acks))
		for _, id := range it.acks {
			r := &agentv1.AckResult{CommandId: id}
			if err := refused[id]; err != nil {
				ss.log.LogAttrs(ss.ctx, slog.LevelWarn, "ack rejected", slog.String("command", id), slog.Any("error", err))
				r.Error = err.Error()
			}
			results = append(results, r)
			ss.settle(id)
		}
		return ss.control(&agentv1.ServerMessage{Msg: &agentv1.ServerMessage_Batch{Batch: &agentv1.ServerBatch{AckResults: results}}})
	case it.update != nil:
		u := *it.update
		ss.s.counts.updates.Add(1)
		err := q.Update(ss.ctx, ss.a, u)
		if err != nil && !errors.Is(err, ErrRejected) {
			ss.cancel(fmt.Errorf("recording %s update of command %s: %w", u.State, u.CommandID, err))
			return false
		}
		errText := ""
		if err != nil {
			errText = err.Error()
			ss.log.LogAttrs(ss.ctx, slog.LevelWarn, "update rejected", slog.String("command", u.CommandID), slog.Any("error", err))
		}
		if u.Final() {
			ss.settle(u.CommandID)
			return ss.control(updateAck(u, errText))
		}
	case it.status != nil:
		if err := q.Status(ss.ctx, ss.a, *it.status); err != nil {
			ss.log.LogAttrs(ss.ctx, slog.LevelError, "recording agent status", slog.Any("error", err))
		}
	}
	return true
}

// settle takes a command out of this stream's window.
func (ss *session) settle(id string) {
	ss.mu.Lock()
	_, ok := ss.sent[id]
	delete(ss.sent, id)
	ss.mu.Unlock()
	if ok {
		select {
		case ss.freed <- struct{}{}:
		default:
		}
	}
}

func (ss *session) room() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.s.cfg.Window - len(ss.sent)
}

// send is the stream's only writer: commands the queue offers, and control messages.
func (ss *session) send() error {
	cfg := ss.s.cfg
	notify, unsubscribe := cfg.Queue.Notify(ss.a)
	defer unsubscribe()
	poll := time.NewTicker(cfg.PollInterval)
	defer poll.Stop()
	idle := time.NewTicker(cfg.IdleTimeout / 4)
	defer idle.Stop()
	recheck := time.NewTicker(cfg.RecheckInterval)
	defer recheck.Stop()

	// What was queued before the first claim goes first: a site agent's watermark, under which
	// it journals the commands that follow.
	for queued := true; queued; {
		select {
		case m := <-ss.ctl:
			if err := ss.sendControl(m); err != nil {
				return err
			}
		default:
			queued = false
		}
	}
	node := ss.a.Kind == pki.KindNode || ss.a.Kind == pki.KindNodeTenant
	every := cfg.PollInterval
	claim, polled, starved := true, false, false
	for {
		if claim {
			sent, st, err := ss.claimAndSend()
			if err != nil {
				return err
			}
			starved = st
			// The poll is a fallback for a signal missed (a command queued by another server
			// whose notice was dropped): it counts from the last claim, so a busy stream never
			// claims for it, and an idle node's stream stretches it (nextPoll).
			every = nextPoll(every, cfg.PollInterval, cfg.IdlePollInterval, node, polled, sent > 0)
			poll.Reset(every)
			if err := ss.sendCancels(); err != nil {
				return err
			}
			claim, polled = false, false
		}
		select {
		case <-ss.ctx.Done():
			return context.Cause(ss.ctx)
		case <-notify:
			claim = true
		case <-poll.C:
			claim, polled = true, true
		case <-ss.freed:
			claim = starved
		case m := <-ss.ctl:
			if err := ss.sendControl(m); err != nil {
				return err
			}
		case <-idle.C:
			if since := time.Since(time.Unix(0, ss.lastSeen.Load())); since > cfg.IdleTimeout {
				return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("nothing received from the agent for %s", since.Round(time.Second)))
			}
		case <-recheck.C:
			if err := ss.recheck(); err != nil {
				return err
			}
		}
	}
}

// nextPoll is how long a stream waits for its next poll after a claim, from the last wait
// (every): PollInterval (base) after a signal or a claim that found work (found), and for a
// site agent's stream; a node's stream whose poll found nothing waits twice as long as before,
// up to idleMax. Pure.
func nextPoll(every, base, idleMax time.Duration, node, polled, found bool) time.Duration {
	if !node || !polled || found {
		return base
	}
	return max(base, min(2*every, idleMax))
}

// claimAndSend claims and sends commands until the queue has none or the window is full;
// sent counts the commands claimed, starved reports a full window.
func (ss *session) claimAndSend() (sent int, starved bool, err error) {
	cfg := ss.s.cfg
	for {
		room := min(ss.room(), cfg.BatchSize)
		if room <= 0 {
			return sent, true, nil
		}
		cmds, err := cfg.Queue.Claim(ss.ctx, ss.a, room)
		if err != nil {
			return sent, false, fmt.Errorf("claiming commands: %w", err)
		}
		if err := ss.sendCommands(cmds); err != nil {
			return sent, false, err
		}
		sent += len(cmds)
		if len(cmds) < room {
			return sent, false, nil
		}
	}
}

func (ss *session) sendCommands(cmds []Command) error {
	if err := ss.checkGenerations(cmds); err != nil {
		return err
	}
	batch := make([]*agentv1.Command, 0, len(cmds))
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := ss.write(&agentv1.ServerBatch{Commands: batch})
		if err == nil {
			ss.s.counts.commandsSent.Add(int64(len(batch)))
		}
		batch, size = batch[:0:0], 0
		return err
	}
	for _, c := range cmds {
		if reason := ss.refuseCommand(c); reason != "" {
			if err := ss.failUndelivered(c, reason); err != nil {
				return err
			}
			continue
		}
		ss.mu.Lock()
		_, dup := ss.sent[c.ID]
		if ss.sent == nil {
			ss.sent = make(map[string]string)
		}
		ss.sent[c.ID] = c.Kind
		ss.mu.Unlock()
		if dup {
			continue // already in flight on this stream
		}
		if size+len(c.Args) > maxFrameArgs {
			if err := flush(); err != nil {
				return err
			}
		}
		batch = append(batch, commandMsg(c, ss.s.cfg.Attested(c.Kind)))
		size += len(c.Args)
	}
	return flush()
}

// checkGenerations admits a node's stream again before it is given a command made for another
// identity generation than its certificate's: the node's generation was bumped since the stream
// opened (metal.revokeIdentity), and the revoked identity must not get the new one's work while
// it waits for the next re-check. A refused stream ends with the commands unsent (due again to
// the node's next stream).
func (ss *session) checkGenerations(cmds []Command) error {
	if ss.a.Kind != pki.KindNode && ss.a.Kind != pki.KindNodeTenant {
		return nil
	}
	for _, c := range cmds {
		if c.NodeID == ss.a.NodeID && c.Generation != 0 && c.Generation != ss.a.Generation {
			return ss.recheck()
		}
	}
	return nil
}

// refuseCommand is the gateway's own rule on what an identity may receive: never another
// node's work, never an attested command for a node tenant.
func (ss *session) refuseCommand(c Command) string {
	switch ss.a.Kind {
	case pki.KindNode, pki.KindNodeTenant:
		if c.NodeID != ss.a.NodeID {
			return fmt.Sprintf("command for node %s offered to %s", c.NodeID, ss.a)
		}
		if ss.a.Kind == pki.KindNodeTenant && ss.s.cfg.Attested(c.Kind) {
			return fmt.Sprintf("%s is attested: a node-tenant identity cannot run it", c.Kind)
		}
	}
	return ""
}

// failUndelivered records the failure of a command the gateway refused to deliver. It is the
// gateway's report, unsigned: it can only ever make an attested command fail.
func (ss *session) failUndelivered(c Command, reason string) error {
	ss.log.LogAttrs(ss.ctx, slog.LevelError, "command not delivered", slog.String("command", c.ID), slog.String("reason", reason))
	err := ss.s.cfg.Queue.Update(ss.ctx, ss.a, Update{CommandID: c.ID, State: StateFailed, Error: "gateway: " + reason})
	if err != nil && !errors.Is(err, ErrRejected) {
		return fmt.Errorf("failing undelivered command %s: %w", c.ID, err)
	}
	return nil
}

func (ss *session) sendCancels() error {
	cc, ok := ss.s.cfg.Queue.(Canceller)
	if !ok {
		return nil
	}
	ids, err := cc.Cancels(ss.ctx, ss.a)
	if err != nil {
		return fmt.Errorf("listing cancelled commands: %w", err)
	}
	var out []*agentv1.Cancel
	for _, id := range ids {
		if !ss.cancelled[id] {
			if ss.cancelled == nil {
				ss.cancelled = make(map[string]bool)
			}
			ss.cancelled[id] = true
			out = append(out, &agentv1.Cancel{CommandId: id})
		}
	}
	if len(out) == 0 {
		return nil
	}
	return ss.write(&agentv1.ServerBatch{Cancels: out})
}

// sendControl sends m and whatever other control messages are waiting; update acks and ack
// results go in one frame.
func (ss *session) sendControl(m *agentv1.ServerMessage) error {
	var b agentv1.ServerBatch
	take := func(m *agentv1.ServerMessage) error {
		if ua := m.GetUpdateAck(); ua != nil {
			b.UpdateAcks = append(b.UpdateAcks, ua)
			return nil
		}
		if rs := m.GetBatch().GetAckResults(); len(rs) > 0 {
			b.AckResults = append(b.AckResults, rs...)
			return nil
		}
		if err := ss.stream.Send(m); err != nil {
			return fmt.Errorf("sending to agent: %w", err)
		}
		return nil
	}
	if err := take(m); err != nil {
		return err
	}
	for more := true; more && len(b.UpdateAcks)+len(b.AckResults) < ss.s.cfg.BatchSize; {
		select {
		case m := <-ss.ctl:
			if err := take(m); err != nil {
				return err
			}
		default:
			more = false
		}
	}
	if len(b.UpdateAcks)+len(b.AckResults) == 0 {
		return nil
	}
	return ss.write(&b)
}

// write sends a batch, as its single item when it has only one.
func (ss *session) write(b *agentv1.ServerBatch) error {
	var m *agentv1.ServerMessage
	switch {
	case len(b.Commands) == 1 && len(b.UpdateAcks)+len(b.Cancels)+len(b.AckResults) == 0:
		m = &agentv1.ServerMessage{Msg: &agentv1.ServerMessage_Command{Command: b.Commands[0]}}
	case len(b.UpdateAcks) == 1 && len(b.Commands)+len(b.Cancels)+len(b.AckResults) == 0:
		m = &agentv1.ServerMessage{Msg: &agentv1.ServerMessage_UpdateAck{UpdateAck: b.UpdateAcks[0]}}
	case len(b.AckResults) == 1 && len(b.Commands)+len(b.Cancels)+len(b.UpdateAcks) == 0:
		m = &agentv1.ServerMessage{Msg: &agentv1.ServerMessage_AckResult{AckResult: b.AckResults[0]}}
	default:
		m = &agentv1.ServerMessage{Msg: &agentv1.ServerMessage_Batch{Batch: b}}
	}
	if err := ss.stream.Send(m); err != nil {
		return fmt.Errorf("sending to agent: %w", err)
	}
	return nil
}
