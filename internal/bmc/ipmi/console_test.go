package ipmi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// fakeSerial is the machine's serial port behind the virtual BMC: each SOL activation gets a new
// net.Pipe, whose machine end the test takes with next.
type fakeSerial struct{ ports chan *machinePort }

func newFakeSerial() *fakeSerial { return &fakeSerial{ports: make(chan *machinePort, 8)} }

func (f *fakeSerial) open(context.Context) (io.ReadWriteCloser, error) {
	bmcEnd, machineEnd := net.Pipe()
	p := &machinePort{conn: machineEnd, closed: make(chan struct{})}
	go p.collect()
	f.ports <- p
	return bmcEnd, nil
}

// next waits for the next activation.
func (f *fakeSerial) next(t *testing.T) *machinePort {
	t.Helper()
	select {
	case p := <-f.ports:
		t.Cleanup(func() { _ = p.conn.Close() })
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for a SOL activation to open the serial port")
		return nil
	}
}

// none checks that no activation opened the serial port.
func (f *fakeSerial) none(t *testing.T) {
	t.Helper()
	select {
	case <-f.ports:
		t.Fatal("the serial port was opened")
	default:
	}
}

// machinePort is the machine's side of one activation: what the console typed is collected;
// closed is closed once the BMC closed its side.
type machinePort struct {
	conn   net.Conn
	typed  syncBuffer
	closed chan struct{}
}

func (p *machinePort) collect() {
	defer close(p.closed)
	_, _ = io.Copy(&p.typed, p.conn)
}

func (p *machinePort) write(t *testing.T, s string) {
	t.Helper()
	if _, err := p.conn.Write([]byte(s)); err != nil {
		t.Fatalf("machine writing to its serial port: %v", err)
	}
}

func (p *machinePort) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-p.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the BMC did not close the serial port")
	}
}

// console runs Console in the background; in is a pipe the test writes to.
type console struct {
	in     *io.PipeWriter
	out    syncBuffer
	cancel context.CancelFunc
	done   chan error
}

func startConsole(t *testing.T, d *Driver, opts bmc.ConsoleOptions) *console {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	inR, inW := io.Pipe()
	c := &console{in: inW, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- d.Console(ctx, inR, &c.out, opts) }()
	t.Cleanup(func() {
		cancel()
		_ = inW.Close()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Error("Console did not return")
		}
	})
	return c
}

func (c *console) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err // for the cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Console did not return")
		return nil
	}
}

func (c *console) waitOutput(t *testing.T, want string) {
	t.Helper()
	eventually(t, fmt.Sprintf("console output %q", want), func() bool { return strings.Contains(c.out.String(), want) })
}

func solBMC(t *testing.T) (*ipmibmc.BMC, *fakeSerial, *fakeMachine) {
	t.Helper()
	serial := newFakeSerial()
	m := &fakeMachine{on: true}
	b := startBMC(t, ipmibmc.Config{Serial: serial.open}, m)
	return b, serial, m
}

func TestConsoleRelaysBothWaysAndEndsOnCancel(t *testing.T) {
	b, serial, _ := solBMC(t)
	d := newDriver(t, b, testPassword, quickOptions())
	c := startConsole(t, d, bmc.ConsoleOptions{})
	port := serial.next(t)

	// The machine's output reaches out as it comes, before anything else is written.
	port.write(t, "SeaBIOS (version 1.16)\r\n")
	c.waitOutput(t, "SeaBIOS (version 1.16)\r\n")

	// The operator's keystrokes reach the machine.
	if _, err := c.in.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "keystrokes on the serial port", func() bool { return port.typed.String() == "root\r" })

	// A burst larger than many SOL packets arrives complete, in order, once.
	var burst strings.Builder
	for i := range 300 {
		fmt.Fprintf(&burst, "line %04d of the kernel's boot log\r\n", i)
	}
	port.write(t, burst.String())
	want := "SeaBIOS (version 1.16)\r\n" + burst.String()
	eventually(t, "the whole burst", func() bool { return len(c.out.String()) >= len(want) })
	if got := c.out.String(); got != want {
		t.Fatalf("console output differs from what the machine wrote (%d bytes, want %d)", len(got), len(want))
	}

	c.cancel()
	if err := c.wait(t); err != nil {
		t.Fatalf("Console after cancel = %v, want nil", err)
	}
	port.waitClosed(t)
	eventually(t, "the payload deactivated and the session closed", func() bool { return b.ActiveSessions() == 0 })

	// Deactivated: a second console activates without taking over, and ends at input EOF.
	c2 := startConsole(t, d, bmc.ConsoleOptions{})
	port2 := serial.next(t)
	port2.write(t, "login: ")
	c2.waitOutput(t, "login: ")
	_ = c2.in.Close()
	if err := c2.wait(t); err != nil {
		t.Fatalf("Console after input EOF = %v, want nil", err)
	}
	port2.waitClosed(t)
}

