package sim

import (
	"context"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"

	"bcd/internal/engine"
	"bcd/internal/store"
)

// The in-process links have the engine's gate.
var (
	_ cpuBounder = (*engine.Engine)(nil)
	_ cpuBounder = spread(nil)
)

// gatedLink is a link with a gate that counts what goes through it, or refuses it (refuse).
type gatedLink struct {
	Link
	through atomic.Int64
	refuse  error
}

func (l *gatedLink) CPUBound(_ context.Context, f func()) error {
	if l.refuse != nil {
		return l.refuse
	}
	l.through.Add(1)
	f()
	return nil
}

// A simulated machine's key and certificate request, and its signed result, are made through
// the link's gate when it has one (in process: the engine's), at once when it has none; a gate
// that refuses (the context ended) leaves the machine without them.
func TestSimulatedMachinesCryptographyGoesThroughTheLinksGate(t *testing.T) {
	ctx := context.Background()
	ended := errors.New("context ended")
	for _, c := range []struct {
		name        string
		link        *gatedLink
		gated       bool
		wantThrough int64
	}{
		{name: "a gate", link: &gatedLink{}, gated: true, wantThrough: 2},
		{name: "no gate", link: &gatedLink{}},
		{name: "a gate that refuses", link: &gatedLink{refuse: ended}, gated: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var link Link = struct{ Link }{c.link} // (no CPUBound)
			if c.gated {
				link = c.link
			}
			s := New(Config{}, link)
			key, csr, err := s.keyAndCSR(ctx, "ramdisk-n1")
			if c.link.refuse != nil {
				if !errors.Is(err, ended) || key != nil || csr != nil {
					t.Fatalf("a refused key: %v (key %v, request %d bytes), want the gate's error and nothing", err, key != nil, len(csr))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req, err := x509.ParseCertificateRequest(csr); err != nil || req.Subject.CommonName != "ramdisk-n1" {
				t.Fatalf("the certificate request: %v, %v", req, err)
			}
			r := &ramdisk{s: s, m: &Machine{NodeID: "n1"}, key: key, cert: []byte("certificate")}
			u := r.signed(ctx, store.Command{ID: "c1", NodeID: "n1", Kind: "disk.wipe", Generation: 1}, map[string]any{"devices": []string{}})
			if u.State != "succeeded" || len(u.NodeSig) == 0 {
				t.Fatalf("the signed result: state %s, %d signature bytes, error %q", u.State, len(u.NodeSig), u.Error)
			}
			if got := c.link.through.Load(); got != c.wantThrough {
				t.Errorf("%d went through the gate, want %d", got, c.wantThrough)
			}
		})
	}
}
