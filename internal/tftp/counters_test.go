package tftp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"
)

// tftpCounts is a copy of the counters, for comparisons.
type tftpCounts struct {
	served, bytes uint64
	failed        [NumFailures]uint64
}

func countsOf(c *Counters) tftpCounts {
	s := tftpCounts{served: c.Served.Load(), bytes: c.Bytes.Load()}
	for i := range s.failed {
		s.failed[i] = c.Failed[i].Load()
	}
	return s
}

// Each read request is counted once: served whole with its bytes, or failed by reason.
func TestCountersOverLoopback(t *testing.T) {
	dir, files := debianIPXEDir(t)
	route, err := NewDirRoute(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer route.Close()
	counters := &Counters{}
	client := serveLoopback(t, Config{Routes: []Route{route}, Counters: counters})
	client.RequestTSize(true)
	tests := []struct {
		name  string
		moved func(c *tftpCounts)
	}{
		{"ipxe.efi", func(c *tftpCounts) { c.served++; c.bytes += uint64(len(files["ipxe.efi"])) }},
		{"undionly.kpxe", func(c *tftpCounts) { c.served++; c.bytes += uint64(len(files["undionly.kpxe"])) }},
		{"missing.efi", func(c *tftpCounts) { c.failed[FailNotFound]++ }},
		{"link", func(c *tftpCounts) { c.failed[FailNotFound]++ }}, // leads outside the directory
		{"../secret", func(c *tftpCounts) { c.failed[FailBadName]++ }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := countsOf(counters)
			tc.moved(&want)
			if wt, err := client.Receive(tc.name, "octet"); err == nil {
				var buf bytes.Buffer
				_, _ = wt.WriteTo(&buf)
			}
			// The server counts once its read handler returns, after the client has the last
			// block: poll with a deadline.
			deadline := time.Now().Add(10 * time.Second)
			for countsOf(counters) != want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := countsOf(counters); got != want {
				t.Errorf("counters %+v, want %+v", got, want)
			}
		})
	}
}

// A read request beyond the bounds is counted as busy.
func TestCountersBusy(t *testing.T) {
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := &Counters{}
	s, err := New(Config{Routes: []Route{fakeRoute{}}, Conn: conn, MaxPerClient: 1, Counters: c})
	if err != nil {
		t.Fatal(err)
	}
	// A transfer runs for the address the next request comes from (none: not over a socket).
	if _, _, err := s.acquire(netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if err := s.read(t.Context(), "ipxe.efi", &bytes.Buffer{}); err == nil {
		t.Fatal("second transfer from one address accepted")
	}
	if got := c.Failed[FailBusy].Load(); got != 1 {
		t.Errorf("busy = %d, want 1", got)
	}
}
