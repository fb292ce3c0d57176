package agentlink

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"time"

	"bcd/internal/durable"
)

// The journal is the agent's memory of command ids: a command is acknowledged only once its
// id is in the journal, and a command whose id is there is never run again. It is an
// append-only file of records, each framed as
//
//	u32be(len(payload)) u32be(CRC-32C(payload)) payload
//
// where payload is one JSON record. A torn last record (crash mid-write), or zeros where the
// crash left the end of an append unwritten, is dropped when the journal is opened; damage
// anywhere else refuses to open (running a command twice is worse than not starting). Records
// replay idempotently, so compaction (rewrite to a temporary file, fsync, rename) may overlap
// appends.

// maxRecordBytes bounds one record (a result can be large: an inventory).
const maxRecordBytes = 64 << 20

// JournalFile is the journal's file name in DataDir.
const JournalFile = "journal"

// Record operations.
const (
	opReceived  = "recv"    // the command arrived (and will be acknowledged)
	opStarted   = "start"   // it is about to run (after the server answered its ack)
	opFinal     = "final"   // its final update, as sent
	opConfirmed = "confirm" // the server accepted the final update
	opForgotten = "forget"  // never started, and the server refused it: as if never received
)

type record struct {
	Op         string `json:"op"`
	ID         string `json:"id"`
	Kind       string `json:"kind,omitempty"`
	NodeID     string `json:"node,omitempty"`
	Generation uint64 `json:"gen,omitempty"`
	Attest     bool   `json:"attest,omitempty"`
	// Starts marks a command whose start is journaled (opStarted): without one it never ran.
	// Journals written before start records existed lack it: their unfinished commands may
	// have run.
	Starts     bool   `json:"starts,omitempty"`
	Args       []byte `json:"args,omitempty"`
	DeadlineMS int64  `json:"deadline,omitempty"`
	State      string `json:"state,omitempty"`
	Result     []byte `json:"result,omitempty"`
	Error      string `json:"error,omitempty"`
	Sig        []byte `json:"sig,omitempty"`
	Cert       []byte `json:"cert,omitempty"`
	// Store and Fences (opReceived): the store the command came from and its restore fences, as
	// the agent's watermark said when it arrived. Kept for the last command received only.
	Store  string `json:"store,omitempty"`
	Fences int64  `json:"fences,omitempty"`
}

func crcTable() *crc32.Table { return crc32.MakeTable(crc32.Castagnoli) }

func appendRecord(b []byte, r record) []byte {
	payload, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("encoding journal record: %v", err)) // plain struct: cannot fail
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(payload, crcTable()))
	return append(b, payload...)
}

// decodeJournal parses a journal. good is the length of the intact prefix: everything after it
// is a torn last record to be truncated away.
func decodeJournal(data []byte) (recs []record, good int, err error) {
	tab := crcTable()
	off := 0
	for off < len(data) {
		if len(data)-off < 8 {
			return recs, off, nil // torn header
		}
		n := int(binary.BigEndian.Uint32(data[off:]))
		sum := binary.BigEndian.Uint32(data[off+4:])
		if n == 0 && allZero(data[off:]) {
			// No record is empty: zeros to the end are an append a crash cut short after
			// the file's size reached the disk and before its data did (nothing fsync'd).
			return recs, off, nil
		}
		if n > maxRecordBytes {
			return nil, 0, fmt.Errorf("%w: record at offset %d claims %d bytes", errJournalCorrupt, off, n)
		}
		end := off + 8 + n
		if end > len(data) {
			return recs, off, nil // torn payload
		}
		payload := data[off+8 : end]
		if crc32.Checksum(payload, tab) != sum {
			if end == len(data) {
				return recs, off, nil // torn last record
			}
			return nil, 0, fmt.Errorf("%w: checksum mismatch at offset %d", errJournalCorrupt, off)
		}
		var r record
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, 0, fmt.Errorf("%w: record at offset %d: %v", errJournalCorrupt, off, err)
		}
		switch r.Op {
		case opReceived, opStarted, opFinal, opConfirmed, opForgotten:
		default:
			return nil, 0, fmt.Errorf("%w: record at offset %d: unknown op %q", errJournalCorrupt, off, r.Op)
		}
		if r.ID == "" {
			return nil, 0, fmt.Errorf("%w: record at offset %d has no command id", errJournalCorrupt, off)
		}
		recs = append(recs, r)
		off = end
	}
	return recs, off, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// jentry is what the journal knows of one command.
