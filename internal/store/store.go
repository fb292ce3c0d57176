// Package store is the control plane's SQL store: one schema, two engines (SQLite through
// modernc.org/sqlite, embedded and the default; PostgreSQL through pgx). Queries are written once
// with ? placeholders and rebound for PostgreSQL. Every state change of a node is written in one
// transaction together with its event row and its reconciler wake-up row.
package store

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	rtrace "runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"bcd/internal/catalog"
)

//go:embed migrations
var migrations embed.FS

// Engine is the SQL engine behind a store.
type Engine string

const (
	SQLite   Engine = "sqlite"
	Postgres Engine = "postgres"
)

// Store is the control plane's store.
type Store struct {
	engine Engine
	write  *sql.DB // SQLite: written by commitLoop alone, BEGIN IMMEDIATE; PostgreSQL: the pool
	read   *sql.DB // SQLite: a pool of read-only connections; PostgreSQL: the same pool
	// claims is SQLite's connection for the reads made for every claim and every agent's
	// connection (hotQuery: CommandCandidates, PendingCancels), opened as the writer's is
	// (openLiteReader): a read that finds it free (claimsMu) goes through it, one that does not
	// through read's pool. database/sql and its driver's conversion of every column were two
	// thirds of a claim's read (a command's row has 30 columns).
	claims   *liteConn
	claimsMu sync.Mutex
	// claimsShut: Close closed claims (under claimsMu); reads go to the pool, which says so.
	claimsShut bool
	binds      sync.Map
	// SQLite re-parses every statement it is not given prepared: prepared statements are kept
	// per database (database/sql prepares them once per connection).
	readStmts stmtCache
	// imageSigs remembers the catalog signatures that verified (every deploy step checks its
	// image again, in the writer).
	imageSigs *catalog.VerifiedSignatures
	// eventWindow is how many ids (on PostgreSQL's follow: events) a statement of an event
	// listing by kind reads at most (0: eventScanWindow; tests make it small).
	eventWindow int
	// now is the local clock (tests replace it while the store runs). On PostgreSQL the
	// store's time is the database's: offset, measured by SyncClock, is added to the local
	// clock, unless a test set the clock by hand (manual).
	now    atomic.Pointer[func() time.Time]
	offset atomic.Int64
	manual atomic.Bool
	// clock is the local clock unless a test replaced it (anchored false): the wall time at
	// its last anchoring plus the monotonic time since (see WallStep, Reanchor).
	clock    anchoredClock
	anchored atomic.Bool
	// SQLite has one writer: concurrent writes are group-committed by one goroutine (see
	// commitLoop and commitPass) and answered once flushed (flushLoop).
	writes chan *writeReq
	// lastGroup is the writes of the writer's last group, fillNs how long it lets a group
	// fill under load (groupWaits; tests lengthen it).
	lastGroup, fillNs atomic.Int64
	stop              chan struct{}
	loop              sync.WaitGroup
	// ckpt is SQLite's checkpointer connection: the writer does not checkpoint as it commits
	// (that copied the WAL into the database inside a commit, on the one writer); checkpointLoop
	// does, beside it. The writer only restarts the WAL once it passes walLimit (walBound).
	ckpt      *sql.DB
	committed chan struct{}
	// ckptNow asks checkpointLoop to catch up with the writer at once (the WAL is over its
	// limit: walBound), and ckptCatchUps counts the times it did.
	ckptNow      chan struct{}
	ckptCatchUps atomic.Int64
	// ckptMu is held by whoever checkpoints (checkpointLoop, restartWAL): SQLite runs one
	// checkpoint at a time and would answer the other "busy".
	ckptMu sync.Mutex
	// wal is the WAL file's path and walLimit the size it is held to (see restartWAL).
	wal      string
	walLimit int64
	// busy, busyCPU, groups and written count the writer's work (WriterStats), walRestarts the
	// WAL's restarts and walWaited those the writer waited for readers for.
	busy, busyCPU, groups, written, walRestarts, walWaited atomic.Int64
	// measureCPU locks the writer to one OS thread and reads its CPU (MeasureWriterCPU).
	measureCPU atomic.Bool
	// reruns counts the groups the writer ran again with savepoints (a write of a pass
	// without them failed; see commitPass), and on PostgreSQL the writes run again so
	// (speculate).
	reruns atomic.Int64
	// heldEvents is the array the writer's passes hold their events in (Tx.holdEvents), and
	// heldEventInserts the statements that insert them, one per size in heldEventChunks.
	heldEvents       []Event
	heldEventInserts [len(heldEventChunks)]string
	// lite is SQLite's writer connection, used by commitLoop alone (see liteConn); write
	// (database/sql) migrates the schema and restarts the WAL.
	lite *liteConn
	// flush is SQLite's writes committed but not yet flushed to disk, which flushLoop answers
	// once the WAL holding them is (see flushLoop); flushWake tells it there are some and
	// flushQuit that the writer stopped. flushFailed is set for good by a flush that failed.
	// flushes and flushBusy count the flushes and the time they took.
	flush struct {
		sync.Mutex
		pending []committedGroup
	}
	flushWake, flushQuit chan struct{}
	flushFailed          atomic.Pointer[error]
	flushes, flushBusy   atomic.Int64
	// syncWAL flushes the WAL file to disk (fdatasync); a test replaces it.
	syncWAL atomic.Pointer[func(*os.File) error]
	// rehearse: RehearseWrites.
	rehearse atomic.Bool
	// trips counts the round trips of PostgreSQL's write transactions (WriteRoundTrips), and
	// pgStatements the statements they sent (WriterStats.Statements).
	trips, pgStatements atomic.Int64
	// migrateLock and installLock are PostgreSQL advisory lock keys, one pair per schema:
	// servers sharing a store migrate it and take first-start decisions one at a time.
	migrateLock, installLock int64
	// channelTag ends the names of the store's NOTIFY channels: they are per database, the
	// store is one schema.
	channelTag string
	// dsn is PostgreSQL's connection string, for connections of their own (Listen). It may
	// hold a password: never logged.
	dsn string
}

// lockKey is an advisory lock key for name.
func lockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// WriterStats is what SQLite's single writer did since the store opened.
type WriterStats struct {
	Groups, Writes int64
	// Busy is the time it spent running and committing groups and restarting the WAL (the
	// rest it waited for work). CPU is the CPU time its thread used meanwhile, counted only
	// while MeasureWriterCPU is on: Busy less the time it waited for a core (other threads of
	// the process, or of the machine, had them), the figure to compare between runs on a shared
	// machine (0 where the platform does not tell).
	Busy, CPU time.Duration
	// WALRestarts counts the times the WAL began again from its start after it had reached its
	// limit while writes went on (walBound), and WALRestartsWaited those of them for which the
	// writer waited for readers to leave the WAL.
	WALRestarts, WALRestartsWaited int64
	// Reruns counts the passes the writer rolled back and ran again because a write it ran
	// without a savepoint failed (see commitPass); on PostgreSQL, the writes run again because
	// a savepoint run without one failed (see speculate).
	Reruns int64
	// Flushes counts the flushes of the WAL to disk that answered committed writes, and
	// FlushTime is the time they took (beside the writer, which goes on meanwhile).
	Flushes   int64
	FlushTime time.Duration
	// Statements counts the SQL statements the writer ran (its transactions' BEGIN and COMMIT
	// included): a count of its work that does not depend on how fast the machine is. On
	// PostgreSQL, the statements the write transactions sent (their reads, savepoints, BEGIN and
	// COMMIT included, a failed one's ROLLBACK not; the round trips they took are
	// WriteRoundTrips).
	// WALPages counts the pages its commits wrote to the write-ahead log (SQLite): a commit
	// writes each page it changed once, so rows that share pages cost less.
	Statements, WALPages int64
	// Reprepares counts the times SQLite prepared one of the writer's statements again as it
	// ran (see RepreparedStatements): a few of SQLite's own (after a change of schema, a PRAGMA
	// at each run), else a statement whose text should change.
	Reprepares int64
	// CachedReads counts the reads of a node's open workflow the writer looked up in its cache
	// (SQLite, see workflowCache), and CacheHits those it found there.
	CachedReads, CacheHits int64
	// CommandReads counts the reads of a command by id the writer looked up in its cache, and
	// CommandHits those it found there.
	CommandReads, CommandHits int64
	// NodeReads counts the reads of a node by id the writer looked up in its cache, and
	// NodeHits those it found there.
	NodeReads, NodeHits int64
}

// MeasureWriterCPU turns the count of SQLite's writer's CPU time (WriterStats.CPU) on or off,
// from its next group on. While on, the writer's goroutine is locked to one OS thread, whose
// CPU clock is read around each group. Off by default: a locked goroutine that is woken (after
// a lock SQLite waited on) or preempted waits until its own thread has a processor again,
// where an unlocked one runs on whichever is free first, and that cost the writer about 8 % of
// its throughput (bcd sim, 3 000 nodes on 2 cores: 2 306 against 2 500 nodes/s summed over the
// phases, six alternated pairs).
func (s *Store) MeasureWriterCPU(on bool) { s.measureCPU.Store(on) }

