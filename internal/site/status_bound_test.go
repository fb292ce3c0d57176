package site_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/netboot"
	"bcd/internal/site"
)

// TestDiscoveryFloodKeepsTheLink: hosts on the provisioning network post discovery reports
// (unauthenticated, up to 64 KiB each) with distinct MACs, more than the gateway's 16 MiB frame
// would hold in one status report. The agent keeps a bounded amount (beyond, while what waits to
// be sent fills it, reports are refused with 503: a ramdisk retries), sends them at most 1 MiB
// per report on its one stream, and commands still flow. Before the bound, the status report exceeded the gateway's frame limit,
// the gateway ended every stream it came first on, and no command was ever acknowledged.
func TestDiscoveryFloodKeepsTheLink(t *testing.T) {
	env := startGateway(t)
	var logs syncBuffer
	cfg := agentConfig(t, env, "a1", t.TempDir(), logger(t, &logs))
	cfg.DiscoveryBoot = true
	ag := startAgent(t, cfg, "a1")
	link, err := ag.Link(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	accepted, refused := postDiscoveries(t, ag, 320)

	// Every inventory kept reaches the control plane, over several reports.
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := map[string]bool{}
		for i, st := range env.Queue.Statuses(ag.ref) {
			size := 0
			for _, d := range st.Discovered {
				if d.Inventory != "" {
					got[d.MAC] = true
					size += len(d.Inventory)
				}
			}
			if size > 1<<20 {
				t.Fatalf("status report %d carries %d bytes of inventories, more than 1 MiB", i, size)
			}
		}
		if len(got) >= len(accepted) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d inventories reached the control plane", len(got), len(accepted))
		}
		time.Sleep(50 * time.Millisecond) // poll with a deadline: the statuses are a list the test scans
	}
	// Commands flow on the same stream.
	if u := do(t, env, ag, "c1", site.KindBMCQuery, "n1", map[string]any{}); !u.Final() {
		t.Fatalf("command c1: %+v", u)
	}
	if n := link.Sessions(); n != 1 {
		t.Errorf("%d streams: the status reports broke the link", n)
	}
	t.Logf("%d reports kept, %d refused; %d status reports", len(accepted), refused, len(env.Queue.Statuses(ag.ref)))
}

// TestDiscoveryReportsWaitForTheStream: while a status report is still on its way (a slow link
// to the control plane: here 1 MiB/s, so that a report of 1 MiB takes longer than the half second
// between reports), the agent does not replace the report it has not handed to the stream yet
// with the next one: the inventories the replaced one carried were counted as sent and never
// reached the control plane (a flood on a loaded machine lost 14 of 320). Every inventory kept
// arrives.
func TestDiscoveryReportsWaitForTheStream(t *testing.T) {
	env := startGateway(t)
	var logs syncBuffer
	cfg := agentConfig(t, env, "a1", t.TempDir(), logger(t, &logs))
	cfg.DiscoveryBoot = true
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = slowLink(t, u.Host, 1<<20)
	cfg.GatewayURL = u.String()
	// Heartbeats far apart: the link is slow, not dead (a new stream sends every inventory
	// again, which would hide the loss).
	cfg.HeartbeatInterval = time.Minute
	ag := startAgent(t, cfg, "a1")
	link, err := ag.Link(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	accepted, _ := postDiscoveries(t, ag, 96)
	deadline := time.Now().Add(45 * time.Second) // 6 MiB at 1 MiB/s
	for {
		got := map[string]bool{}
		for _, st := range env.Queue.Statuses(ag.ref) {
			for _, d := range st.Discovered {
				if d.Inventory != "" {
					got[d.MAC] = true
				}
			}
		}
		if len(got) >= len(accepted) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d inventories reached the control plane (%d streams)", len(got), len(accepted), link.Sessions())
		}
		time.Sleep(50 * time.Millisecond) // poll with a deadline: the statuses are a list the test scans
	}
	t.Logf("%d inventories over %d streams", len(accepted), link.Sessions())
}

// postDiscoveries posts n discovery reports of nearly the largest size, each of its own MAC, to
// the agent: the MACs it accepted, and how many it refused (503: its queue is full).
func postDiscoveries(t *testing.T, ag *testAgent, n int) (map[string]bool, int) {
	t.Helper()
	pad := strings.Repeat("x", netboot.MaxDiscoveryReport-200)
	accepted, refused := map[string]bool{}, 0
	for i := range n {
		mac := fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)
		body := fmt.Sprintf(`{"bootMac":%q,"disks":%q}`, mac, pad)
		resp, err := http.Post(ag.BootURL()+netboot.DiscoveryPath, "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusNoContent:
			accepted[mac] = true
		case http.StatusServiceUnavailable:
			refused++
		default:
			t.Fatalf("report %d: HTTP %d", i, resp.StatusCode)
		}
	}
	return accepted, refused
}

// slowLink forwards loopback TCP connections to backend, the bytes towards it at rate bytes a
// second (those back at full speed), and returns its address.
func slowLink(t *testing.T, backend string, rate int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(cs ...net.Conn) {
		mu.Lock()
		conns = append(conns, cs...)
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			track(c, b)
			wg.Go(func() {
				defer b.Close()
				buf := make([]byte, 16<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := b.Write(buf[:n]); werr != nil {
							return
						}
						time.Sleep(time.Duration(n) * time.Second / time.Duration(rate)) // the link's rate
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, b)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