func TestConsoleInUseAndTakeOver(t *testing.T) {
	b, serial, _ := solBMC(t)
	opts := quickOptions()
	first := startConsole(t, newDriver(t, b, testPassword, opts), bmc.ConsoleOptions{})
	port := serial.next(t)
	port.write(t, "first\r\n")
	first.waitOutput(t, "first\r\n")

	// Another client (its own driver, as another site agent's or ipmitool would be).
	other := newDriver(t, b, testPassword, opts)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := other.Console(ctx, strings.NewReader(""), io.Discard, bmc.ConsoleOptions{})
	if !errors.Is(err, bmc.ErrConsoleInUse) {
		t.Fatalf("Console on a console in use = %v, want ErrConsoleInUse", err)
	}
	serial.none(t)
	select {
	case err := <-first.done:
		t.Fatalf("the first console ended (%v) when another was refused", err)
	default:
	}

	second := startConsole(t, other, bmc.ConsoleOptions{TakeOver: true})
	port.waitClosed(t)
	port2 := serial.next(t)
	port2.write(t, "second\r\n")
	second.waitOutput(t, "second\r\n")

	err = first.wait(t)
	if !errors.Is(err, ErrConsoleEnded) {
		t.Fatalf("the console taken over ended with %v, want ErrConsoleEnded", err)
	}
	// The first console did not deactivate the second's payload on its way out.
	port2.write(t, "still here\r\n")
	second.waitOutput(t, "still here\r\n")
	select {
	case err := <-second.done:
		t.Fatalf("the second console ended: %v", err)
	default:
	}
}

func TestConsoleWrongPassword(t *testing.T) {
	b, serial, _ := solBMC(t)
	const wrong = "Wrong-pw-4242"
	d := newDriver(t, b, wrong, quickOptions())
	err := d.Console(t.Context(), strings.NewReader(""), io.Discard, bmc.ConsoleOptions{})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("Console with a wrong password = %v, want ErrAuth", err)
	}
	if msg := err.Error(); strings.Contains(msg, wrong) || strings.Contains(msg, testPassword) || !strings.Contains(msg, "serial console on "+b.Addr().String()) {
		t.Fatalf("error %q: want the BMC named and no password", msg)
	}
	serial.none(t)
}

// TestConsoleDoesNotHoldThePacer: the power commands of workflows still run on a machine whose
// console is open (the Pacer allows one session per BMC).
func TestConsoleDoesNotHoldThePacer(t *testing.T) {
	b, serial, _ := solBMC(t)
	opts := quickOptions()
	opts.Pacer = NewPacer(PacerConfig{MaxSessions: 1, MinInterval: time.Millisecond})
	d := newDriver(t, b, testPassword, opts)
	c := startConsole(t, d, bmc.ConsoleOptions{})
	port := serial.next(t)
	port.write(t, "up\r\n")
	c.waitOutput(t, "up\r\n")

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if st, err := d.GetPower(ctx); err != nil || st != bmc.PowerOn {
		t.Fatalf("GetPower while a console runs = %v, %v; want on", st, err)
	}
	// And the console kept running.
	port.write(t, "after\r\n")
	c.waitOutput(t, "after\r\n")
}

// TestConsoleBMCSilent: a BMC that stops answering ends the console with ErrConsoleSilent within
// the exchange timeouts.
func TestConsoleBMCSilent(t *testing.T) {
	b, serial, _ := solBMC(t)
	proxy := newDropProxy(t, b.Addr())
	d, err := New(bmc.Endpoint{Address: proxy.addr(), Username: testUser, Password: testPassword}, quickOptions())
	if err != nil {
		t.Fatal(err)
	}
	c := startConsole(t, d, bmc.ConsoleOptions{})
	port := serial.next(t)
	port.write(t, "hello\r\n")
	c.waitOutput(t, "hello\r\n")

	proxy.drop.Store(true)
	start := time.Now()
	err = c.wait(t)
	if !errors.Is(err, ErrConsoleSilent) {
		t.Fatalf("Console with a silent BMC = %v, want ErrConsoleSilent", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("silence noticed after %s", took)
	}
	if strings.Contains(err.Error(), testPassword) {
		t.Fatalf("error holds the password: %v", err)
	}
}

// dropProxy relays UDP between one client and a BMC on loopback, and drops everything while
// drop is set.
type dropProxy struct {
	conn *net.UDPConn
	drop atomic.Bool
}

func newDropProxy(t *testing.T, bmcAddr *net.UDPAddr) *dropProxy {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp", nil, bmcAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); _ = up.Close() })
	p := &dropProxy{conn: conn}
	var client atomic.Pointer[net.UDPAddr]
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			client.Store(from)
			if !p.drop.Load() {
				_, _ = up.Write(buf[:n])
			}
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			if to := client.Load(); to != nil && !p.drop.Load() {
				_, _ = conn.WriteToUDP(buf[:n], to)
			}
		}
	}()
	return p
}

func (p *dropProxy) addr() string { return p.conn.LocalAddr().String() }