// WriterStats reports the single writer's work (on PostgreSQL only Reruns: see speculate).
func (s *Store) WriterStats() WriterStats {
	w := WriterStats{Groups: s.groups.Load(), Writes: s.written.Load(), Busy: time.Duration(s.busy.Load()), CPU: time.Duration(s.busyCPU.Load()),
		WALRestarts: s.walRestarts.Load(), WALRestartsWaited: s.walWaited.Load(), Reruns: s.reruns.Load(), Flushes: s.flushes.Load(), FlushTime: time.Duration(s.flushBusy.Load())}
	if s.lite == nil {
		w.Statements = s.pgStatements.Load()
	} else {
		w.Statements, w.WALPages, w.Reprepares = s.lite.statements.Load(), s.lite.walFrames.Load(), s.lite.reprepares.Load()
		if rc := s.lite.cache; rc != nil {
			w.CachedReads, w.CacheHits = rc.reads.Load(), rc.hits.Load()
			w.CommandReads, w.CommandHits = rc.cmdReads.Load(), rc.cmdHits.Load()
			w.NodeReads, w.NodeHits = rc.nodeReads.Load(), rc.nodeHits.Load()
		}
	}
	return w
}

// RepreparedStatements reports, by their text, the writer's statements that SQLite prepared
// again as they ran, and how many times (SQLite; nil when none was). Once after a change of
// schema is expected, and a PRAGMA at each run; any other statement prepared again at each run
// has a plan that hangs on a value bound to it, and its text should say what it searches
// (INDEXED BY) instead.
func (s *Store) RepreparedStatements() map[string]int64 {
	if s.lite == nil {
		return nil
	}
	s.lite.repMu.Lock()
	defer s.lite.repMu.Unlock()
	return maps.Clone(s.lite.reprepared)
}

// WriteRoundTrips is how many round trips to the database the write transactions of this store
// took so far (PostgreSQL; zero on SQLite): what a write costs in waits on the network.
func (s *Store) WriteRoundTrips() int64 { return s.trips.Load() }

// busyTimeout is how long an SQLite connection waits for a lock another one holds.
const busyTimeout = 10 * time.Second

// DefaultWALLimit is the size the SQLite store's write-ahead log is held to while writes go on.
const DefaultWALLimit = 64 << 20

type writeReq struct {
	ctx  context.Context
	f    func(*Tx) error
	done chan error
}

// Under load the writer lets a group fill before it runs it: when the last group had at least
// fillAfter writes and this one has fewer than fillTo, it waits up to fillFor for more.
// A commit's cost is mostly the pages it writes to the WAL, and writes in one group share pages
// (the queue's, the events', the commands' recent leaves): measured in `bcd sim` at 10 000 nodes,
// groups of 50-100 writes instead of 15-30 wrote 32 WAL pages a node instead of 37-40, and
// every phase moved 3-8 % more nodes a second (the process's two cores are shared by the
// writer and the agents' work, which the writer's pause lets run). A lone write on an idle
// store never waits (its last group was small).
const (
	fillAfter = 32
	fillTo    = 64
	fillFor   = 2 * time.Millisecond
)

// groupWaits says whether the writer waits for more writes before running a group of n, the last
// having had last. Pure.
func groupWaits(last, n int) bool { return last >= fillAfter && n < fillTo }

// fill adds to group the writes that come within fillFor (the store's fillNs), until it
// has fillTo.
func (s *Store) fill(group []*writeReq) []*writeReq {
	t := time.NewTimer(time.Duration(s.fillNs.Load()))
	defer t.Stop()
	for len(group) < fillTo {
		select {
		case req := <-s.writes:
			group = append(group, req)
		case <-t.C:
			return group
		case <-s.stop:
			return group // (run, and answered, before the loop sees the stop)
		}
	}
	return group
}

// maxGroup bounds the writes committed together.
const maxGroup = 256

// Sentinel errors, wrapped with what was being done.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("already exists")
	ErrStale    = errors.New("changed concurrently")
)

// ParseDSN tells the engine of a DSN: "sqlite:PATH" (or a bare path ending in .db) or
// "postgres://…" / "postgresql://…".
func ParseDSN(dsn string) (Engine, string, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return Postgres, dsn, nil
	case strings.HasPrefix(dsn, "sqlite:"):
		p := strings.TrimPrefix(strings.TrimPrefix(dsn, "sqlite:"), "//")
		if p == "" {
			return "", "", errors.New("store DSN sqlite: needs a file path, e.g. sqlite:/var/lib/bcd/bcd.db")
		}
		return SQLite, p, nil
	case strings.HasSuffix(dsn, ".db"):
		return SQLite, dsn, nil
	}
	return "", "", fmt.Errorf("unrecognised store DSN %q: accepted are sqlite:PATH and postgres://USER@HOST/DB", redactDSN(dsn))
}

// uriPath is path as the path of a SQLite "file:" URI: SQLite ends the path at '?' or '#' and
// decodes %HH escapes in it, so those three characters are escaped. Unescaped, a data directory
// named "a#1" opened the store "a" (and "a#2" the same one), and "c%41" the directory "cA".
func uriPath(path string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
}

// openPostgres opens the pool. Its commits must be durable: an agent runs a command once its
// acknowledgement is committed, and a commit a crash of the database took back would let a second
// agent run it. A database (or role, or DSN) whose synchronous_commit is off gets the pool's
// sessions set to on, and a warning; any other setting (on, local, remote_write, remote_apply)
// is kept.
func openPostgres(ctx context.Context, dsn string, conns int) (*sql.DB, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		// The driver would quote the DSN back, redacting only what it still recognises as the
		// password: neither its message nor url.Parse's (which repeats the DSN) is shown.
		return nil, errors.New("the postgres store's DSN is not a URL: percent-encode % @ / ? # in its user and password (% as %25, @ as %40, …)")
	}
	q := u.Query()
	open := func(dsn string) (*sql.DB, string, error) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, "", fmt.Errorf("opening postgres store %s: %w", redactDSN(dsn), driverError(dsn, err))
		}
		db.SetMaxOpenConns(conns)
		db.SetMaxIdleConns(conns)
		var sync string
		if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&sync); err != nil {
			db.Close()
			return nil, "", fmt.Errorf("connecting to postgres store %s: %w", redactDSN(dsn), driverError(dsn, err))
		}
		return db, sync, nil
	}
	db, sync, err := open(dsn)
	if err != nil || sync != "off" {
		return db, err
	}
	db.Close()
	q.Set("synchronous_commit", "on") // pgx sends unknown parameters as the session's settings
	u.RawQuery = q.Encode()
	if db, sync, err = open(u.String()); err != nil {
		return nil, err
	}
	if sync != "on" {
		db.Close()
		return nil, fmt.Errorf("postgres store %s: synchronous_commit is %q after setting it on for bcd's sessions: commits would not be durable", redactDSN(dsn), sync)
	}
	slog.Default().Warn("the database's synchronous_commit is off: bcd's sessions set it on (an acknowledged command must survive a crash of the database)",
		"store", redactDSN(dsn))
	return db, nil
}

// poolParam is the DSN parameter that bounds the connections a server opens to PostgreSQL (its
// pool: each write transaction holds one, reads take one for their statement). Listening for
// other servers' notices takes one more of its own.
const (
	poolParam      = "pool_max_conns"
	defaultPool    = 32
	minPool        = 2
	maxPool        = 1024
	poolParamUsage = "want a whole number of connections from 2 to 1024 (default 32)"
)

// poolOf takes pool_max_conns out of a PostgreSQL DSN (pgx would send it to the server as a
// setting): the DSN without it, and the pool's size.
func poolOf(dsn string) (string, int, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn, defaultPool, nil // openPostgres refuses it, without repeating it
	}
	q := u.Query()
	if !q.Has(poolParam) {
		return dsn, defaultPool, nil
	}
	v := q.Get(poolParam)
	n, err := strconv.Atoi(v)
	if err != nil || n < minPool || n > maxPool || len(q[poolParam]) > 1 {
		return "", 0, fmt.Errorf("postgres store %s: %s=%q: %s", redactDSN(dsn), poolParam, v, poolParamUsage)
	}
	q.Del(poolParam)
	u.RawQuery = q.Encode()
	return u.String(), n, nil
}

// driverError is err from the database driver, unless its message repeats a password of dsn
// (the driver redacts only the passwords it knows of): then it says no more than that it failed.
func driverError(dsn string, err error) error {
	msg := err.Error()
	for _, pw := range dsnPasswords(dsn) {
		if pw != "" && strings.Contains(msg, pw) {
			return errors.New("the driver's message is not shown: it repeats a password of the DSN")
		}
	}
	return err
}

// dsnPasswords are the passwords of a URL DSN (in its userinfo, or a parameter whose name holds
// "password"), each as written and decoded.
func dsnPasswords(dsn string) []string {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil
	}
	var out []string
	if pw, ok := u.User.Password(); ok {
		out = append(out, pw)
		_, authority, _ := strings.Cut(dsn, "://")
		if i := strings.IndexAny(authority, "/?#"); i >= 0 {
			authority = authority[:i]
		}
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			_, raw, _ := strings.Cut(authority[:at], ":")
			out = append(out, raw)
		}
	}
	for _, kv := range strings.Split(u.RawQuery, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if !strings.Contains(strings.ToLower(k), "password") {
			continue
		}
		out = append(out, v)
		if dv, err := url.QueryUnescape(v); err == nil {
			out = append(out, dv)
		}
	}
	return out
}

