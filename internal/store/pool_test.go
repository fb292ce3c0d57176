package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// pool_max_conns is bcd's parameter, taken out of the DSN before pgx sees it (pgx would send it
// to the server as a setting, which the server refuses); out of bounds is refused with what is
// accepted, and without the DSN's password.
func TestPoolOf(t *testing.T) {
	const base = "postgres://bcd:s3cret@db.example:5432/bcd"
	cases := []struct {
		dsn      string
		wantDSN  string
		wantSize int
		wantErr  bool
	}{
		{base, base, 32, false},
		{base + "?sslmode=disable", base + "?sslmode=disable", 32, false},
		{base + "?pool_max_conns=8", base, 8, false},
		{base + "?sslmode=disable&pool_max_conns=2", base + "?sslmode=disable", 2, false},
		{base + "?pool_max_conns=1024&search_path=x", base + "?search_path=x", 1024, false},
		{base + "?pool_max_conns=1", "", 0, true},
		{base + "?pool_max_conns=0", "", 0, true},
		{base + "?pool_max_conns=1025", "", 0, true},
		{base + "?pool_max_conns=-4", "", 0, true},
		{base + "?pool_max_conns=eight", "", 0, true},
		{base + "?pool_max_conns=", "", 0, true},
		{base + "?pool_max_conns=8&pool_max_conns=16", "", 0, true},
	}
	for _, c := range cases {
		t.Run(c.dsn, func(t *testing.T) {
			dsn, size, err := poolOf(c.dsn)
			if c.wantErr {
				if err == nil {
					t.Fatalf("poolOf accepted it: %q, %d", dsn, size)
				}
				msg := err.Error()
				if !strings.Contains(msg, "pool_max_conns") || !strings.Contains(msg, "from 2 to 1024") || strings.Contains(msg, "s3cret") {
					t.Fatalf("error %q: want pool_max_conns named, what is accepted, and no password", msg)
				}
				return
			}
			if err != nil || dsn != c.wantDSN || size != c.wantSize {
				t.Fatalf("poolOf = %q, %d, %v; want %q, %d", dsn, size, err, c.wantDSN, c.wantSize)
			}
		})
	}
}

// A PostgreSQL store opened with pool_max_conns=2 holds at most two connections (its LISTEN
// connection apart), and still runs many writers at once, each reading in its transaction.
func TestPostgresPoolSize(t *testing.T) {
	base := os.Getenv("BCD_TEST_POSTGRES_DSN")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("BCD_TEST_POSTGRES_DSN is not set under CI")
		}
		t.Skip("BCD_TEST_POSTGRES_DSN not set: PostgreSQL skipped outside CI")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	schema := fmt.Sprintf("t_pool_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	defer admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	s, err := Open(ctx, base+sep+"search_path="+schema+"&pool_max_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.write.Stats().MaxOpenConnections; got != 2 {
		t.Fatalf("the pool holds up to %d connections, want 2", got)
	}
	if strings.Contains(s.dsn, "pool_max_conns") {
		t.Fatalf("the DSN kept for LISTEN connections still has pool_max_conns: %s", redactDSN(s.dsn))
	}
	heard := make(chan string, 1)
	lctx, stopListen := context.WithCancel(ctx)
	listening := make(chan error, 1)
	go func() {
		listening <- s.Listen(lctx, "pooltest", func(p string) {
			select {
			case heard <- p:
			default:
			}
		})
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Write(ctx, func(tx *Tx) error {
				var n int
				if err := tx.queryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil {
					return err
				}
				if n != i {
					return fmt.Errorf("read %d, want %d", n, i)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The LISTEN connection works with the DSN bcd keeps: a notice reaches it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := admin.ExecContext(ctx, "SELECT pg_notify($1, 'hello')", s.ChannelName("pooltest")); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-heard:
			if p != "hello" {
				t.Fatalf("heard %q, want hello", p)
			}
			stopListen()
			if err := <-listening; err != nil && ctx.Err() == nil && lctx.Err() == nil {
				t.Fatal(err)
			}
			return
		case err := <-listening:
			t.Fatalf("Listen ended before a notice: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no notice reached the LISTEN connection in 30 s")
		}
	}
}