type jentry struct {
	cmd Command
	// starts: the command's start is journaled before it runs; started: it was.
	starts, started bool
	final           *Update
	confirmed       bool
}

// ran reports whether the command may have run: its start was journaled, or the journal that
// recorded it did not journal starts.
func (e *jentry) ran() bool { return e.started || !e.starts }

// journal is the at-most-once record. Appends from concurrent callers share one write and one
// fsync (group commit). With no path it lives in RAM only (the ramdisk). The file is open only
// while a batch is written: an agent holds no descriptor for its journal between commands
// (`bcd sim --server` runs thousands of installed OSes' agents in one process, each with its
// own journal, under one limit of open files), and a compaction's new file is simply the one
// the next batch opens.
type journal struct {
	retain     int // confirmed entries kept
	minCompact int // records before compaction is considered

	mu        sync.Mutex
	cond      *sync.Cond
	path      string
	closed    bool // close ran: nothing more is written
	entries   map[string]*jentry
	confirmed []string // confirmation order, oldest first
	// lastID is the last command received, lastMark the store and fences it came under.
	lastID   string
	lastMark storeMark
	records  int // records in the file
	// spentArgs counts the entries whose arguments (which may carry one-time tokens and BMC
	// credentials sealed to this agent's key) the file still holds though their command started
	// or ended; compactedAt is the last compaction. A compaction drops them (argsCompaction).
	spentArgs   int
	compactedAt time.Time

	pending  []byte
	seq      uint64 // batch accumulating
	done     uint64 // last batch written
	flushing bool
	err      error // sticky: a journal that failed to write accepts nothing more
}

// openJournal reads (or creates) the journal in dir; dir "" keeps it in RAM.
func openJournal(dir string, retain int) (*journal, error) {
	j := &journal{retain: retain, minCompact: 4096, entries: map[string]*jentry{}, seq: 1}
	j.cond = sync.NewCond(&j.mu)
	if dir == "" {
		return j, nil
	}
	j.path = filepath.Join(dir, JournalFile)
	data, err := os.ReadFile(j.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading journal: %w", err)
	}
	recs, good, err := decodeJournal(data)
	if err != nil {
		return nil, fmt.Errorf("reading journal %s: %w", j.path, err)
	}
	for _, r := range recs {
		j.apply(r)
	}
	j.records = len(recs)
	f, err := os.OpenFile(j.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening journal: %w", err)
	}
	if good < len(data) {
		// Appends go to the file's end: a torn record there must go first.
		if err := f.Truncate(int64(good)); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("truncating torn journal record: %w", err)
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("truncating torn journal record: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("opening journal: %w", err)
	}
	if data == nil {
		// Created now (or empty): its name must outlive a power loss, or the records synced
		// into it could go with it.
		if err := durable.SyncDir(dir); err != nil {
			return nil, fmt.Errorf("creating journal %s: %w", j.path, err)
		}
	}
	j.mu.Lock()
	j.pruneLocked()
	err = j.err
	j.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return j, nil
}

// apply replays one record; replaying a record twice changes nothing.
func (j *journal) apply(r record) {
	e := j.entries[r.ID]
	if e == nil {
		e = &jentry{cmd: Command{ID: r.ID}}
		j.entries[r.ID] = e
	}
	switch r.Op {
	case opReceived:
		e.cmd = Command{ID: r.ID, Kind: r.Kind, NodeID: r.NodeID, Generation: r.Generation, Attest: r.Attest, Args: r.Args}
		if r.DeadlineMS != 0 {
			e.cmd.Deadline = time.UnixMilli(r.DeadlineMS)
		}
		e.starts = r.Starts
		j.lastID, j.lastMark = r.ID, storeMark{StoreID: r.Store, Fences: r.Fences}
	case opStarted:
		e.started = true
		j.spendArgs(e)
	case opForgotten:
		delete(j.entries, r.ID)
	case opFinal:
		e.final = &Update{CommandID: r.ID, State: r.State, Result: r.Result, Error: r.Error, NodeSig: r.Sig, SignerCertDER: r.Cert}
		j.spendArgs(e)
	case opConfirmed:
		if !e.confirmed {
			e.confirmed = true
			j.confirmed = append(j.confirmed, r.ID)
		}
	}
}

// spendArgs forgets the arguments of a command that started or ended: a restart never runs it
// again (it reports it interrupted, or re-sends its final update), and its arguments may carry
// secrets that must not stay on disk longer than needed.
func (j *journal) spendArgs(e *jentry) {
	if len(e.cmd.Args) > 0 {
		e.cmd.Args = nil
		j.spentArgs++
	}
}

// argsCompaction is how long the file may keep arguments spent since the last compaction.
const argsCompaction = time.Hour

// receivedRecord is c's arrival from the store of watermark m.
func receivedRecord(c Command, m storeMark) record {
	r := record{Op: opReceived, ID: c.ID, Kind: c.Kind, NodeID: c.NodeID, Generation: c.Generation, Attest: c.Attest, Args: c.Args, Starts: true,
		Store: m.StoreID, Fences: m.Fences}
	if !c.Deadline.IsZero() {
		r.DeadlineMS = c.Deadline.UnixMilli()
	}
	return r
}

func finalRecord(u Update) record {
	return record{Op: opFinal, ID: u.CommandID, State: u.State, Result: u.Result, Error: u.Error, Sig: u.NodeSig, Cert: u.SignerCertDER}
}

// receive records the commands not seen before, arrived from the store of watermark m, and
// returns them (fresh), and copies of the entries of those seen before (known). It returns once
// fresh ids are durable.
func (j *journal) receive(cmds []Command, m storeMark) (fresh []Command, known []jentry, err error) {
	j.mu.Lock()
	var buf []byte
	for _, c := range cmds {
		if e, ok := j.entries[c.ID]; ok {
			known = append(known, *e)
			continue
		}
		r := receivedRecord(c, m)
		j.apply(r)
		buf = appendRecord(buf, r)
		fresh = append(fresh, c)
	}
	if len(buf) == 0 {
		j.mu.Unlock()
		return nil, known, nil
	}
	err = j.writeLocked(buf, true)
	j.mu.Unlock()
	return fresh, known, err
}

// known returns copies of the entries of the commands in cmds the journal holds.
func (j *journal) known(cmds []Command) []jentry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []jentry
	for _, c := range cmds {
		if e, ok := j.entries[c.ID]; ok {
			out = append(out, *e)
		}
	}
	return out
}

