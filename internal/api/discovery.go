package api

import (
	"context"

	"connectrpc.com/connect"

	bcdv1 "bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
	"bcd/internal/store"
)

func (h *nodes) ConfirmMac(ctx context.Context, req *connect.Request[bcdv1.ConfirmMacRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	n, err := h.svc.ConfirmMAC(ctx, principal(ctx), req.Msg.Node, req.Msg.Mac, req.Msg.Reason)
	return h.respond(ctx, n, err)
}

func (h *nodes) MacCandidates(ctx context.Context, req *connect.Request[bcdv1.ListMacCandidatesRequest]) (*connect.Response[bcdv1.ListMacCandidatesResponse], error) {
	list, err := h.svc.MACCandidates(ctx, principal(ctx), req.Msg.Site, req.Msg.State)
	if err != nil {
		return nil, toConnect(err)
	}
	out := &bcdv1.ListMacCandidatesResponse{}
	for _, c := range list {
		out.Candidates = append(out.Candidates, &bcdv1.MacCandidate{Node: c.NodeID, Mac: c.MAC, Uuid: c.UUID, State: c.State, SeenAt: ts(c.SeenAt),
			CreatedAt: ts(c.CreatedAt), DecidedBy: c.DecidedBy, DecidedAt: ts(c.DecidedAt), Workflow: c.WorkflowID})
	}
	return connect.NewResponse(out), nil
}

// discoveredList answers a listing of discovered machines.
func discoveredList(list []store.Discovery) *bcdv1.ListDiscoveredResponse {
	out := &bcdv1.ListDiscoveredResponse{}
	for _, d := range list {
		out.Machines = append(out.Machines, discoveredProto(d))
	}
	return out
}

func discoveredProto(d store.Discovery) *bcdv1.DiscoveredMachine {
	return &bcdv1.DiscoveredMachine{Mac: d.MAC, Uuid: d.UUID, Arch: d.Arch, FirstSeen: ts(d.FirstSeen), LastSeen: ts(d.LastSeen), Agent: d.AgentID,
		Inventory: d.Inventory, Acceptance: d.Acceptance, Node: d.NodeID}
}

func (h *nodes) Pending(ctx context.Context, req *connect.Request[bcdv1.ListPendingRequest]) (*connect.Response[bcdv1.ListDiscoveredResponse], error) {
	list, err := h.svc.Pending(ctx, principal(ctx), req.Msg.Site, int(req.Msg.Limit))
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(discoveredList(list)), nil
}

func (h *nodes) Accept(ctx context.Context, req *connect.Request[bcdv1.AcceptRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	m := req.Msg
	in := metal.AcceptInput{Site: m.Site, MAC: m.Mac, Pool: m.Pool, Name: m.Name, Labels: m.Labels, Reason: m.Reason, BMC: bmcInput(m.Bmc), BootMode: m.BootMode}
	n, err := h.svc.AcceptDiscovered(ctx, principal(ctx), in)
	return h.respond(ctx, n, err)
}

func (h *nodes) Reject(ctx context.Context, req *connect.Request[bcdv1.RejectRequest]) (*connect.Response[bcdv1.RejectResponse], error) {
	if err := h.svc.RejectDiscovered(ctx, principal(ctx), req.Msg.Site, req.Msg.Mac, req.Msg.Reason); err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.RejectResponse{}), nil
}
