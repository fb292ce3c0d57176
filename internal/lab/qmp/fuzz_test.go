package qmp

import (
	"testing"
)

// FuzzDispatch feeds arbitrary lines from the peer to the reply/event router: nothing may panic,
// and a pending command receives at most one reply.
func FuzzDispatch(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": 1}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "x"}, "id": 1}`))
	f.Add([]byte(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`))
	f.Add([]byte(`{"event": "RESET", "data": {"guest": true}, "timestamp": {}}`))
	f.Add([]byte(`{"QMP": {"version": {}}}`))
	f.Add([]byte(`{"return": {"status": "running"}, "id": "1"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, line []byte) {
		c := &Client{pending: map[uint64]chan reply{}, done: make(chan struct{})}
		ch := make(chan reply, 1)
		c.pending[1] = ch
		c.dispatch(line)
		c.dispatch(line)
		if len(c.events) > maxEvents {
			t.Fatalf("%d events recorded", len(c.events))
		}
	})
}