// start records durably that a command is about to run. Once it returns, a crash leaves the
// command interrupted (it may have run); before, the command is known never to have run.
func (j *journal) start(id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := record{Op: opStarted, ID: id}
	j.apply(r)
	return j.writeLocked(appendRecord(nil, r), true)
}

// forget drops a command that never started and that the server refused: offered again later
// (its own again), it is a new command to this agent. Not waited for: if it is lost, the
// command is asked about again at the next start.
func (j *journal) forget(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if e, ok := j.entries[id]; !ok || e.ran() || e.final != nil {
		return
	}
	r := record{Op: opForgotten, ID: id}
	j.apply(r)
	_ = j.writeLocked(appendRecord(nil, r), false)
}

// finish records a command's final update durably.
func (j *journal) finish(u Update) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	r := finalRecord(u)
	j.apply(r)
	return j.writeLocked(appendRecord(nil, r), true)
}

// confirm records that the server accepted a final update. It is not waited for: losing it
// only means the update is sent once more.
func (j *journal) confirm(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	e, ok := j.entries[id]
	if !ok || e.confirmed || e.final == nil {
		return
	}
	j.apply(record{Op: opConfirmed, ID: id})
	_ = j.writeLocked(appendRecord(nil, record{Op: opConfirmed, ID: id}), false)
	j.pruneLocked()
}

// unconfirmed returns the final updates the server has not accepted yet.
func (j *journal) unconfirmed() []Update {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []Update
	for _, e := range j.entries {
		if e.final != nil && !e.confirmed {
			out = append(out, *e.final)
		}
	}
	return out
}

// unfinished returns the commands recorded without a final update: those that may have run
// (started, or recorded by a journal that did not record starts) and those that never ran.
func (j *journal) unfinished() (ran, never []Command) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, e := range j.entries {
		switch {
		case e.final != nil:
		case e.ran():
			ran = append(ran, e.cmd)
		default:
			never = append(never, e.cmd)
		}
	}
	return ran, never
}

// failed is the journal's sticky write error.
func (j *journal) failed() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// last returns the last command received and the store and fences it came under.
func (j *journal) last() (string, storeMark) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lastID, j.lastMark
}

// errJournalClosed refuses what is journaled after the journal was closed.
var errJournalClosed = errors.New("journal closed")

