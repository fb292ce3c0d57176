package inband

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestMessages(t *testing.T) {
	pw := "Aa1-bcdefghijklmnopq" // 20 bytes
	cases := []struct {
		name string
		got  []byte
		want []byte
	}{
		{"get channel info", GetChannelInfoReq(1), []byte{0x01}},
		{"get LAN IP", GetLANConfigReq(1, LANParamIP), []byte{0x01, 0x03, 0, 0}},
		{"get LAN port", GetLANConfigReq(2, LANParamPort), []byte{0x02, 0x08, 0, 0}},
		{"get user access", GetUserAccessReq(1, 1), []byte{0x01, 0x01}},
		{"get user name", GetUserNameReq(3), []byte{0x03}},
		{"set user name", SetUserNameReq(3, "bcd"), append([]byte{0x03, 'b', 'c', 'd'}, make([]byte, 13)...)},
		{"set user name of 16", SetUserNameReq(5, "abcdefghijklmnop"), append([]byte{0x05}, "abcdefghijklmnop"...)},
		{"set password", SetUserPasswordReq(3, pwSet, pw), append([]byte{0x83, 0x02}, pw...)},
		{"set short password", SetUserPasswordReq(3, pwSet, "x"), append([]byte{0x83, 0x02, 'x'}, make([]byte, 19)...)},
		{"test password", SetUserPasswordReq(4, pwTest, pw), append([]byte{0x84, 0x03}, pw...)},
		{"enable user", SetUserPasswordReq(3, pwEnable, ""), []byte{0x03, 0x01}},
		{"set user access admin", SetUserAccessReq(1, 3, PrivAdmin), []byte{0x91, 0x03, 0x04, 0x00}},
		{"user id masked", GetUserNameReq(0xff), []byte{0x3f}},
	}
	for _, c := range cases {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("%s: % x, want % x", c.name, c.got, c.want)
		}
	}
}

func TestDecoders(t *testing.T) {
	if ip, err := DecodeLANIP([]byte{0x11, 10, 0, 0, 5}); err != nil || ip.String() != "10.0.0.5" {
		t.Errorf("DecodeLANIP: %v %v", ip, err)
	}
	for _, bad := range [][]byte{nil, {0x11, 10, 0, 0}, {0x11, 0, 0, 0, 0}} {
		if _, err := DecodeLANIP(bad); err == nil {
			t.Errorf("DecodeLANIP(% x) accepted", bad)
		}
	}
	if p, err := DecodeLANPort([]byte{0x11, 0x6f, 0x02}); err != nil || p != 623 {
		t.Errorf("DecodeLANPort: %d %v", p, err)
	}
	if _, err := DecodeLANPort([]byte{0x11, 0x6f}); err == nil {
		t.Error("DecodeLANPort accepted 2 bytes")
	}
	if n, err := DecodeMaxUsers([]byte{0xca, 0x02, 0x01, 0x34}); err != nil || n != 10 {
		t.Errorf("DecodeMaxUsers: %d %v", n, err)
	}
	if _, err := DecodeMaxUsers([]byte{1, 2, 3}); err == nil {
		t.Error("DecodeMaxUsers accepted 3 bytes")
	}
	name := append([]byte("admin"), make([]byte, 11)...)
	if s, err := DecodeUserName(name); err != nil || s != "admin" {
		t.Errorf("DecodeUserName: %q %v", s, err)
	}
	if s, _ := DecodeUserName(make([]byte, 16)); s != "" {
		t.Errorf("empty name decoded as %q", s)
	}
	if _, err := DecodeUserName(name[:15]); err == nil {
		t.Error("DecodeUserName accepted 15 bytes")
	}
	for _, c := range []struct {
		resp []byte
		lan  bool
		ok   bool
	}{{[]byte{1, 0x04, 0x01}, true, true}, {[]byte{0x0f, 0x0c, 0x05}, false, true}, {[]byte{1, 0x84, 1, 0, 0, 0, 0, 0, 0}, true, true}, {[]byte{1}, false, false}} {
		lan, err := ChannelIsLAN(c.resp)
		if lan != c.lan || (err == nil) != c.ok {
			t.Errorf("ChannelIsLAN(% x) = %v, %v", c.resp, lan, err)
		}
	}
	if cc, d, err := DecodeResponse([]byte{0xc1}); err != nil || cc != 0xc1 || len(d) != 0 {
		t.Errorf("DecodeResponse: %x %v %v", cc, d, err)
	}
	if _, _, err := DecodeResponse(nil); err == nil {
		t.Error("DecodeResponse accepted nothing")
	}
}

