package agentlink

import (
	"fmt"
	"testing"
)

// Every stream re-sends the acks of the commands whose answer has not come (resume). A stream
// that ends before its sender took them all (a gateway refusing the agent after its hello: a
// store behind what the agent saw, FAILED_PRECONDITION, for as long as no operator fences it)
// left the rest queued, and the next stream queued them all again: the outbox grew by the
// awaiting commands at every reconnect, and each stream sent every duplicate.
func TestResumeQueuesEachAckOnce(t *testing.T) {
	for _, tc := range []struct {
		name               string
		awaiting, sessions int
	}{
		{"one stream", 1000, 1},
		{"streams ending before their first frame", 1000, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := openJournal("", 100)
			if err != nil {
				t.Fatal(err)
			}
			l := &Link{j: j, running: map[string]*run{}, awaiting: map[string]Command{}}
			l.out.init()
			for i := range tc.awaiting {
				id := fmt.Sprintf("c%04d", i)
				l.awaiting[id] = Command{ID: id}
			}
			for range tc.sessions {
				l.resume()
				l.out.take() // the one frame each stream sent before it ended
			}
			l.resume()
			seen := map[string]int{}
			for {
				m, _ := l.out.take()
				if m == nil {
					break
				}
				for _, a := range m.GetBatch().GetAcks() {
					seen[a.GetCommandId()]++
				}
				if a := m.GetAck(); a != nil {
					seen[a.GetCommandId()]++
				}
			}
			if len(seen) != tc.awaiting {
				t.Fatalf("%d commands acknowledged, want %d", len(seen), tc.awaiting)
			}
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("the last stream acknowledges %s %d times, want once", id, n)
				}
			}
		})
	}
}
