package gateway

import (
	"strings"
	"testing"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/wirebound"

	"google.golang.org/protobuf/encoding/protowire"
)

// emptyAcks is an AgentMessage holding a batch of n empty acknowledgements, built on the wire
// (2 bytes each).
func emptyAcks(n int) []byte {
	var batch []byte
	for range n {
		batch = protowire.AppendTag(batch, 1, protowire.BytesType)
		batch = protowire.AppendVarint(batch, 0)
	}
	var msg []byte
	msg = protowire.AppendTag(msg, 6, protowire.BytesType)
	return protowire.AppendBytes(msg, batch)
}

// The codec refuses a flood before decoding it, with what is accepted, and decodes the rest as
// protobuf does. (How elements are counted is wirebound's TestCount.)
func TestBoundedProtoUnmarshal(t *testing.T) {
	c := wirebound.NewProto(MaxDecodedElements) // as server.go registers it
	var m agentv1.AgentMessage
	err := c.Unmarshal(emptyAcks(1<<20), &m)
	if err == nil || !strings.Contains(err.Error(), "at most 65536") || m.GetBatch() != nil {
		t.Fatalf("a flood of 1 MiB acknowledgements: %v (decoded: %v)", err, m.GetBatch() != nil)
	}
	if err := c.Unmarshal(emptyAcks(512), &m); err != nil || len(m.GetBatch().GetAcks()) != 512 {
		t.Fatalf("512 acknowledgements: %v, %d decoded", err, len(m.GetBatch().GetAcks()))
	}
	if _, err := (noJSON{name: "json"}).Marshal(&m); err == nil {
		t.Error("JSON marshalled")
	}
}
