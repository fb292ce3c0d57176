package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"runtime"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gateway"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
)

// An agent's message that would decode to more than gateway.MaxDecodedElements elements (here
// a frame of a million empty acknowledgements: 2 MiB on the wire, about 100 MiB decoded) ends
// its stream before it is decoded; one of 512 is taken. JSON is not spoken at all.
func TestFloodOfEmptyElementsRefusedBeforeDecoding(t *testing.T) {
	env := start(t)
	tlsCert := certFor(t, env, func(der []byte) ([]byte, error) { return env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now()) })
	batchOf := func(acks int) *agentv1.AgentBatch {
		batch := &agentv1.AgentBatch{Acks: make([]*agentv1.CommandAck, acks)}
		for i := range batch.Acks {
			batch.Acks[i] = &agentv1.CommandAck{}
		}
		return batch
	}
	send := func(batch *agentv1.AgentBatch) error {
		// A bound on a hang only: marshalling a million messages under -race on a loaded
		// machine takes most of 20 s.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		s := rawClient(t, env, tlsCert).Connect(ctx)
		defer func() { _ = s.CloseResponse() }()
		for _, m := range []*agentv1.AgentMessage{
			{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}},
			{Msg: &agentv1.AgentMessage_Batch{Batch: batch}},
			{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}},
		} {
			if err := s.Send(m); err != nil {
				break // the server ended the stream: Receive says why
			}
		}
		_ = s.CloseRequest()
		for {
			if _, err := s.Receive(); err != nil {
				if connect.CodeOf(err) == connect.CodeUnknown && err.Error() == "unknown: EOF" {
					return nil
				}
				return err
			}
		}
	}
	flood := batchOf(1 << 20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := send(flood)
	runtime.ReadMemStats(&after)
	if err == nil || connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a million empty acknowledgements: %v, want the stream refused (invalid argument: over %d elements)", err, gateway.MaxDecodedElements)
	}
	// Sending costs the client its 2 MiB frame and buffers; decoding it would have cost the
	// gateway (in this process too) about 100 MiB.
	if grew := (after.TotalAlloc - before.TotalAlloc) >> 20; grew > 48 {
		t.Errorf("%d MiB allocated for a refused frame of 2 MiB", grew)
	}
	if err := send(batchOf(512)); err != nil && connect.CodeOf(err) == connect.CodeInvalidArgument {
		t.Fatalf("512 acknowledgements refused: %v", err)
	}

	resp, err := httpClient(t, env, tls.Certificate{}).Post(env.URL+agentv1connect.GatewayServiceJoinProcedure, "application/json", bytes.NewReader([]byte(`{"token":"x"}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("a JSON join was answered %s", resp.Status)
	}
}
