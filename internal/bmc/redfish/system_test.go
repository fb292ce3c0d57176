package redfish_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"
	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

func TestSystemPath(t *testing.T) {
	tests := []struct {
		address string
		want    string
		wantErr bool
	}{
		{"https://10.0.0.5", "", false},
		{"https://10.0.0.5/", "", false},
		{"10.0.0.5:8443", "", false},
		{"https://10.0.0.5/redfish/v1", "", false},
		{"https://10.0.0.5/redfish/v1/", "", false},
		{"https://10.0.0.5/redfish/v1/Systems/Node2", "/redfish/v1/Systems/Node2", false},
		{"https://10.0.0.5/redfish/v1/Systems/Node2/", "/redfish/v1/Systems/Node2", false},
		{"https://[fd00::5]:443/redfish/v1/Systems/System.Embedded.1", "/redfish/v1/Systems/System.Embedded.1", false},
		{"10.0.0.5/redfish/v1/Systems/1", "/redfish/v1/Systems/1", false},
		{"https://10.0.0.5/redfish/v1/Systems", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/Node2/Bios", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/..", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/%2e%2e", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/a%2Fb", "", true},
		{"https://10.0.0.5/redfish/v1/Managers/1", "", true},
		{"https://10.0.0.5/Systems/1", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/1?x=y", "", true},
		{"https://10.0.0.5/redfish/v1/Systems/1#frag", "", true},
	}
	for _, tt := range tests {
		got, err := redfish.SystemPath(tt.address)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("SystemPath(%q) = %q, %v; want %q, error %v", tt.address, got, err, tt.want, tt.wantErr)
			continue
		}
		if err != nil && !strings.Contains(err.Error(), "/redfish/v1/Systems/ID") {
			t.Errorf("SystemPath(%q): error %q does not say what is accepted", tt.address, err)
		}
	}
}

// multiNode scripts a chassis BMC serving several ComputerSystems that no heuristic tells apart
// (all Physical, no manager names one): only the address can.
func multiNode(ids ...string) *scripted {
	s := newScripted()
	var members []any
	for _, id := range ids {
		uri := "/redfish/v1/Systems/" + id
		members = append(members, ref(uri))
		s.docs[uri] = func() (int, any) {
			return 200, map[string]any{"@odata.id": uri, "SystemType": "Physical", "PowerState": "On", "UUID": id,
				"Boot":    map[string]any{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None"},
				"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{"target": uri + "/Actions/ComputerSystem.Reset"}}}
		}
		s.posts["POST "+uri+"/Actions/ComputerSystem.Reset"] = func(map[string]any) (int, any) { return 204, nil }
	}
	s.docs["/redfish/v1/Systems"] = func() (int, any) { return 200, map[string]any{"Members": members} }
	s.docs["/redfish/v1/Managers"] = func() (int, any) { return 200, map[string]any{"Members": []any{}} }
	return s
}

// TestNamedSystem: an address naming /redfish/v1/Systems/ID makes the driver act on exactly that
// system, reading no other (no heuristic runs); a system the BMC does not list is an error naming
// the ones it does, and nothing is reset; without a path the heuristics still run.
func TestNamedSystem(t *testing.T) {
	tests := []struct {
		name    string
		systems []string
		path    string
		want    string   // system acted on; "" for an error
		errHas  []string // in the error when want is ""
	}{
		{name: "named among three", systems: []string{"Node1", "Node2", "Node3"}, path: "/redfish/v1/Systems/Node2", want: "Node2"},
		{name: "trailing slash", systems: []string{"Node1", "Node2", "Node3"}, path: "/redfish/v1/Systems/Node3/", want: "Node3"},
		{name: "named, only one listed", systems: []string{"1"}, path: "/redfish/v1/Systems/1", want: "1"},
		{name: "not listed", systems: []string{"Node1", "Node2", "Node3"}, path: "/redfish/v1/Systems/Node9",
			errHas: []string{"/redfish/v1/Systems/Node9", "/redfish/v1/Systems/Node1", "/redfish/v1/Systems/Node2", "/redfish/v1/Systems/Node3"}},
		{name: "not listed, never the only member instead", systems: []string{"1"}, path: "/redfish/v1/Systems/2",
			errHas: []string{"/redfish/v1/Systems/2", "it lists: /redfish/v1/Systems/1"}},
		{name: "case matters", systems: []string{"Node1", "Node2"}, path: "/redfish/v1/Systems/node1",
			errHas: []string{"/redfish/v1/Systems/node1", "/redfish/v1/Systems/Node1"}},
		{name: "no path, ambiguous", systems: []string{"Node1", "Node2"}, path: "",
			errHas: []string{"/redfish/v1/Systems/Node1", "/redfish/v1/Systems/Node2", "name the node's system in its BMC address"}},
		{name: "no path, only one", systems: []string{"Node1"}, path: "", want: "Node1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := multiNode(tt.systems...)
			c := dial(t, serve(t, s)+tt.path, quirkOpts())
			inv, err := c.Inspect(ctx(t))
			if tt.want == "" {
				if err == nil {
					t.Fatalf("Inspect acted on system %q", inv.SystemUUID)
				}
				for _, w := range tt.errHas {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %s", err, w)
					}
				}
				if err := c.SetPower(ctx(t), bmc.ActionReset); err == nil || len(s.requests("POST /redfish/v1/Systems")) != 0 {
					t.Errorf("SetPower: %v, resets %q", err, s.requests("POST /redfish/v1/Systems"))
				}
				return
			}
			if err != nil || inv.SystemUUID != strings.ToLower(tt.want) {
				t.Fatalf("Inspect = %q, %v; want system %s", inv.SystemUUID, err, tt.want)
			}
			if err := c.SetPower(ctx(t), bmc.ActionReset); err != nil {
				t.Fatal(err)
			}
			want := "POST /redfish/v1/Systems/" + tt.want + "/Actions/ComputerSystem.Reset"
			if got := s.requests("POST /redfish/v1/Systems"); len(got) != 1 || !strings.HasPrefix(got[0], want) {
				t.Errorf("resets %q, want one %s", got, want)
			}
			if tt.path == "" {
				return
			}
			for _, other := range tt.systems {
				if other != tt.want && len(s.requests("GET /redfish/v1/Systems/"+other)) != 0 {
					t.Errorf("the driver read system %s: it guessed instead of taking the named one", other)
				}
			}
			if got := s.requests("GET /redfish/v1/Managers"); len(got) != 0 {
				t.Errorf("the driver read the managers to choose a named system: %q", got)
			}
		})
	}
}

