package engine

import (
	"context"
	"testing"

	"bcd/internal/gateway"
	"bcd/internal/pki"
)

// TestAgentOf: what the engine makes of a gateway identity. A node-tenant certificate (the
// installed OS's) is the OS whatever its hello says, so it never counts as the node's ramdisk,
// which runs and attests the node's commands.
func TestAgentOf(t *testing.T) {
	site := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 3}
	tenant := gateway.AgentRef{Kind: pki.KindNodeTenant, NodeID: "n1", Generation: 3}
	for _, tc := range []struct {
		name     string
		ref      gateway.AgentRef
		saysOS   bool
		kind, id string
	}{
		{"site agent", site, false, "site", "a1"},
		{"node certificate: the ramdisk", node, false, "node", "node:n1"},
		{"node certificate announcing the OS role", node, true, "os", "os:n1"},
		{"node-tenant certificate", tenant, false, "os", "os:n1"},
		{"node-tenant certificate announcing the OS role", tenant, true, "os", "os:n1"},
	} {
		a := agentOf(context.Background(), tc.ref, tc.saysOS)
		if a.Kind != tc.kind || a.ID != tc.id {
			t.Errorf("%s: %s %s, want %s %s", tc.name, a.Kind, a.ID, tc.kind, tc.id)
		}
	}
}
