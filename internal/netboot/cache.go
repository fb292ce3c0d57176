package netboot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"bcd/internal/durable"
)

// DefaultFetchTimeout bounds one download (it runs detached from the callers waiting for it).
const DefaultFetchTimeout = 30 * time.Minute

// CacheConfig configures an artifact cache.
type CacheConfig struct {
	Dir      string       // holds sha256/<hex> (verified files only) and tmp/ (downloads in progress)
	Client   *http.Client // nil: a client with a 30 min overall timeout
	MaxBytes int64        // largest artifact accepted; 0: 8 GiB
	// FetchTimeout bounds one download; 0: DefaultFetchTimeout.
	FetchTimeout time.Duration
	// Bound and Retain are what Prune keeps (PrunePolicy); zero values keep everything.
	Bound  int64
	Retain time.Duration
	Logger *slog.Logger
	Now    func() time.Time // default time.Now
}

// Cache holds artifacts fetched from their origin URLs. A file becomes visible (Has, Open) only
// after its content hashed to the expected SHA-256: it is written to a temporary file, hashed
// while written, and renamed into place on a match; on a mismatch it is deleted. A cache
// directory belongs to one Cache at a time: opening it removes what tmp/ holds (downloads a
// crash interrupted).
//
// Prune removes the artifacts nothing uses any more (PlanPrune). What a Fetch, a response of
// ServeArtifact or a download in progress uses is never removed by a Prune running at the same
// time; the last use of each artifact is its file's modification time (set by the cache, at most
// every touchEvery), so that it survives restarts.
type Cache struct {
	root     *os.Root
	dir      string
	client   *http.Client
	maxBytes int64
	timeout  time.Duration
	policy   PrunePolicy
	now      func() time.Time
	log      *slog.Logger

	pruneMu sync.Mutex // one Prune at a time

	mu      sync.Mutex
	flights map[string]*flight // digest → the download in progress
	closed  bool
	wg      sync.WaitGroup // downloads in progress
	seq     uint64         // bumped at every use
	uses    map[string]use // digest → its last use by this process
	readers map[string]int // digest → responses of ServeArtifact serving it now
	held    map[string]int64
	added   chan struct{} // closed and replaced when an artifact is cached
	// Evictions since the cache was opened; overBound: the last Prune found the artifacts in
	// use alone above the bound.
	evictions, evictedBytes int64
	overBound               bool
}

// use is the last use of a digest by this process: its sequence number (Prune spares what was
// used after it began), its time, and when its file's modification time was last set.
type use struct {
	seq     uint64
	at      time.Time
	touched time.Time
}

// touchEvery spaces the writes of an artifact's last use to its file: the ranges a BMC's
// virtual media reads would otherwise each cost a metadata write. A restart loses at most this
// much of the last-use order.
const touchEvery = time.Hour

// flight is one download that concurrent fetches of a digest share. It runs detached from their
// contexts and is cancelled only when none of them still waits for it.
type flight struct {
	done    chan struct{} // closed when err is set
	err     error
	waiters int
	cancel  context.CancelFunc
}

// NewCache creates the cache directories if needed, removes the partial downloads a crash left
// in tmp/, and opens the cache.
func NewCache(cfg CacheConfig) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("artifact cache: no directory configured")
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "sha256"), filepath.Join(cfg.Dir, "tmp")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("artifact cache: creating %s: %w", d, err)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := sweepTmp(filepath.Join(cfg.Dir, "tmp"), log); err != nil {
		return nil, fmt.Errorf("artifact cache: %w", err)
	}
	root, err := os.OpenRoot(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("artifact cache: opening %s: %w", cfg.Dir, err)
	}
	c := &Cache{root: root, dir: cfg.Dir, client: cfg.Client, maxBytes: cfg.MaxBytes, timeout: cfg.FetchTimeout, log: log,
		policy: PrunePolicy{Bound: cfg.Bound, Retain: cfg.Retain}, now: cfg.Now,
		flights: map[string]*flight{}, uses: map[string]use{}, readers: map[string]int{}, held: map[string]int64{},
		added: make(chan struct{})}
	if c.now == nil {
		c.now = time.Now
	}
	held, err := c.scan()
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("artifact cache: %w", err)
	}
	for _, h := range held {
		c.held[h.SHA256] = h.Bytes
	}
	if c.client == nil {
		c.client = &http.Client{Timeout: DefaultFetchTimeout}
	}
	if c.maxBytes <= 0 {
		c.maxBytes = 8 << 30
	}
	if c.timeout <= 0 {
		c.timeout = DefaultFetchTimeout
	}
	return c, nil
}

// sweepTmp removes the partial downloads left in dir (a crash, a power loss in the middle of a
// download): nothing else removes them, and each may be as large as an artifact.
func sweepTmp(dir string, log *slog.Logger) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("listing partial downloads in %s: %w", dir, err)
	}
	var errs []error
	removed := 0
	for _, de := range des {
		if err := os.RemoveAll(filepath.Join(dir, de.Name())); err != nil {
			errs = append(errs, fmt.Errorf("removing partial download %s: %w", de.Name(), err))
			continue
		}
		removed++
	}
	if removed > 0 {
		log.Info("artifact cache: removed partial downloads an earlier run left", "dir", dir, "files", removed)
	}
	return errors.Join(errs...)
}

// Close cancels the downloads in progress, waits for them and releases the cache directory
// handle.
func (c *Cache) Close() error {
	c.mu.Lock()
	c.closed = true
	for _, f := range c.flights {
		f.cancel()
	}
	c.mu.Unlock()
	c.wg.Wait()
	c.pruneMu.Lock() // a Prune running ends first
	defer c.pruneMu.Unlock()
	return c.root.Close()
}

