package ipmi

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// lossyProxy relays the datagrams of one client to a BMC and back, recording every request, and
// can drop the BMC's answer to one request: the request reached the BMC, the client never hears.
type lossyProxy struct {
	conn *net.UDPConn // the client's side

	mu       sync.Mutex
	requests [][]byte
	dropAt   int // 1-based index of the request whose answer is dropped; 0: none
	dropNext bool
	delay    time.Duration         // > 0: that answer is delayed this long instead of dropped
	dropIf   func(req []byte) bool // non-nil: the answer to every request it holds for is dropped
}

func startLossyProxy(t *testing.T, bmcAddr *net.UDPAddr) *lossyProxy {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.DialUDP("udp", nil, bmcAddr)
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{conn: conn}
	var client *net.UDPAddr
	var clientMu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			clientMu.Lock()
			client = from
			clientMu.Unlock()
			p.mu.Lock()
			p.requests = append(p.requests, bytes.Clone(buf[:n]))
			if p.dropAt != 0 && len(p.requests) == p.dropAt || p.dropIf != nil && p.dropIf(buf[:n]) {
				p.dropNext = true
			}
			p.mu.Unlock()
			_, _ = up.Write(buf[:n])
		}
	})
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			drop, delay := p.dropNext, p.delay
			p.dropNext = false
			p.mu.Unlock()
			clientMu.Lock()
			to := client
			clientMu.Unlock()
			switch {
			case to == nil:
			case drop && delay > 0:
				answer := bytes.Clone(buf[:n])
				wg.Go(func() {
					time.Sleep(delay) // the slow BMC
					_, _ = conn.WriteToUDP(answer, to)
				})
			case !drop:
				_, _ = conn.WriteToUDP(buf[:n], to)
			}
		}
	})
	t.Cleanup(func() {
		conn.Close()
		up.Close()
		wg.Wait()
	})
	return p
}

// dropAnswerTo drops the answer to the request after the next offset ones (0: the one being
// handled now).
func (p *lossyProxy) dropAnswerTo(offset int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset == 0 {
		p.dropNext = true
		return
	}
	p.dropAt = len(p.requests) + offset
}

// copies counts the requests identical to the one at index i (1-based).
func (p *lossyProxy) copies(i int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.requests {
		if bytes.Equal(r, p.requests[i-1]) {
			n++
		}
	}
	return n
}

// TestCycleAndResetNeverSentTwice: the answer to a Chassis Control power cycle or hard reset is
// lost (the BMC got it and ran it). go-ipmi would retransmit the identical request, and a BMC
// that does not recognise the repeat runs it again (LAB-NOTES gotcha 4): the driver must send it
// once and say that its outcome is unknown.
func TestCycleAndResetNeverSentTwice(t *testing.T) {
	for _, action := range []bmc.PowerAction{bmc.ActionCycle, bmc.ActionReset} {
		t.Run(string(action), func(t *testing.T) {
			m := &fakeMachine{on: true}
			b := startBMC(t, ipmibmc.Config{}, m)
			p := startLossyProxy(t, b.Addr())
			var arm sync.Once
			m.mu.Lock()
			m.onPoll = func() { arm.Do(func() { p.dropAnswerTo(1) }) } // the read before the Chassis Control
			m.mu.Unlock()
			d, err := New(bmc.Endpoint{Address: p.conn.LocalAddr().String(), Username: testUser, Password: testPassword}, quickOptions())
			if err != nil {
				t.Fatal(err)
			}
			err = d.SetPower(t.Context(), action)
			p.mu.Lock()
			control := p.dropAt
			p.mu.Unlock()
			if control == 0 {
				t.Fatal("the Chassis Control was never reached")
			}
			if n := p.copies(control); n != 1 {
				t.Fatalf("the Chassis Control went to the BMC %d times, want once (SetPower: %v)", n, err)
			}
			if err == nil || !strings.Contains(err.Error(), "not sent again") {
				t.Fatalf("SetPower(%s) = %v, want an error saying the outcome is unknown and nothing was sent again", action, err)
			}
			want := counts{on: true, offs: 1, ons: 1}
			if action == bmc.ActionReset {
				want = counts{on: true, resets: 1}
			}
			eventually(t, "the action run once", func() bool { return m.counts() == want })
		})
	}
}

// TestCycleSurvivesALostRead: in the session of a cycle nothing is retransmitted by go-ipmi, so
// the driver sends a read whose answer was lost again itself.
func TestCycleSurvivesALostRead(t *testing.T) {
	m := &fakeMachine{on: true}
	b := startBMC(t, ipmibmc.Config{}, m)
	p := startLossyProxy(t, b.Addr())
	var arm sync.Once
	m.mu.Lock()
	m.onPoll = func() { arm.Do(func() { p.dropAnswerTo(0) }) }
	m.mu.Unlock()
	d, err := New(bmc.Endpoint{Address: p.conn.LocalAddr().String(), Username: testUser, Password: testPassword}, quickOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetPower(t.Context(), bmc.ActionCycle); err != nil {
		t.Fatalf("SetPower(cycle) with one lost Get Chassis Status answer: %v", err)
	}
	eventually(t, "one cycle", func() bool { return m.counts() == counts{on: true, offs: 1, ons: 1} })
	if c := m.counts(); c != (counts{on: true, offs: 1, ons: 1}) {
		t.Fatalf("machine calls %+v", c)
	}
}

// TestCycleOnASlowBMC: a BMC that answers a Chassis Control later than one exchange timeout (it
// runs the action before answering) but within the time the retransmissions used to give it
// still cycles the machine, once, without an error.
func TestCycleOnASlowBMC(t *testing.T) {
	m := &fakeMachine{on: true}
	b := startBMC(t, ipmibmc.Config{DedupeWindow: -1}, m)
	p := startLossyProxy(t, b.Addr())
	opts := quickOptions()
	p.mu.Lock()
	p.delay = opts.Timeout * 3 / 2
	p.mu.Unlock()
	var arm sync.Once
	m.mu.Lock()
	m.onPoll = func() { arm.Do(func() { p.dropAnswerTo(1) }) }
	m.mu.Unlock()
	d, err := New(bmc.Endpoint{Address: p.conn.LocalAddr().String(), Username: testUser, Password: testPassword}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetPower(t.Context(), bmc.ActionCycle); err != nil {
		t.Fatalf("SetPower(cycle) on a slow BMC: %v", err)
	}
	p.mu.Lock()
	control := p.dropAt
	p.mu.Unlock()
	if n := p.copies(control); n != 1 {
		t.Fatalf("the Chassis Control went to the BMC %d times, want once", n)
	}
	eventually(t, "one cycle", func() bool { return m.counts() == counts{on: true, offs: 1, ons: 1} })
}
