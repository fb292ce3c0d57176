package ipmi

import (
	"bytes"
	"sync"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// firstInSession is a lossyProxy.dropIf that holds for the first request sent inside an RMCP+
// session (authenticated IPMI payload: the login's Set Session Privilege Level) and for its
// retransmissions (identical bytes), and for nothing else.
type firstInSession struct {
	mu    sync.Mutex
	first []byte
}

func (f *firstInSession) match(req []byte) bool {
	// RMCP header (4 bytes), then the session header: auth type 06h (RMCP+), payload type
	// (bit 6: authenticated; low 6 bits 0: an IPMI message).
	if len(req) < 6 || req[4] != 0x06 || req[5]&0x40 == 0 || req[5]&0x3f != 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.first == nil {
		f.first = bytes.Clone(req)
	}
	return bytes.Equal(req, f.first)
}

// TestFailedLoginClosesItsActiveSession: a login whose session the BMC activated (RAKP done)
// but that failed after, at Set Session Privilege Level (here: no answer), sends Close Session,
// so the BMC does not hold the session until its inactivity timeout (BMCs have few slots). The
// driver then logs in with the next cipher suite and reads the power.
func TestFailedLoginClosesItsActiveSession(t *testing.T) {
	m := &fakeMachine{on: true}
	b := startBMC(t, ipmibmc.Config{}, m)
	p := startLossyProxy(t, b.Addr())
	var f firstInSession
	p.mu.Lock()
	p.dropIf = f.match
	p.mu.Unlock()
	d, err := New(bmc.Endpoint{Address: p.conn.LocalAddr().String(), Username: testUser, Password: testPassword}, quickOptions())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.GetPower(t.Context()); err != nil || got != bmc.PowerOn {
		t.Fatalf("GetPower after a login lost at Set Session Privilege Level: %v %v", got, err)
	}
	f.mu.Lock()
	dropped := f.first != nil
	f.mu.Unlock()
	if !dropped {
		t.Fatal("no Set Session Privilege Level was seen: the test dropped nothing")
	}
	eventually(t, "every session closed on the BMC", func() bool { return b.ActiveSessions() == 0 })
}
