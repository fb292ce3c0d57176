package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"bcd/internal/batch"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
	"bcd/internal/wirebound"
)

// apiCodecs are the codecs Handler decodes requests with, by Connect's name.
func apiCodecs() map[string]connect.Codec {
	return map[string]connect.Codec{
		"proto":               wirebound.NewProto(MaxDecodedElements),
		"json":                strictJSON{name: "json", limit: MaxDecodedElements},
		"json; charset=utf-8": strictJSON{name: "json; charset=utf-8", limit: MaxDecodedElements},
	}
}

// label63 is the i-th of a set of distinct 63-character names, label keys or values (the
// longest accepted).
func label63(i int) string { return fmt.Sprintf("n%061d0", i) }

func labels64() map[string]string {
	m := make(map[string]string, 64)
	for i := range 64 {
		m[label63(i)] = label63(i)
	}
	return m
}

func list(n int, item func(int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = item(i)
	}
	return out
}

// The largest request of each kind the API takes decodes, in protobuf and in JSON: a bulk of
// batch.MaxBulk nodes (or metal.MaxSelectors selectors), 64 MACs and labels, a pool policy of 64
// labels and 64 firmware components, a signed image. None is refused for its size.
func TestLargestRequestsAccepted(t *testing.T) {
	selectors := list(metal.MaxSelectors, func(i int) string { return label63(i) + "=" + label63(i) })
	bmc := &bcdv1.BmcCredentials{Driver: "redfish", Address: "https://10.0.0.9", Username: "root", Password: password, TlsFingerprintSha256: strings.Repeat("a", 64)}
	policy := &bcdv1.PoolPolicy{HardwareProfile: label63(0), Labels: labels64(), FirmwareBaseline: labels64(), FastTrackWindow: "24h", AutoAccept: true, AutoAcceptInband: true}
	tests := []struct {
		name string
		req  proto.Message
	}{
		{"a bulk of the most nodes", &bcdv1.BulkRequest{Pool: label63(0), Verb: "undeploy", Nodes: list(batch.MaxBulk, label63), Wipe: "secure", Reason: "r"}},
		{"a bulk of the most selectors", &bcdv1.BulkRequest{Pool: label63(0), Verb: "retire", Selectors: selectors, Reason: "r"}},
		{"a bulk of both (refused later, never for its size)", &bcdv1.BulkRequest{Nodes: list(batch.MaxBulk, label63), Selectors: selectors}},
		{"an enrolment", &bcdv1.EnrollRequest{Name: label63(0), Pool: label63(1), Bmc: bmc, Labels: labels64(),
			Macs: list(64, func(i int) string { return fmt.Sprintf("52:54:00:00:00:%02x", i) }), ProductUuid: "00000000-0000-0000-0000-000000000000", Reason: "r", BootMode: "uefi"}},
		{"an acceptance", &bcdv1.AcceptRequest{Site: "s", Mac: "52:54:00:00:00:01", Pool: "p", Name: "n", Bmc: bmc, Labels: labels64(), Reason: "r"}},
		{"a node listing", &bcdv1.ListNodesRequest{Labels: selectors, PageSize: metal.MaxPageSize}},
		{"a pool", &bcdv1.CreatePoolRequest{Name: "p", Site: "s", Policy: policy}},
		{"a pool update", &bcdv1.UpdatePoolRequest{Pool: "p", Policy: policy}},
		{"a site", &bcdv1.CreateSiteRequest{Name: "s", Labels: labels64()}},
		{"a hardware profile", &bcdv1.PutHardwareProfileRequest{Profile: &bcdv1.HardwareProfile{Name: "h", LocalBoot: "sanboot",
			Drivers: map[string]string{"power": "redfish", "management": "redfish", "boot": "redfish", "deploy": "redfish", "inspect": "redfish", "virtual-media": "redfish"}}}},
		{"an image", &bcdv1.AddImageRequest{Image: &bcdv1.Image{Name: "i", Url: "https://x/i.raw", Size: 1 << 40, Format: "raw", Compression: "zstd",
			Sha256: strings.Repeat("a", 64), Sha512: strings.Repeat("b", 128), Signer: "s", Signature: bytes.Repeat([]byte{1}, 64)}}},
	}
	for _, tt := range tests {
		wire, err := proto.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		text, err := protojson.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		for name, codec := range apiCodecs() {
			in := wire
			if name != "proto" {
				in = text
			}
			if len(in) > MaxRequestBytes {
				t.Errorf("%s: %d bytes in %s, over MaxRequestBytes", tt.name, len(in), name)
			}
			got := tt.req.ProtoReflect().New().Interface()
			if err := codec.Unmarshal(in, got); err != nil || !proto.Equal(got, tt.req) {
				t.Errorf("%s in %s: %v (decoded as sent: %v)", tt.name, name, err, proto.Equal(got, tt.req))
			}
		}
	}
}

