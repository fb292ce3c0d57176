package tftp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pintftp "github.com/pin/tftp/v3"
	"go.uber.org/goleak"
)

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("counting open files: %v", err)
	}
	return len(es)
}

// floodClient sends read requests from one loopback address and never acknowledges; it counts
// the TFTP errors that say the server is busy.
type floodClient struct {
	conn net.PacketConn
	busy atomic.Int64
}

func newFloodClient(t *testing.T, ip string) *floodClient {
	t.Helper()
	pc, err := net.ListenPacket("udp4", ip+":0")
	if err != nil {
		t.Fatalf("binding %s: %v", ip, err)
	}
	c := &floodClient{conn: pc}
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n >= 4 && binary.BigEndian.Uint16(buf) == 5 && strings.Contains(string(buf[4:n]), "too many transfers") {
				c.busy.Add(1)
			}
		}
	}()
	t.Cleanup(func() { pc.Close() })
	return c
}

// TestReadRequestFloodIsBounded: read requests nobody acknowledges hold a transfer each (a UDP
// socket, a goroutine and the open file) for the retransmit schedule. The transfers in
// progress stay within the per-address bound for one address and within the global bound for
// many; the requests beyond are answered with a TFTP error at once, and the server serves
// again once the abandoned transfers timed out.
func TestReadRequestFloodIsBounded(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const maxTransfers, maxPerClient = 12, 3
	tests := []struct {
		name      string
		clients   int // loopback addresses 127.0.0.2, 127.0.0.3, …
		perClient int // requests each sends
		wantPeak  int
	}{
		{"one address", 1, 200, maxPerClient},
		{"many addresses", 20, 10, maxTransfers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			body := bytes.Repeat([]byte("E"), 1<<20)
			if err := os.WriteFile(filepath.Join(dir, "ipxe.efi"), body, 0o644); err != nil {
				t.Fatal(err)
			}
			route, err := NewDirRoute(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer route.Close()
			pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv, err := New(Config{Routes: []Route{route}, Conn: pc, Timeout: 300 * time.Millisecond, Retries: 3,
				MaxTransfers: maxTransfers, MaxPerClient: maxPerClient})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Serve: %v", err)
				}
			}()

			before := openFDs(t)
			rrq := append([]byte{0, 1}, []byte("ipxe.efi\x00octet\x00")...)
			clients := make([]*floodClient, tt.clients)
			for i := range clients {
				clients[i] = newFloodClient(t, fmt.Sprintf("127.0.0.%d", i+2))
			}
			for range tt.perClient {
				for _, c := range clients {
					if _, err := c.conn.WriteTo(rrq, pc.LocalAddr()); err != nil {
						t.Fatal(err)
					}
				}
			}
			sent := tt.clients * tt.perClient
			// Every request is either a transfer or refused; wait until all were handled.
			deadline := time.Now().Add(20 * time.Second)
			var peak, refused int
			for {
				srv.mu.Lock()
				peak, refused = srv.peak, srv.refused
				srv.mu.Unlock()
				if refused >= sent-4*maxTransfers { // a transfer that timed out frees its slot
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after %d requests: %d refused, peak %d", sent, refused, peak)
				}
				time.Sleep(10 * time.Millisecond)
			}
			// pin/tftp opens a socket for each request before asking the server, which closes
			// it at once when a bound refuses the request: what stays open is the clients'
			// sockets, and a socket and a file per transfer.
			limit := before + tt.clients + 2*maxTransfers + 4
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				fds := openFDs(t)
				if fds <= limit {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d open files after the flood (%d before, at most %d expected): the transfers are not bounded", fds, before, limit)
				}
			}
			if peak != tt.wantPeak {
				t.Errorf("at most %d transfers at once, want %d (the bound)", peak, tt.wantPeak)
			}
			var busy int64
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				busy = 0
				for _, c := range clients {
					busy += c.busy.Load()
				}
				if busy > 0 {
					break
				}
			}
			if busy == 0 {
				t.Error("no refused request was answered with a TFTP error")
			}
			t.Logf("%d requests: peak %d transfers, %d refused, %d busy errors received", sent, peak, refused, busy)

			// The abandoned transfers time out and free their slots: a client that acknowledges
			// is served again.
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				srv.mu.Lock()
				active := srv.active
				srv.mu.Unlock()
				if active == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d transfers still in progress", active)
				}
			}
			cl, err := pintftp.NewClient(pc.LocalAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			cl.SetTimeout(500 * time.Millisecond)
			wt, err := cl.Receive("ipxe.efi", "octet")
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if _, err := wt.WriteTo(&buf); err != nil || !bytes.Equal(buf.Bytes(), body) {
				t.Fatalf("after the flood: %d bytes, %v", buf.Len(), err)
			}
		})
	}
}