func TestValidate(t *testing.T) {
	good := Request{Username: "bcd", Password: "p"}
	cases := []struct {
		r  Request
		ok bool
	}{
		{good, true},
		{Request{Username: "", Password: "p"}, false},
		{Request{Username: "abcdefghijklmnopq", Password: "p"}, false},
		{Request{Username: "a b", Password: "p"}, false},
		{Request{Username: "bcd", Password: ""}, false},
		{Request{Username: "bcd", Password: strings.Repeat("x", 21)}, false},
		{Request{Username: "bcd", Password: "p", Channel: 12}, false},
		{Request{Username: "bcd", Password: "p", Channel: 11}, true},
	}
	for _, c := range cases {
		if err := c.r.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%q, channel %d) = %v", c.r.Username, c.r.Channel, err)
		}
	}
}

// fakeBMC is a scripted BMC: channels, LAN address, user slots; it records what it was sent.
type fakeBMC struct {
	lanChannel byte
	ip         [4]byte
	port       uint16 // 0: parameter 8 not supported
	names      []string
	unnamedErr bool // unnamed slots answer 0xcc (some BMCs)
	failOn     byte // a command answering 0xd4
	users      map[byte]*fakeUser
	sent       []string
}

type fakeUser struct {
	name     string
	password string
	enabled  bool
	admin    bool
}

func (f *fakeBMC) Exchange(_ context.Context, netFn, cmd byte, d []byte) (byte, []byte, error) {
	f.sent = append(f.sent, fmt.Sprintf("%02x/%02x", netFn, cmd))
	if cmd == f.failOn && netFn == NetFnApp {
		return 0xd4, nil, nil
	}
	u := func(id byte) *fakeUser {
		if f.users[id] == nil {
			f.users[id] = &fakeUser{}
		}
		return f.users[id]
	}
	switch {
	case netFn == NetFnApp && cmd == CmdGetChannelInfo:
		if d[0] == f.lanChannel {
			return 0, []byte{d[0], 0x04, 0x01, 0x80, 0xf2, 0x1b, 0, 0, 0}, nil
		}
		if d[0] > 3 {
			return 0xcc, nil, nil
		}
		return 0, []byte{d[0], 0x0c, 0x05, 0, 0, 0, 0, 0, 0}, nil
	case netFn == NetFnTransport && cmd == CmdGetLANConfig:
		if d[0] != f.lanChannel {
			return 0xcc, nil, nil
		}
		switch d[1] {
		case LANParamIP:
			return 0, append([]byte{0x11}, f.ip[:]...), nil
		case LANParamPort:
			if f.port == 0 {
				return 0x80, nil, nil
			}
			return 0, []byte{0x11, byte(f.port), byte(f.port >> 8)}, nil
		}
	case netFn == NetFnApp && cmd == CmdGetUserAccess:
		return 0, []byte{byte(len(f.names)), 1, 1, 0}, nil
	case netFn == NetFnApp && cmd == CmdGetUserName:
		n := f.names[d[0]-1]
		if n == "" && f.unnamedErr {
			return 0xcc, nil, nil
		}
		out := make([]byte, 16)
		copy(out, n)
		return 0, out, nil
	case netFn == NetFnApp && cmd == CmdSetUserName:
		name, _ := DecodeUserName(d[1:])
		f.names[d[0]-1] = name
		u(d[0]).name = name
		return 0, nil, nil
	case netFn == NetFnApp && cmd == CmdSetUserPassword:
		id := d[0] & 0x3f
		switch d[1] {
		case pwSet:
			u(id).password = string(bytes.TrimRight(d[2:], "\x00"))
		case pwEnable:
			u(id).enabled = true
		case pwTest:
			if u(id).password != string(bytes.TrimRight(d[2:], "\x00")) {
				return 0x80, nil, nil
			}
		}
		return 0, nil, nil
	case netFn == NetFnApp && cmd == CmdSetUserAccess:
		if d[0]&0x0f != f.lanChannel || d[0]&0x10 == 0 {
			return 0xcc, nil, nil
		}
		u(d[1]).admin = d[2] == PrivAdmin
		return 0, nil, nil
	}
	return 0xc1, nil, nil
}

