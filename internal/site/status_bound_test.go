package site_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
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

	pad := strings.Repeat("x", netboot.MaxDiscoveryReport-200)
	accepted := map[string]bool{}
	refused := 0
	for i := range 320 {
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
