package wirebound

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/bcdv1"
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

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func limitOf(err error) int {
	var e *ExceededError
	if errors.As(err, &e) {
		return e.Limit
	}
	return -1
}

// What a message decodes to is counted on the wire: each message, map entry and list element,
// nested ones included; a count over the limit is refused, naming the caller's limit, before
// anything is decoded.
func TestCount(t *testing.T) {
	status := &agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Status{Status: &agentv1.StatusReport{
		Discovered: []*agentv1.DiscoveredMachine{{Mac: "a"}, {Mac: "b"}},
		Drivers:    []string{"redfish", "ipmi", ""},
		Facts:      map[string]string{"a": "1", "b": "2"},
	}}}
	agent := (&agentv1.AgentMessage{}).ProtoReflect().Descriptor()
	pool := (&bcdv1.CreatePoolRequest{}).ProtoReflect().Descriptor()
	tests := []struct {
		name  string
		wire  []byte
		md    protoreflect.MessageDescriptor
		limit int
		want  int
		// wantLimit: the limit an *ExceededError names, -1 for none.
		wantLimit int
	}{
		{"empty", nil, agent, 10, 0, -1},
		{"a status report", mustMarshal(t, status), agent, 100, 1 + 2 + 3 + 2, -1},
		{"512 acknowledgements", emptyAcks(512), agent, 1 << 16, 1 + 512, -1},
		{"at the limit", emptyAcks(9), agent, 10, 10, -1},
		{"one over", emptyAcks(10), agent, 10, 11, 10},
		{"a flood", emptyAcks(1 << 20), agent, 1 << 16, 1<<16 + 1, 1 << 16},
		{"a policy's maps", mustMarshal(t, &bcdv1.CreatePoolRequest{Policy: &bcdv1.PoolPolicy{
			Labels: map[string]string{"a": "1", "b": ""}, FirmwareBaseline: map[string]string{"BIOS": "1"}}}), pool, 100, 1 + 2 + 1, -1},
		{"a packed list of varints", func() []byte {
			var v []byte
			for _, x := range []uint64{1, 300, 1 << 40} {
				v = protowire.AppendVarint(v, x)
			}
			b := protowire.AppendTag(nil, 1, protowire.BytesType)
			return protowire.AppendBytes(b, v)
		}(), (&descriptorpb.SourceCodeInfo_Location{}).ProtoReflect().Descriptor(), 100, 3, -1}, // path: packed int32
		{"unknown fields count for nothing", protowire.AppendBytes(protowire.AppendTag(nil, 999, protowire.BytesType), emptyAcks(100)), agent, 10, 0, -1},
	}
	for _, tt := range tests {
		got, err := Count(tt.wire, tt.md, tt.limit)
		if got != tt.want || limitOf(err) != tt.wantLimit || (tt.wantLimit < 0 && err != nil) {
			t.Errorf("%s: %d, %v; want %d (limit named: %d)", tt.name, got, err, tt.want, tt.wantLimit)
		}
	}
	if _, err := Count([]byte{0x32, 0x05, 0x0a}, agent, 10); err == nil {
		t.Error("a truncated message was counted")
	}
}

// Messages nested deeper than MaxDepth are refused without being followed further; up to
// MaxDepth they are counted. The chain is google.protobuf.Value's, which nests: a Value's
// struct_value (5) is a Struct, whose fields (1) map entries hold a Value (2): three levels.
func TestCountDepth(t *testing.T) {
	value := (&structpb.Value{}).ProtoReflect().Descriptor()
	for _, tt := range []struct {
		levels  int
		wantErr bool
	}{{10, false}, {MaxDepth / 3, false}, {MaxDepth/3 + 1, true}, {1000, true}} {
		b := []byte{}
		for range tt.levels {
			var entry []byte
			entry = protowire.AppendTag(entry, 2, protowire.BytesType) // MapEntry.value: Value
			entry = protowire.AppendBytes(entry, b)
			var st []byte
			st = protowire.AppendTag(st, 1, protowire.BytesType) // Struct.fields entry
			st = protowire.AppendBytes(st, entry)
			var v []byte
			v = protowire.AppendTag(v, 5, protowire.BytesType) // Value.struct_value
			b = protowire.AppendBytes(v, st)
		}
		n, err := Count(b, value, 1<<30)
		var deep *TooDeepError
		if errors.As(err, &deep) != tt.wantErr || (!tt.wantErr && (err != nil || n != 3*tt.levels)) {
			t.Errorf("%d levels: %d, %v; want refused for depth: %v", tt.levels*3, n, err, tt.wantErr)
		}
	}
}

