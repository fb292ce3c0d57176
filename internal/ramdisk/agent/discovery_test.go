package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
	"bcd/internal/pki"
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

type switchEntries struct {
	mu sync.Mutex
	m  map[string]netboot.Entry
}

func (s *switchEntries) Entry(_ context.Context, mac net.HardwareAddr) (netboot.Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[mac.String()]
	return e, ok
}

// TestDecisionReachesTheRamdisk: a discovery-mode ramdisk asking the site's boot handler learns
// nothing until a ramdisk entry exists for its boot MAC, then joins with that entry's gateway,
// token and CA.
func TestDecisionReachesTheRamdisk(t *testing.T) {
	ca, err := pki.CreateCA("test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const token = "tok_AbCdEfGhIjKlMnOp0123456789"
	sha := strings.Repeat("a", 64)
	ramdisk := netboot.Entry{Kind: netboot.KindRamdisk, Kernel: netboot.Artifact{Name: "vmlinuz", URL: "http://o.example/k", SHA256: sha},
		Initrd: netboot.Artifact{Name: "initrd.img", URL: "http://o.example/i", SHA256: sha}, GatewayURL: "https://gw.example:8443",
		Token: token, CA: base64.RawURLEncoding.EncodeToString(ca.CertPEM())}
	entries := &switchEntries{m: map[string]netboot.Entry{}}
	rec := &recordedDiscoveries{}
	rejected := rejections{"52:54:00:ab:cd:f0": true}
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: "http://127.0.0.1:1", Entries: entries, Discovery: rec, Artifacts: noArtifacts{}, Rejections: rejected})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	report := srv.URL + netboot.DiscoveryPath
	const mac = "52:54:00:ab:cd:ef"
	ask := func() (BootParams, Verdict, error) { return AskDecision(t.Context(), srv.Client(), report, mac) }
	if _, v, err := ask(); v != VerdictPending || err != nil {
		t.Fatalf("before any decision: %v %v", v, err)
	}
	if _, v, err := AskDecision(t.Context(), srv.Client(), report, "52:54:00:ab:cd:f0"); v != VerdictReject || err != nil {
		t.Fatalf("a rejected machine: %v %v", v, err)
	}
	entries.mu.Lock()
	entries.m[mac] = netboot.Entry{Kind: netboot.KindLocal, Local: netboot.LocalExit}
	entries.mu.Unlock()
	if _, v, err := ask(); v != VerdictPending || err != nil {
		t.Fatalf("with a local entry: %v %v", v, err)
	}
	entries.mu.Lock()
	entries.m[mac] = ramdisk
	entries.mu.Unlock()
	p, v, err := ask()
	if err != nil || v != VerdictJoin {
		t.Fatalf("accepted: %v %v", v, err)
	}
	if p.Mode != ModeJoin || p.Token != token || p.GatewayURL != "https://gw.example:8443" || !bytes.Equal(p.CAPEM, ca.CertPEM()) {
		t.Fatalf("join parameters %v (CA %d bytes)", p, len(p.CAPEM))
	}
	if _, _, err := AskDecision(t.Context(), srv.Client(), srv.URL+"/nothing", mac); err == nil {
		t.Error("a 404 was taken for a decision")
	}
	if len(rec.seen) != 0 {
		t.Errorf("decision requests were recorded as discoveries: %d", len(rec.seen))
	}
}

type rejections map[string]bool

func (r rejections) Rejected(_ context.Context, mac net.HardwareAddr) bool { return r[mac.String()] }
