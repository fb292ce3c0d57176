package gateway

import (
	"net"
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "bcd/internal/gen/agentv1"
)

// FuzzSiteReports feeds wire bytes as an agent's boot-lease request and status report: nothing
// may panic; every DHCP lease accepted and every withheld pair kept has a 6-octet MAC in its
// canonical form and an address (IPv4 for leases); what is accepted survives a round trip.
func FuzzSiteReports(f *testing.F) {
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&agentv1.BootLeaseRequest{TtlMs: 5000, Epoch: 3, DhcpLeases: []*agentv1.DHCPLease{{Mac: "52:54:00:AA:00:01", Ip: "10.0.0.7", ExpiresUnixMs: 7000}, {Mac: "52:54:00:aa:00:02", Ip: "10.0.0.8"}}})
	seed(&agentv1.StatusReport{WithheldBoots: []*agentv1.WithheldBoot{{Mac: "52:54:00:aa:00:01", Remote: "::ffff:10.0.0.66", Count: 3, FirstUnixMs: 1, LastUnixMs: 2}}})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req agentv1.BootLeaseRequest
		if proto.Unmarshal(b, &req) == nil {
			if ls, err := DHCPLeasesFromProto(req.GetDhcpLeases()); err == nil {
				for _, l := range ls {
					if hw, err := net.ParseMAC(l.MAC); err != nil || len(hw) != 6 || hw.String() != l.MAC || !l.IP.Is4() {
						t.Fatalf("accepted lease %+v", l)
					}
				}
				again, err := DHCPLeasesFromProto(DHCPLeasesToProto(ls))
				if err != nil || len(again) != len(ls) {
					t.Fatalf("round trip of %+v: %+v %v", ls, again, err)
				}
				for i := range ls {
					if again[i].MAC != ls[i].MAC || again[i].IP != ls[i].IP || again[i].Expires.UnixMilli() != ls[i].Expires.UnixMilli() {
						t.Fatalf("round trip changed %+v into %+v", ls[i], again[i])
					}
				}
			}
		}
		var st agentv1.StatusReport
		if proto.Unmarshal(b, &st) == nil {
			s := statusOf(&st)
			if len(s.Withheld) > MaxWithheldBoots {
				t.Fatalf("%d withheld pairs kept", len(s.Withheld))
			}
			for _, w := range s.Withheld {
				if hw, err := net.ParseMAC(w.MAC); err != nil || len(hw) != 6 || hw.String() != w.MAC || !w.Remote.IsValid() || w.Remote.Is4In6() {
					t.Fatalf("kept withheld pair %+v", w)
				}
			}
		}
	})
}