// The JSON count: objects but the outermost, members and array elements; nothing inside
// strings; at the limit accepted, one over refused; nesting past MaxDepth refused.
func TestCountJSON(t *testing.T) {
	tests := []struct {
		name      string
		json      string
		limit     int
		want      int
		wantLimit int  // the limit an *ExceededError names, -1 for none
		wantDeep  bool // refused as nested too deep
	}{
		{"empty", ``, 10, 0, -1, false},
		{"empty object", `{}`, 10, 0, -1, false},
		{"scalar fields", `{"node":"n1","reason":"r"}`, 10, 2, -1, false},
		{"a list", `{"nodes":["a","b","c"]}`, 10, 1 + 3, -1, false},
		{"an empty list", `{"nodes":[ ]}`, 10, 1, -1, false},
		{"a list of one", `{"nodes":[ "a" ]}`, 10, 2, -1, false},
		{"a nested message and a map", `{"policy":{"labels":{"a":"1","b":"2"}}}`, 10, 1 + 1 + 1 + 1 + 2, -1, false},
		{"whitespace", " {\n\t\"nodes\" : [ \"a\" , \"b\" ] } ", 10, 1 + 2, -1, false},
		{"at the limit", `{"nodes":["","","","","","","","",""]}`, 10, 10, -1, false},
		{"one over", `{"nodes":["","","","","","","","","",""]}`, 10, 11, 10, false},
		{"a flood of empty objects", `{"items":[` + strings.Repeat(`{},`, 100000) + `{}]}`, 1 << 14, 1<<14 + 1, 1 << 14, false},
		{"brackets, braces, commas and colons in strings", `{"reason":"[{,:}] \"[,]\" \\","nodes":["a,b","[x]","{:}"]}`, 10, 2 + 3, -1, false},
		{"escaped quotes do not end strings", `{"reason":"\",\",\",\"","nodes":[]}`, 10, 2, -1, false},
		{"an unterminated string ends the count", `{"reason":"[[[[,,,,`, 10, 1, -1, false},
		{"nested to the limit", strings.Repeat(`[`, MaxDepth+1) + strings.Repeat(`]`, MaxDepth+1), 1 << 20, MaxDepth, -1, false},
		{"nested past the limit", strings.Repeat(`[`, MaxDepth+2), 1 << 20, 0, -1, true},
		{"deep objects", strings.Repeat(`{"a":`, 1<<17), 1 << 20, 0, -1, true},
		{"deep objects over the count first", strings.Repeat(`{"a":`, 1<<17), 10, 11, 10, false},
	}
	for _, tt := range tests {
		got, err := CountJSON([]byte(tt.json), tt.limit)
		var deep *TooDeepError
		switch {
		case tt.wantDeep:
			if !errors.As(err, &deep) {
				t.Errorf("%s: %d, %v; want refused as too deep", tt.name, got, err)
			}
		case got != tt.want || limitOf(err) != tt.wantLimit || (tt.wantLimit < 0 && err != nil):
			t.Errorf("%s: %d, %v; want %d (limit named: %d)", tt.name, got, err, tt.want, tt.wantLimit)
		}
	}
}

