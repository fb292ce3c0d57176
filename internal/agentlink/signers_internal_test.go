package agentlink

import (
	"bytes"
	"testing"
	"time"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// A signed result waiting to be sent goes out with the agent's current certificate when the
// one it was signed under was renewed since (same key: the signature still verifies, and the
// old certificate may be of a CA a finished rotation no longer trusts); a certificate of another
// key is left as it is, and so is an unsigned update.
func TestCurrentSigners(t *testing.T) {
	oldCA, err := pki.CreateCA("old agent CA", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := pki.CreateCA("new agent CA", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	key, csr, err := pki.NewKeyAndCSR("agent")
	if err != nil {
		t.Fatal(err)
	}
	_, otherCSR, err := pki.NewKeyAndCSR("other")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *pki.CA, csr []byte) []byte {
		der, err := ca.IssueSiteAgent(csr, "s1", "a1", time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	before, current, other := issue(oldCA, csr), issue(newCA, csr), issue(oldCA, otherCSR)
	id := &identity{key: key, certDER: current}
	if err := id.parse(); err != nil {
		t.Fatal(err)
	}
	l := &Link{}
	l.id.Store(id)
	m := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Batch{Batch: &agentv1.AgentBatch{Updates: []*agentv1.CommandUpdate{
		{CommandId: "renewed", NodeSig: []byte("sig"), SignerCertDer: before},
		{CommandId: "another key", NodeSig: []byte("sig"), SignerCertDer: other},
		{CommandId: "unsigned"},
	}}}}
	l.currentSigners(m)
	ups := m.GetBatch().GetUpdates()
	if !bytes.Equal(ups[0].SignerCertDer, current) {
		t.Error("a result signed before the renewal still carries the old certificate")
	}
	if !bytes.Equal(ups[1].SignerCertDer, other) {
		t.Error("a certificate of another key was replaced")
	}
	if len(ups[2].SignerCertDer) != 0 {
		t.Error("an unsigned update got a certificate")
	}
	single := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Update{Update: &agentv1.CommandUpdate{CommandId: "one", NodeSig: []byte("sig"), SignerCertDer: before}}}
	l.currentSigners(single)
	if !bytes.Equal(single.GetUpdate().SignerCertDer, current) {
		t.Error("a single update signed before the renewal still carries the old certificate")
	}
}