// redactDSN is dsn as an error or a log line may show it: what tells the operator which store
// (scheme, user, host, port, database, parameters), with every password (the URL's userinfo, a
// password or sslpassword parameter) replaced by xxxxx. A DSN that is not a URL bcd can take apart
// (a % that is no escape in its password, libpq's keyword=value form) may hold its password
// anywhere: a fixed placeholder stands for it.
func redactDSN(dsn string) string {
	unparseable := "[unparseable DSN]"
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		unparseable = "postgres://" + unparseable
	}
	u, err := url.Parse(dsn)
	if err != nil || u.Opaque != "" || u.Scheme == "" && strings.Contains(dsn, "=") {
		return unparseable
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return unparseable
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q[k] = []string{"xxxxx"}
		}
	}
	u.RawQuery = q.Encode()
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// Open connects to the store named by dsn and applies the embedded migrations.
func Open(ctx context.Context, dsn string) (*Store, error) {
	return open(ctx, dsn, DefaultWALLimit)
}

func open(ctx context.Context, dsn string, walLimit int64) (*Store, error) {
	engine, target, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	s := &Store{engine: engine, imageSigs: catalog.NewVerifiedSignatures()}
	s.SetWall(time.Now)
	switch engine {
	case SQLite:
		separatePageCaches()
		if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
			return nil, fmt.Errorf("creating store directory: %w", err)
		}
		// A new database is created 0600 (it holds sealed secrets and token hashes); SQLite
		// gives its WAL and shared-memory files the database's mode. An existing file keeps its.
		if f, err := os.OpenFile(target, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
			if err := f.Close(); err != nil {
				return nil, fmt.Errorf("creating the SQLite store %s: %w", target, err)
			}
		} else if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("creating the SQLite store %s: %w", target, err)
		}
		// Every connection's settings, and a driver DSN of the file with them and extra.
		common := []string{"journal_mode(WAL)", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()), "foreign_keys(1)", "temp_store(MEMORY)"}
		dsn := func(extra ...string) string {
			return "file:" + uriPath(target) + "?_pragma=" + strings.Join(append(slices.Clone(common), extra...), "&_pragma=")
		}
		// The writer's page cache holds the hot rows of a large fleet (nodes, open workflows,
		// queued commands, the queue); SQLite's default is 2 MiB.
		// journal_size_limit: the first commit after the WAL restarts cuts the file back to
		// the limit (it would otherwise keep its largest size for ever).
		s.wal, s.walLimit = target+"-wal", walLimit
		writer := append(slices.Clone(common), "cache_size(-16384)", "wal_autocheckpoint(0)",
			fmt.Sprintf("journal_size_limit(%d)", walLimit))
		// w migrates the schema and restarts the WAL, its commits synchronous (FULL: the WAL
		// is flushed to disk before a commit returns). The writes themselves go through lite,
		// below, whose commits do not wait for the disk (NORMAL): flushLoop flushes the WAL
		// beside the writer and only then answers the writes it holds. What a caller was told
		// is stored (an acknowledgement an agent then acts on, a one-time token spent, a
		// wipe's proof) survives a power loss, not only a crash of the process, as with FULL;
		// the writer meanwhile runs the next group.
		w, err := sql.Open("sqlite", dsn(append(slices.Clone(writer), "synchronous(FULL)")...)+"&_txlock=immediate")
		if err != nil {
			return nil, fmt.Errorf("opening sqlite store %s: %w", target, err)
		}
		w.SetMaxOpenConns(2)
		w.SetMaxIdleConns(2)
		w.SetConnMaxLifetime(0)
		// Migrate through the writer before readers open the file.
		s.write, s.read = w, w
		if err := s.migrate(ctx); err != nil {
			w.Close()
			return nil, err
		}
		lite, err := openLite(target, append(writer, "synchronous(NORMAL)"))
		if err != nil {
			w.Close()
			return nil, err
		}
		s.lite = lite
		r, err := sql.Open("sqlite", dsn("synchronous(NORMAL)", "query_only(1)"))
		if err != nil {
			lite.close()
			w.Close()
			return nil, fmt.Errorf("opening sqlite store %s for reading: %w", target, err)
		}
		r.SetMaxOpenConns(8)
		r.SetMaxIdleConns(8)
		s.read = r
		if s.claims, err = openLiteReader(target, append(slices.Clone(common), "synchronous(NORMAL)", "query_only(1)")); err != nil {
			lite.close()
			r.Close()
			w.Close()
			return nil, fmt.Errorf("opening sqlite store %s for claims: %w", target, err)
		}
		// Checkpoints flush the database file whatever the setting; NORMAL skips only the
		// WAL's flush, which this connection never writes.
		c, err := sql.Open("sqlite", dsn("synchronous(NORMAL)"))
		if err != nil {
			s.claims.close()
			lite.close()
			r.Close()
			w.Close()
			return nil, fmt.Errorf("opening sqlite store %s for checkpoints: %w", target, err)
		}
		c.SetMaxOpenConns(1)
		s.ckpt = c
		s.writes, s.stop, s.committed, s.ckptNow = make(chan *writeReq), make(chan struct{}), make(chan struct{}, 1), make(chan struct{}, 1)
		s.fillNs.Store(int64(fillFor))
		s.flushWake, s.flushQuit = make(chan struct{}, 1), make(chan struct{})
		flush := fdatasync
		s.syncWAL.Store(&flush)
		s.loop.Add(3)
		go s.commitLoop()
		go s.flushLoop()
		go s.checkpointLoop()
	case Postgres:
		target, conns, err := poolOf(target)
		if err != nil {
			return nil, err
		}
		s.dsn = target
		db, err := openPostgres(ctx, target, conns)
		if err != nil {
			return nil, err
		}
		s.write, s.read = db, db
		var schema string
		if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			db.Close()
			return nil, fmt.Errorf("reading the store's schema: %w", err)
		}
		s.migrateLock, s.installLock = lockKey("bcd migrations "+schema), lockKey("bcd installation "+schema)
		s.channelTag = fmt.Sprintf("%016x", uint64(lockKey("bcd channels "+schema)))
		if err := s.migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	dir := "migrations/sqlite"
	dialect := goose.DialectSQLite3
	if s.engine == Postgres {
		dir, dialect = "migrations/postgres", goose.DialectPostgres
	}
	sub, err := fs.Sub(migrations, dir)
	if err != nil {
		return fmt.Errorf("opening embedded migrations: %w", err)
	}
	var opts []goose.ProviderOption
	if s.engine == Postgres {
		// Servers starting at once on one database migrate it one at a time (an advisory
		// lock, polled every second for up to five minutes).
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(s.migrateLock), lock.WithLockTimeout(1, 300))
		if err != nil {
			return fmt.Errorf("preparing the migration lock: %w", err)
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(dialect, s.write, sub, opts...)
	if err != nil {
		return fmt.Errorf("preparing migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("applying migrations: %w", err)
	}
	// A database a newer bcd migrated has tables and columns this one does not know, or no
	// longer finds what this one reads (00049: a workflow's steps): refused here rather than
	// failing its work later, node by node.
	current, known, err := p.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("reading the database's schema version: %w", err)
	}
	if current > known {
		return fmt.Errorf("the database's schema is at version %d, newer than this bcd knows (%d): a newer bcd migrated it, and only that version or a later one can run on it", current, known)
	}
	return nil
}

// Engine returns the store's engine.
func (s *Store) Engine() Engine { return s.engine }

// Close closes the connections.
func (s *Store) Close() error {
	if s.stop != nil {
		close(s.stop)
		s.loop.Wait()
	}
	s.readStmts.close()
	var errs []error
	if s.claims != nil {
		s.claimsMu.Lock()
		errs = append(errs, s.claims.close())
		s.claimsShut = true
		s.claimsMu.Unlock()
	}
	if s.lite != nil {
		errs = append(errs, s.lite.close())
	}
	if s.ckpt != nil {
		errs = append(errs, s.ckpt.Close())
	}
	if s.read != s.write {
		errs = append(errs, s.read.Close())
	}
	errs = append(errs, s.write.Close())
	return errors.Join(errs...)
}

// SetClock replaces the store's clock by one a test moves by hand: it is used as it is, and
// SyncClock no longer corrects it.
func (s *Store) SetClock(now func() time.Time) {
	s.anchored.Store(false)
	s.manual.Store(true)
	s.offset.Store(0)
	s.now.Store(&now)
}

// SetLocalClock replaces the local clock that SyncClock corrects (a test of a machine whose
// clock is off).
func (s *Store) SetLocalClock(now func() time.Time) {
	s.anchored.Store(false)
	s.manual.Store(false)
	s.now.Store(&now)
}