// The codec refuses, before decoding, what would decode to more than its limit, saying what and
// the limit; it decodes the rest as protobuf does.
func TestProtoCodec(t *testing.T) {
	c := NewProto(1 << 16)
	var m agentv1.AgentMessage
	err := c.Unmarshal(emptyAcks(1<<20), &m)
	if err == nil || !strings.Contains(err.Error(), "too many elements") || !strings.Contains(err.Error(), "at most 65536") || m.GetBatch() != nil {
		t.Fatalf("a flood of 1 MiB acknowledgements: %v (decoded: %v)", err, m.GetBatch() != nil)
	}
	if err := c.Unmarshal(emptyAcks(512), &m); err != nil || len(m.GetBatch().GetAcks()) != 512 {
		t.Fatalf("512 acknowledgements: %v, %d decoded", err, len(m.GetBatch().GetAcks()))
	}
	b, err := c.Marshal(&m)
	if err != nil || len(b) != len(emptyAcks(512)) {
		t.Fatalf("marshal: %d bytes, %v", len(b), err)
	}
	if err := c.Unmarshal(b, struct{}{}); err == nil {
		t.Error("decoded into a non-message")
	}
}

// fuzzTypes are the API requests the JSON fuzz decodes into: lists, maps and nested messages.
func fuzzTypes() []proto.Message {
	return []proto.Message{
		&bcdv1.BulkRequest{}, &bcdv1.EnrollRequest{}, &bcdv1.CreatePoolRequest{},
		&bcdv1.UpdatePoolRequest{}, &bcdv1.AcceptRequest{}, &bcdv1.AddImageRequest{},
		&bcdv1.PutHardwareProfileRequest{}, &bcdv1.ListNodesRequest{},
	}
}

// CountJSON never counts less than what protojson decodes a JSON text to (counted on its wire
// form by Count), for any text protojson accepts into an API request.
func FuzzCountJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"nodes":["a","b"],"selectors":[]}`, `{"policy":{"labels":{"a":"1"},"firmwareBaseline":{"BIOS":"1"}}}`,
		`{"bmc":{"address":"x"},"macs":["",""],"labels":{"a":"","b":""}}`, `{"image":{"name":"[,]","signature":"AAAA"}}`,
		`{"profile":{"drivers":{"power":"redfish"}}}`, `{"labels":["a=b"],"pageSize":3}`, `{"nodes":null,"policy":null}`,
		`{"reason":"\"{[,:]}\\"}`, `{"policy":{}}`, `{"labels":{"\u005b":"]"}}`,
	} {
		for i := range fuzzTypes() {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		types := fuzzTypes()
		m := types[int(which)%len(types)]
		if protojson.Unmarshal(b, m) != nil {
			return
		}
		wire, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		decoded, err := Count(wire, m.ProtoReflect().Descriptor(), 1<<30)
		if err != nil {
			t.Fatalf("%T decoded from %q: the wire count failed: %v", m, b, err)
		}
		counted, err := CountJSON(b, 1<<30)
		if err != nil || counted < decoded {
			t.Fatalf("%T from %q: counted %d (%v), decodes to %d elements", m, b, counted, err, decoded)
		}
	})
}

// typicalJSON is a typical request with something of everything: an enrolment.
const typicalJSON = `{"name":"rack4-node17","pool":"default","macs":["52:54:00:00:00:01","52:54:00:00:00:02"],` +
	`"bmc":{"driver":"redfish","address":"https://10.0.4.17","username":"root","password":"Very-Secret-BMC-Password-42"},` +
	`"labels":{"rack":"r4","row":"b","gpu":"h100"},"reason":"new rack","bootMode":"uefi"}`

func BenchmarkCountJSON(b *testing.B) {
	in := []byte(typicalJSON)
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := CountJSON(in, 1<<14); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkProtojsonUnmarshal(b *testing.B) {
	in := []byte(typicalJSON)
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var m bcdv1.EnrollRequest
		if err := protojson.Unmarshal(in, &m); err != nil {
			b.Fatal(err)
		}
	}
}

func typicalWire(b *testing.B) []byte {
	var m bcdv1.EnrollRequest
	if err := protojson.Unmarshal([]byte(typicalJSON), &m); err != nil {
		b.Fatal(err)
	}
	return mustMarshal(b, &m)
}

func BenchmarkCount(b *testing.B) {
	in := typicalWire(b)
	md := (&bcdv1.EnrollRequest{}).ProtoReflect().Descriptor()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := Count(in, md, 1<<14); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkProtoUnmarshal(b *testing.B) {
	in := typicalWire(b)
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var m bcdv1.EnrollRequest
		if err := proto.Unmarshal(in, &m); err != nil {
			b.Fatal(err)
		}
	}
}
