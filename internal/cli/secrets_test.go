package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"bcd/internal/secrets"
	"bcd/internal/server"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// runSecrets runs `bcd secrets ARGS` (the command built on its own: the root registers it).
func runSecrets(t *testing.T, env map[string]string, args ...string) (err error, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	g := &globals{env: Env{Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb}}
	root := &cobra.Command{Use: "bcd", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(secretsCmd(g))
	root.SetArgs(append([]string{"secrets"}, args...))
	root.SetOut(&out)
	root.SetErr(&errb)
	err = root.ExecuteContext(context.Background())
	return err, out.String(), errb.String()
}

// bcd secrets rotate-key on a server's data dir: refused while the server runs, with the key in
// BCD_SEAL_KEY and where there is no store; with the server stopped it replaces the key,
// showing no secret and no key; the server then starts and opens every secret, and one given
// the old key refuses to start, naming the key it lacks.
func TestSecretsRotateKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "seal.key")
	ring, err := secrets.LoadOrCreateKeyring(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	oldText, _ := os.ReadFile(keyFile)
	sealer, _ := secrets.NewKeyringSealer(ring)
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(dir, "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	err = st.Write(ctx, func(tx *store.Tx) error {
		for i := range 7 {
			id, plain := fmt.Sprintf("sec%d", i), fmt.Sprintf("bmc-pw-%d", i)
			sealed, err := sealer.Seal(id, []byte(plain))
			if err != nil {
				return err
			}
			want[id] = plain
			if err := tx.InsertSecret(ctx, id, "default", sealed); err != nil {
				return err
			}
		}
		return nil
	})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", DataDir: dir}
	start := func(cfg server.Config) (stop func(), err error) {
		ctx, cancel := context.WithCancel(context.Background())
		srv, err := server.New(ctx, cfg, log)
		if err != nil {
			cancel()
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}, nil
	}
	stop, err := start(cfg) // stores the agent CA, its key sealed
	if err != nil {
		t.Fatal(err)
	}
	if err, _, _ := runSecrets(t, nil, "rotate-key", "--data-dir", dir); err == nil || !strings.Contains(err.Error(), "in use by another bcd server") {
		t.Errorf("rotate-key beside a running server: %v", err)
	}
	stop()

	for name, c := range map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"BCD_SEAL_KEY": {map[string]string{"BCD_SEAL_KEY": strings.TrimSpace(string(oldText))}, []string{"--data-dir", dir}, "BCD_SEAL_KEY is set"},
		"no store":     {nil, []string{"--data-dir", t.TempDir()}, "no SQLite store"},
		"no key file":  {nil, []string{"--data-dir", dir, "--seal-key-file", filepath.Join(dir, "nope.key")}, "give the server's --data-dir or --seal-key-file"},
		"batch 0":      {nil, []string{"--data-dir", dir, "--batch", "0"}, "--batch 0"},
		"an argument":  {nil, []string{"--data-dir", dir, "now"}, "unknown command"},
	} {
		if err, _, _ := runSecrets(t, c.env, append([]string{"rotate-key"}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	if got, _ := os.ReadFile(keyFile); !bytes.Equal(got, oldText) {
		t.Fatal("a refused rotate-key changed the key file")
	}

	err, out, errOut := runSecrets(t, nil, "rotate-key", "--data-dir", dir, "--batch", "3")
	if err != nil {
		t.Fatalf("rotate-key: %v\n%s%s", err, out, errOut)
	}
	newRing, err := secrets.LoadKeyring(keyFile)
	if err != nil || newRing.Len() != 1 || newRing.IDs()[0] == ring.IDs()[0] {
		t.Fatalf("key file after: %v %v", newRing, err)
	}
	newText, _ := os.ReadFile(keyFile)
	for _, l := range []string{"checked 7/7 secrets", "added key " + newRing.IDs()[0], "re-sealed 7 secrets", "removed key " + ring.IDs()[0], "done: 7 secrets and 1 agent CA keys"} {
		if !strings.Contains(out, l) {
			t.Errorf("output lacks %q:\n%s", l, out)
		}
	}
	for _, secret := range append([]string{strings.TrimSpace(string(oldText)), strings.TrimSpace(string(newText))}, "bmc-pw-") {
		if strings.Contains(out+errOut, secret) {
			t.Errorf("output shows a secret (%q):\n%s%s", secret, out, errOut)
		}
	}

	// The old key, given to a server, is refused at start with what it lacks.
	old := cfg
	old.Key = base64.StdEncoding.EncodeToString(mustKey(t, oldText))
	if stop, err := start(old); err == nil {
		stop()
		t.Fatal("a server started with the key of before the rotation")
	} else if !strings.Contains(err.Error(), "sealed under key "+newRing.IDs()[0]) || !strings.Contains(err.Error(), "7 secrets") {
		t.Errorf("start with the old key: %v", err)
	}
	stop, err = start(cfg)
	if err != nil {
		t.Fatalf("start after the rotation: %v", err)
	}
	stop()
	st, err = store.Open(ctx, "sqlite:"+filepath.Join(dir, "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, _ := secrets.NewKeyringSealer(newRing)
	for id, plain := range want {
		sealed, err := st.Sealed(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.Open(id, sealed); err != nil || string(got) != plain || secrets.KeyIDOf(sealed) != newRing.IDs()[0] {
			t.Errorf("%s after the rotation: %q %v", id, got, err)
		}
	}
}

func mustKey(t *testing.T, text []byte) []byte {
	t.Helper()
	k, err := secrets.ParseKey(string(text))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// On PostgreSQL, rotate-key refuses while a server's heartbeat is recent, naming it, and rotates
// once it has left.
func TestSecretsRotateKeyPostgresHeartbeat(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.DSN(t, store.Postgres)
	keyFile := filepath.Join(t.TempDir(), "seal.key")
	ring, err := secrets.LoadOrCreateKeyring(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	sealer, _ := secrets.NewKeyringSealer(ring)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealed, _ := sealer.Seal("sec1", []byte("bmc-pw"))
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.InsertSecret(ctx, "sec1", "default", sealed); err != nil {
			return err
		}
		return tx.ServerAlive(ctx, "srv-a", 0)
	}); err != nil {
		t.Fatal(err)
	}
	args := []string{"rotate-key", "--store", dsn, "--seal-key-file", keyFile}
	if err, out, _ := runSecrets(t, nil, args...); err == nil || !strings.Contains(err.Error(), "server srv-a recorded that it was alive") || strings.Contains(out, "bcd:bcd") {
		t.Fatalf("rotate-key beside a live server: %v\n%s", err, out)
	}
	if r, err := secrets.LoadKeyring(keyFile); err != nil || r.Len() != 1 || r.IDs()[0] != ring.IDs()[0] {
		t.Fatalf("key file changed by a refused rotation: %v %v", r, err)
	}
	if err := st.Write(ctx, func(tx *store.Tx) error { return tx.ServerLeaving(ctx, "srv-a") }); err != nil {
		t.Fatal(err)
	}
	if err, out, _ := runSecrets(t, nil, args...); err != nil || !strings.Contains(out, "done: 1 secrets") || strings.Contains(out, "bcd:bcd") {
		t.Fatalf("rotate-key: %v\n%s", err, out)
	}
	r, err := secrets.LoadKeyring(keyFile)
	if err != nil || r.Len() != 1 || r.IDs()[0] == ring.IDs()[0] {
		t.Fatalf("key file: %v %v", r, err)
	}
}
