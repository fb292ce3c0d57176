package cli

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/server"
	"bcd/internal/store"
)

// A server refuses a SQLite store restored from a backup taken before its last heartbeat, and
// says what to do; `bcd store after-restore` refuses while a server runs on the store and on a
// path with no store, fences the restored one, and the server starts on it then, with the
// fence recorded as an event.
func TestStoreAfterRestore(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", DataDir: dir}
	db := filepath.Join(dir, "bcd.db")
	mark := filepath.Join(dir, "store.watermark")

	// start runs a server on dir until stop is called.
	start := func() (stop func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		srv, err := server.New(ctx, cfg, log)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}
	}
	stop := start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(mark); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server kept no store watermark after its first heartbeat")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, stderr := run(t, nil, "store", "after-restore", "--data-dir", dir); code == 0 || !strings.Contains(stderr, "in use by another bcd server") {
		t.Errorf("after-restore beside a running server: exit %d, %s", code, stderr)
	}
	// The backup: a consistent copy while the server runs, as the operations guide says.
	backup := filepath.Join(t.TempDir(), "backup.db")
	conn, err := sql.Open("sqlite", "file:"+db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(`VACUUM INTO '` + backup + `'`); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	stop() // a clean stop counts a beat after the backup

	for _, f := range []string{db, db + "-wal", db + "-shm"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = server.New(context.Background(), cfg, log)
	if !errors.Is(err, server.ErrRestored) || !strings.Contains(err.Error(), "bcd store after-restore") {
		t.Fatalf("a server on the restored store: %v", err)
	}

	if code, _, stderr := run(t, nil, "store", "after-restore", "--data-dir", filepath.Join(dir, "nothing")); code == 0 || !strings.Contains(stderr, "no SQLite store at") {
		t.Errorf("after-restore on a path with no store: exit %d, %s", code, stderr)
	}
	code, stdout, stderr := run(t, nil, "store", "after-restore", "--data-dir", dir, "--reason", "restored last night's backup")
	if code != 0 || !strings.Contains(stdout, "store fenced:") || !strings.Contains(stdout, "queued or held commands recorded lost") {
		t.Fatalf("after-restore: exit %d\n%s%s", code, stdout, stderr)
	}
	stop = start()
	stop()
	st, err := store.Open(context.Background(), "sqlite:"+db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.Events(context.Background(), store.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		if e.Kind == "control_plane.restore_fenced" {
			found = strings.HasPrefix(e.Reason, "restored last night's backup") && e.Actor == "operator"
		}
	}
	if !found {
		t.Errorf("no control_plane.restore_fenced event with the reason given in %d events", len(evs))
	}
}