// SetWall makes the store's local clock follow the wall clock wall (tests step it), anchored
// to it now.
func (s *Store) SetWall(wall func() time.Time) {
	s.clock.follow(wall)
	now := s.clock.now
	s.manual.Store(false)
	s.now.Store(&now)
	s.anchored.Store(true)
}

// WallStep is how far the wall clock moved beyond the store's local clock since it was last
// anchored (Reanchor): a step of it (NTP stepping the clock, a suspended host resumed; negative
// when back). 0 when a test set the clock.
func (s *Store) WallStep() time.Duration {
	if !s.anchored.Load() {
		return 0
	}
	return s.clock.drift()
}

// Reanchor moves the store's local clock to the wall clock (the engine does, at each heartbeat
// on SQLite, once the steps in progress were given a forward step's time).
func (s *Store) Reanchor() {
	if s.anchored.Load() {
		s.clock.reanchor()
	}
}

// anchoredClock is a local clock that a step of the wall clock does not move: the wall time it
// was anchored at plus the monotonic time since.
type anchoredClock struct {
	wall atomic.Pointer[func() time.Time]
	at   atomic.Pointer[clockAnchor]
}

type clockAnchor struct{ wall, mono time.Time }

// follow anchors the clock to wall, which it follows from then on.
func (c *anchoredClock) follow(wall func() time.Time) {
	c.wall.Store(&wall)
	c.reanchor()
}

func (c *anchoredClock) now() time.Time {
	a := c.at.Load()
	return a.wall.Add(time.Since(a.mono))
}

func (c *anchoredClock) reanchor() {
	mono := time.Now()
	c.at.Store(&clockAnchor{wall: (*c.wall.Load())().Round(0), mono: mono})
}

// drift is how far the wall clock is from this one.
func (c *anchoredClock) drift() time.Duration { return (*c.wall.Load())().Round(0).Sub(c.now()) }

// nowMicros is the store's clock in Unix microseconds.
func (s *Store) nowMicros() int64 { return (*s.now.Load())().UnixMicro() + s.offset.Load() }

// NowMicros is the store's clock in Unix microseconds: what a write starting now reads as its
// time (Tx.At).
func (s *Store) NowMicros() int64 { return s.nowMicros() }

// maxClockRoundTrip bounds the round trip of a clock reading SyncClock trusts: the reading is
// taken as of the middle of it.
const maxClockRoundTrip = time.Second

// TrustedClockOffset is how far from the database's a local clock may be and still be used as it
// is. NTP keeps hosts within milliseconds of each other, and a reading is only as good as half
// its round trip: correcting a good clock by a reading would put servers' times further apart
// (a ramdisk's arrival recorded by one server before the step another started), not closer.
const TrustedClockOffset = time.Second

// SyncClock makes the store's clock the database's (PostgreSQL) when the local clock is off by
// TrustedClockOffset or more: it reads the database's clock and keeps how far the local clock is
// from it, which every transaction's time (Tx.At) then adds. Servers sharing a store judge each
// other's heartbeats, leases and agents' departures by these times, so one whose clock is off
// (NTP down) must not see the others as dead, nor be seen so. It returns the offset in use (the
// database's time less the local clock). On SQLite, whose one process is the store's only
// clock, and with a clock set by hand, it does nothing.
func (s *Store) SyncClock(ctx context.Context) (time.Duration, error) {
	off, measured, err := s.MeasureClock(ctx)
	if err != nil || !measured {
		return off, err
	}
	s.SetClockOffset(off)
	return off, nil
}

// MeasureClock reads the offset SyncClock would set (PostgreSQL: the database's clock less the
// local one, 0 under TrustedClockOffset), without setting it; measured is false where there is
// nothing to measure (SQLite, a clock set by hand), and the offset is then the one in use. On an
// error the offset in use is returned with it.
func (s *Store) MeasureClock(ctx context.Context) (off time.Duration, measured bool, err error) {
	current := time.Duration(s.offset.Load()) * time.Microsecond
	if s.engine != Postgres || s.manual.Load() {
		return current, false, nil
	}
	local := *s.now.Load()
	var db int64
	t0 := local()
	err = s.read.QueryRowContext(ctx, `SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint`).Scan(&db)
	t1 := local()
	if err != nil {
		return current, false, fmt.Errorf("reading the database's clock: %w", err)
	}
	if rtt := t1.Sub(t0); rtt > maxClockRoundTrip {
		return current, false, fmt.Errorf("reading the database's clock took %s (at most %s is trusted): offset kept at %s", rtt, maxClockRoundTrip, current)
	}
	us := db - (t0.UnixMicro()+t1.UnixMicro())/2
	if time.Duration(us).Abs()*time.Microsecond < TrustedClockOffset {
		us = 0
	}
	return time.Duration(us) * time.Microsecond, true, nil
}

// SetClockOffset sets the offset every transaction's time adds to the local clock (one
// MeasureClock read).
func (s *Store) SetClockOffset(off time.Duration) { s.offset.Store(off.Microseconds()) }

// orFail is the conflict clause of a statement that writes many rows in the writer's
// transaction: on SQLite "OR FAIL ", on PostgreSQL nothing (it has no such clause).
//
// SQLite runs a statement that may write several rows and may abort (a NOT NULL or unique
// constraint's default, ABORT, undoes the statement's own rows) inside a statement journal:
// every page the statement changes is copied first, so that its rows can be undone alone. FAIL
// stops at the failing row and keeps the rows before it, which SQLite needs no journal for.
// Nothing is lost by it here: a statement that fails fails its write, whose savepoint (or the
// whole pass) is rolled back with every row it wrote (Store.commitPass), and no caller of such a
// statement goes on in the same transaction after its error.
func (s *Store) orFail() string {
	if s.engine == SQLite {
		return "OR FAIL "
	}
	return ""
}

// bind rewrites ? placeholders to $n for PostgreSQL (queries never hold a literal '?').
func (s *Store) bind(q string) string {
	if s.engine != Postgres {
		return q
	}
	if v, ok := s.binds.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	out := b.String()
	s.binds.Store(q, out)
	return out
}

// Tx is a write transaction.
type Tx struct {
	s *Store
	// q runs the transaction's statements on PostgreSQL: the connection itself, where the
	// transaction's BEGIN and COMMIT are statements like the others (held, and sent with the
	// first and the last writes). lc runs them on SQLite's writer (see liteConn).
	q  querier
	lc *liteConn
	at int64
	// PostgreSQL: conn is the transaction's connection, and later the writes whose outcome
	// nothing reads (execLater), held to go out together with the next statement in one round
	// trip (a pipeline: each statement prepared and bound as on its own, one Sync). sent counts
	// the statements the database has run, queued those given to the transaction: a savepoint
	// exists on the server once its statement's number is below sent.
	conn         *sql.Conn
	later        []laterStmt
	sent, queued int
	// trips counts the transaction's round trips to the database (PostgreSQL; the store adds
	// them up for WriteRoundTrips), and stmts the statements it sent (WriterStats.Statements).
	trips, stmts int
	// broken is the error of a savepoint that left the transaction unusable (PostgreSQL): the
	// write fails with it even if the savepoint's caller goes on. depth: savepoints open.
	broken error
	depth  int
	// optimistic: the write runs without a savepoint of its own (SQLite's writer, see
	// commitPass), and so do its savepoints (on both engines; PostgreSQL: speculate);
	// spoiled says one of them failed, whose writes nothing can undo but the rollback of the
	// whole pass (SQLite) or transaction (PostgreSQL), which then runs again with savepoints.
	optimistic, spoiled bool
	// undo are what the transaction's functions kept outside it (OnUndo), undone, last first,
	// when their writes are.
	undo []func()
	// nodes are the indexed columns of the nodes the transaction read or wrote, by id, at the
	// version it saw (SQLite's writer: UpdateNode).
	nodes map[string]nodeKeys
	// events are the events the writes of SQLite's writer appended, inserted together before
	// the commit (holdEvents).
	events []Event
}

// OnUndo registers f, which undoes what the caller kept outside the transaction (in memory)
// beside its writes: it runs if those writes are undone (the savepoint around them rolled
// back, the write failed or is run again from its start, the commit failed), and never once
// they are committed. A write function that marks state of its own as it writes registers its
// undoing here: a function may run more than once before its outcome (see Write).
func (t *Tx) OnUndo(f func()) { t.undo = append(t.undo, f) }

// undoFrom runs, last first, and drops the undo functions registered since the mark'th.
func (t *Tx) undoFrom(mark int) {
	for i := len(t.undo) - 1; i >= mark; i-- {
		t.undo[i]()
	}
	t.undo = t.undo[:mark]
}

// querier is what runs a PostgreSQL transaction's statements: its *sql.Conn.
type querier interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

// laterStmt is a write held by execLater: its statement (bound), its arguments, and what it
// does, for its error. A held savepoint changes nothing a read sees: reads do not send it.
// speculative: held inside a savepoint of a write run without them (see speculate), whose
// failure spoils the run.
type laterStmt struct {
	q, what     string
	args        []any
	savepoint   bool
	speculative bool
}

// stmtCache holds prepared statements of one *sql.DB, bounded so that generated queries (label
// filters) cannot grow it without limit.
type stmtCache struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

