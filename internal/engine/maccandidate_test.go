package engine

import (
	"strings"
	"testing"
	"time"

	"bcd/internal/provision"
	"bcd/internal/store"
)

func TestUUIDForms(t *testing.T) {
	for _, tc := range []struct{ in, a, b string }{
		{"00112233-4455-6677-8899-aabbccddeeff", "00112233-4455-6677-8899-aabbccddeeff", "33221100-5544-7766-8899-aabbccddeeff"},
		{"33221100-5544-7766-8899-AABBCCDDEEFF", "33221100-5544-7766-8899-aabbccddeeff", "00112233-4455-6677-8899-aabbccddeeff"},
		{"11111111-1111-1111-8899-aabbccddeeff", "11111111-1111-1111-8899-aabbccddeeff", "11111111-1111-1111-8899-aabbccddeeff"},
		{"not-a-uuid", "not-a-uuid", "not-a-uuid"},
	} {
		a, b := UUIDForms(tc.in)
		if a != tc.a || b != tc.b {
			t.Errorf("UUIDForms(%s) = %s, %s; want %s, %s", tc.in, a, b, tc.a, tc.b)
		}
		if !SameSMBIOSUUID(a, b) || !SameSMBIOSUUID(b, a) {
			t.Errorf("%s and %s should be the same SMBIOS UUID", a, b)
		}
	}
}