// emptyNodes is a BulkRequest of n empty node names: in protobuf, 2 bytes each.
func emptyNodes(n int) []byte {
	var b []byte
	for range n {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}

// jsonNodes is a BulkRequest in JSON of n node names, each item.
func jsonNodes(n int, item string) string {
	return `{"nodes":[` + strings.Repeat(item+`,`, n-1) + item + `]}`
}

// Each codec takes a request of MaxDecodedElements elements and refuses one more, before
// decoding it, saying what was exceeded and the limit (no content of the request).
func TestDecodedElementsBound(t *testing.T) {
	const secret = "hunter2-in-the-flood"
	tests := []struct {
		name    string
		codec   string
		in      []byte
		refused bool
	}{
		{"proto at the limit", "proto", emptyNodes(MaxDecodedElements), false},
		{"proto one over", "proto", emptyNodes(MaxDecodedElements + 1), true},
		// {"nodes": [...]}: one member and the list's elements.
		{"json at the limit", "json", []byte(jsonNodes(MaxDecodedElements-1, `""`)), false},
		{"json one over", "json", []byte(jsonNodes(MaxDecodedElements, `""`)), true},
		{"json; charset=utf-8 one over", "json; charset=utf-8", []byte(jsonNodes(MaxDecodedElements, `""`)), true},
		{"json of names holding brackets and commas", "json", []byte(jsonNodes(MaxDecodedElements-1, `"[{,:}],\"[,]\""`)), false},
		{"json flood of labels", "json", []byte(`{"labels":{` + strings.Join(list(MaxDecodedElements+1, func(i int) string { return fmt.Sprintf(`"%d":"%s"`, i, secret) }), ",") + `}}`), true},
		{"proto flood naming a secret", "proto", bytes.Repeat(protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), secret), MaxDecodedElements+1), true},
	}
	for _, tt := range tests {
		var m bcdv1.BulkRequest
		if strings.Contains(tt.name, "labels") {
			var site bcdv1.CreateSiteRequest
			err := apiCodecs()[tt.codec].Unmarshal(tt.in, &site)
			checkRefusal(t, tt.name, err, tt.refused, len(site.GetLabels()), secret)
			continue
		}
		err := apiCodecs()[tt.codec].Unmarshal(tt.in, &m)
		checkRefusal(t, tt.name, err, tt.refused, len(m.GetNodes()), secret)
	}
}

// JSON nested deeper than wirebound.MaxDepth (which no request nests) is refused before
// protojson follows it, in either JSON codec.
func TestDeepJSONRefused(t *testing.T) {
	for _, depth := range []int{wirebound.MaxDepth + 1, 1 << 18} {
		in := []byte(strings.Repeat(`{"policy":`, depth) + `{}` + strings.Repeat(`}`, depth))
		for _, name := range []string{"json", "json; charset=utf-8"} {
			var m bcdv1.CreatePoolRequest
			err := apiCodecs()[name].Unmarshal(in, &m)
			if err == nil || !strings.Contains(err.Error(), "nested too deep") || m.GetPolicy() != nil {
				t.Errorf("%s nested %d deep: %v, want refused as nested too deep", name, depth, err)
			}
		}
	}
}

func checkRefusal(t *testing.T, name string, err error, refused bool, decoded int, secret string) {
	t.Helper()
	if !refused {
		if err != nil {
			t.Errorf("%s: refused: %v", name, err)
		}
		return
	}
	want := fmt.Sprintf("at most %d are accepted", MaxDecodedElements)
	if err == nil || !strings.Contains(err.Error(), "too many elements") || !strings.Contains(err.Error(), want) || decoded != 0 {
		t.Errorf("%s: %v (%d decoded), want refused before decoding with %q", name, err, decoded, want)
	}
	if err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("%s: the refusal echoes the request: %v", name, err)
	}
}

// A refused flood costs the server nothing more than its bytes, not what they would decode to:
// 1 MiB of empty node names in protobuf (2 bytes each, 524,288 names) decoded to 43 MiB, in JSON
// (3 bytes each) to 35 MiB; 1 MiB of distinct empty labels to 14-17 MiB.
func TestFloodRefusedBeforeDecoding(t *testing.T) {
	tests := []struct {
		codec string
		in    []byte
	}{
		{"proto", emptyNodes(MaxRequestBytes / 2)},
		{"json", []byte(jsonNodes(MaxRequestBytes/3-4, `""`))},
	}
	for _, tt := range tests {
		var before, after runtime.MemStats
		var m bcdv1.BulkRequest
		runtime.ReadMemStats(&before)
		err := apiCodecs()[tt.codec].Unmarshal(tt.in, &m)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Errorf("%s: a flood of %d bytes decoded to %d node names", tt.codec, len(tt.in), len(m.GetNodes()))
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("%s: %d KiB allocated for a refused request of %d KiB", tt.codec, grew>>10, len(tt.in)>>10)
		}
	}
}

