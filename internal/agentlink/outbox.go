package agentlink

import (
	"sync"

	"bcd/internal/gateway"
	agentv1 "bcd/internal/gen/agentv1"
)

// Frame bounds for what the agent sends.
const (
	maxFrameItems  = 512
	maxFrameResult = 4 << 20
	// maxStatusInventory bounds the discovered machines' inventories in one status report
	// (the gateway refuses a frame over 16 MiB, and the status goes first on every stream);
	// the site agent keeps its reports far below it. Beyond, machines are listed without.
	maxStatusInventory = 8 << 20
)

// outbox holds what waits to be sent; it outlives streams. Acks are dropped when a stream
// breaks (the gateway offers unacknowledged commands again), final updates are not (the
// journal re-queues the unconfirmed ones on the next stream).
type outbox struct {
	signal chan struct{}

	mu         sync.Mutex
	acks       []string
	updates    map[string]Update
	order      []string
	status     *agentv1.StatusReport
	lastStatus *agentv1.StatusReport
}

func (o *outbox) init() {
	o.signal = make(chan struct{}, 1)
	o.updates = map[string]Update{}
}

func (o *outbox) lock()   { o.mu.Lock() }
func (o *outbox) unlock() { o.mu.Unlock() }

func (o *outbox) wake() {
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// dropAcks forgets the acks a stream that ended did not send: the next one sends again those it
// must (resume), and the gateway offers the unacknowledged commands again.
func (o *outbox) dropAcks() {
	o.lock()
	o.acks = nil
	o.unlock()
}

func (o *outbox) ack(id string) {
	o.lock()
	o.acks = append(o.acks, id)
	o.unlock()
	o.wake()
}

// update queues u; a later update replaces an earlier unsent one, except that nothing
// replaces a final update.
func (o *outbox) update(u Update) {
	o.lock()
	prev, ok := o.updates[u.CommandID]
	switch {
	case !ok:
		o.order = append(o.order, u.CommandID)
		o.updates[u.CommandID] = u
	case prev.final():
	default:
		o.updates[u.CommandID] = u
	}
	o.unlock()
	o.wake()
}

func (o *outbox) setStatus(s Status) {
	m := statusMsg(s)
	o.lock()
	o.status, o.lastStatus = m, m
	o.unlock()
	o.wake()
}

// statusPending says whether a status report waits to be handed to a stream.
func (o *outbox) statusPending() bool {
	o.lock()
	defer o.unlock()
	return o.status != nil
}

func (o *outbox) resendStatus() {
	o.lock()
	o.status = o.lastStatus
	o.unlock()
}

// take returns the next frame to send (acks first, then updates in the order queued) and
// the pending status report, or nils when nothing waits.
func (o *outbox) take() (*agentv1.AgentMessage, *agentv1.StatusReport) {
	o.lock()
	defer o.unlock()
	status := o.status
	o.status = nil
	var b agentv1.AgentBatch
	n := min(len(o.acks), maxFrameItems)
	for _, id := range o.acks[:n] {
		b.Acks = append(b.Acks, &agentv1.CommandAck{CommandId: id})
	}
	o.acks = o.acks[n:]
	if len(o.acks) == 0 {
		o.acks = nil
	}
	size, i := 0, 0
	for ; i < len(o.order) && n < maxFrameItems && (size < maxFrameResult || i == 0); i++ {
		u := o.updates[o.order[i]]
		delete(o.updates, o.order[i])
		b.Updates = append(b.Updates, updateMsg(u))
		size += len(u.Result)
		n++
	}
	o.order = o.order[i:]
	if len(o.order) == 0 {
		o.order = nil
	}
	switch {
	case n == 0:
		return nil, status
	case n == 1 && len(b.Acks) == 1:
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Ack{Ack: b.Acks[0]}}, status
	case n == 1:
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Update{Update: b.Updates[0]}}, status
	default:
		return &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Batch{Batch: &b}}, status
	}
}

func stateMsg(s string) agentv1.CommandState {
	switch s {
	case StateRunning:
		return agentv1.CommandState_COMMAND_STATE_RUNNING
	case StateSucceeded:
		return agentv1.CommandState_COMMAND_STATE_SUCCEEDED
	case StateFailed:
		return agentv1.CommandState_COMMAND_STATE_FAILED
	case StateInterrupted:
		return agentv1.CommandState_COMMAND_STATE_INTERRUPTED
	default:
		return agentv1.CommandState_COMMAND_STATE_UNSPECIFIED
	}
}

func updateMsg(u Update) *agentv1.CommandUpdate {
	m := &agentv1.CommandUpdate{
		CommandId: u.CommandID, State: stateMsg(u.State), ResultJson: u.Result, Error: u.Error,
		NodeSig: u.NodeSig, SignerCertDer: u.SignerCertDER,
	}
	if u.Progress != (Progress{}) {
		m.Progress = &agentv1.Progress{Done: u.Progress.Done, Total: u.Progress.Total, Message: u.Progress.Message}
	}
	return m
}

func statusMsg(s Status) *agentv1.StatusReport {
	m := &agentv1.StatusReport{HoldsBootLease: s.HoldsBootLease, Drivers: s.Drivers, Facts: s.Facts}
	inventory := 0
	for _, d := range s.Discovered {
		dm := &agentv1.DiscoveredMachine{Mac: d.MAC, Uuid: d.UUID, Arch: d.Arch}
		if inventory+len(d.Inventory) <= maxStatusInventory {
			dm.Inventory = d.Inventory
			inventory += len(d.Inventory)
		}
		if !d.FirstSeen.IsZero() {
			dm.FirstSeenUnixMs = d.FirstSeen.UnixMilli()
		}
		if !d.LastSeen.IsZero() {
			dm.LastSeenUnixMs = d.LastSeen.UnixMilli()
		}
		m.Discovered = append(m.Discovered, dm)
	}
	m.WithheldBoots = gateway.WithheldBootsToProto(s.Withheld)
	return m
}