// writeLocked appends buf to the file; with wait, returns once it is written and fsync'd.
// Called with j.mu held; may release it while writing.
func (j *journal) writeLocked(buf []byte, wait bool) error {
	if j.err != nil {
		return j.err
	}
	if j.closed {
		return errJournalClosed
	}
	if j.path == "" {
		return nil
	}
	j.records++
	j.pending = append(j.pending, buf...)
	if !wait {
		return nil
	}
	my := j.seq
	for j.done < my {
		if !j.flushing {
			j.flushLocked()
			break
		}
		j.cond.Wait()
	}
	return j.err
}

// flushLocked writes the pending batch as its leader.
func (j *journal) flushLocked() {
	buf, my := j.pending, j.seq
	j.pending, j.seq, j.flushing = nil, j.seq+1, true
	j.mu.Unlock()
	err := appendFile(j.path, buf)
	j.mu.Lock()
	j.flushing = false
	j.done = my
	if err != nil && j.err == nil {
		j.err = fmt.Errorf("writing journal: %w", err)
	}
	j.cond.Broadcast()
}

// pruneLocked forgets the oldest confirmed entries beyond retain and compacts the file when
// most of it is dead.
func (j *journal) pruneLocked() {
	for len(j.confirmed) > j.retain {
		delete(j.entries, j.confirmed[0])
		j.confirmed = j.confirmed[1:]
	}
	if j.path == "" || j.flushing || j.err != nil || j.closed {
		return
	}
	spent := j.spentArgs > 0 && time.Since(j.compactedAt) >= argsCompaction
	if !spent && (j.records < j.minCompact || j.records < 4*len(j.entries)) {
		return
	}
	if err := j.compactLocked(); err != nil {
		j.err = err
		j.cond.Broadcast()
	}
}

// compactLocked rewrites the journal with the live entries only. Confirmed entries keep their
// final state but not their result (the server has it).
func (j *journal) compactLocked() error {
	var buf []byte
	n := 0
	add := func(r record) { buf = appendRecord(buf, r); n++ }
	write := func(e *jentry, keepResult bool, m storeMark) {
		r := receivedRecord(e.cmd, m)
		r.Starts = e.starts
		add(r)
		if e.started && e.final == nil {
			add(record{Op: opStarted, ID: e.cmd.ID})
		}
		if e.final != nil {
			r := finalRecord(*e.final)
			if !keepResult {
				r.Result = nil
			}
			add(r)
		}
		if e.confirmed {
			add(record{Op: opConfirmed, ID: e.cmd.ID})
		}
	}
	// The last command received is written last, with the store it came from: a replay takes
	// the last received record as the last command (lastID, lastMark).
	last := j.entries[j.lastID]
	for _, id := range j.confirmed {
		if e := j.entries[id]; e != last {
			write(e, false, storeMark{})
		}
	}
	for _, e := range j.entries {
		if !e.confirmed && e != last {
			write(e, true, storeMark{})
		}
	}
	if last != nil {
		write(last, !last.confirmed, j.lastMark)
	}
	// The records not yet written (pending) were applied before they were queued: the image
	// holds what they say, and they are dropped with the old file. Written after the image they
	// would name entries it pruned, which a replay would bring back as commands that never
	// finished. Their writers waiting for a flush find nothing left to write.
	if err := replaceFiles(filepath.Dir(j.path), namedFile{filepath.Base(j.path), buf}); err != nil {
		return fmt.Errorf("compacting journal: %w", err)
	}
	j.pending = nil
	j.records = n
	j.spentArgs, j.compactedAt = 0, time.Now()
	return nil
}

// close writes what is pending (records not waited for: confirmations, forgotten commands);
// nothing is journaled after it.
func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.flushing {
		j.cond.Wait()
	}
	if j.closed {
		return nil
	}
	j.closed = true
	if j.path == "" || len(j.pending) == 0 || j.err != nil {
		return nil
	}
	err := appendFile(j.path, j.pending)
	j.pending = nil
	if err != nil {
		return fmt.Errorf("closing journal: %w", err)
	}
	return nil
}

// appendFile appends buf to the file at path and flushes it to disk (fsync), opening it for
// this write only.
func appendFile(path string, buf []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// namedFile is a file's name in its directory and its content.
type namedFile struct {
	name string
	data []byte
}

// replaceFiles replaces each file in dir atomically and durably (mode 0600), in order.
func replaceFiles(dir string, files ...namedFile) error {
	for _, f := range files {
		if err := durable.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return err
		}
	}
	return nil
}
