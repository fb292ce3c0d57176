package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/ramdisk/inband"
	"bcd/internal/ramdisk/inventory"
)

// scriptedBMC answers the in-band provisioning sequence for a BMC at 10.0.0.9 with a free
// slot 3 and records the password it was given.
type scriptedBMC struct {
	password string
	closed   bool
}

func (b *scriptedBMC) Close() error { b.closed = true; return nil }

func (b *scriptedBMC) Exchange(_ context.Context, netFn, cmd byte, d []byte) (byte, []byte, error) {
	switch {
	case netFn == inband.NetFnApp && cmd == inband.CmdGetChannelInfo:
		return 0, []byte{d[0], 0x04, 0x01, 0, 0, 0, 0, 0, 0}, nil
	case netFn == inband.NetFnTransport && cmd == inband.CmdGetLANConfig && d[1] == inband.LANParamIP:
		return 0, []byte{0x11, 10, 0, 0, 9}, nil
	case netFn == inband.NetFnTransport:
		return 0x80, nil, nil
	case cmd == inband.CmdGetUserAccess:
		return 0, []byte{3, 1, 1, 0}, nil
	case cmd == inband.CmdGetUserName:
		if d[0] == 2 {
			return 0, append([]byte("ADMIN"), make([]byte, 11)...), nil
		}
		return 0, make([]byte, 16), nil
	case cmd == inband.CmdSetUserPassword && d[1] == 0x02:
		b.password = strings.TrimRight(string(d[2:]), "\x00")
	case cmd == inband.CmdSetUserPassword && d[1] == 0x03:
		if strings.TrimRight(string(d[2:]), "\x00") != b.password {
			return 0x80, nil, nil
		}
	}
	return 0, nil, nil
}

func TestProvisionInband(t *testing.T) {
	ca, err := pki.CreateCA("test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, csr, err := pki.NewKeyAndCSR("node")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueNode(csr, "n1", 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const pw = "Gen3rated-Pa55.word0"
	plain, _ := json.Marshal(map[string]string{"username": "bcd", "password": pw})
	jwe, err := pki.EncryptToAgent(cert, plain)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _, _ := pki.NewKeyAndCSR("other")
	args := func(cred string) string {
		b, _ := json.Marshal(map[string]any{"credentials": cred})
		return string(b)
	}
	cases := []struct {
		name    string
		key     bool
		wrong   bool
		noIPMI  bool
		openErr bool
		args    string
		wantErr string
	}{
		{name: "provisions", key: true, args: args(jwe)},
		{name: "no credentials", key: true, args: `{}`, wantErr: "credentials are missing"},
		{name: "bad channel", key: true, args: `{"credentials":"x","channel":12}`, wantErr: "channel 12"},
		{name: "bad channel as a step argument", key: true, args: `{"credentials":"x","channel":"12"}`, wantErr: "channel 12"},
		{name: "no key", args: args(jwe), wantErr: "no node key"},
		{name: "another node's key", key: true, wrong: true, args: args(jwe), wantErr: "decrypting the BMC credential"},
		{name: "not a JWE", key: true, args: args("garbage"), wantErr: "decrypting the BMC credential"},
		{name: "no IPMI interface", key: true, noIPMI: true, args: args(jwe), wantErr: "no IPMI system interface"},
		{name: "device does not open", key: true, openErr: true, args: args(jwe), wantErr: "no /dev/ipmi0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bmc := &scriptedBMC{}
			d := testDeps(t, inventory.Inventory{})
			if !tc.noIPMI {
				d.IPMI = func(context.Context) (inband.Transport, io.Closer, error) {
					if tc.openErr {
						return nil, nil, errors.New("no /dev/ipmi0")
					}
					return bmc, bmc, nil
				}
			}
			c := NewCommands(d)
			if tc.key {
				c.SetKey(key)
			}
			if tc.wrong {
				c.SetKey(otherKey)
			}
			res, err, _ := run(t, c, KindInbandBMC, tc.args)
			if err != nil && strings.Contains(err.Error(), pw) || strings.Contains(string(res), pw) {
				t.Fatalf("the password leaked: %s / %v", res, err)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got inband.Result
			if err := json.Unmarshal(res, &got); err != nil {
				t.Fatal(err)
			}
			if got != (inband.Result{Address: "10.0.0.9", Channel: 1, UserID: 3, Username: "bcd"}) || bmc.password != pw || !bmc.closed {
				t.Fatalf("result %+v, BMC password set %v, closed %v", got, bmc.password == pw, bmc.closed)
			}
		})
	}
}