func TestDecideMAC(t *testing.T) {
	const (
		uuid    = "00112233-4455-6677-8899-aabbccddeeff"
		swapped = "33221100-5544-7766-8899-aabbccddeeff"
		other   = "99999999-4455-6677-8899-aabbccddeeff"
		mac1    = "52:54:00:00:00:01"
		mac2    = "52:54:00:00:00:02"
		site    = "site-a"
	)
	us := func(d time.Duration) int64 { return d.Microseconds() }
	cycle := us(100 * time.Hour)
	deadline := cycle + us(time.Hour)
	seen := func(mac, u string, first, last time.Duration) store.Discovery {
		return store.Discovery{SiteID: site, MAC: mac, UUID: u, FirstSeen: cycle + us(first), LastSeen: cycle + us(last)}
	}
	base := func(mod func(*macInput)) macInput {
		in := macInput{NodeID: "n1", SiteID: site, Window: MACWindow, UUID: uuid, CycleAt: cycle, Now: cycle + us(time.Minute), Deadline: deadline}
		if mod != nil {
			mod(&in)
		}
		return in
	}
	type want struct {
		out   macOutcome
		mac   string
		fault provision.Fault
		until int64
		text  string
	}
	for _, tc := range []struct {
		name string
		in   macInput
		want want
	}{
		{"node already has a MAC", base(func(i *macInput) { i.MACs = 1; i.Sightings = []store.Discovery{seen(mac1, uuid, 0, 0)} }), want{out: macDone}},
		{"no UUID, no MAC", base(func(i *macInput) { i.UUID = "" }), want{out: macFail, fault: provision.FaultMACNotDiscovered, text: "neither a MAC nor a product UUID"}},
		{"nothing seen yet: wait for the window's end", base(nil), want{out: macWait, until: cycle + us(MACWindow) + 1}},
		{"nothing seen, window over", base(func(i *macInput) { i.Now = cycle + us(MACWindow) + 1 }), want{out: macFail, fault: provision.FaultMACNotDiscovered, text: "within 10m0s"}},
		{"nothing seen, deadline before the window's end", base(func(i *macInput) { i.Deadline = cycle + us(5*time.Minute) }), want{out: macWait, until: cycle + us(5*time.Minute)}},
		{"nothing seen, deadline reached inside the window", base(func(i *macInput) { i.Deadline = cycle + us(5*time.Minute); i.Now = i.Deadline }),
			want{out: macFail, fault: provision.FaultMACNotDiscovered, text: "within 5m0s"}},
		{"seen under the same byte order", base(func(i *macInput) { i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute)} }), want{out: macPropose, mac: mac1, until: deadline}},
		{"seen under the swapped byte order", base(func(i *macInput) { i.Sightings = []store.Discovery{seen(mac1, swapped, time.Minute, time.Minute)} }), want{out: macPropose, mac: mac1, until: deadline}},
		{"seen under the swapped order, node enrolled swapped", base(func(i *macInput) {
			i.UUID = swapped
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute)}
		}), want{out: macPropose, mac: mac1}},
		{"seen in upper case", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, strings.ToUpper(uuid), time.Minute, time.Minute)}
		}), want{out: macPropose, mac: mac1}},
		{"another UUID is no sighting", base(func(i *macInput) { i.Sightings = []store.Discovery{seen(mac1, other, time.Minute, time.Minute)} }), want{out: macWait}},
		{"seen exactly at the cycle", base(func(i *macInput) { i.Sightings = []store.Discovery{seen(mac1, uuid, 0, 0)} }), want{out: macPropose, mac: mac1}},
		{"seen exactly at the window's end", base(func(i *macInput) {
			i.Now = cycle + us(MACWindow)
			i.Sightings = []store.Discovery{seen(mac1, uuid, MACWindow, MACWindow)}
		}), want{out: macPropose, mac: mac1}},
		{"first seen after the window", base(func(i *macInput) {
			i.Now = cycle + us(20*time.Minute)
			i.Sightings = []store.Discovery{seen(mac1, uuid, MACWindow+time.Microsecond, 20*time.Minute)}
		}), want{out: macFail, fault: provision.FaultMACNotDiscovered}},
		{"seen only before the cycle", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, -time.Hour, -time.Second)}
		}), want{out: macWait}},
		{"seen before and again within the window", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, -time.Hour, 30*time.Second)}
		}), want{out: macPropose, mac: mac1}},
		{"seen before and only after the window: not provably in it", base(func(i *macInput) {
			i.Now = cycle + us(30*time.Minute)
			i.Sightings = []store.Discovery{seen(mac1, uuid, -time.Hour, 30*time.Minute)}
		}), want{out: macFail, fault: provision.FaultMACNotDiscovered}},
		{"first seen in the window, still seen after it", base(func(i *macInput) {
			i.Now = cycle + us(30*time.Minute)
			i.Sightings = []store.Discovery{seen(mac1, uuid, 2*time.Minute, 30*time.Minute)}
		}), want{out: macPropose, mac: mac1}},
		{"seen at another site only", base(func(i *macInput) {
			d := seen(mac1, uuid, time.Minute, time.Minute)
			d.SiteID = "site-b"
			i.Sightings = []store.Discovery{d}
		}), want{out: macWait}},
		{"two MACs in the window", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute), seen(mac2, swapped, 2*time.Minute, 2*time.Minute)}
		}), want{out: macFail, fault: provision.FaultMACAmbiguous, text: mac1 + ", " + mac2}},
		{"another MAC under the UUID 23 h ago", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute), seen(mac2, uuid, -23*time.Hour, -23*time.Hour)}
		}), want{out: macFail, fault: provision.FaultMACAmbiguous}},
		{"another MAC under the UUID at another site", base(func(i *macInput) {
			d := seen(mac2, uuid, -time.Hour, -time.Hour)
			d.SiteID = "site-b"
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute), d}
		}), want{out: macFail, fault: provision.FaultMACAmbiguous}},
		{"another MAC under the UUID more than 24 h ago", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute), seen(mac2, uuid, -25*time.Hour, -24*time.Hour)}
		}), want{out: macPropose, mac: mac1}},
		{"another MAC under another UUID", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute), seen(mac2, other, time.Minute, time.Minute)}
		}), want{out: macPropose, mac: mac1}},
		{"same MAC seen yesterday and now", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, -20*time.Hour, time.Minute)}
		}), want{out: macPropose, mac: mac1}},
		{"the MAC belongs to another node", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute)}
			i.Owners = map[string]string{mac1: "n2"}
		}), want{out: macFail, fault: provision.FaultMACConflict, mac: mac1, text: "belongs to node n2"}},
		{"the MAC belongs to another node, trusted network", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute)}
			i.Owners = map[string]string{mac1: "n2"}
			i.Trust = true
		}), want{out: macFail, fault: provision.FaultMACConflict}},
		{"trusted network binds at once", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, swapped, time.Minute, time.Minute)}
			i.Trust = true
		}), want{out: macBind, mac: mac1}},
		{"trusted network: still no ambiguity allowed", base(func(i *macInput) {
			i.Sightings = []store.Discovery{seen(mac1, uuid, time.Minute, time.Minute), seen(mac2, uuid, time.Minute, time.Minute)}
			i.Trust = true
		}), want{out: macFail, fault: provision.FaultMACAmbiguous}},
		{"pending candidate waits for the deadline", base(func(i *macInput) { i.Pending = mac1 }), want{out: macWait, mac: mac1, until: deadline}},
		{"pending candidate past the deadline", base(func(i *macInput) { i.Pending = mac1; i.Now = deadline }), want{out: macFail, fault: provision.FaultMACUnconfirmed, mac: mac1, text: "confirm-mac n1 " + mac1}},
		{"confirmed candidate: the node has its MAC", base(func(i *macInput) { i.Pending = mac1; i.MACs = 1 }), want{out: macDone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decideMAC(tc.in)
			if got.Outcome != tc.want.out {
				t.Fatalf("outcome %d, want %d (%+v)", got.Outcome, tc.want.out, got)
			}
			if tc.want.mac != "" && got.MAC != tc.want.mac {
				t.Errorf("MAC %s, want %s", got.MAC, tc.want.mac)
			}
			if got.Fault != tc.want.fault {
				t.Errorf("fault %s, want %s", got.Fault, tc.want.fault)
			}
			if tc.want.until != 0 && got.Until != tc.want.until {
				t.Errorf("until %d, want %d", got.Until, tc.want.until)
			}
			if !strings.Contains(got.Reason, tc.want.text) {
				t.Errorf("reason %q does not say %q", got.Reason, tc.want.text)
			}
		})
	}
}