// Over HTTP, every way of sending a request is bounded, the caller authenticated or not: the
// Connect protocol's JSON (both its content types), its protobuf, its GET form, and gRPC. The
// answer is invalid_argument (as the agent gateway's) with the limit, never the content.
func TestDecodedElementsBoundOverHTTP(t *testing.T) {
	e := newEnv(t)
	const secret = "hunter2-in-the-flood"
	floodJSON := jsonNodes(MaxDecodedElements+1, `"`+secret+`"`)
	floodProto := bytes.Repeat(protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), secret), MaxDecodedElements+1)
	listFlood := `{"labels":[` + strings.Repeat(`"a=b",`, MaxDecodedElements) + `"a=b"]}`
	grpcFrame := func(msg []byte) []byte {
		return append([]byte{0, byte(len(msg) >> 24), byte(len(msg) >> 16), byte(len(msg) >> 8), byte(len(msg))}, msg...)
	}
	const bulk = "/bcd.v1.BatchService/Bulk"
	tests := []struct {
		name, method, path, contentType, token string
		body                                   []byte
		wantCode                               string // the Connect error code; "" for a gRPC answer
	}{
		{"json", "POST", bulk, "application/json", e.admin, []byte(floodJSON), "invalid_argument"},
		{"json; charset=utf-8", "POST", bulk, "application/json; charset=utf-8", e.admin, []byte(floodJSON), "invalid_argument"},
		{"proto", "POST", bulk, "application/proto", e.admin, floodProto, "invalid_argument"},
		{"unauthenticated", "POST", bulk, "application/json", "", []byte(floodJSON), "invalid_argument"},
		{"GET", "GET", "/bcd.v1.NodeService/List?connect=v1&encoding=json&base64=1&message=" + url.QueryEscape(base64.URLEncoding.EncodeToString([]byte(listFlood))), "", e.admin, nil, "invalid_argument"},
		{"grpc", "POST", bulk, "application/grpc", e.admin, grpcFrame(floodProto), ""},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, e.srv.URL+tt.path, bytes.NewReader(tt.body))
		if tt.contentType != "" {
			req.Header.Set("Content-Type", tt.contentType)
		}
		if tt.token != "" {
			req.Header.Set("Authorization", "Bearer "+tt.token)
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf("at most %d are accepted", MaxDecodedElements)
		if tt.wantCode == "" { // gRPC: the status is in the trailers
			if st, msg := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message"); st != "3" || !strings.Contains(msg, "too many elements") {
				t.Errorf("%s: grpc-status %q %q, want 3 (invalid argument) saying too many elements", tt.name, st, msg)
			}
			continue
		}
		var got struct{ Code, Message string }
		_ = json.Unmarshal(body, &got)
		if resp.StatusCode != http.StatusBadRequest || got.Code != tt.wantCode || !strings.Contains(got.Message, want) {
			t.Errorf("%s: %d %s, want 400 %s saying %q", tt.name, resp.StatusCode, body, tt.wantCode, want)
		}
		if strings.Contains(string(body), secret) {
			t.Errorf("%s: the answer echoes the request: %s", tt.name, body)
		}
	}

	// "application/json; charset=utf-8" is as strict as "application/json": unknown fields are
	// refused (Connect's own codec for it discarded them).
	req, _ := http.NewRequest("POST", e.srv.URL+"/bcd.v1.NodeService/Get", strings.NewReader(`{"node":"ghost","colour":"red"}`))
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Authorization", "Bearer "+e.admin)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "colour") {
		t.Errorf("an unknown field in application/json; charset=utf-8: %d %s, want 400 naming it", resp.StatusCode, body)
	}
}

// BenchmarkStrictJSON is the API's JSON decoding of a typical request (an enrolment), the count
// included; wirebound's BenchmarkCountJSON is the count alone.
func BenchmarkStrictJSON(b *testing.B) {
	in := []byte(enrollJSON("rack4-node17", "52:54:00:00:00:01"))
	c := strictJSON{name: "json", limit: MaxDecodedElements}
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		var m bcdv1.EnrollRequest
		if err := c.Unmarshal(in, &m); err != nil {
			b.Fatal(err)
		}
	}
}
