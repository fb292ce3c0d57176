package ipmibmc

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/bougou/go-ipmi/pkg/vmproto"

	"bcd/internal/ramdisk/inband"
)

// vmTransport is the guest's side of QEMU's ipmi-bmc-extern link: the ramdisk's in-band
// provisioning speaks through it as it would through /dev/ipmi0 and the KCS interface.
type vmTransport struct{ c *vmproto.Client }

func (v vmTransport) Exchange(_ context.Context, netFn, cmd byte, data []byte) (byte, []byte, error) {
	return v.c.Command(netFn, cmd, data...)
}

// TestInbandUserLogsInOutOfBand: one BMC state, two faces. The host provisions a user over
// the VM protocol (no session, system interface); the BMC reports its RMCP+ address in-band;
// that user then opens an RMCP+ session at the reported address, and the operator's user is
// untouched. Provisioning again reuses the slot and replaces the password.
func TestInbandUserLogsInOutOfBand(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "bmc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	b := start(t, Config{InbandListener: ln}, &fakeMachine{})
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	tr := vmTransport{vmproto.NewClient(conn, 5*time.Second)}

	for i, pw := range []string{"Inband-Pa55.word-001", "Inband-Pa55.word-002"} {
		res, err := inband.Provision(t.Context(), tr, inband.Request{Username: "bcd", Password: pw})
		if err != nil {
			t.Fatalf("provisioning %d: %v", i, err)
		}
		if want := b.Addr().String(); res.Address != want {
			t.Fatalf("in-band address %q, want the RMCP+ socket %q", res.Address, want)
		}
		if res.Channel != lanChannel || res.UserID == adminUserID || res.Reused != (i > 0) {
			t.Fatalf("provisioning %d: %+v", i, res)
		}
		host, port, _ := net.SplitHostPort(res.Address)
		p, _ := strconv.Atoi(port)
		login(t, host, p, "bcd", pw, true)
		if i > 0 {
			login(t, host, p, "bcd", "Inband-Pa55.word-001", false)
		}
		login(t, host, p, testUser, testPassword, true)
	}
}

func login(t *testing.T, host string, port int, user, pw string, want bool) {
	t.Helper()
	c, err := client.NewClient(host, port, user, pw)
	if err != nil {
		t.Fatal(err)
	}
	c.WithTimeout(time.Second).WithRetry(0).WithCipherSuiteID(types.CipherSuiteID17)
	err = c.Connect(t.Context())
	if err == nil {
		defer c.Close(context.Background())
		_, err = c.GetChassisStatus(t.Context())
	}
	if (err == nil) != want {
		t.Fatalf("RMCP+ login as %s: err = %v, want success %v", user, err, want)
	}
}

// FuzzInbandStream: whatever bytes a guest sends over the in-band link (a VM is not trusted),
// the BMC survives and the next connection (QEMU reconnects after a guest reset) is served.
func FuzzInbandStream(f *testing.F) {
	for _, seed := range [][]byte{
		{0x01, 0x18, 0x01, 0xe7, 0xa0},             // Get Device ID, msgID 1
		{0xff, 0xa1, 0x08, 0x3f, 0xa1},             // QEMU's version and capabilities commands
		{0xaa, 0xa0, 0xaa, 0xb0, 0xa0},             // escapes, one dangling
		{0x01, 0x18, 0x47, 0x82, 0x02, 0x00, 0xa0}, // Set User Password, short
		make([]byte, 5000),                         // over-long frame
	} {
		f.Add(seed)
	}
	sock := filepath.Join(f.TempDir(), "bmc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		f.Fatal(err)
	}
	b, err := New(Config{Addr: "127.0.0.1:0", Username: testUser, Password: testPassword, InbandListener: ln}, &fakeMachine{})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	f.Cleanup(func() { cancel(); <-done })
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(in)
		_ = c.Close()
		c, err = net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cc, resp, err := vmproto.NewClient(c, 5*time.Second).Command(0x06, 0x01) // Get Device ID
		if err != nil || cc != 0 || len(resp) < 11 {
			t.Fatalf("after % x: Get Device ID: cc %#x, % x, %v", in, cc, resp, err)
		}
	})
}
