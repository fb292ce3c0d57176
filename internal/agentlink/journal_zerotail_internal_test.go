package agentlink

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A crash can leave the unsynced end of an appended file as zeros (the file's new size reached
// the disk, the data did not: XFS, ext4 with data=writeback). Zeros are never a record (every
// record has a JSON payload) and hold nothing the agent acknowledged (that was fsync'd before),
// so the journal opens with them cut off, as a torn last record is; the agent is not left
// refusing to start on "journal corrupt". A non-zero byte among them is still damage.
func TestJournalZeroTailAfterCrash(t *testing.T) {
	var good []byte
	good = appendRecord(good, receivedRecord(Command{ID: "a", Kind: "bmc.power"}, storeMark{}))
	good = appendRecord(good, record{Op: opStarted, ID: "a"})
	withByte := append(bytes.Clone(good), make([]byte, 4096)...)
	withByte[len(good)+2000] = 1
	for _, tc := range []struct {
		name    string
		data    []byte
		corrupt bool
	}{
		{"zero page after the records", append(bytes.Clone(good), make([]byte, 4096)...), false},
		{"zeros shorter than a header", append(bytes.Clone(good), make([]byte, 5)...), false},
		{"zeros then a stray byte", withByte, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, JournalFile), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			j, err := openJournal(dir, 10)
			if tc.corrupt {
				if !errors.Is(err, errJournalCorrupt) {
					t.Fatalf("opened with %v, want corrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ran, _ := j.unfinished(); len(ran) != 1 || ran[0].ID != "a" {
				t.Errorf("ran %v, want a (started before the crash)", ran)
			}
			if err := j.finish(Update{CommandID: "a", State: StateInterrupted}); err != nil {
				t.Fatal(err)
			}
			if err := j.close(); err != nil {
				t.Fatal(err)
			}
			data, _ := os.ReadFile(filepath.Join(dir, JournalFile))
			if recs, n, err := decodeJournal(data); err != nil || n != len(data) || len(recs) != 3 {
				t.Fatalf("after reopening: %d records, %d/%d bytes, %v", len(recs), n, len(data), err)
			}
		})
	}
}