// Has reports whether the artifact with this digest is held, verified.
func (c *Cache) Has(sha string) bool {
	if !IsSHA256(sha) {
		return false
	}
	fi, err := c.root.Stat(filepath.Join("sha256", sha))
	return err == nil && fi.Mode().IsRegular()
}

// Open opens a verified artifact for reading. The reader is not counted as a use: a Prune may
// remove the artifact meanwhile, and the open file stays readable (an unlinked file lives on
// until its last descriptor closes).
func (c *Cache) Open(sha string) (*os.File, error) {
	if !IsSHA256(sha) {
		return nil, fmt.Errorf("opening artifact: %w", fs.ErrInvalid)
	}
	f, err := c.root.Open(filepath.Join("sha256", sha))
	if err != nil {
		return nil, fmt.Errorf("opening artifact %s: %w", sha, err)
	}
	return f, nil
}

// Fetch makes sure the artifact is held, downloading it if needed. Concurrent fetches of one
// digest share one download, which runs detached from their contexts (bounded by the cache's
// FetchTimeout): a caller that gives up returns at once, and the download is cancelled only
// once no caller waits for it any more. Errors name the URL without its query (it may be
// signed).
func (c *Cache) Fetch(ctx context.Context, a Artifact) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("fetching artifact: %w", err)
	}
	// A use before the look: a Prune that began before it and listed the references before the
	// caller made its own spares the artifact, or removed it already (and it is fetched again).
	c.use(a.SHA256)
	if c.Has(a.SHA256) {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("fetching artifact %s: the cache is closed", a.Name)
	}
	f := c.flights[a.SHA256]
	if f == nil {
		f = c.startLocked(ctx, a)
	}
	f.waiters++
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		c.mu.Lock()
		f.waiters--
		if f.waiters == 0 {
			// Nobody waits any more: stop, and let the next caller start afresh.
			f.cancel()
			if c.flights[a.SHA256] == f {
				delete(c.flights, a.SHA256)
			}
		}
		c.mu.Unlock()
		return fmt.Errorf("fetching artifact %s: %w", a.Name, ctx.Err())
	}
}

// startLocked starts the download of a, detached from ctx (its values, for logging, stay).
func (c *Cache) startLocked(ctx context.Context, a Artifact) *flight {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	f := &flight{done: make(chan struct{}), cancel: cancel}
	c.flights[a.SHA256] = f
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		var err error
		if !c.Has(a.SHA256) {
			err = c.download(dctx, a)
		}
		cancel()
		c.mu.Lock()
		if c.flights[a.SHA256] == f {
			delete(c.flights, a.SHA256)
		}
		f.err = err
		c.mu.Unlock()
		close(f.done)
	}()
	return f
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}

func (c *Cache) download(ctx context.Context, a Artifact) error {
	where := redactURL(a.URL)
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		return fmt.Errorf("fetching artifact %s from %s: %w", a.Name, where, err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		// url.Error repeats the full URL: report only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("fetching artifact %s from %s: %w", a.Name, where, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching artifact %s from %s: HTTP status %d", a.Name, where, resp.StatusCode)
	}
	tmp, err := os.CreateTemp(filepath.Join(c.dir, "tmp"), a.SHA256+".*")
	if err != nil {
		return fmt.Errorf("fetching artifact %s: creating temporary file: %w", a.Name, err)
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, c.maxBytes+1))
	if err != nil {
		return fmt.Errorf("fetching artifact %s from %s: after %d bytes: %w", a.Name, where, n, err)
	}
	if n > c.maxBytes {
		return fmt.Errorf("fetching artifact %s from %s: larger than the %d bytes allowed", a.Name, where, c.maxBytes)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		return fmt.Errorf("fetching artifact %s from %s: sha256 mismatch: got %s, want %s", a.Name, where, got, a.SHA256)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fetching artifact %s: syncing: %w", a.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("fetching artifact %s: closing: %w", a.Name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(c.dir, "sha256", a.SHA256)); err != nil {
		return fmt.Errorf("fetching artifact %s: moving into the cache: %w", a.Name, err)
	}
	keep = true
	now := c.now()
	c.mu.Lock()
	c.held[a.SHA256] = n
	c.useLocked(a.SHA256, now)
	close(c.added)
	c.added = make(chan struct{})
	c.mu.Unlock()
	c.touch(a.SHA256, now) // its first use: from the cache's clock
	if err := durable.SyncDir(filepath.Join(c.dir, "sha256")); err != nil {
		c.log.WarnContext(ctx, "artifact cached but not yet durable: a power loss may lose it (it is fetched again then)", "name", a.Name, "err", err)
	}
	c.log.InfoContext(ctx, "artifact cached", "name", a.Name, "sha256", a.SHA256, "bytes", n, "from", where, "took", time.Since(start))
	return nil
}

// ServeArtifact serves a verified artifact with Range support; 404 when it is not held. The
// artifact is used (spared by Prune) until the response ends; a Prune that removed it between
// the open and then does not cut the response (the open file stays readable).
func (c *Cache) ServeArtifact(w http.ResponseWriter, r *http.Request, sha string) {
	f, err := c.Open(sha)
	if err != nil {
		http.Error(w, "artifact not held", http.StatusNotFound)
		return
	}
	defer f.Close()
	// Counted only once opened: requests for digests not held leave nothing behind.
	c.acquire(sha)
	defer c.release(sha)
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "artifact unreadable", http.StatusInternalServerError)
		return
	}
	w.Header().Set("ETag", `"`+sha+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}
