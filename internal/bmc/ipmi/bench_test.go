package ipmi

import (
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// BenchmarkGetPower measures one full operation (session open, Get Chassis Status, close)
// against the virtual BMC on loopback.
func BenchmarkGetPower(b *testing.B) {
	m := &fakeMachine{on: true}
	bm, err := ipmibmc.New(ipmibmc.Config{Addr: "127.0.0.1:0", Username: testUser, Password: testPassword, GUID: testGUID}, m)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	go func() { _ = bm.Serve(ctx) }()
	d, err := New(bmc.Endpoint{Address: bm.Addr().String(), Username: testUser, Password: testPassword}, quickOptions())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if st, err := d.GetPower(ctx); err != nil || st != bmc.PowerOn {
			b.Fatal(st, err)
		}
	}
}
