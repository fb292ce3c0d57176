// Package inband provisions a BMC credential from the host it manages, over the host's IPMI
// system interface (the kernel's /dev/ipmi0, KCS/BT/SSIF; no network, no session): it reads
// the BMC's LAN address, picks or creates a user slot, sets the name and a password the
// control plane generated, grants administrator access with IPMI messaging on the LAN channel
// and enables the user, then tests the password in-band. The messages are pure functions of
// their arguments (table-tested); the exchange itself goes through a Transport (the Linux
// device in device_linux.go, or any peer in tests).
//
// The password is never part of an error or a Result.
package inband

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Net functions and commands used here (IPMI 2.0 tables G-1).
const (
	NetFnApp       = 0x06
	NetFnTransport = 0x0c

	CmdGetChannelInfo  = 0x42
	CmdSetUserAccess   = 0x43
	CmdGetUserAccess   = 0x44
	CmdSetUserName     = 0x45
	CmdGetUserName     = 0x46
	CmdSetUserPassword = 0x47
	CmdGetLANConfig    = 0x02
)

// LAN configuration parameters read (IPMI 2.0 table 23-4).
const (
	LANParamIP   = 3
	LANParamPort = 8 // primary RMCP port (optional; 623 when absent)
)

// Set User Password operations (IPMI 2.0 §22.30).
const (
	pwEnable = 0x01
	pwSet    = 0x02
	pwTest   = 0x03
)

// Limits of the user commands.
const (
	MaxNameLen     = 16
	MaxPasswordLen = 20
	PrivAdmin      = 0x04
	mediumLAN      = 0x04
	maxChannel     = 0x0b // channels 1..11 are implementation-specific (0 is IPMB, 14/15 special)
	firstUserSlot  = 2    // user 1 is the anonymous/null user with a fixed name
)

// Transport exchanges one request with the BMC: the completion code and the response data
// after it.
type Transport interface {
	Exchange(ctx context.Context, netFn, cmd byte, data []byte) (cc byte, resp []byte, err error)
}

// CompletionError is a non-zero completion code.
type CompletionError struct {
	Op string
	CC byte
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("%s: the BMC answered completion code %#02x (%s)", e.Op, e.CC, ccText(e.CC))
}

func ccText(cc byte) string {
	switch cc {
	case 0xc1:
		return "command not supported"
	case 0xc7, 0xc8:
		return "request length invalid"
	case 0xc9:
		return "parameter out of range"
	case 0xcc:
		return "invalid data field in request"
	case 0xd4:
		return "insufficient privilege"
	case 0xd5:
		return "not supported in present state"
	case 0x80:
		return "parameter not supported / password mismatch"
	case 0x81:
		return "wrong password size"
	}
	return "error"
}

// Request is what the control plane asks for.
type Request struct {
	Username string // the user name to set (1..16 bytes, printable ASCII)
	Password string // 1..20 bytes; never logged, never in errors
	// Channel is the LAN channel; 0 finds the first LAN channel (Get Channel Info).
	Channel byte
}

// Result is what the ramdisk reports: where the BMC is and which user slot holds the
// credential (never the password).
type Result struct {
	Address  string `json:"address"` // host or host:port (when the RMCP port is not 623)
	Channel  byte   `json:"channel"`
	UserID   byte   `json:"userId"`
	Username string `json:"username"`
	Reused   bool   `json:"reused"` // the slot already carried this name
}

// Validate checks a request. Pure.
func (r Request) Validate() error {
	if r.Username == "" || len(r.Username) > MaxNameLen {
		return fmt.Errorf("username must be 1 to %d bytes", MaxNameLen)
	}
	for _, c := range r.Username {
		if c < 0x21 || c > 0x7e {
			return errors.New("username must be printable ASCII without spaces")
		}
	}
	if r.Password == "" || len(r.Password) > MaxPasswordLen {
		return fmt.Errorf("password must be 1 to %d bytes", MaxPasswordLen)
	}
	if r.Channel > maxChannel {
		return fmt.Errorf("channel %d: accepted are 1 to %d, or 0 to find the LAN channel", r.Channel, maxChannel)
	}
	return nil
}

// ---------------------------------------------------------------- messages (pure)

