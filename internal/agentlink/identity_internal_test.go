package agentlink

import (
	"testing"
	"time"
)

// The transport declares a connection dead after three silent heartbeat intervals, as send
// declares a stream dead: a ping after one, unanswered for two more. Dead after two, a gateway
// that was only slow (a loaded host) cut joins with "http2: client connection lost".
func TestTransportConnectionDeadAfterThreeSilentIntervals(t *testing.T) {
	for _, hb := range []time.Duration{250 * time.Millisecond, time.Second, 10 * time.Second} {
		tr, err := transport(&Config{GatewayURL: "https://127.0.0.1:8443", HeartbeatInterval: hb}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.HTTP2.SendPingTimeout + tr.HTTP2.PingTimeout; tr.HTTP2.SendPingTimeout != hb || got != 3*hb {
			t.Errorf("heartbeat %v: ping after %v, dead after %v; want a ping after %v, dead after %v",
				hb, tr.HTTP2.SendPingTimeout, got, hb, 3*hb)
		}
	}
}