// TestNamedSystemVirtualBMC: against the lab's virtual BMC (one system, /redfish/v1/Systems/1),
// naming it drives it; naming another is refused before anything changes.
func TestNamedSystemVirtualBMC(t *testing.T) {
	svc, err := redfishbmc.New(redfishbmc.Config{Username: user, Password: pass, UUID: "4C4C4544-0042-3510-8056-B4C04F4E3432"}, vbmc.NewFakeMachine())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	tests := []struct {
		path   string
		wantOK bool
	}{
		{"/redfish/v1/Systems/1", true},
		{"/redfish/v1/Systems/2", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			c, err := redfish.New(ctx(t), bmc.Endpoint{Address: srv.URL + tt.path, Username: user, Password: pass}, quirkOpts())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			err = c.SetBootDevice(ctx(t), bmc.BootPXE, bmc.BootOptions{Mode: bmc.BootModeLegacy})
			if tt.wantOK {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "/redfish/v1/Systems/2") || !strings.Contains(err.Error(), "it lists: /redfish/v1/Systems/1") {
				t.Fatalf("SetBootDevice on an unlisted system: %v", err)
			}
			if strings.Contains(err.Error(), pass) {
				t.Errorf("password in error: %v", err)
			}
		})
	}
}

// TestNewRefusesAnotherPath: a path that names no ComputerSystem is refused when the client is
// made, without quoting the address.
func TestNewRefusesAnotherPath(t *testing.T) {
	for _, path := range []string{"/redfish/v1/Managers/1", "/redfish/v1/Systems", "/redfish/v1/Systems/1/Bios"} {
		_, err := redfish.New(ctx(t), bmc.Endpoint{Address: "https://127.0.0.1:1" + path, Username: user, Password: pass}, quirkOpts())
		if err == nil || !strings.Contains(err.Error(), "/redfish/v1/Systems/ID") {
			t.Errorf("New with path %s: %v", path, err)
		}
	}
}