// GetChannelInfoReq asks about channel ch.
func GetChannelInfoReq(ch byte) []byte { return []byte{ch & 0x0f} }

// ChannelIsLAN decodes Get Channel Info: whether the channel's medium is 802.3 LAN.
func ChannelIsLAN(resp []byte) (bool, error) {
	if len(resp) < 3 {
		return false, fmt.Errorf("get channel info: response of %d bytes, want at least 3", len(resp))
	}
	return resp[1]&0x7f == mediumLAN, nil
}

// GetLANConfigReq reads parameter param of channel ch (set and block selectors 0).
func GetLANConfigReq(ch, param byte) []byte { return []byte{ch & 0x0f, param, 0, 0} }

// DecodeLANIP decodes parameter 3: revision, then four octets.
func DecodeLANIP(resp []byte) (netip.Addr, error) {
	if len(resp) < 5 {
		return netip.Addr{}, fmt.Errorf("get LAN configuration (IP address): response of %d bytes, want 5", len(resp))
	}
	a := netip.AddrFrom4([4]byte(resp[1:5]))
	if a.IsUnspecified() {
		return netip.Addr{}, errors.New("get LAN configuration: the BMC has no IP address (0.0.0.0) on this channel")
	}
	return a, nil
}

// DecodeLANPort decodes parameter 8: revision, then the port little-endian.
func DecodeLANPort(resp []byte) (uint16, error) {
	if len(resp) < 3 {
		return 0, fmt.Errorf("get LAN configuration (RMCP port): response of %d bytes, want 3", len(resp))
	}
	return uint16(resp[1]) | uint16(resp[2])<<8, nil
}

// GetUserAccessReq reads user id's access on channel ch.
func GetUserAccessReq(ch, id byte) []byte { return []byte{ch & 0x0f, id & 0x3f} }

// DecodeMaxUsers decodes the maximum user ID of a Get User Access response.
func DecodeMaxUsers(resp []byte) (byte, error) {
	if len(resp) < 4 {
		return 0, fmt.Errorf("get user access: response of %d bytes, want 4", len(resp))
	}
	return resp[0] & 0x3f, nil
}

// GetUserNameReq reads user id's name.
func GetUserNameReq(id byte) []byte { return []byte{id & 0x3f} }

// DecodeUserName decodes Get User Name: 16 bytes, NUL padded.
func DecodeUserName(resp []byte) (string, error) {
	if len(resp) < MaxNameLen {
		return "", fmt.Errorf("get user name: response of %d bytes, want %d", len(resp), MaxNameLen)
	}
	b := resp[:MaxNameLen]
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b), nil
}

// SetUserNameReq names user id (16 bytes, NUL padded).
func SetUserNameReq(id byte, name string) []byte {
	out := make([]byte, 1+MaxNameLen)
	out[0] = id & 0x3f
	copy(out[1:], name)
	return out
}

// SetUserPasswordReq sets (op pwSet) or tests (pwTest) a 20-byte password, or enables or
// disables the user (no password bytes).
func SetUserPasswordReq(id, op byte, password string) []byte {
	if op != pwSet && op != pwTest {
		return []byte{id & 0x3f, op}
	}
	out := make([]byte, 2+MaxPasswordLen)
	out[0] = 0x80 | id&0x3f // bit 7: 20-byte password (IPMI 2.0)
	out[1] = op
	copy(out[2:], password)
	return out
}

// SetUserAccessReq grants user id privilege priv on channel ch with IPMI messaging enabled
// (and link authentication and callback off), no session limit.
func SetUserAccessReq(ch, id, priv byte) []byte {
	return []byte{0x80 | 0x10 | ch&0x0f, id & 0x3f, priv & 0x0f, 0}
}

// ---------------------------------------------------------------- provisioning

