package qmp_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"bcd/internal/lab/qmp"
	"bcd/internal/lab/qmp/qmptest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t *testing.T, s *qmptest.Server) *qmp.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qmp.Dial(ctx, s.Path)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestHelpers(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		start   string
		run     func(*qmp.Client) error
		command string
		status  string
	}{
		{"reset", "running", func(c *qmp.Client) error { return c.SystemReset(ctx) }, "system_reset", "running"},
		{"powerdown", "running", func(c *qmp.Client) error { return c.SystemPowerdown(ctx) }, "system_powerdown", "running"},
		{"stop", "running", func(c *qmp.Client) error { return c.Stop(ctx) }, "stop", "paused"},
		{"cont", "paused", func(c *qmp.Client) error { return c.Cont(ctx) }, "cont", "running"},
		{"cont from prelaunch", "prelaunch", func(c *qmp.Client) error { return c.Cont(ctx) }, "cont", "running"},
		{"qom-set", "running", func(c *qmp.Client) error { return c.QomSet(ctx, qmp.PeripheralPath("nic0"), "bootindex", 1) }, "qom-set", "running"},
		{"change medium", "running", func(c *qmp.Client) error { return c.ChangeMedium(ctx, "cd0", "/tmp/x.iso") }, "blockdev-change-medium", "running"},
		{"eject", "running", func(c *qmp.Client) error { return c.Eject(ctx, "cd0") }, "eject", "running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := qmptest.New(t, tt.start, "nic0", "cd0")
			c := dial(t, s)
			if err := tt.run(c); err != nil {
				t.Fatalf("%s: %v", tt.command, err)
			}
			cmds := s.Commands()
			if len(cmds) != 2 || cmds[0] != "qmp_capabilities" || cmds[1] != tt.command {
				t.Fatalf("commands = %v, want [qmp_capabilities %s]", cmds, tt.command)
			}
			st, err := c.QueryStatus(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Status != tt.status || st.Running != (tt.status == "running") {
				t.Fatalf("status = %+v, want %s", st, tt.status)
			}
		})
	}
}

func TestQomAndMedia(t *testing.T) {
	ctx := context.Background()
	s := qmptest.New(t, "running", "nic0", "cd0")
	c := dial(t, s)
	if err := c.QomSet(ctx, qmp.PeripheralPath("nic0"), "bootindex", 3); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := c.QomGet(ctx, qmp.PeripheralPath("nic0"), "bootindex", &v); err != nil || v != 3 {
		t.Fatalf("QomGet = %d, %v; want 3", v, err)
	}
	if err := c.ChangeMedium(ctx, "cd0", "/x.iso"); err != nil || s.Medium("cd0") != "/x.iso" {
		t.Fatalf("medium = %q, %v", s.Medium("cd0"), err)
	}
	if err := c.Eject(ctx, "cd0"); err != nil || s.Medium("cd0") != "" {
		t.Fatalf("after eject medium = %q, %v", s.Medium("cd0"), err)
	}
	err := c.QomSet(ctx, qmp.PeripheralPath("nope"), "bootindex", 1)
	var qe *qmp.Error
	if !errors.As(err, &qe) || qe.Class != "GenericError" {
		t.Fatalf("QomSet on unknown device: %v, want a *qmp.Error", err)
	}
}

func TestEventsRecorded(t *testing.T) {
	ctx := context.Background()
	s := qmptest.New(t, "running")
	c := dial(t, s)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.SystemReset(ctx); err != nil {
		t.Fatal(err)
	}
	ev := c.Events()
	if len(ev) != 2 || ev[0].Event != "STOP" || ev[1].Event != "RESET" {
		t.Fatalf("events = %+v, want STOP, RESET", ev)
	}
	if len(c.Events()) != 0 {
		t.Fatal("Events did not forget")
	}
}

func TestConcurrent(t *testing.T) {
	ctx := context.Background()
	s := qmptest.New(t, "running", "nic0")
	c := dial(t, s)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 50 {
		wg.Go(func() {
			if _, err := c.QueryStatus(ctx); err != nil {
				errs <- err
			}
			if err := c.QomSet(ctx, qmp.PeripheralPath("nic0"), "bootindex", i); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(s.Commands()); n != 101 {
		t.Fatalf("server saw %d commands, want 101", n)
	}
}

func TestQuitClosesConnection(t *testing.T) {
	ctx := context.Background()
	s := qmptest.New(t, "running")
	c := dial(t, s)
	if err := c.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection still open after quit")
	}
	if _, err := c.QueryStatus(ctx); err == nil {
		t.Fatal("command on a closed connection succeeded")
	}
}

func TestDialErrors(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := qmp.Dial(ctx, filepath.Join(dir, "absent.sock")); err == nil {
		t.Fatal("Dial to an absent socket succeeded")
	}

	// A peer that is not QEMU.
	path := filepath.Join(dir, "bad.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("hello\n"))
		_ = c.Close()
	}()
	if _, err := qmp.Dial(ctx, path); err == nil {
		t.Fatal("Dial to a non-QMP peer succeeded")
	}
	<-done

	// A peer that never greets: the context ends the wait.
	silent := filepath.Join(dir, "silent.sock")
	ln2, err := net.Listen("unix", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln2.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	short, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := qmp.Dial(short, silent); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial to a silent peer: %v, want deadline exceeded", err)
	}
	(<-accepted).Close()
}

func TestExecuteContextCancelled(t *testing.T) {
	s := qmptest.New(t, "running")
	c := dial(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Stop(ctx); err == nil {
		// The reply may win the race with the cancelled context; both outcomes must leave the
		// client usable.
		t.Log("reply arrived before cancellation was seen")
	}
	if _, err := c.QueryStatus(context.Background()); err != nil {
		t.Fatalf("client unusable after a cancelled command: %v", err)
	}
}
