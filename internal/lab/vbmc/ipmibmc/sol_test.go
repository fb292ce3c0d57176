package ipmibmc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/transport"
	"github.com/bougou/go-ipmi/pkg/types"
)

// lockedBuffer is a bytes.Buffer for one writer goroutine and a reading test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serialSocket listens where QEMU would serve the machine's serial port; accept returns the
// machine's side of the next connection.
func serialSocket(t *testing.T) (string, net.Listener) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sol") // t.TempDir may exceed a unix socket path's 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "serial.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return path, ln
}

func accept(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Cleanup(func() { _ = r.c.Close() })
		return r.c
	case <-time.After(5 * time.Second):
		t.Fatal("the BMC did not connect to the serial socket")
		return nil
	}
}

func activate(ctx context.Context, c *client.Client) error {
	_, err := c.ActivatePayload(ctx, &transport.ActivatePayloadRequest{
		PayloadType: types.PayloadTypeSOL, PayloadInstance: 1, EnableEncryption: true, EnableAuthentication: true,
	})
	return err
}

func ccOf(err error) types.CompletionCode {
	var re *types.ResponseError
	if errors.As(err, &re) {
		return re.CompletionCode()
	}
	return types.CodeOK
}

func TestSOLBridgesTheSerialSocket(t *testing.T) {
	path, ln := serialSocket(t)
	b := start(t, Config{SerialSocket: path}, &fakeMachine{on: true})
	c := connect(t, b.Addr().Port)
	ctx := t.Context()
	if err := activate(ctx, c); err != nil {
		t.Fatalf("Activate Payload: %v", err)
	}
	machine := accept(t, ln)
	if _, err := machine.Write([]byte("bcd lab VM login: ")); err != nil {
		t.Fatal(err)
	}

	inR, inW := io.Pipe()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- c.SOLStream(ctx, inR, &out, &client.SOLStreamOptions{PollInterval: 20 * time.Millisecond})
	}()
	eventually(t, "the machine's text at the console", func() bool { return out.String() == "bcd lab VM login: " })

	typed := make(chan string, 1)
	go func() {
		buf := make([]byte, 5)
		_, _ = io.ReadFull(machine, buf)
		typed <- string(buf)
	}()
	if _, err := inW.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-typed:
		if got != "root\r" {
			t.Fatalf("machine read %q, want %q", got, "root\r")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("keystrokes did not reach the serial socket")
	}

	_ = inW.Close()
	if err := <-done; err != nil {
		t.Fatalf("SOLStream: %v", err)
	}
	if _, err := c.DeactivatePayload(ctx, &transport.DeactivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: 1}); err != nil {
		t.Fatalf("Deactivate Payload: %v", err)
	}
	// Deactivation disconnects from the serial port.
	_ = machine.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := machine.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("machine side after deactivation: %v, want EOF", err)
	}
	// And the port is free for the next activation.
	if err := activate(ctx, c); err != nil {
		t.Fatalf("Activate Payload again: %v", err)
	}
	accept(t, ln)
}

func TestSOLWithoutASerialPort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.sock")
	cases := []struct {
		name string
		cfg  Config
		want types.CompletionCode
	}{
		{"no serial port configured", Config{}, types.CodeActivatePayloadTypeDisabled},
		// QEMU not running: the activation fails, the BMC goes on.
		{"serial socket absent", Config{SerialSocket: path}, types.CodeUnspecifiedError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := start(t, tc.cfg, &fakeMachine{on: true})
			c := connect(t, b.Addr().Port)
			err := activate(t.Context(), c)
			if err == nil {
				t.Fatal("Activate Payload succeeded without a serial port")
			}
			if got := ccOf(err); got != tc.want {
				t.Fatalf("Activate Payload: %v (cc %#x), want cc %#x", err, uint8(got), uint8(tc.want))
			}
			if _, err := c.GetChassisStatus(t.Context()); err != nil {
				t.Fatalf("the BMC stopped answering: %v", err)
			}
		})
	}
}

func TestNewRefusesTwoSerialPorts(t *testing.T) {
	_, err := New(Config{Addr: "127.0.0.1:0", Username: testUser, Password: testPassword, SerialSocket: "/x/serial.sock",
		Serial: func(context.Context) (io.ReadWriteCloser, error) { return nil, errors.New("unused") }}, &fakeMachine{})
	if err == nil || !strings.Contains(err.Error(), "SerialSocket or Serial, not both") {
		t.Fatalf("New with both = %v", err)
	}
}

// TestIpmitoolSOL: ipmitool's "sol activate" shows the machine's text and types into it.
func TestIpmitoolSOL(t *testing.T) {
	bin := ipmitoolPath(t)
	path, ln := serialSocket(t)
	b := start(t, Config{SerialSocket: path}, &fakeMachine{on: true})

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-I", "lanplus", "-H", "127.0.0.1", "-p", fmt.Sprint(b.Addr().Port),
		"-U", testUser, "-E", "-C", "17", "sol", "activate")
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+testPassword)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	machine := accept(t, ln)
	if _, err := machine.Write([]byte("Welcome to the bcd lab VM\r\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the machine's text in ipmitool's output", func() bool { return strings.Contains(out.String(), "Welcome to the bcd lab VM") })

	typed := make(chan string, 1)
	go func() {
		buf := make([]byte, 3)
		_, _ = io.ReadFull(machine, buf)
		typed <- string(buf)
	}()
	if _, err := stdin.Write([]byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-typed:
		if got != "ls\r" {
			t.Errorf("machine read %q from ipmitool, want %q", got, "ls\r")
		}
	case <-time.After(10 * time.Second):
		t.Error("ipmitool's keystrokes did not reach the machine")
	}

	// ~. at the start of a line ends ipmitool's session (and deactivates the payload).
	if _, err := stdin.Write([]byte("\r~.")); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("ipmitool sol activate: %v\n%s", err, out.String())
	}
	_ = machine.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, machine); err != nil {
		t.Fatalf("serial port after ipmitool left: %v, want EOF", err)
	}
}
