package site

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

func testRamdisk() RamdiskConfig {
	return RamdiskConfig{GatewayURL: "https://gw:7443",
		Kernel: netboot.Artifact{Name: "vmlinuz", URL: "http://o/vmlinuz", SHA256: strings.Repeat("a", 64)},
		Initrd: netboot.Artifact{Name: "initrd", URL: "http://o/initrd", SHA256: strings.Repeat("b", 64)}}
}

func TestBuildSync(t *testing.T) {
	es := []agentlink.BootEntry{
		{NodeID: "n1", Kind: "ramdisk", MACs: []string{"52:54:00:00:00:01"}, Token: "bcdd_one_0123456789abcdef"},
		{NodeID: "n2", Kind: "instance", MACs: []string{"52-54-00-00-00-02"}, Token: "bcdi_two_0123456789abcdef", Local: "sanboot"},
		{NodeID: "n3", Kind: "removed", MACs: []string{"52:54:00:00:00:03", "bad"}},
		{NodeID: "n4", Kind: "ramdisk", MACs: []string{"not a mac"}, Token: "bcdd_four_0123456789abcdef"},
		{NodeID: "n5", Kind: "pxe", MACs: []string{"52:54:00:00:00:05"}},
		{Kind: "ramdisk"},
		{NodeID: "n6", Kind: "sanboot", MACs: []string{"52:54:00:00:00:06"}, ISOName: "rescue.iso", ISOURL: "http://o/rescue.iso", ISOSHA256: strings.Repeat("C", 64)},
		{NodeID: "n7", Kind: "sanboot", MACs: []string{"52:54:00:00:00:07"}, ISOName: "rescue.iso", ISOURL: "http://o/rescue.iso"},
	}
	recs, err := buildSync(es, testRamdisk(), "exit")
	if err == nil || !strings.Contains(err.Error(), "node n4") || !strings.Contains(err.Error(), "node n5") || !strings.Contains(err.Error(), "node n7") {
		t.Errorf("error %v: want n4 (bad MAC), n5 (unknown kind) and n7 (ISO without sha256) named", err)
	}
	if len(recs) != 4 {
		t.Fatalf("records %+v, want n1 n2 n3 n6", recs)
	}
	if r := recs[3]; r.Entry == nil || r.Entry.Kind != netboot.KindSanboot || r.Entry.ISO.SHA256 != strings.Repeat("c", 64) || r.Entry.ISO.URL != "http://o/rescue.iso" ||
		len(r.Entry.Artifacts()) != 1 || r.Instance != "" {
		t.Errorf("sanboot record %+v", r)
	}
	if r := recs[0]; r.Entry == nil || r.Entry.Kind != netboot.KindRamdisk || r.Entry.Token != "bcdd_one_0123456789abcdef" || r.Instance != "" {
		t.Errorf("ramdisk record %+v", r)
	}
	if r := recs[1]; r.Entry == nil || r.Entry.Kind != netboot.KindLocal || r.Entry.Local != netboot.LocalSanbootDrive || r.Instance != "bcdi_two_0123456789abcdef" ||
		r.MACs[0] != "52:54:00:00:00:02" {
		t.Errorf("instance record %+v", r)
	}
	if r := recs[2]; r.Entry != nil || len(r.MACs) != 1 {
		t.Errorf("removal record %+v", r)
	}
	// No ramdisk configured: ramdisk entries cannot be served here, instances still can.
	recs, err = buildSync(es[:2], RamdiskConfig{}, "")
	if err == nil || len(recs) != 1 || recs[0].NodeID != "n2" || recs[0].Entry.Local != netboot.LocalSanbootDrive {
		t.Errorf("without a ramdisk: %+v, %v", recs, err)
	}
}