const maxCachedStmts = 256

// get returns a prepared statement for q, or nil when q is not to be cached or preparing failed
// (the caller then runs q directly and gets the error there).
func (c *stmtCache) get(ctx context.Context, db *sql.DB, q string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.m[q]; ok {
		return st
	}
	if len(c.m) >= maxCachedStmts {
		return nil
	}
	st, err := db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	if c.m == nil {
		c.m = map[string]*sql.Stmt{}
	}
	c.m[q] = st
	return st
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.m {
		st.Close()
	}
	c.m = nil
}

// stmtCtx is the context a statement runs under. On SQLite, where the writer's transaction
// holds a whole group of callers' writes, a statement is never interrupted by its caller's
// context (an interrupted statement can roll back the group's transaction); the writer checks
// each caller's context before running its function. The driver also watches a cancellable
// context with a goroutine per statement.
func (t *Tx) stmtCtx(ctx context.Context) context.Context {
	if t.s.engine == SQLite {
		return context.Background()
	}
	return ctx
}

// args returns a statement's arguments given as pointers to their values (a row's fields).
// SQLite's writer binds each as it is when the statement runs, at once (liteStmt.bind): no
// allocation for each value held in an interface, the most numerous of the writer's. Elsewhere
// the values are taken now: PostgreSQL's writes may go out later (execLater), after the fields
// changed. A pointer to an unsigned integer gives an int64; anything not a pointer is itself.
func (t *Tx) args(ptrs ...any) []any {
	if t.lc != nil {
		return ptrs
	}
	return t.appendArgs(make([]any, 0, len(ptrs)), ptrs...)
}

// appendArgs appends to dst the arguments given as pointers (see args).
func (t *Tx) appendArgs(dst []any, ptrs ...any) []any {
	if t.lc != nil {
		return append(dst, ptrs...)
	}
	for _, p := range ptrs {
		var v any
		switch x := p.(type) {
		case *string:
			v = pointee(x)
		case *int64:
			v = pointee(x)
		case *int:
			v = pointee(x)
		case *uint64:
			if x != nil {
				v = int64(*x)
			}
		case *bool:
			v = pointee(x)
		case *[]byte:
			v = pointee(x)
		default:
			v = p
		}
		dst = append(dst, v)
	}
	return dst
}

// pointee is what p points at, or nil (NULL, as the writer binds a nil pointer) for a nil p.
func pointee[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func (t *Tx) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	ctx = t.stmtCtx(ctx)
	q = t.s.bind(q)
	if t.lc != nil {
		return t.lc.exec(q, args)
	}
	if len(t.later) > 0 {
		// The held writes and this one, in one round trip.
		t.later = append(t.later, laterStmt{q: q, args: args, speculative: t.speculating()})
		return t.flush(ctx)
	}
	t.queued++
	t.trips++
	t.stmts++
	res, err := t.q.ExecContext(ctx, q, args...)
	if err == nil {
		t.sent = t.queued
	}
	return res, err
}

// execLater runs a write whose outcome (rows affected) nothing reads; what says what it does,
// for its error. On SQLite it runs now. On PostgreSQL it is held and goes out with the next
// statement, at the latest when the savepoint around it ends or the transaction commits: its
// error is then that statement's, or the savepoint's, or the commit's. A caller that must tell
// its errors apart (a unique key taken) uses exec.
func (t *Tx) execLater(ctx context.Context, what, q string, args ...any) error {
	if t.conn == nil {
		if _, err := t.exec(ctx, q, args...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	t.later = append(t.later, laterStmt{q: t.s.bind(q), what: what, args: args, speculative: t.speculating()})
	t.queued++
	return nil
}

// speculating says whether the transaction is inside a savepoint that was not opened
// (PostgreSQL, see speculate).
func (t *Tx) speculating() bool { return t.optimistic && t.depth > 0 }

// flush sends the held writes (PostgreSQL) in one round trip, and returns the last one's
// result. After an error the transaction is aborted: only a rollback (to a savepoint) follows.
func (t *Tx) flush(ctx context.Context) (sql.Result, error) {
	if len(t.later) == 0 {
		return driverResult(0), nil
	}
	rows, err := t.send(ctx)
	if err != nil {
		return nil, err
	}
	return driverResult(rows), nil
}

// batchRead is a read sent in the pipeline after the held statements: take reads its results.
type batchRead struct {
	q    string
	args []any
	take func(pgx.BatchResults) error
}

// send sends the held statements in one pipeline and returns the last one's rows affected;
// reads are sent after them in the same pipeline, in order.
func (t *Tx) send(ctx context.Context, reads ...*batchRead) (rows int64, err error) {
	held, sent := t.later, t.sent
	t.later = nil
	t.trips++
	t.stmts += len(held) + len(reads)
	if len(held) > 0 && held[len(held)-1].what == "" {
		t.queued++ // exec's statement, added by exec
	}
	err = t.conn.Raw(func(dc any) error {
		c, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("the postgres store's connection is a %T, not pgx's", dc)
		}
		b := &pgx.Batch{}
		for _, st := range held {
			b.Queue(st.q, st.args...)
		}
		for _, read := range reads {
			b.Queue(read.q, read.args...)
		}
		br := c.Conn().SendBatch(ctx, b)
		for i, st := range held {
			tag, err := br.Exec()
			if err != nil {
				br.Close()
				t.sent += i
				if strings.Contains(err.Error(), "preprocessing batch") {
					// Preparing the statements failed, before any ran: which one is in err.
					whats := make([]string, 0, len(held))
					for _, st := range held {
						whats = append(whats, cmp.Or(st.what, "a write"))
					}
					return fmt.Errorf("%s: %w", strings.Join(whats, "; "), err)
				}
				if st.what == "" {
					return err
				}
				return fmt.Errorf("%s: %w", st.what, err)
			}
			if st.q == "COMMIT" && tag.String() == "ROLLBACK" {
				// The database answers COMMIT so in a transaction an earlier statement aborted.
				br.Close()
				return errors.New("committing transaction: the database rolled it back (a statement of it failed)")
			}
			rows = tag.RowsAffected()
		}
		t.sent += len(held)
		for _, read := range reads {
			if err := read.take(br); err != nil {
				br.Close()
				return err
			}
		}
		return br.Close()
	})
	var pe *pgconn.PgError
	if failed := t.sent < sent+len(held) || errors.As(err, &pe); failed && t.optimistic &&
		(t.depth > 0 || slices.ContainsFunc(held, func(st laterStmt) bool { return st.speculative })) {
		// A statement sent in a savepoint that was not opened failed, or one it held, or may
		// have: nothing undoes it but the whole transaction's rollback (see speculate). (A
		// read that found no row aborts nothing.)
		t.spoiled = true
	}
	if t.sent < sent+len(held) && t.depth == 0 && t.broken == nil {
		// Held writes did not all run (failed, or never sent): the write fails even if its
		// caller goes on (in a savepoint, savepointLater decides).
		t.broken = err
	}
	return rows, err
}

// sendHeldFirst says whether a statement returning rows must go after what is held: anything
// but savepoints must be seen (heldForRead), and the savepoints too precede a statement that
// may write (UPDATE … RETURNING), so that a rollback to them undoes it.
func (t *Tx) sendHeldFirst(q string) bool {
	if t.heldForRead() {
		return true
	}
	q = strings.TrimLeft(q, " \t\r\n")
	return len(t.later) > 0 && !(len(q) >= 6 && strings.EqualFold(q[:6], "SELECT"))
}

// heldForRead says whether a read must send what is held first: anything but savepoints (a
// savepoint waits for the next write; see savepointLater).
func (t *Tx) heldForRead() bool {
	for _, st := range t.later {
		if !st.savepoint {
			return true
		}
	}
	return false
}

// pipelinedRow is a one-row read that goes out, when its caller scans it, in one pipeline
// after the held statements it must see (the transaction's BEGIN among them): every caller
// scans a row it reads at once.
type pipelinedRow struct {
	t    *Tx
	ctx  context.Context
	q    string
	args []any
}

func (r pipelinedRow) Scan(dest ...any) error {
	_, err := r.t.send(r.ctx, &batchRead{q: r.q, args: r.args, take: func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(dest...)
	}})
	return err
}

// driverResult is a pipelined statement's result: its rows affected.
type driverResult int64

func (r driverResult) LastInsertId() (int64, error) {
	return 0, errors.New("LastInsertId is not supported by this store")
}
func (r driverResult) RowsAffected() (int64, error) { return int64(r), nil }

// rowScanner is a row read by queryRow: *sql.Row, or a pipelinedRow (PostgreSQL).
type rowScanner interface{ Scan(...any) error }

// rowsIter is a read of several rows: *sql.Rows, or pipelinedRows (PostgreSQL).
type rowsIter interface {
	Next() bool
	Scan(dest ...any) error
	Close() error
	Err() error
}