// An auto-accepted machine goes to the most specific auto-accepting pool whose hardware
// requirements its self-asserted inventory meets (the most requirements, then by name).
func TestAcceptingPool(t *testing.T) {
	pool := func(name string, reqs ...string) store.Pool {
		return store.Pool{Name: name, Policy: store.PoolPolicy{AutoAccept: true, HardwareRequirements: reqs}}
	}
	general, gpu, large := pool("general"), pool("gpu", "gpus>=1"), pool("gpu-large", "gpus>=8", "memory>=1TiB")
	const (
		plain   = `{"memory":{"totalBytes":68719476736}}`
		twoGPUs = `{"memory":{"totalBytes":549755813888},"pci":[{"gpu":true},{"gpu":true}]}`
		eight   = `{"memory":{"totalBytes":2199023255552},"pci":[{"gpu":true},{"gpu":true},{"gpu":true},{"gpu":true},{"gpu":true},{"gpu":true},{"gpu":true},{"gpu":true}]}`
	)
	for _, c := range []struct {
		name  string
		pools []store.Pool
		inv   string
		want  string // "" none
	}{
		{"no pool auto-accepts", nil, plain, ""},
		{"one pool that requires nothing", []store.Pool{general}, plain, "general"},
		{"a plain machine: the pool that requires nothing", []store.Pool{general, gpu, large}, plain, "general"},
		{"two GPUs: the GPU pool", []store.Pool{general, gpu, large}, twoGPUs, "gpu"},
		{"eight GPUs and 2 TiB: the most specific", []store.Pool{general, gpu, large}, eight, "gpu-large"},
		{"eight GPUs, the large pool listed first", []store.Pool{large, gpu}, eight, "gpu-large"},
		{"no pool fits: an operator decides", []store.Pool{gpu, large}, plain, ""},
		{"as specific: by name", []store.Pool{pool("a", "gpus>=1"), pool("b", "memory>=1GiB")}, twoGPUs, "a"},
		{"an inventory not read: only a pool that requires nothing", []store.Pool{general, gpu}, "not json", "general"},
		{"an inventory not read, every pool requires", []store.Pool{gpu}, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := AcceptingPool(c.pools, c.inv)
			if ok != (c.want != "") || got.Name != c.want {
				t.Errorf("AcceptingPool = %q, %v; want %q", got.Name, ok, c.want)
			}
		})
	}
}
