package netboot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// logSink collects JSON log lines.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// records are the log lines whose message is msg, decoded.
func (s *logSink) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// pruneCache is a cache on a temp dir with the policy, a settable clock and a log sink.
func pruneCache(t *testing.T, dir string, p PrunePolicy, clk *clock, sink *logSink) *Cache {
	t.Helper()
	c, err := NewCache(CacheConfig{Dir: dir, Bound: p.Bound, Retain: p.Retain, Now: clk.Now,
		Logger: slog.New(slog.NewJSONHandler(sink, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// body is n bytes of content distinct for each seed.
func body(seed byte, n int) []byte { return bytes.Repeat([]byte{seed}, n) }

func inUse(shas ...string) func(context.Context) (map[string]bool, error) {
	return func(context.Context) (map[string]bool, error) {
		m := map[string]bool{}
		for _, s := range shas {
			m[s] = true
		}
		return m, nil
	}
}

func fetchAt(t *testing.T, c *Cache, clk *clock, at time.Time, a Artifact) {
	t.Helper()
	clk.Set(at)
	if err := c.Fetch(context.Background(), a); err != nil {
		t.Fatal(err)
	}
}

// TestCachePruneEvictsLRUKeepsInUse: over its bound, the cache evicts the least recently used
// artifact nothing uses, never the one in use (even though it is older), logs the eviction with
// digest, size, last use and reason, counts it, and fetches the evicted artifact again on demand.
func TestCachePruneEvictsLRUKeepsInUse(t *testing.T) {
	bodies := map[string][]byte{"/a": body('a', 1000), "/b": body('b', 1000), "/c": body('c', 1000)}
	o := newOrigin(t, bodies)
	arts := map[string]Artifact{}
	for p, b := range bodies {
		arts[p] = Artifact{Name: p[1:] + ".img", URL: o.srv.URL + p, SHA256: digest(b)}
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clk, sink := &clock{}, &logSink{}
	c := pruneCache(t, t.TempDir(), PrunePolicy{Bound: 2500}, clk, sink)
	added := c.Added()
	fetchAt(t, c, clk, t0, arts["/a"]) // the oldest, in use
	select {
	case <-added:
	default:
		t.Fatal("Added not signalled after a download")
	}
	fetchAt(t, c, clk, t0.Add(time.Hour), arts["/b"])   // the least recently used of the others
	fetchAt(t, c, clk, t0.Add(2*time.Hour), arts["/c"]) // the most recent
	if st := c.Stats(); st.Artifacts != 3 || st.Bytes != 3000 {
		t.Fatalf("stats before pruning %+v", st)
	}

	clk.Set(t0.Add(3 * time.Hour))
	res, err := c.Prune(context.Background(), inUse(arts["/a"].SHA256))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Evicted) != 1 || res.Evicted[0].SHA256 != arts["/b"].SHA256 || res.Evicted[0].Reason != EvictOverBound {
		t.Fatalf("evicted %+v, want b over the bound", res.Evicted)
	}
	if !c.Has(arts["/a"].SHA256) || c.Has(arts["/b"].SHA256) || !c.Has(arts["/c"].SHA256) {
		t.Fatalf("held after pruning: a %t, b %t, c %t; want a and c", c.Has(arts["/a"].SHA256), c.Has(arts["/b"].SHA256), c.Has(arts["/c"].SHA256))
	}
	want := CacheStats{Artifacts: 2, Bytes: 2000, Bound: 2500, Evictions: 1, EvictedBytes: 1000}
	if res.Stats != want || c.Stats() != want {
		t.Fatalf("stats %+v / %+v, want %+v", res.Stats, c.Stats(), want)
	}
	logs := sink.records(t, "artifact evicted from the cache")
	if len(logs) != 1 {
		t.Fatalf("%d eviction log lines, want 1", len(logs))
	}
	l := logs[0]
	if l["sha256"] != arts["/b"].SHA256 || l["bytes"] != float64(1000) || l["reason"] != "over-bound" ||
		l["last_use"] != t0.Add(time.Hour).Format(time.RFC3339) || l["unused_for"] != "2h0m0s" || l["bound_bytes"] != float64(2500) {
		t.Fatalf("eviction log line %v", l)
	}
	tmpEmpty(t, c)

	// Within the bound now: a second prune evicts nothing; the evicted one is fetched again.
	if res, err := c.Prune(context.Background(), inUse(arts["/a"].SHA256)); err != nil || len(res.Evicted) != 0 {
		t.Fatalf("second prune: %+v, %v", res.Evicted, err)
	}
	hits := o.hits.Load()
	fetchAt(t, c, clk, t0.Add(4*time.Hour), arts["/b"])
	if !c.Has(arts["/b"].SHA256) || o.hits.Load() != hits+1 {
		t.Fatalf("evicted artifact not fetched again (origin hits %d → %d)", hits, o.hits.Load())
	}
}

// gatedWriter lets a response write after bytes, then blocks until gate closes; reached is
// closed when it blocks. (It hides the ResponseWriter's ReadFrom: every byte goes through Write.)
type gatedWriter struct {
	http.ResponseWriter
	after   int
	written int
	blocked bool
	reached chan struct{}
	gate    chan struct{}
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	total := 0
	if !g.blocked && g.written+len(p) > g.after {
		g.blocked = true
		n, err := g.ResponseWriter.Write(p[:g.after-g.written])
		g.written += n
		total += n
		if err != nil {
			return total, err
		}
		if f, ok := g.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		close(g.reached)
		<-g.gate
		p = p[n:]
	}
	n, err := g.ResponseWriter.Write(p)
	g.written += n
	return total + n, err
}

// servePaused serves sha from c on loopback; the response stops after 64 KiB until release is
// called (at the latest when the test ends). The body, or the error reading it, arrives on
// the returned channel.
func servePaused(t *testing.T, c *Cache, sha string) (release func(), got <-chan []byte) {
	t.Helper()
	gw := &gatedWriter{after: 64 << 10, reached: make(chan struct{}), gate: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gw.ResponseWriter = w
		c.ServeArtifact(gw, r, sha)
	}))
	t.Cleanup(srv.Close)
	release = sync.OnceFunc(func() { close(gw.gate) })
	t.Cleanup(release) // before srv.Close, which waits for the handler
	out := make(chan []byte, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/artifacts/" + sha + "/x.img")
		if err != nil {
			out <- []byte(err.Error())
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			b = append(b, err.Error()...)
		}
		out <- b
	}()
	recv(t, gw.reached, "the response to stall after 64 KiB")
	return release, out
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestCachePruneSparesServedArtifact: an artifact being served is not evicted while the
// response runs, whatever the bound; it is once the response ended. And a response whose file
// is unlinked under it (an eviction between ServeArtifact's open and its count, or an
// operator's rm) still delivers every byte: the open file stays readable.
func TestCachePruneSparesServedArtifact(t *testing.T) {
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	other := body('o', 1<<20)
	o := newOrigin(t, map[string][]byte{"/big": big, "/other": other})
	art := Artifact{Name: "x.img", URL: o.srv.URL + "/big", SHA256: digest(big)}
	art2 := Artifact{Name: "y.img", URL: o.srv.URL + "/other", SHA256: digest(other)}
	clk, sink := &clock{}, &logSink{}
	clk.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	dir := t.TempDir()
	c := pruneCache(t, dir, PrunePolicy{Bound: 1}, clk, sink)
	for _, a := range []Artifact{art, art2} {
		if err := c.Fetch(context.Background(), a); err != nil {
			t.Fatal(err)
		}
	}

	release, got := servePaused(t, c, art.SHA256)
	res, err := c.Prune(context.Background(), inUse()) // nothing referenced, bound 1 byte
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Evicted) != 1 || res.Evicted[0].SHA256 != art2.SHA256 || !c.Has(art.SHA256) {
		t.Fatalf("evicted %+v while %s was served; want only the other one", res.Evicted, art.SHA256[:8])
	}
	if !res.OverBound {
		t.Error("the served artifact alone exceeds the bound: not reported")
	}
	release()
	if b := <-got; sum(b) != art.SHA256 {
		t.Fatalf("served %d bytes, digest differs", len(b))
	}
	c.mu.Lock()
	readers := c.readers[art.SHA256]
	c.mu.Unlock()
	if readers != 0 {
		t.Fatalf("%d readers counted after the response ended", readers)
	}
	res, err = c.Prune(context.Background(), inUse())
	if err != nil || len(res.Evicted) != 1 || res.Evicted[0].SHA256 != art.SHA256 {
		t.Fatalf("once served, not evicted: %+v, %v", res.Evicted, err)
	}

	// The file unlinked under an open response.
	if err := c.Fetch(context.Background(), art); err != nil {
		t.Fatal(err)
	}
	release, got = servePaused(t, c, art.SHA256)
	if err := os.Remove(filepath.Join(dir, "sha256", art.SHA256)); err != nil {
		t.Fatal(err)
	}
	release()
	if b := <-got; sum(b) != art.SHA256 {
		t.Fatalf("a response whose file was unlinked delivered %d bytes, digest differs", len(b))
	}
	if c.Has(art.SHA256) {
		t.Fatal("an unlinked artifact is still held")
	}
	// The next prune notices it is gone.
	if _, err := c.Prune(context.Background(), inUse()); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Artifacts != 0 || st.Bytes != 0 {
		t.Fatalf("stats after the file vanished: %+v", st)
	}
}

// TestCacheLastUseSurvivesRestart: the last use of each artifact is its file's modification
// time, set by the cache: a new Cache on the same directory evicts in the order of the last
// uses the earlier one saw, and retention counts from them.
func TestCacheLastUseSurvivesRestart(t *testing.T) {
	bodies := map[string][]byte{"/a": body('a', 1000), "/b": body('b', 1000)}
	o := newOrigin(t, bodies)
	a := Artifact{Name: "a.img", URL: o.srv.URL + "/a", SHA256: digest(bodies["/a"])}
	b := Artifact{Name: "b.img", URL: o.srv.URL + "/b", SHA256: digest(bodies["/b"])}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	clk, sink := &clock{}, &logSink{}
	policy := PrunePolicy{Bound: 1000, Retain: 7 * 24 * time.Hour}

	first, err := NewCache(CacheConfig{Dir: dir, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	fetchAt(t, first, clk, t0, a)
	fetchAt(t, first, clk, t0.Add(time.Hour), b)
	fetchAt(t, first, clk, t0.Add(2*time.Hour), a) // a hit: a use, written to disk (an hour since the last)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	for sha, want := range map[string]time.Time{a.SHA256: t0.Add(2 * time.Hour), b.SHA256: t0.Add(time.Hour)} {
		fi, err := os.Stat(filepath.Join(dir, "sha256", sha))
		if err != nil {
			t.Fatal(err)
		}
		if d := fi.ModTime().Sub(want).Abs(); d > time.Second {
			t.Errorf("%s: last use on disk %s, want %s", sha[:8], fi.ModTime().UTC(), want)
		}
	}

	clk.Set(t0.Add(3 * time.Hour))
	second := pruneCache(t, dir, policy, clk, sink)
	if st := second.Stats(); st.Artifacts != 2 || st.Bytes != 2000 {
		t.Fatalf("a reopened cache counts %+v", st)
	}
	res, err := second.Prune(context.Background(), inUse())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Evicted) != 1 || res.Evicted[0].SHA256 != b.SHA256 || res.Evicted[0].Reason != EvictOverBound {
		t.Fatalf("after a restart evicted %+v, want b (used before a)", res.Evicted)
	}
	// Under the bound now; a week after its last use, a goes for retention.
	clk.Set(t0.Add(2*time.Hour + 7*24*time.Hour - time.Second))
	if res, err := second.Prune(context.Background(), inUse()); err != nil || len(res.Evicted) != 0 {
		t.Fatalf("a second before its retention ends: %+v, %v", res.Evicted, err)
	}
	clk.Set(t0.Add(2*time.Hour + 7*24*time.Hour))
	res, err = second.Prune(context.Background(), inUse())
	if err != nil || len(res.Evicted) != 1 || res.Evicted[0].SHA256 != a.SHA256 || res.Evicted[0].Reason != EvictUnused {
		t.Fatalf("at its retention's end: %+v, %v", res.Evicted, err)
	}
	l := sink.records(t, "artifact evicted from the cache")
	if len(l) != 2 || l[1]["reason"] != "unused" || l[1]["retain"] != "168h0m0s" || l[1]["unused_for"] != "168h0m0s" {
		t.Fatalf("eviction log lines %v", l)
	}
}

// TestCachePruneReferencedCountsAsUsed: an artifact in use is touched by each prune, so that
// its retention runs from when nothing needs it any more, not from its last download.
func TestCachePruneReferencedCountsAsUsed(t *testing.T) {
	o := newOrigin(t, map[string][]byte{"/a": body('a', 10)})
	a := Artifact{Name: "a.img", URL: o.srv.URL + "/a", SHA256: digest(body('a', 10))}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clk, sink := &clock{}, &logSink{}
	c := pruneCache(t, t.TempDir(), PrunePolicy{Retain: 24 * time.Hour}, clk, sink)
	fetchAt(t, c, clk, t0, a)
	clk.Set(t0.Add(30 * 24 * time.Hour)) // a month in use, never served
	if res, err := c.Prune(context.Background(), inUse(a.SHA256)); err != nil || len(res.Evicted) != 0 {
		t.Fatalf("in use: %+v, %v", res.Evicted, err)
	}
	clk.Set(t0.Add(30*24*time.Hour + 23*time.Hour)) // unreferenced for 23 hours
	if res, err := c.Prune(context.Background(), inUse()); err != nil || len(res.Evicted) != 0 {
		t.Fatalf("retention counted from the download: %+v, %v", res.Evicted, err)
	}
	clk.Set(t0.Add(31 * 24 * time.Hour))
	if res, err := c.Prune(context.Background(), inUse()); err != nil || len(res.Evicted) != 1 {
		t.Fatalf("a day after its last reference: %+v, %v", res.Evicted, err)
	}
}

// TestCachePruneSparesConcurrentUse: a reference made while a prune runs, and the Fetch that
// follows it, keep the artifact even though the prune's list of references missed it. A failing
// list of references evicts nothing.
func TestCachePruneSparesConcurrentUse(t *testing.T) {
	bodies := map[string][]byte{"/a": body('a', 100), "/b": body('b', 100)}
	o := newOrigin(t, bodies)
	a := Artifact{Name: "a.img", URL: o.srv.URL + "/a", SHA256: digest(bodies["/a"])}
	b := Artifact{Name: "b.img", URL: o.srv.URL + "/b", SHA256: digest(bodies["/b"])}
	clk, sink := &clock{}, &logSink{}
	clk.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := pruneCache(t, t.TempDir(), PrunePolicy{Bound: 1}, clk, sink)
	for _, x := range []Artifact{a, b} {
		if err := c.Fetch(context.Background(), x); err != nil {
			t.Fatal(err)
		}
	}
	hits := o.hits.Load()

	_, err := c.Prune(context.Background(), func(context.Context) (map[string]bool, error) {
		return nil, errors.New("the boot entries are unreadable")
	})
	if err == nil || !strings.Contains(err.Error(), "listing the artifacts in use") || !c.Has(a.SHA256) || !c.Has(b.SHA256) {
		t.Fatalf("failing references: %v; held a %t b %t", err, c.Has(a.SHA256), c.Has(b.SHA256))
	}

	res, err := c.Prune(context.Background(), func(ctx context.Context) (map[string]bool, error) {
		// Listed before the reference was made; the Fetch that follows the reference comes
		// before the eviction.
		if err := c.Fetch(ctx, a); err != nil {
			return nil, err
		}
		return map[string]bool{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Has(a.SHA256) || c.Has(b.SHA256) || len(res.Evicted) != 1 {
		t.Fatalf("evicted %+v; a held %t, want a kept and b evicted", res.Evicted, c.Has(a.SHA256))
	}
	if o.hits.Load() != hits {
		t.Fatal("the Fetch during the prune downloaded again")
	}
}