func (t *Tx) query(ctx context.Context, q string, args ...any) (rowsIter, error) {
	ctx = t.stmtCtx(ctx)
	q = t.s.bind(q)
	if t.lc != nil {
		return t.lc.query(q, args)
	}
	if t.conn != nil && t.sendHeldFirst(q) {
		// After what it must see, in the same pipeline (the transaction's BEGIN among them).
		r := &pipelinedRows{}
		if _, err := t.send(ctx, &batchRead{q: q, args: args, take: r.take}); err != nil {
			return nil, err
		}
		return r, nil
	}
	t.trips++
	t.stmts++
	return t.q.QueryContext(ctx, q, args...)
}

// pipelinedRows are the rows of a read sent in a pipeline after held statements: read whole, as
// the database sent them, before the pipeline ends, and decoded as the caller scans them (as a
// pipelined one-row read is, by pgx's types). Reads in a write transaction are small.
type pipelinedRows struct {
	types  *pgtype.Map
	fields []pgconn.FieldDescription
	rows   [][][]byte
	next   int // the row Scan reads is rows[next-1]
}

func (r *pipelinedRows) take(br pgx.BatchResults) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	r.types = rows.Conn().TypeMap()
	r.fields = slices.Clone(rows.FieldDescriptions())
	for rows.Next() {
		raw := rows.RawValues()
		row := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				row[i] = slices.Clone(v)
			}
		}
		r.rows = append(r.rows, row)
	}
	rows.Close()
	return rows.Err()
}

func (r *pipelinedRows) Next() bool {
	if r.next >= len(r.rows) {
		r.next = len(r.rows) + 1
		return false
	}
	r.next++
	return true
}

func (r *pipelinedRows) Scan(dest ...any) error {
	if r.next < 1 || r.next > len(r.rows) {
		return errors.New("scanning rows: no row (Next was not called, or returned false)")
	}
	row := r.rows[r.next-1]
	if len(dest) != len(row) {
		return fmt.Errorf("scanning rows: %d columns into %d values", len(row), len(dest))
	}
	for i, d := range dest {
		f := r.fields[i]
		if err := r.types.Scan(f.DataTypeOID, f.Format, row[i], d); err != nil {
			return fmt.Errorf("scanning column %d (%s): %w", i, f.Name, err)
		}
	}
	return nil
}

func (r *pipelinedRows) Close() error { r.rows, r.next = nil, 1; return nil }
func (r *pipelinedRows) Err() error   { return nil }

func (t *Tx) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	ctx = t.stmtCtx(ctx)
	q = t.s.bind(q)
	if t.lc != nil {
		return t.lc.queryRow(q, args)
	}
	if t.conn != nil && t.sendHeldFirst(q) {
		return pipelinedRow{t: t, ctx: ctx, q: q, args: args}
	}
	t.trips++
	t.stmts++
	return t.q.QueryRowContext(ctx, q, args...)
}

// Savepoint runs f inside a savepoint of the transaction: an error from f undoes f's writes
// alone, and is returned.
func (t *Tx) Savepoint(ctx context.Context, f func() error) error {
	ferr, err := t.savepoint(ctx, "nested", f)
	if err != nil {
		return err
	}
	return ferr
}

// savepoint runs f inside savepoint name, rolled back to when f fails: f's error, and apart
// from it the error of the savepoint itself (the transaction is then unusable).
func (t *Tx) savepoint(ctx context.Context, name string, f func() error) (ferr, err error) {
	if t.conn != nil {
		return t.savepointLater(ctx, name, f)
	}
	if t.optimistic {
		if ferr = f(); ferr != nil {
			// Nothing undoes f's writes but the rollback of the pass: its caller must not go
			// on and see them. The pass ends here (runCaught takes the panic) and runs again.
			t.spoiled = true
			panic(errSpoiled)
		}
		return nil, nil
	}
	if _, err := t.exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, fmt.Errorf("opening savepoint: %w", err)
	}
	mark := len(t.undo)
	if ferr = f(); ferr != nil {
		t.undoFrom(mark)
		if _, err := t.exec(ctx, "ROLLBACK TO SAVEPOINT "+name); err != nil {
			return ferr, fmt.Errorf("rolling back savepoint after %v: %w", ferr, err)
		}
	}
	if _, err := t.exec(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return ferr, fmt.Errorf("releasing savepoint: %w", err)
	}
	return ferr, nil
}

// savepointLater is savepoint on PostgreSQL, where the SAVEPOINT statement is held with the
// writes (execLater) and goes out with the next statement, and f's held writes go out before
// f is taken as done (their errors are f's). A savepoint that succeeded is left to the
// transaction's end (a RELEASE would be one more round trip): its name holds its depth, so
// that an outer savepoint's rollback does not stop at an inner one left unreleased. An
// outermost savepoint that leaves the transaction unusable breaks it (Tx.broken).
func (t *Tx) savepointLater(ctx context.Context, name string, f func() error) (ferr, err error) {
	if t.optimistic {
		return t.speculate(f), nil
	}
	defer func() {
		// (An inner savepoint's error is its outer one's f's, which that one may undo.)
		if err != nil && t.broken == nil && t.depth == 0 {
			t.broken = err
		}
	}()
	mark, held, undone := t.queued, len(t.later), len(t.undo)
	defer func() {
		if ferr != nil || err != nil {
			t.undoFrom(undone)
		}
	}()
	name = fmt.Sprintf("%s_%d", name, t.depth)
	t.depth++
	defer func() { t.depth-- }()
	t.later = append(t.later, laterStmt{q: "SAVEPOINT " + name, what: "opening savepoint", savepoint: true})
	t.queued++
	if ferr = f(); ferr == nil {
		if t.sent <= mark && len(t.later) == held+1 {
			// f sent and held nothing: no savepoint was needed.
			t.later, t.queued = t.later[:held], mark
			return nil, nil
		}
		if _, ferr = t.flush(ctx); ferr == nil {
			return nil, nil
		}
	}
	switch {
	case t.sent > mark:
		// The savepoint exists: what f held is dropped, what f sent is undone.
		t.later = nil
		if _, err := t.exec(ctx, "ROLLBACK TO SAVEPOINT "+name); err != nil {
			return ferr, fmt.Errorf("rolling back savepoint after %v: %w", ferr, err)
		}
		return ferr, nil
	case len(t.later) > held:
		// The savepoint was not sent, nor any write of f's: f changed nothing in the database,
		// unless a read of f's failed there, which aborted the whole transaction.
		t.later, t.queued = t.later[:held], mark
		var pe *pgconn.PgError
		if errors.As(ferr, &pe) {
			return ferr, fmt.Errorf("the transaction failed before its savepoint was sent: %w", ferr)
		}
		return ferr, nil
	default:
		// The writes sent with the savepoint failed before it: the transaction is aborted.
		return ferr, fmt.Errorf("opening savepoint: %w", ferr)
	}
}

// speculate runs f as a savepoint of a PostgreSQL write run without them (Tx.optimistic, the
// first run of every write: see Store.Write). No SAVEPOINT goes out, nor does f's end send what
// f held: its writes go with the transaction's next statement, its COMMIT at the latest. That
// saves the round trip a savepoint's end costs to learn whether its writes failed, which they
// rarely do. f's error is returned as a savepoint's would be while nothing of f's reached the
// database (what f held is dropped); otherwise, and when one of f's writes or of the statements
// sent while f ran fails later, the run is spoiled: its transaction is rolled back and the write
// runs again with savepoints.
func (t *Tx) speculate(f func() error) error {
	trips, held, queued, undone := t.trips, len(t.later), t.queued, len(t.undo)
	t.depth++
	ferr := f()
	t.depth--
	if ferr == nil {
		return nil
	}
	t.undoFrom(undone)
	if t.trips == trips && !t.spoiled {
		t.later, t.queued = t.later[:held], queued
		return ferr
	}
	t.spoiled = true
	return ferr
}

// forUpdate is the row-lock suffix: PostgreSQL locks the row, SQLite's writer is already alone.
func (t *Tx) forUpdate() string {
	if t.s.engine == Postgres {
		return " FOR UPDATE"
	}
	return ""
}

// Write runs f in one write transaction, retried on serialization failures. On SQLite, f may be
// committed together with other writers' functions: an error from f rolls back f's writes
// only. On either engine f may run more than once before its outcome is returned (PostgreSQL
// retries it; SQLite's writer runs a group again, with savepoints, when a write of it failed
// without one): f must keep nothing outside the transaction but what it sets afresh each
// time it runs. f must not call Write itself.
func (s *Store) Write(ctx context.Context, f func(*Tx) error) error {
	if s.writes != nil {
		req := &writeReq{ctx: ctx, f: f, done: make(chan error, 1)}
		select {
		case s.writes <- req:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return errors.New("store is closed")
		}
		err := <-req.done
		var p *writePanic
		if errors.As(err, &p) {
			// f panicked in the writer, which undid f's writes alone and went on with the
			// others of its group: the panic goes on here, in f's caller, as it would on
			// PostgreSQL.
			slog.Default().Error("a write panicked in the store's writer", "panic", p.value, "stack", string(p.stack))
			panic(p.value)
		}
		return err
	}
	// (SQLite's writes all go through its writer: s.writes.) A write runs first without
	// savepoints (speculate), and again with them if one of them failed.
	optimistic := true
	for attempt := 0; ; {
		err := s.writePostgres(ctx, f, optimistic)
		if optimistic && errors.Is(err, errSpoiled) {
			optimistic = false
			s.reruns.Add(1)
			continue
		}
		if err == nil || attempt >= 4 || !retryable(err) {
			return err
		}
		attempt++
	}
}

