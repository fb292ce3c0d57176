package engine

import (
	"strings"
	"testing"

	"bcd/internal/store"
)

func TestInbandAddress(t *testing.T) {
	cases := []struct {
		result string
		want   string
	}{
		{`{"address":"10.0.0.5","userId":3}`, "10.0.0.5"},
		{`{"address":"10.0.0.5:6230"}`, "10.0.0.5:6230"},
		{`{"address":"fd00::5"}`, "fd00::5"},
		{`{"address":"[fd00::5]:623"}`, "[fd00::5]:623"},
		{`{"address":"0.0.0.0"}`, ""},
		{`{"address":"10.0.0.5:0"}`, ""},
		{`{"address":"224.0.0.1"}`, ""},
		{`{"address":"bmc.example"}`, ""},
		{`{"address":"https://10.0.0.5"}`, ""},
		{`{"address":""}`, ""},
		{`not json`, ""},
	}
	for _, c := range cases {
		got, _, err := InbandAddress(c.result)
		if got != c.want || (err == nil) != (c.want != "") {
			t.Errorf("InbandAddress(%s) = %q, %v; want %q", c.result, got, err, c.want)
		}
	}
}

func TestMediaEntry(t *testing.T) {
	sha := "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
	insert := `{"action":"insert","image":"rescue","url":"http://i/r.iso","sha256":"` + sha + `","macs":["52:54:00:AA:00:01"]}`
	cmd := func(args, result, state string) store.Command {
		return store.Command{ID: "c1", Kind: "bmc.media", SiteID: "s1", NodeID: "n1", TargetAgent: "a1", Generation: 3, State: state, Args: args, Result: result}
	}
	cases := []struct {
		name string
		c    store.Command
		kind string
		err  bool
	}{
		{"sanboot insert", cmd(insert, `{"via":"sanboot","image":"rescue"}`, "succeeded"), store.BootEntrySanboot, false},
		{"virtual media", cmd(insert, `{"via":"virtualMedia"}`, "succeeded"), "", false},
		{"sanboot eject", cmd(`{"action":"eject","macs":["52:54:00:aa:00:01"]}`, `{"via":"sanboot"}`, "succeeded"), store.BootEntryRemoved, false},
		{"virtual eject", cmd(`{"action":"eject"}`, `{"via":"virtualMedia"}`, "succeeded"), "", false},
		{"failed", cmd(insert, `{"via":"sanboot"}`, "failed"), "", false},
		{"another kind", store.Command{Kind: "bmc.power", State: "succeeded", Result: `{"via":"sanboot"}`}, "", false},
		{"bad result", cmd(insert, `nope`, "succeeded"), "", true},
		{"bad action", cmd(`{"action":"spin"}`, `{"via":"sanboot"}`, "succeeded"), "", true},
	}
	for _, c := range cases {
		e, ok, err := MediaEntry(c.c)
		if (err != nil) != c.err || ok != (c.kind != "") || e.Kind != c.kind {
			t.Errorf("%s: %+v %v %v", c.name, e, ok, err)
			continue
		}
		if c.kind == store.BootEntrySanboot && (e.ISO == nil || e.ISO.Name != "rescue.iso" || e.ISO.SHA256 != strings.ToLower(sha) || e.MACs[0] != "52:54:00:aa:00:01" ||
			e.AgentID != "a1" || e.CommandID != "c1" || e.Generation != 3 || e.SiteID != "s1") {
			t.Errorf("%s: entry %+v iso %+v", c.name, e, e.ISO)
		}
	}
}
