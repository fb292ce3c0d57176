package api

import (
	"context"
	"crypto/x509"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	bcdv1 "bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
	"bcd/internal/pki"
)

func (h *inventory) GetAgentCA(ctx context.Context, _ *connect.Request[bcdv1.GetAgentCARequest]) (*connect.Response[bcdv1.AgentCAResponse], error) {
	return agentCAResponse(h.svc.AgentCA(ctx, principal(ctx)))
}

func (h *inventory) RotateAgentCA(ctx context.Context, req *connect.Request[bcdv1.RotateAgentCARequest]) (*connect.Response[bcdv1.AgentCAResponse], error) {
	return agentCAResponse(h.svc.RotateAgentCA(ctx, principal(ctx), req.Msg.Reason))
}

func (h *inventory) ActivateAgentCA(ctx context.Context, req *connect.Request[bcdv1.ActivateAgentCARequest]) (*connect.Response[bcdv1.AgentCAResponse], error) {
	return agentCAResponse(h.svc.ActivateAgentCA(ctx, principal(ctx), req.Msg.Reason, req.Msg.Force))
}

func (h *inventory) FinishAgentCA(ctx context.Context, req *connect.Request[bcdv1.FinishAgentCARequest]) (*connect.Response[bcdv1.AgentCAResponse], error) {
	return agentCAResponse(h.svc.FinishAgentCA(ctx, principal(ctx), req.Msg.Reason, req.Msg.Force))
}

func agentCAResponse(r metal.AgentCARotation, err error) (*connect.Response[bcdv1.AgentCAResponse], error) {
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&bcdv1.AgentCAResponse{Rotation: agentCARotation(r)}), nil
}

// doctorAgentCA is the rotation for bcd doctor: only while one is in progress, and only to an
// admin token without a tenant.
func doctorAgentCA(ctx context.Context, svc *metal.Service, p auth.Principal) (*bcdv1.AgentCARotation, error) {
	r, ok, err := svc.AgentCAStatus(ctx, p)
	if err != nil || !ok || r.Rotation.Stage() == pki.StageSteady {
		return nil, err
	}
	return agentCARotation(r), nil
}

func agentCARotation(r metal.AgentCARotation) *bcdv1.AgentCARotation {
	ca := func(c *x509.Certificate) *bcdv1.AgentCA {
		if c == nil {
			return nil
		}
		return &bcdv1.AgentCA{Sha256: pki.Fingerprint(c.Raw), Subject: c.Subject.CommonName,
			NotBefore: c.NotBefore.UTC().Format(time.RFC3339), NotAfter: c.NotAfter.UTC().Format(time.RFC3339)}
	}
	out := &bcdv1.AgentCARotation{Stage: r.Rotation.Stage(), Active: ca(r.Rotation.Active), Next: ca(r.Rotation.Next), Previous: ca(r.Rotation.Previous)}
	for _, l := range r.Lagging {
		out.Lagging = append(out.Lagging, &bcdv1.AgentCALag{Agent: l.Agent.AgentID, Kind: l.Agent.Kind, Site: l.Agent.SiteID, Node: l.Agent.NodeID, Reason: l.Reason})
	}
	return out
}