func TestProvision(t *testing.T) {
	const pw = "Secr3t-Pa55word.xyzw"
	cases := []struct {
		name    string
		bmc     fakeBMC
		req     Request
		want    Result
		wantErr string
	}{
		{"first free slot, default port", fakeBMC{lanChannel: 1, ip: [4]byte{10, 0, 0, 5}, names: []string{"", "ADMIN", "", ""}},
			Request{Username: "bcd", Password: pw}, Result{Address: "10.0.0.5", Channel: 1, UserID: 3, Username: "bcd"}, ""},
		{"reuses the named slot, port reported", fakeBMC{lanChannel: 3, ip: [4]byte{10, 0, 0, 6}, port: 6230, names: []string{"", "", "root", "bcd"}},
			Request{Username: "bcd", Password: pw}, Result{Address: "10.0.0.6:6230", Channel: 3, UserID: 4, Username: "bcd", Reused: true}, ""},
		{"error for unnamed slots means free", fakeBMC{lanChannel: 1, ip: [4]byte{10, 0, 0, 7}, port: 623, unnamedErr: true, names: []string{"", "root", ""}},
			Request{Username: "bcd", Password: pw}, Result{Address: "10.0.0.7", Channel: 1, UserID: 3, Username: "bcd"}, ""},
		{"explicit channel", fakeBMC{lanChannel: 2, ip: [4]byte{10, 0, 0, 8}, names: []string{"", ""}},
			Request{Username: "bcd", Password: pw, Channel: 2}, Result{Address: "10.0.0.8", Channel: 2, UserID: 2, Username: "bcd"}, ""},
		{"no free slot", fakeBMC{lanChannel: 1, ip: [4]byte{10, 0, 0, 5}, names: []string{"", "a", "b"}},
			Request{Username: "bcd", Password: pw}, Result{}, "all 3 user slots are named"},
		{"no LAN channel", fakeBMC{lanChannel: 12, ip: [4]byte{10, 0, 0, 5}, names: []string{"", ""}},
			Request{Username: "bcd", Password: pw}, Result{}, "no LAN channel"},
		{"no address", fakeBMC{lanChannel: 1, names: []string{"", ""}},
			Request{Username: "bcd", Password: pw}, Result{}, "no IP address"},
		{"refused password", fakeBMC{lanChannel: 1, ip: [4]byte{10, 0, 0, 5}, names: []string{"", ""}, failOn: CmdSetUserPassword},
			Request{Username: "bcd", Password: pw}, Result{}, "set user password 2: the BMC answered completion code 0xd4"},
		{"refused access", fakeBMC{lanChannel: 1, ip: [4]byte{10, 0, 0, 5}, names: []string{"", ""}, failOn: CmdSetUserAccess},
			Request{Username: "bcd", Password: pw}, Result{}, "set user access 2 on channel 1"},
		{"bad request", fakeBMC{}, Request{Username: "bcd"}, Result{}, "password must be"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.bmc
			f.users = map[byte]*fakeUser{}
			got, err := Provision(context.Background(), &f, c.req)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				if strings.Contains(err.Error(), pw) {
					t.Fatalf("the error carries the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("result %+v, want %+v", got, c.want)
			}
			u := f.users[got.UserID]
			if u == nil || u.password != pw || !u.enabled || !u.admin || f.names[got.UserID-1] != "bcd" {
				t.Fatalf("user %d on the BMC: %+v (names %q)", got.UserID, u, f.names)
			}
		})
	}
}

func TestProvisionTransportError(t *testing.T) {
	boom := errors.New("device gone")
	_, err := Provision(context.Background(), transportFunc(func(context.Context, byte, byte, []byte) (byte, []byte, error) { return 0, nil, boom }),
		Request{Username: "bcd", Password: "pw", Channel: 1})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
}

type transportFunc func(ctx context.Context, netFn, cmd byte, data []byte) (byte, []byte, error)

func (f transportFunc) Exchange(ctx context.Context, netFn, cmd byte, data []byte) (byte, []byte, error) {
	return f(ctx, netFn, cmd, data)
}