func call(ctx context.Context, t Transport, op string, netFn, cmd byte, data []byte) ([]byte, error) {
	cc, resp, err := t.Exchange(ctx, netFn, cmd, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if cc != 0 {
		return nil, &CompletionError{Op: op, CC: cc}
	}
	return resp, nil
}

// Provision makes req's user an administrator on the BMC's LAN channel through t and reports
// where the BMC answers. It reuses the slot that already carries the name, else takes the
// first unnamed slot from 2 up.
func Provision(ctx context.Context, t Transport, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, fmt.Errorf("in-band BMC provisioning: %w", err)
	}
	ch := req.Channel
	if ch == 0 {
		for c := byte(1); c <= maxChannel; c++ {
			resp, err := call(ctx, t, fmt.Sprintf("get channel info %d", c), NetFnApp, CmdGetChannelInfo, GetChannelInfoReq(c))
			var ce *CompletionError
			if errors.As(err, &ce) {
				continue // no such channel
			}
			if err != nil {
				return Result{}, err
			}
			if lan, err := ChannelIsLAN(resp); err != nil {
				return Result{}, err
			} else if lan {
				ch = c
				break
			}
		}
		if ch == 0 {
			return Result{}, errors.New("in-band BMC provisioning: the BMC reports no LAN channel (1 to 11)")
		}
	}
	resp, err := call(ctx, t, "get LAN configuration (IP address)", NetFnTransport, CmdGetLANConfig, GetLANConfigReq(ch, LANParamIP))
	if err != nil {
		return Result{}, err
	}
	ip, err := DecodeLANIP(resp)
	if err != nil {
		return Result{}, err
	}
	addr := ip.String()
	if resp, err := call(ctx, t, "get LAN configuration (RMCP port)", NetFnTransport, CmdGetLANConfig, GetLANConfigReq(ch, LANParamPort)); err == nil {
		if port, err := DecodeLANPort(resp); err == nil && port != 0 && port != 623 {
			addr = netip.AddrPortFrom(ip, port).String()
		}
	} // the parameter is optional: 623

	resp, err = call(ctx, t, "get user access", NetFnApp, CmdGetUserAccess, GetUserAccessReq(ch, 1))
	if err != nil {
		return Result{}, err
	}
	maxUsers, err := DecodeMaxUsers(resp)
	if err != nil {
		return Result{}, err
	}
	var id, free byte
	for u := byte(firstUserSlot); u <= maxUsers; u++ {
		resp, err := call(ctx, t, fmt.Sprintf("get user name %d", u), NetFnApp, CmdGetUserName, GetUserNameReq(u))
		var ce *CompletionError
		if errors.As(err, &ce) {
			// Some BMCs answer an error for a never-named slot: it is free.
			if free == 0 {
				free = u
			}
			continue
		}
		if err != nil {
			return Result{}, err
		}
		name, err := DecodeUserName(resp)
		if err != nil {
			return Result{}, err
		}
		if name == req.Username {
			id = u
			break
		}
		if name == "" && free == 0 {
			free = u
		}
	}
	res := Result{Address: addr, Channel: ch, Username: req.Username, Reused: id != 0}
	if id == 0 {
		if free == 0 {
			return Result{}, fmt.Errorf("in-band BMC provisioning: all %d user slots are named and none is %q", maxUsers, req.Username)
		}
		id = free
		if _, err := call(ctx, t, fmt.Sprintf("set user name %d", id), NetFnApp, CmdSetUserName, SetUserNameReq(id, req.Username)); err != nil {
			return Result{}, err
		}
	}
	res.UserID = id
	steps := []struct {
		op   string
		cmd  byte
		data []byte
	}{
		{fmt.Sprintf("set user password %d", id), CmdSetUserPassword, SetUserPasswordReq(id, pwSet, req.Password)},
		{fmt.Sprintf("set user access %d on channel %d", id, ch), CmdSetUserAccess, SetUserAccessReq(ch, id, PrivAdmin)},
		{fmt.Sprintf("enable user %d", id), CmdSetUserPassword, SetUserPasswordReq(id, pwEnable, "")},
		{fmt.Sprintf("test password of user %d", id), CmdSetUserPassword, SetUserPasswordReq(id, pwTest, req.Password)},
	}
	for _, s := range steps {
		if _, err := call(ctx, t, s.op, NetFnApp, s.cmd, s.data); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// DecodeResponse splits a system-interface response into its completion code and data.
func DecodeResponse(b []byte) (byte, []byte, error) {
	if len(b) < 1 {
		return 0, nil, errors.New("empty response from the BMC (no completion code)")
	}
	return b[0], b[1:], nil
}
