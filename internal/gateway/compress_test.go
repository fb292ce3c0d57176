package gateway_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"bcd/internal/gateway"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// envelope is one message of a Connect stream as it went over the wire.
type envelope struct {
	flags   byte
	payload []byte
}

// envelopeRecorder keeps the envelopes of the response bodies that pass through it.
type envelopeRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []envelope
}

func (r *envelopeRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err == nil {
		resp.Body = &envelopeReader{body: resp.Body, rec: r}
	}
	return resp, err
}

func (r *envelopeRecorder) envelopes() []envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]envelope(nil), r.seen...)
}

// envelopeReader parses the bytes it passes on: a flags byte, a 4-byte big-endian length, the
// payload.
type envelopeReader struct {
	body io.ReadCloser
	rec  *envelopeRecorder
	buf  []byte
}

func (e *envelopeReader) Read(p []byte) (int, error) {
	n, err := e.body.Read(p)
	e.buf = append(e.buf, p[:n]...)
	for len(e.buf) >= 5 {
		size := int(binary.BigEndian.Uint32(e.buf[1:5]))
		if len(e.buf) < 5+size {
			break
		}
		e.rec.mu.Lock()
		e.rec.seen = append(e.rec.seen, envelope{flags: e.buf[0], payload: bytes.Clone(e.buf[5 : 5+size])})
		e.rec.mu.Unlock()
		e.buf = e.buf[5+size:]
	}
	return n, err
}

func (e *envelopeReader) Close() error { return e.body.Close() }

// The gateway compresses a message for an agent that accepts gzip only from CompressMinBytes
// on: a frame of one small command goes as it is, and so does one of about 2 KiB (a join's
// answer, a certificate and the CA's, is about 1.1 KiB that gzip shrinks by an eighth), a
// large one compressed.
func TestOnlyLargeFramesAreCompressed(t *testing.T) {
	env := start(t)
	site := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
	large, err := json.Marshal(map[string]string{"note": strings.Repeat("the same words again ", 400)})
	if err != nil {
		t.Fatal(err)
	}
	env.Queue.Enqueue(site, gateway.Command{ID: "small", Kind: "bmc.power", Args: []byte(`{"state":"on"}`)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := httpClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) {
		return env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	}))
	rec := &envelopeRecorder{next: hc.Transport}
	hc.Transport = rec
	s := agentv1connect.NewGatewayServiceClient(hc, env.URL).Connect(ctx)
	defer func() { _ = s.CloseResponse() }()
	if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}}); err != nil {
		t.Fatal(err)
	}
	receive := func(id string) {
		t.Helper()
		for {
			m, err := s.Receive()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range commandsOf(m) {
				if c.GetId() == id {
					return
				}
			}
		}
	}
	receive("small")
	medium, err := json.Marshal(map[string]string{"cert": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x30, 0x82, 0x02, 0x1c, 0xa0, 0x03}, 256))})
	if err != nil {
		t.Fatal(err)
	}
	if len(medium) < 2<<10 || len(medium) >= gateway.CompressMinBytes {
		t.Fatalf("the medium command's arguments are %d bytes: want 2 KiB to CompressMinBytes (%d)", len(medium), gateway.CompressMinBytes)
	}
	env.Queue.Enqueue(site, gateway.Command{ID: "medium", Kind: "bmc.power", Args: medium})
	receive("medium")
	env.Queue.Enqueue(site, gateway.Command{ID: "large", Kind: "bmc.power", Args: large})
	receive("large")
	_ = s.CloseRequest()

	found := map[string]envelope{}
	for _, e := range rec.envelopes() {
		if e.flags&0x02 != 0 {
			continue // the end of the stream
		}
		payload := e.payload
		if e.flags&0x01 != 0 {
			zr, err := gzip.NewReader(bytes.NewReader(payload))
			if err != nil {
				t.Fatalf("a compressed envelope is not gzip: %v", err)
			}
			if payload, err = io.ReadAll(zr); err != nil {
				t.Fatalf("reading a compressed envelope: %v", err)
			}
		}
		var m agentv1.ServerMessage
		if err := proto.Unmarshal(payload, &m); err != nil {
			t.Fatalf("decoding an envelope: %v", err)
		}
		for _, c := range commandsOf(&m) {
			found[c.GetId()] = e
		}
	}
	for _, id := range []string{"small", "medium"} {
		if e, ok := found[id]; !ok || e.flags&0x01 != 0 {
			t.Errorf("the %s command's frame: seen %v, flags %#x; want it uncompressed", id, ok, e.flags)
		}
	}
	e, ok := found["large"]
	if !ok || e.flags&0x01 == 0 {
		t.Fatalf("the large command's frame: seen %v, flags %#x; want it compressed", ok, e.flags)
	}
	if len(e.payload) >= len(large)/4 {
		t.Errorf("the large command's frame is %d bytes compressed for %d bytes of arguments", len(e.payload), len(large))
	}
}