func TestEntriesSync(t *testing.T) {
	e, err := OpenEntries(t.TempDir(), "https://gw", nil)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := LocalEntry("", "")
	ram, _ := RamdiskEntry(testRamdisk(), "bcdd_x_0123456789abcdef")
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	if err := e.Install("old", []string{"52:54:00:00:00:09"}, local); err != nil {
		t.Fatal(err)
	}
	if err := e.Install("n1", []string{"52:54:00:00:00:01", "52:54:00:00:00:11"}, local); err != nil {
		t.Fatal(err)
	}
	// A delta replaces n1's entries (one MAC left) and keeps the others.
	if err := e.Sync(false, []syncRecord{{NodeID: "n1", MACs: []string{"52:54:00:00:00:01"}, Entry: &ram}}); err != nil {
		t.Fatal(err)
	}
	if got, ok := e.Entry(context.Background(), mac("52:54:00:00:00:01")); !ok || got.Kind != netboot.KindRamdisk {
		t.Errorf("n1 after delta: %+v %t", got, ok)
	}
	if e.Has("52:54:00:00:00:11") || !e.Has("52:54:00:00:00:09") {
		t.Error("delta: n1's dropped MAC kept, or another node's entry lost")
	}
	// A removal in a delta.
	if err := e.Sync(false, []syncRecord{{NodeID: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if e.Has("52:54:00:00:00:01") {
		t.Error("removed entry still served")
	}
	// A full table replaces everything, instance tokens included.
	if err := e.Sync(false, []syncRecord{{NodeID: "n2", MACs: []string{"52:54:00:00:00:02"}, Entry: &local, Instance: "bcdi_2"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(true, []syncRecord{{NodeID: "n3", MACs: []string{"52:54:00:00:00:03"}, Entry: &ram}}); err != nil {
		t.Fatal(err)
	}
	if e.Len() != 1 || !e.Has("52:54:00:00:00:03") || e.Has("52:54:00:00:00:09") {
		t.Errorf("after a full sync: %d entries", e.Len())
	}
	e.mu.Lock()
	_, inst := e.t.Instances["n2"]
	e.mu.Unlock()
	if inst {
		t.Error("a full sync kept an instance token of a node it does not list")
	}
	// The table is saved: a reopened one serves the same.
	e2, err := OpenEntries(e.path[:strings.LastIndex(e.path, "/")], "https://gw", nil)
	if err != nil || e2.Len() != 1 || !e2.Has("52:54:00:00:00:03") {
		t.Errorf("reopened: %v, %d entries", err, e2.Len())
	}
}

// fakeLink answers BootLease, PollSet and ReportPower as told.
type fakeLink struct {
	mu      sync.Mutex
	grant   agentlink.LeaseGrant
	err     error
	reqs    []agentlink.LeaseRequest
	reports [][]agentlink.PowerReading
	repErr  error
}

func (f *fakeLink) BootLease(_ context.Context, req agentlink.LeaseRequest) (agentlink.LeaseGrant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	return f.grant, f.err
}

func (f *fakeLink) PollSet(context.Context, uint64) ([]agentlink.PollTarget, time.Duration, error) {
	return nil, time.Minute, nil
}

func (f *fakeLink) ReportPower(_ context.Context, epoch uint64, rs []agentlink.PowerReading) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, rs)
	return f.repErr
}

func TestGatewayLease(t *testing.T) {
	ctx := context.Background()
	var applied [][]agentlink.BootEntry
	var applyErr error
	f := &fakeLink{}
	g := newGatewayLease(f, func(full bool, es []agentlink.BootEntry) error {
		applied = append(applied, es)
		return applyErr
	}, slog.New(slog.DiscardHandler))
	acquire := func() bool {
		t.Helper()
		held, err := g.Acquire(ctx, "s", "a", 5*time.Second)
		if err != nil && applyErr == nil {
			t.Fatal(err)
		}
		return held
	}

	f.grant = agentlink.LeaseGrant{Held: false, Holder: "b", Epoch: 4}
	if acquire() {
		t.Fatal("held while b holds it")
	}
	var rejected []string
	g.rejected = func(m []string) { rejected = m }
	f.grant = agentlink.LeaseGrant{Held: true, Holder: "a", Epoch: 5, Revision: 7, Full: true,
		Entries: []agentlink.BootEntry{{NodeID: "n1", Kind: "ramdisk"}}, Rejected: []string{"52:54:00:00:00:09"}}
	if !acquire() || len(applied) != 1 {
		t.Fatalf("take: applied %v", applied)
	}
	if len(rejected) != 1 || rejected[0] != "52:54:00:00:00:09" {
		t.Errorf("rejected MACs handed on: %v", rejected)
	}
	if ep, _ := g.Epoch(); ep != 5 {
		t.Errorf("epoch %d, want 5", ep)
	}
	f.grant = agentlink.LeaseGrant{Held: true, Holder: "a", Epoch: 5, Revision: 7}
	if !acquire() || len(applied) != 1 {
		t.Fatal("a renewal without entries applied something")
	}
	if r := f.reqs[len(f.reqs)-1]; r.Epoch != 5 || r.KnownRevision != 7 || r.TTL != 5*time.Second {
		t.Errorf("renewal request %+v: want epoch 5, revision 7", r)
	}
	// Entries that cannot be applied: not held, and everything is asked again next time.
	applyErr = errors.New("disk full")
	f.grant = agentlink.LeaseGrant{Held: true, Holder: "a", Epoch: 5, Revision: 8, Entries: []agentlink.BootEntry{{NodeID: "n2", Kind: "ramdisk"}}}
	if held, err := g.Acquire(ctx, "s", "a", 5*time.Second); held || err == nil {
		t.Errorf("unapplied entries: held %t, err %v", held, err)
	}
	applyErr = nil
	f.grant = agentlink.LeaseGrant{Held: true, Holder: "a", Epoch: 5, Revision: 8, Full: true}
	acquire()
	if r := f.reqs[len(f.reqs)-1]; r.Epoch != 0 || r.KnownRevision != 0 {
		t.Errorf("after a failed apply the agent asked %+v, want epoch 0 (everything again)", r)
	}
	if err := g.Release(ctx, "s", "a"); err != nil || !f.reqs[len(f.reqs)-1].Release {
		t.Errorf("release: %v %+v", err, f.reqs[len(f.reqs)-1])
	}
	if ep, _ := g.Epoch(); ep != 0 {
		t.Errorf("epoch %d after release", ep)
	}
	// A control plane without a lease: the agent is the only one, always held.
	f.err = agentlink.ErrUnsupported
	_, changed := g.Epoch()
	if !acquire() || !g.Unsupported() {
		t.Error("unsupported: not held")
	}
	select {
	case <-changed:
	default:
		t.Error("unsupported: pollers not told")
	}
	if n := len(f.reqs); !acquire() || len(f.reqs) != n {
		t.Error("unsupported: asked the gateway again")
	}
}

func TestLinkReporter(t *testing.T) {
	f := &fakeLink{}
	g := newGatewayLease(f, func(bool, []agentlink.BootEntry) error { return nil }, slog.New(slog.DiscardHandler))
	r := newLinkReporter(f, g, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, time.Millisecond) }()
	defer func() { cancel(); <-done }()
	sent := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, b := range f.reports {
			n += len(b)
		}
		return n
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(2 * time.Millisecond) // poll with a deadline
		}
	}
	// Not the holder: dropped.
	_ = r.ReportPower(ctx, PowerReading{NodeID: "n0", Power: "on"})
	wait("the reading dropped", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.pending) == 0 })
	if sent() != 0 {
		t.Fatal("a reading was sent without the lease")
	}
	g.setEpoch(3, 0)
	// A transient error: kept and sent again.
	f.mu.Lock()
	f.repErr = errors.New("unavailable")
	f.mu.Unlock()
	_ = r.ReportPower(ctx, PowerReading{NodeID: "n1", Err: errors.New("timeout"), Failures: 2})
	wait("a first attempt", func() bool { return sent() >= 1 })
	f.mu.Lock()
	f.repErr = nil
	f.mu.Unlock()
	wait("the retry", func() bool { return sent() >= 2 })
	f.mu.Lock()
	last := f.reports[len(f.reports)-1]
	f.mu.Unlock()
	if len(last) != 1 || last[0].NodeID != "n1" || last[0].Failures != 2 || last[0].Error != "timeout" || last[0].Power != "" {
		t.Errorf("retried batch %+v", last)
	}
}

// The agent answers its netboot handler's rejection lookups from what the last grant said.
func TestAgentRejected(t *testing.T) {
	a := &Agent{}
	mac, _ := net.ParseMAC("52:54:00:00:00:09")
	if a.Rejected(context.Background(), mac) {
		t.Fatal("rejected before any grant")
	}
	a.setRejected([]string{"52-54-00-00-00-09", "nonsense"})
	if !a.Rejected(context.Background(), mac) {
		t.Fatal("a rejected MAC is not rejected")
	}
	a.setRejected(nil)
	if a.Rejected(context.Background(), mac) {
		t.Fatal("a MAC stays rejected after the control plane stopped listing it")
	}
}
