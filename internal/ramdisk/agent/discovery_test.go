package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
	"bcd/internal/ramdisk/inventory"
)

type recordedDiscoveries struct {
	mu   sync.Mutex
	seen []netboot.Discovery
}

func (r *recordedDiscoveries) RecordDiscovery(_ context.Context, d netboot.Discovery) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, d)
	return nil
}

type noEntries struct{}

func (noEntries) Entry(context.Context, net.HardwareAddr) (netboot.Entry, bool) {
	return netboot.Entry{}, false
}

type noArtifacts struct{}

func (noArtifacts) Has(string) bool { return false }
func (noArtifacts) ServeArtifact(w http.ResponseWriter, _ *http.Request, _ string) {
	http.NotFound(w, nil)
}

// TestDiscoveryReportReachesTheSite: what a discovery-mode ramdisk posts is what the site's
// boot handler accepts and records for the boot MAC.
func TestDiscoveryReportReachesTheSite(t *testing.T) {
	rec := &recordedDiscoveries{}
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: "http://127.0.0.1:1", Entries: noEntries{}, Discovery: rec, Artifacts: noArtifacts{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	inv := inventory.Inventory{Disks: []inventory.Disk{{Name: "nvme0n1", Model: "Sam", SizeBytes: 1 << 40}}, Memory: inventory.Memory{TotalBytes: 64 << 30}}
	r := NewDiscoveryReport("52:54:00:ab:cd:ef", agentlink.NodeHints{ProductUUID: "4c4c4544-0042-3510-8057-b4c04f4b4d32", MACs: []string{"52:54:00:ab:cd:ef", "52:54:00:ab:cd:f0"}}, inv)
	if err := PostDiscoveryReport(context.Background(), srv.Client(), srv.URL+netboot.DiscoveryPath, r); err != nil {
		t.Fatal(err)
	}
	if len(rec.seen) != 1 || rec.seen[0].MAC.String() != "52:54:00:ab:cd:ef" {
		t.Fatalf("recorded %+v", rec.seen)
	}
	doc := string(rec.seen[0].Inventory)
	for _, want := range []string{`"systemUuid":"4c4c4544-0042-3510-8057-b4c04f4b4d32"`, `"macs":["52:54:00:ab:cd:ef","52:54:00:ab:cd:f0"]`, `"name":"nvme0n1"`, `"totalBytes":68719476736`} {
		if !strings.Contains(doc, want) {
			t.Errorf("recorded inventory lacks %s: %s", want, doc)
		}
	}
	// A refused report is an error naming the site's reason.
	r.BootMAC = "nope"
	if err := PostDiscoveryReport(context.Background(), srv.Client(), srv.URL+netboot.DiscoveryPath, r); err == nil || !strings.Contains(err.Error(), "bootMac") {
		t.Fatalf("bad report: %v", err)
	}
}
