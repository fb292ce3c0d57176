package gateway

import (
	"net"
	"net/netip"
	"time"

	agentv1 "bcd/internal/gen/agentv1"
)

// stateOf maps the wire state to the queue's; "" for an unknown state.
func stateOf(s agentv1.CommandState) string {
	switch s {
	case agentv1.CommandState_COMMAND_STATE_RUNNING:
		return StateRunning
	case agentv1.CommandState_COMMAND_STATE_SUCCEEDED:
		return StateSucceeded
	case agentv1.CommandState_COMMAND_STATE_FAILED:
		return StateFailed
	case agentv1.CommandState_COMMAND_STATE_INTERRUPTED:
		return StateLost
	default:
		return ""
	}
}

// updateOf copies a wire update; the byte slices are the received ones, unchanged.
func updateOf(m *agentv1.CommandUpdate) Update {
	u := Update{
		CommandID:     m.GetCommandId(),
		State:         stateOf(m.GetState()),
		Result:        m.GetResultJson(),
		Error:         m.GetError(),
		NodeSig:       m.GetNodeSig(),
		SignerCertDER: m.GetSignerCertDer(),
	}
	if p := m.GetProgress(); p != nil {
		u.ProgressDone, u.ProgressTotal, u.ProgressMessage = p.GetDone(), p.GetTotal(), p.GetMessage()
	}
	return u
}

func helloOf(m *agentv1.Hello) Hello {
	return Hello{
		AgentVersion: m.GetAgentVersion(),
		Capabilities: m.GetCapabilities(),
		Drivers:      m.GetDrivers(),
		ResumeAfter:  m.GetResumeAfter(),
		CAs:          m.GetCaSha256(),
		StoreWatermark: Watermark{StoreID: m.GetStoreWatermark().GetStoreId(), Fences: m.GetStoreWatermark().GetFences(),
			Beats: m.GetStoreWatermark().GetBeats()},
	}
}

func statusOf(m *agentv1.StatusReport) Status {
	s := Status{HoldsBootLease: m.GetHoldsBootLease(), Drivers: m.GetDrivers(), Facts: m.GetFacts()}
	for _, d := range m.GetDiscovered() {
		s.Discovered = append(s.Discovered, Discovered{
			MAC: d.GetMac(), UUID: d.GetUuid(), Arch: d.GetArch(), Inventory: d.GetInventory(),
			FirstSeen: unixMS(d.GetFirstSeenUnixMs()), LastSeen: unixMS(d.GetLastSeenUnixMs()),
		})
	}
	for _, w := range m.GetWithheldBoots() {
		if len(s.Withheld) == MaxWithheldBoots {
			break
		}
		mac, err := net.ParseMAC(w.GetMac())
		remote, rerr := netip.ParseAddr(w.GetRemote())
		if err != nil || len(mac) != 6 || rerr != nil {
			continue // an agent's malformed pair is left out, not the report
		}
		s.Withheld = append(s.Withheld, WithheldBoot{MAC: mac.String(), Remote: remote.Unmap(), Count: int(w.GetCount()),
			First: unixMS(w.GetFirstUnixMs()), Last: unixMS(w.GetLastUnixMs())})
	}
	return s
}

// WithheldBootsToProto is the wire form of withheld boot-script pairs.
func WithheldBootsToProto(ws []WithheldBoot) []*agentv1.WithheldBoot {
	out := make([]*agentv1.WithheldBoot, 0, len(ws))
	for _, w := range ws {
		out = append(out, &agentv1.WithheldBoot{Mac: w.MAC, Remote: w.Remote.String(), Count: uint32(w.Count),
			FirstUnixMs: w.First.UnixMilli(), LastUnixMs: w.Last.UnixMilli()})
	}
	return out
}

func hintsOf(m *agentv1.NodeHints) NodeHints {
	return NodeHints{ProductUUID: m.GetProductUuid(), MACs: m.GetMacs()}
}

func commandMsg(c Command, attest bool) *agentv1.Command {
	m := &agentv1.Command{
		Id: c.ID, Kind: c.Kind, NodeId: c.NodeID, Generation: c.Generation,
		ArgsJson: c.Args, Attest: attest,
	}
	if !c.Deadline.IsZero() {
		m.DeadlineUnixMs = c.Deadline.UnixMilli()
	}
	return m
}

func unixMS(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
