package site

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bcd/internal/netboot"
)

// TestCacheInUse: what the agent's pruning keeps is every artifact a boot entry boots, every
// ISO a BMC's virtual media may read, the configured ramdisk and what a retry loop fetches;
// an artifact none of them names is evicted once over the bound, and an ISO whose last
// reference went (an eject) is evicted once its retention ends.
func TestCacheInUse(t *testing.T) {
	files := map[string][]byte{}
	for _, n := range []string{"vmlinuz", "initrd", "entry.iso", "mounted.iso", "fetching.iso", "old.iso", "new.iso"} {
		files["/"+n] = bytes.Repeat([]byte(n), 100)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(files[r.URL.Path]) }))
	defer srv.Close()
	art := func(n string) netboot.Artifact {
		s := sha256.Sum256(files["/"+n])
		return netboot.Artifact{Name: n, URL: srv.URL + "/" + n, SHA256: hex.EncodeToString(s[:])}
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	dir := t.TempDir()
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	c, err := netboot.NewCache(netboot.CacheConfig{Dir: dir, Bound: total - 1, Retain: 7 * 24 * time.Hour, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for i, n := range []string{"old.iso", "vmlinuz", "initrd", "entry.iso", "mounted.iso", "fetching.iso", "new.iso"} {
		now = time.Date(2030, 1, 1, i, 0, 0, 0, time.UTC) // old.iso is the least recently used
		if err := c.Fetch(ctx, art(n)); err != nil {
			t.Fatal(err)
		}
	}
	e, err := OpenEntries(dir, "https://gw", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Install("n1", []string{"52:54:00:00:00:01"}, netboot.Entry{Kind: netboot.KindSanboot, ISO: art("entry.iso")}); err != nil {
		t.Fatal(err)
	}
	mounts, err := openMediaMounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mounts.Add("n2", art("mounted.iso"), now); err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{Ramdisk: RamdiskConfig{Kernel: art("vmlinuz"), Initrd: art("initrd")}}, entries: e, mounts: mounts, cache: c,
		log: slog.New(slog.DiscardHandler), fetching: map[string]*fetchLoop{art("fetching.iso").SHA256: {}}}
	a.cfg.Ramdisk.Kernel.SHA256 = strings.ToUpper(a.cfg.Ramdisk.Kernel.SHA256) // as an embedder may give it

	refs, err := a.cacheInUse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"vmlinuz", "initrd", "entry.iso", "mounted.iso", "fetching.iso"} {
		if !refs[art(n).SHA256] {
			t.Errorf("%s is not kept", n)
		}
	}
	if len(refs) != 5 {
		t.Errorf("%d digests kept, want 5", len(refs))
	}

	now = now.Add(time.Hour)
	res, err := c.Prune(ctx, a.cacheInUse)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Evicted) != 1 || res.Evicted[0].SHA256 != art("old.iso").SHA256 {
		t.Fatalf("evicted %+v, want old.iso only", res.Evicted)
	}
	if f := (&Agent{cache: c}).statusFacts(); f["cacheEvictions"] != "1" || f["cacheArtifacts"] != "6" || f["cacheBoundBytes"] == "0" || f["cacheRetain"] != "168h0m0s" {
		t.Errorf("status facts %v", f)
	}

	// The ISO ejected, unreferenced: kept a week after its last reference (the prune above),
	// then evicted; new.iso, never referenced, went a week after its download.
	if err := mounts.Clear("n2"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(7*24*time.Hour - time.Minute)
	res, err = c.Prune(ctx, a.cacheInUse)
	if err != nil || len(res.Evicted) != 1 || res.Evicted[0].SHA256 != art("new.iso").SHA256 || res.Evicted[0].Reason != netboot.EvictUnused {
		t.Fatalf("a minute before the ejected ISO's retention ends: %+v, %v; want new.iso, unused", res.Evicted, err)
	}
	now = now.Add(time.Minute)
	res, err = c.Prune(ctx, a.cacheInUse)
	if err != nil || len(res.Evicted) != 1 || res.Evicted[0].SHA256 != art("mounted.iso").SHA256 || res.Evicted[0].Reason != netboot.EvictUnused {
		t.Fatalf("a week after the eject: %+v, %v; want mounted.iso, unused", res.Evicted, err)
	}
	for _, n := range []string{"vmlinuz", "initrd", "entry.iso", "fetching.iso"} {
		if !c.Has(art(n).SHA256) {
			t.Errorf("%s, in use, was evicted", n)
		}
	}
}

// TestMediaMounts: the ISOs a node's BMC may read, kept across restarts: an insert adds one,
// its success keeps it alone, a failed fetch drops it, an eject forgets them all.
func TestMediaMounts(t *testing.T) {
	dir := t.TempDir()
	iso := func(n string) netboot.Artifact {
		return netboot.Artifact{Name: n + ".iso", SHA256: strings.Repeat(n, 64)}
	}
	m, err := openMediaMounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	digests := func(m *mediaMounts) string {
		set := map[string]bool{}
		m.AddDigests(set)
		var s []string
		for _, n := range []string{"a", "b", "c"} {
			if set[iso(n).SHA256] {
				s = append(s, n)
			}
		}
		return strings.Join(s, ",")
	}
	steps := []struct {
		name string
		do   func() error
		want string
	}{
		{"insert a", func() error { _, err := m.Add("n1", iso("a"), time.Now()); return err }, "a"},
		{"a taken", func() error { return m.Only("n1", iso("a").SHA256) }, "a"},
		{"insert b: both may be read until the BMC took b", func() error { _, err := m.Add("n1", iso("b"), time.Now()); return err }, "a,b"},
		{"b taken: a is gone", func() error { return m.Only("n1", iso("b").SHA256) }, "b"},
		{"another node inserts c", func() error { _, err := m.Add("n2", iso("c"), time.Now()); return err }, "b,c"},
		{"its fetch failed", func() error { return m.Drop("n2", iso("c").SHA256) }, "b"},
		{"eject", func() error { return m.Clear("n1") }, ""},
		{"eject again", func() error { return m.Clear("n1") }, ""},
		{"insert a again", func() error { _, err := m.Add("n1", iso("a"), time.Now()); return err }, "a"},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := digests(m); got != s.want {
			t.Fatalf("%s: %q, want %q", s.name, got, s.want)
		}
		reopened, err := openMediaMounts(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := digests(reopened); got != s.want {
			t.Fatalf("%s, reopened: %q, want %q", s.name, got, s.want)
		}
	}
	if added, err := m.Add("n1", iso("a"), time.Now()); err != nil || added {
		t.Fatalf("adding what is recorded: added %t, %v", added, err)
	}
}