// writePostgres runs f in a transaction on one connection of the pool, whose BEGIN goes out
// with the transaction's first statement and whose COMMIT with its last held writes: a write
// transaction costs the round trips of its reads, of the writes whose outcome it reads, and
// one more.
func (s *Store) writePostgres(ctx context.Context, f func(*Tx) error, optimistic bool) (err error) {
	conn, err := s.write.Conn(ctx)
	if err != nil {
		return fmt.Errorf("taking a connection: %w", err)
	}
	t := &Tx{s: s, q: conn, conn: conn, at: s.nowMicros(), optimistic: optimistic}
	defer func() {
		if err != nil && t.spoiled && !errors.Is(err, errSpoiled) {
			err = fmt.Errorf("%w: %w", errSpoiled, err) // (run again, with savepoints)
		}
		if err != nil {
			t.undoFrom(0) // (retried, or failed: either way not committed)
		}
	}()
	t.later = append(t.later, laterStmt{q: "BEGIN", what: "beginning transaction"})
	t.queued++
	committed := false
	defer func() {
		s.trips.Add(int64(t.trips))
		s.pgStatements.Add(int64(t.stmts))
		if !committed && t.sent > 0 {
			// The connection goes back to the pool: never inside this transaction. A
			// connection that cannot say ROLLBACK is closed instead.
			if _, rerr := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
				conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}
		conn.Close()
	}()
	if err := f(t); err != nil {
		return err
	}
	if t.spoiled {
		return errSpoiled // (not committed: the write runs again, with savepoints)
	}
	if t.broken != nil {
		return t.broken // a savepoint left the transaction unusable; its caller went on
	}
	if t.sent == 0 && len(t.later) == 1 {
		return nil // f sent and held nothing: no transaction was begun
	}
	t.later = append(t.later, laterStmt{q: "COMMIT", what: "committing transaction"})
	t.queued++
	if _, err := t.flush(ctx); err != nil {
		return err
	}
	committed = true
	return nil
}

// writerGroupRegion names the region of each of the writer's groups in an execution trace.
const writerGroupRegion = "store.writer.group"

// commitLoop is SQLite's single writer: it takes the pending writes (up to maxGroup), runs
// them in one transaction (commitPass), commits once, and hands the group to flushLoop, which
// answers every caller once the commit is on disk.
func (s *Store) commitLoop() {
	defer s.loop.Done()
	defer close(s.flushQuit) // (flushLoop answers what it still holds, then ends)
	// While its CPU is measured, one OS thread runs the writer, whose CPU time is then the
	// writer's (MeasureWriterCPU).
	locked := false
	defer func() {
		if locked {
			runtime.UnlockOSThread()
		}
	}()
	var wal walBound
	for {
		var group []*writeReq
		select {
		case req := <-s.writes:
			group = append(group, req)
		case <-s.stop:
			return
		}
	drain:
		for len(group) < maxGroup {
			select {
			case req := <-s.writes:
				group = append(group, req)
			default:
				break drain
			}
		}
		if groupWaits(int(s.lastGroup.Load()), len(group)) {
			group = s.fill(group)
		}
		s.lastGroup.Store(int64(len(group)))
		if failed := s.flushFailed.Load(); failed != nil {
			for _, r := range group {
				r.done <- *failed
			}
			continue
		}
		if measure := s.measureCPU.Load(); measure != locked {
			if measure {
				runtime.LockOSThread()
			} else {
				runtime.UnlockOSThread()
			}
			locked = measure
		}
		t0 := time.Now()
		var cpu0 time.Duration
		cpuOK := false
		if locked {
			cpu0, cpuOK = threadCPU()
		}
		s.boundWAL(&wal, t0)
		// A region of its own in an execution trace (`bcd sim --trace`): the writer's waits
		// inside its groups are read from the trace's goroutine states within them.
		region := rtrace.StartRegion(context.Background(), writerGroupRegion)
		s.commitGroup(group)
		region.End()
		s.busy.Add(int64(time.Since(t0)))
		if cpuOK {
			if cpu1, ok := threadCPU(); ok {
				s.busyCPU.Add(int64(cpu1 - cpu0))
			}
		}
		s.groups.Add(1)
		s.written.Add(int64(len(group)))
	}
}

func (s *Store) commitGroup(group []*writeReq) {
	// Savepoints are from pessimistic on: the writes before it ran without (a first pass
	// that met an error is run again from its start with the write that failed, and those after
	// it, each in a savepoint). Each pass moves it down, so there are at most as many passes as
	// writes; in practice one, or two.
	pessimistic := len(group)
	rehearse := s.rehearse.Load()
	for {
		redo, ok := s.commitPass(group, pessimistic, rehearse)
		if ok {
			return
		}
		if rehearse && redo == len(group) {
			rehearse = false
			continue
		}
		pessimistic, rehearse = redo, false
		s.reruns.Add(1)
	}
}

// commitPass runs group in one transaction and commits it, the writes from pessimistic on each
// in a savepoint of its own (f's error undoes f's writes alone) and those before it without
// one: a savepoint is two more statements and makes SQLite copy each page the write changes
// first, a third of the writer's statements when every write has one, while a write that fails
// is rare. If one of those before pessimistic fails, or a savepoint of its own (Tx.Savepoint)
// does, the pass is rolled back, answers nobody, and returns that write's index: the group must
// be run again with savepoints from there on. ok says the pass answered every caller. A
// rehearsal is rolled back even if nothing failed (redo is then len(group)).
func (s *Store) commitPass(group []*writeReq, pessimistic int, rehearsal bool) (redo int, ok bool) {
	errs := make([]error, len(group))
	ctx := context.Background()
	tx, err := s.lite.begin()
	if err != nil {
		for _, r := range group {
			r.done <- fmt.Errorf("beginning transaction: %w", err)
		}
		return 0, true
	}
	t := &Tx{s: s, lc: s.lite, at: s.nowMicros(), events: s.heldEvents}
	// keep hands the array the pass held its events in to the next pass, before any of the
	// pass's writes is answered (a test's commitGroup after an answer then sees it kept).
	keep := func() { clear(t.events); s.heldEvents = t.events[:0] }
	// undo rolls the pass back: its writes, and what their functions kept beside them.
	undo := func() {
		tx.Rollback()
		t.undoFrom(0)
		keep()
	}
	fail := func(err error) (int, bool) {
		undo()
		for _, r := range group {
			r.done <- err
		}
		return 0, true
	}
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		if i < pessimistic {
			t.optimistic, t.spoiled = true, false
			ferr := runCaught(r.f, t)
			t.optimistic = false
			if ferr != nil || t.spoiled {
				undo()
				return i, false
			}
			continue
		}
		var err error
		if errs[i], err = t.savepoint(ctx, "w", func() error { return runCaught(r.f, t) }); err != nil {
			return fail(err)
		}
	}
	if err := t.insertHeldEvents(ctx); err != nil {
		return fail(err)
	}
	if rehearsal {
		undo()
		return len(group), false
	}
	if err := tx.Commit(); err != nil {
		t.undoFrom(0)
		keep()
		for _, r := range group {
			r.done <- fmt.Errorf("committing transaction: %w", err)
		}
		return 0, true
	}
	keep()
	s.flush.Lock()
	s.flush.pending = append(s.flush.pending, committedGroup{group, errs})
	s.flush.Unlock()
	select {
	case s.flushWake <- struct{}{}:
	default:
	}
	select {
	case s.committed <- struct{}{}:
	default:
	}
	return 0, true
}

// committedGroup is a group the writer committed, and each of its writes' outcome, not yet
// answered: the WAL holding it may not be on disk yet.
type committedGroup struct {
	group []*writeReq
	errs  []error
}

// flushLoop answers SQLite's committed writes once they are on disk. The writer commits
// without waiting for the disk (synchronous NORMAL) and hands each committed group here; this
// flushes the WAL file (fdatasync, which takes every group committed before it) and only then
// answers their callers, while the writer runs the next groups. A caller is answered as it was
// when each commit flushed the WAL itself (synchronous FULL): what it was told is stored
// survives a power loss. Other readers may see a committed write a moment before it is on disk,
// as they could see it before its caller was answered; a power loss in that moment loses it with
// the writes after it (SQLite's WAL keeps its commits in order), none of them answered. A flush
// that fails leaves the disk's state unknown: every write it held and every write after it
// fail (flushFailed), and the store must be reopened (a restart of the server), which recovers
// what the disk holds.
func (s *Store) flushLoop() {
	defer s.loop.Done()
	var wal *os.File
	defer func() {
		if wal != nil {
			wal.Close()
		}
	}()
	for {
		quit := false
		select {
		case <-s.flushWake:
		case <-s.flushQuit:
			quit = true // the writer stopped: what it committed is all in pending
		}
		s.flush.Lock()
		pending := s.flush.pending
		s.flush.pending = nil
		s.flush.Unlock()
		if len(pending) > 0 {
			err := s.flushFailed.Load()
			if err == nil {
				t0 := time.Now()
				if ferr := s.flushWAL(&wal); ferr != nil {
					e := fmt.Errorf("flushing the SQLite store's write-ahead log to disk: %w (what was committed since the last flush may be lost; the store refuses writes until it is reopened)", ferr)
					slog.Default().Error("the store's disk failed", "error", ferr)
					s.flushFailed.Store(&e)
					err = &e
				}
				s.flushBusy.Add(int64(time.Since(t0)))
				s.flushes.Add(1)
			}
			for _, c := range pending {
				for i, r := range c.group {
					if err != nil {
						r.done <- *err
					} else {
						r.done <- c.errs[i]
					}
				}
			}
		}
		if quit {
			return
		}
	}
}

