package gateway

import (
	"errors"
	"strings"
	"testing"

	agentv1 "bcd/internal/gen/agentv1"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
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

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// What a message decodes to is counted on the wire: each message, map entry and list element,
// nested ones included; a count over the limit is refused before anything is decoded.
func TestDecodedElements(t *testing.T) {
	status := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: &agentv1.StatusReport{
		Discovered: []*agentv1.DiscoveredMachine{{Mac: "a"}, {Mac: "b"}},
		Drivers:    []string{"redfish", "ipmi", ""},
		Facts:      map[string]string{"a": "1", "b": "2"},
	}}}
	tests := []struct {
		name    string
		wire    []byte
		limit   int
		want    int
		wantErr error
	}{
		{"empty", nil, 10, 0, nil},
		{"a status report", mustMarshal(t, status), 100, 1 + 2 + 3 + 2, nil},
		{"512 acknowledgements", emptyAcks(512), MaxDecodedElements, 1 + 512, nil},
		{"one over", emptyAcks(10), 10, 11, errTooManyElements},
		{"a flood", emptyAcks(1 << 20), MaxDecodedElements, MaxDecodedElements + 1, errTooManyElements},
	}
	for _, tt := range tests {
		got, err := decodedElements(tt.wire, (&agentv1.AgentMessage{}).ProtoReflect().Descriptor(), tt.limit, 0)
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("%s: %d, %v; want %d, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
	if _, err := decodedElements([]byte{0x32, 0x05, 0x0a}, (&agentv1.AgentMessage{}).ProtoReflect().Descriptor(), 10, 0); err == nil {
		t.Error("a truncated message was counted")
	}
}

// The codec refuses a flood before decoding it, with what is accepted, and decodes the rest as
// protobuf does.
func TestBoundedProtoUnmarshal(t *testing.T) {
	c := boundedProto{limit: MaxDecodedElements}
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

func BenchmarkDecodedElements(b *testing.B) {
	wire := emptyAcks(512)
	md := (&agentv1.AgentMessage{}).ProtoReflect().Descriptor()
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		if _, err := decodedElements(wire, md, MaxDecodedElements, 0); err != nil {
			b.Fatal(err)
		}
	}
}
