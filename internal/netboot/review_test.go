package netboot

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

type failingDiscovery struct{}

func (failingDiscovery) RecordDiscovery(context.Context, Discovery) error {
	return errors.New("queue full")
}

type noBinding struct{}

func (noBinding) BootsFrom(net.HardwareAddr, netip.Addr) bool { return false }

// TestScriptRequestFloodsLoggedOncePerMinute: anyone on the provisioning network can ask for
// boot scripts in a loop; what the handler logs about them comes once a minute per source (and
// MAC), the next line saying how many were held back, so the agent's log cannot be flooded.
func TestScriptRequestFloodsLoggedOncePerMinute(t *testing.T) {
	mac := "52:54:00:00:00:aa"
	entry := Entry{Kind: KindLocal, Local: LocalExit}
	waiting := ramdiskEntry()
	tests := []struct {
		name    string
		msg     string // the log line
		query   string // of a script request; "" for target
		entries fakeEntries
		setup   func(h *Handler)
		target  string // another request: "METHOD path", body
		body    string
	}{
		{"malformed query", "boot script request refused", "mac=zz", fakeEntries{}, nil, "", ""},
		{"withheld script", "boot script withheld: the request did not come from the address the site's DHCP saw this MAC take",
			"mac=" + mac + "&arch=x86_64", fakeEntries{mac: entry}, func(h *Handler) { h.bindings = noBinding{} }, "", ""},
		{"discovery not recorded", "recording discovery", "mac=" + mac + "&arch=x86_64", fakeEntries{},
			func(h *Handler) { h.discovery = failingDiscovery{} }, "", ""},
		{"artifacts not cached", "boot waits for artifact", "mac=" + mac + "&arch=x86_64", fakeEntries{mac: waiting}, nil, "", ""},
		{"rejected machine polling", "discovery-mode ramdisk told its decision: rejected", "", fakeEntries{},
			func(h *Handler) { h.rejects = fakeRejections{mac: true} }, "GET " + DecisionPath + "?mac=" + mac, ""},
		{"discovery reports in a loop", "discovery report recorded (self-asserted)", "", fakeEntries{}, nil,
			"POST " + DiscoveryPath, `{"bootMac":"` + mac + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newTestHandler(t, tt.entries, fakeArtifacts{})
			if tt.setup != nil {
				tt.setup(h)
			}
			var logged bytes.Buffer
			h.log = slog.New(slog.NewJSONHandler(&logged, nil))
			now := time.Unix(5000, 0)
			h.now = func() time.Time { return now }
			get := func() {
				req := httptest.NewRequest("GET", ScriptPath+"?"+tt.query, nil)
				if tt.target != "" {
					method, target, _ := strings.Cut(tt.target, " ")
					req = httptest.NewRequest(method, target, strings.NewReader(tt.body))
				}
				req.RemoteAddr = "10.0.0.9:1234"
				h.ServeHTTP(httptest.NewRecorder(), req)
			}
			lines := func() []map[string]any { return logLines(t, &logged, tt.msg) }
			for range 100 {
				get()
			}
			if got := lines(); len(got) != 1 {
				t.Fatalf("%d lines %q for 100 requests, want 1", len(got), tt.msg)
			}
			now = now.Add(time.Minute)
			get()
			if got := lines(); len(got) != 2 || got[1]["held_back"] != float64(99) {
				t.Fatalf("after a minute: %v, want a second line holding back 99", got)
			}
		})
	}
}