// flushWAL flushes the WAL file to disk through *wal, which it opens the first time (the file
// exists once the writer has committed in WAL mode, and keeps its inode while the store is open:
// SQLite restarts and truncates it in place).
func (s *Store) flushWAL(wal **os.File) error {
	if *wal == nil {
		f, err := os.Open(s.wal)
		if err != nil {
			return err
		}
		*wal = f
	}
	return (*s.syncWAL.Load())(*wal)
}

// RehearseWrites makes SQLite's writer, while on, roll back the first pass of every group it
// runs and run the group again, as it does when a write of a pass fails: a test turns it on to
// show that a write function keeps nothing outside its transaction that a second run would
// find (and that what it keeps it undoes, OnUndo).
func (s *Store) RehearseWrites(on bool) { s.rehearse.Store(on) }

// writePanic is a panic of a write's function in SQLite's writer, as an error: the writer
// survives it (it would otherwise end the process, and every write after it would wait for
// ever), undoes the function's writes and hands the panic to the function's caller (Write).
type writePanic struct {
	value any
	stack []byte
}

func (p *writePanic) Error() string { return fmt.Sprintf("the write panicked: %v", p.value) }

// errSpoiled ends a write run without savepoints once a savepoint of its failed (see savepoint).
var errSpoiled = errors.New("a savepoint failed in a write run without savepoints: the pass runs again")

// runCaught runs f(t), returning a panic of f's as a *writePanic.
func runCaught(f func(*Tx) error, t *Tx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if v == errSpoiled && t.spoiled {
				err = errSpoiled
				return
			}
			err = &writePanic{value: v, stack: debug.Stack()}
		}
	}()
	return f(t)
}

// walOverLimit reports whether the WAL file has grown past walLimit. After a restart the next
// commit cuts the file back to the limit (journal_size_limit), so a larger file holds frames
// written since the restart beyond the limit.
func (s *Store) walOverLimit() bool {
	fi, err := os.Stat(s.wal)
	return err == nil && fi.Size() > s.walLimit
}

// walRetryAfter is how long the writer lets the WAL grow after readers held off its restart;
// walRetryMax bounds the wait after failures in a row (a restart that cannot succeed, a full
// disk, is tried, and logged, at most that often).
const (
	walRetryAfter = 250 * time.Millisecond
	walRetryMax   = 30 * time.Second
)

// walReaderWait is how long a restart of the WAL waits for readers still reading it; the
// writer waits with it, so it is short (a read is a few milliseconds; a long one, such as a
// large listing, makes the restart wait for the next try).
const walReaderWait = 100 * time.Millisecond

// restartWAL checkpoints the whole WAL and empties its file (the next commit begins it again
// from its start), between two groups, so no write adds to it meanwhile, waiting up to
// walReaderWait for readers still reading it (SQLite's busy handler sleeps the writer between
// its looks). It is walBound's last resort, when restarts that do not wait kept finding a reader
// in the WAL, or when no commit came to restart it: SQLite begins the WAL again, and cuts its
// file back to the limit, only at the next commit that writes a page, so while the writes change
// nothing (their rows already hold what they write) a WAL copied whole keeps its size over the
// limit, and the writer would copy and restart it again and again. It reports false if readers
// held the WAL past walReaderWait.
func (s *Store) restartWAL() bool {
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	ctx := context.Background()
	conn, err := s.write.Conn(ctx)
	if err != nil {
		slog.Default().Warn("restarting the store's write-ahead log", "error", err)
		return false
	}
	defer conn.Close()
	var stuck, frames, copied int64
	if _, err = conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", walReaderWait.Milliseconds())); err == nil {
		err = conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&stuck, &frames, &copied)
		if _, reset := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA busy_timeout = %d", busyTimeout.Milliseconds())); err == nil {
			err = reset
		}
	}
	switch {
	case err != nil:
		slog.Default().Warn("restarting the store's write-ahead log", "error", err)
		return false
	case stuck != 0:
		slog.Default().Warn("restarting the store's write-ahead log: readers (or another checkpoint) held it; it grows until the next try",
			"frames", frames, "copied", copied)
		return false
	}
	return true
}

// checkpointInterval is the least time between two checkpoints while writes go on: each copies
// what the WAL gained since the last one into the database file.
const checkpointInterval = 500 * time.Millisecond

// checkpointLoop copies the WAL into the database file after commits, on its own connection,
// while the writer goes on (SQLite's passive checkpoint takes no lock the writer needs). Readers
// on old snapshots only hold back the part of the WAL they still read. A passive checkpoint
// never catches up with a writer that does not pause, and SQLite begins the WAL again only
// once it is wholly copied: under steady writes the WAL would grow for ever (3 GB beside a
// 600 MB database in a 10 000-node `bcd sim`). Once it holds walLimit, the writer restarts it.
func (s *Store) checkpointLoop() {
	defer s.loop.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	asked := false // the writer asked to catch up (ckptNow)
	for {
		if !asked {
			select {
			case <-s.committed:
			case <-s.ckptNow:
				asked = true
			case <-s.stop:
				return
			}
		}
		s.checkpoint(asked)
		if asked {
			s.ckptCatchUps.Add(1)
			asked = false
		}
		t.Reset(checkpointInterval)
		select {
		case <-t.C:
		case <-s.ckptNow:
			asked = true
		case <-s.stop:
			return
		}
	}
}

// Catching up with the writer (checkpoint), the checkpointer stops once a pass found fewer
// than walCatchUpFrames frames added since the last one, or after walCatchUpPasses passes.
const (
	walCatchUpFrames = 256
	walCatchUpPasses = 8
)

// checkpoint copies the WAL into the database file: one passive pass or, catching up with the
// writer, passes one after the other, each copying what the writer added during the last (a
// pass copies thousands of frames in the time the writer adds hundreds, so they shrink fast)
// until what a pass found added since the last is small: what the writer then copies itself
// before SQLite restarts the WAL (walBackfill) is a few groups' frames.
func (s *Store) checkpoint(catchUp bool) {
	var last int64
	for range walCatchUpPasses {
		var busy, frames, copied int64
		s.ckptMu.Lock()
		err := s.ckpt.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied)
		s.ckptMu.Unlock()
		if err != nil {
			// Not fatal: the WAL grows until the next one succeeds.
			slog.Default().Warn("checkpointing the store's write-ahead log", "error", err)
			return
		}
		if !catchUp || frames-last < walCatchUpFrames {
			return
		}
		last = frames
	}
}

func retryable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "SQLSTATE 40001") || strings.Contains(msg, "SQLSTATE 40P01") || strings.Contains(msg, "database is locked")
}

// isUnique reports a unique-constraint violation on either engine.
func isUnique(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "UNIQUE constraint failed") || strings.Contains(msg, "SQLSTATE 23505")
}

func (s *Store) readStmt(ctx context.Context, q string) *sql.Stmt {
	if s.engine != SQLite {
		return nil
	}
	return s.readStmts.get(ctx, s.read, q)
}

// hotQuery is the query of the reads made for every claim and every agent's connection: the
// claims connection's when no other read holds it (done hands it back once the rows are
// closed), else, and on PostgreSQL, the read pool's.
func (s *Store) hotQuery() (query func(ctx context.Context, q string, args ...any) (rowsIter, error), done func()) {
	if s.claims != nil && s.claimsMu.TryLock() {
		if !s.claimsShut {
			return func(_ context.Context, q string, args ...any) (rowsIter, error) {
				return s.claims.query(q, args)
			}, s.claimsMu.Unlock
		}
		s.claimsMu.Unlock()
	}
	return func(ctx context.Context, q string, args ...any) (rowsIter, error) {
		return s.queryRows(ctx, q, args...)
	}, func() {}
}

func (s *Store) queryRows(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q = s.bind(q)
	if st := s.readStmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return s.read.QueryContext(ctx, q, args...)
}

func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	q = s.bind(q)
	if st := s.readStmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return s.read.QueryRowContext(ctx, q, args...)
}

// scanID scans a row of one text column (an id), for collect.
func scanID(r interface{ Scan(...any) error }) (string, error) {
	var id string
	return id, r.Scan(&id)
}

// collect reads every row of a query with scan; what names the rows in errors.
func collect[T any](rows rowsIter, err error, what string, scan func(interface{ Scan(...any) error }) (T, error)) ([]T, error) {
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", what, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
