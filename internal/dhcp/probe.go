package dhcp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// Prober tells whether something on the network answers at an address: full mode asks before
// it offers an address new to the client, while another server may have leased addresses it
// does not know of (see Config.Probe).
type Prober interface {
	InUse(ctx context.Context, ip netip.Addr) (bool, error)
}

// DefaultProbeTimeout is how long ICMPProber waits for an echo reply: a host on the same link
// answers within milliseconds; iPXE and PXE ROMs retry a DISCOVER after a second or more.
const DefaultProbeTimeout = 300 * time.Millisecond

// ICMPProber probes with an ICMP echo request (as ISC dhcpd and dnsmasq do before offering an
// address) on one raw ICMP socket (root or CAP_NET_RAW), opened in the network namespace of its
// caller; probes run concurrently, their replies told apart by sequence number.
type ICMPProber struct {
	conn    *icmp.PacketConn
	timeout time.Duration
	id      int

	mu      sync.Mutex
	seq     uint16
	waiting map[uint16]probeWait
	done    chan struct{}
}

type probeWait struct {
	ip    netip.Addr
	reply chan struct{}
}

// NewICMPProber opens the probe socket; timeout 0 is DefaultProbeTimeout. Close it when done.
func NewICMPProber(timeout time.Duration) (*ICMPProber, error) {
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return nil, fmt.Errorf("opening the ICMP socket that probes addresses before offering them (needs root or CAP_NET_RAW): %w", err)
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	p := &ICMPProber{conn: c, timeout: timeout, id: int(binary.BigEndian.Uint16(b[:])), waiting: map[uint16]probeWait{}, done: make(chan struct{})}
	go p.read()
	return p, nil
}

// Close closes the socket; probes in flight return not in use.
func (p *ICMPProber) Close() error {
	err := p.conn.Close()
	<-p.done
	return err
}

// read delivers echo replies to the probes waiting for them: one of this prober's (its id), to
// the sequence number of a probe in flight, from the address probed.
func (p *ICMPProber) read() {
	defer close(p.done)
	buf := make([]byte, 1500)
	for {
		n, peer, err := p.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		if !ok || echo.ID != p.id {
			continue
		}
		from, ok := peer.(*net.IPAddr)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(from.IP.To4())
		if !ok {
			continue
		}
		p.mu.Lock()
		w, ok := p.waiting[uint16(echo.Seq)]
		if ok && w.ip == addr {
			delete(p.waiting, uint16(echo.Seq))
			close(w.reply)
		}
		p.mu.Unlock()
	}
}

// InUse sends one echo request to ip and reports whether ip answered within the timeout (or
// before ctx ended).
func (p *ICMPProber) InUse(ctx context.Context, ip netip.Addr) (bool, error) {
	if !ip.Is4() {
		return false, fmt.Errorf("probing %s: only IPv4 addresses are probed", ip)
	}
	w := probeWait{ip: ip, reply: make(chan struct{})}
	p.mu.Lock()
	if len(p.waiting) >= 1<<15 {
		p.mu.Unlock()
		return false, errors.New("probing: too many probes in flight")
	}
	for {
		p.seq++
		if _, busy := p.waiting[p.seq]; !busy {
			break
		}
	}
	seq := p.seq
	p.waiting[seq] = w
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if cur, ok := p.waiting[seq]; ok && cur.reply == w.reply {
			delete(p.waiting, seq)
		}
		p.mu.Unlock()
	}()
	msg, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: int(seq), Data: []byte("bcd dhcp probe")}}).Marshal(nil)
	if err != nil {
		return false, fmt.Errorf("probing %s: %w", ip, err)
	}
	if _, err := p.conn.WriteTo(msg, &net.IPAddr{IP: ip.AsSlice()}); err != nil {
		return false, fmt.Errorf("probing %s: %w", ip, err)
	}
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	select {
	case <-w.reply:
		return true, nil
	case <-timer.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-p.done:
		return false, nil
	}
}
