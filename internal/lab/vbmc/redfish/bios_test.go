package redfishbmc

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func attrsOf(t *testing.T, res map[string]any) map[string]any {
	t.Helper()
	a, ok := res["Attributes"].(map[string]any)
	if !ok {
		t.Fatalf("no Attributes object in %v", res)
	}
	return a
}

// The system links its Bios resource; the Bios resource holds the current attributes with their
// JSON types and names its settings object, which applies at OnReset.
func TestBIOSResource(t *testing.T) {
	e := newEnv(t, nil)
	_, _, sys := e.do("GET", systemURI, nil, nil)
	if got, _ := sys["Bios"].(map[string]any)["@odata.id"].(string); got != biosURI {
		t.Fatalf("system Bios link = %v, want %s", sys["Bios"], biosURI)
	}
	code, hdr, res := e.do("GET", biosURI, nil, nil)
	if code != http.StatusOK || hdr.Get("ETag") == "" {
		t.Fatalf("GET Bios: %d (ETag %q) %v", code, hdr.Get("ETag"), res)
	}
	attrs := attrsOf(t, res)
	want := map[string]any{"BootMode": "Uefi", "ProcCoreDisable": float64(0), "EmbNicPxe": true, "SetupPassword": nil}
	for k, v := range want {
		if got, ok := attrs[k]; !ok || got != v {
			t.Errorf("Attributes[%s] = %#v (present %v), want %#v", k, got, ok, v)
		}
	}
	settings, _ := res["@Redfish.Settings"].(map[string]any)
	if got, _ := settings["SettingsObject"].(map[string]any)["@odata.id"].(string); got != biosSettingsURI {
		t.Errorf("SettingsObject = %v, want %s", settings["SettingsObject"], biosSettingsURI)
	}
	if got, _ := settings["SupportedApplyTimes"].([]any); !slices.Equal(got, []any{"OnReset"}) {
		t.Errorf("SupportedApplyTimes = %v", got)
	}
	code, _, res = e.do("GET", biosSettingsURI, nil, nil)
	if code != http.StatusOK || len(attrsOf(t, res)) != 0 {
		t.Fatalf("GET Bios/Settings before any PATCH: %d %v", code, res)
	}
}

func TestBIOSConfig(t *testing.T) {
	tests := []struct {
		name  string
		attrs map[string]any
		err   string // "" accepted
	}{
		{"defaults", nil, ""},
		{"typed values", map[string]any{"A": "x", "B": int64(7), "C": uint8(1), "D": 3.0, "E": json.Number("-4"), "F": false, "G": nil}, ""},
		{"fraction", map[string]any{"A": 1.5}, "not an integer"},
		{"fraction number", map[string]any{"A": json.Number("1.5")}, "not an integer"},
		{"list", map[string]any{"A": []string{"x"}}, "not supported"},
		{"empty name", map[string]any{"": "x"}, "empty name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{Username: "u", Password: "p", BIOSAttributes: tt.attrs}, nil)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("New: %v, want an error with %q", err, tt.err)
			}
		})
	}
	// The service holds a copy: changing the caller's map later changes nothing.
	attrs := map[string]any{"A": "x"}
	svc, err := New(Config{Username: "u", Password: "p", BIOSAttributes: attrs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	attrs["A"] = "y"
	if v, _ := svc.BIOSAttribute("A"); v != "x" {
		t.Fatalf("BIOSAttribute(A) = %v after the caller's map changed", v)
	}
}

// A PATCH of the settings object is pending until a reset that starts the host; then it is the
// current value and nothing is pending. Resets that leave the host off, or On on a running
// host, apply nothing.
func TestBIOSPendingAppliedAtReset(t *testing.T) {
	tests := []struct {
		resetType string
		on        bool
		applied   bool
	}{
		{"On", false, true},
		{"ForceRestart", true, true},
		{"ForceRestart", false, true},
		{"PowerCycle", true, true},
		{"PowerCycle", false, true},
		{"On", true, false},
		{"ForceOff", true, false},
		{"GracefulShutdown", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.resetType, func(t *testing.T) {
			e := newEnv(t, nil)
			e.m.SetOn(tt.on)
			body := map[string]any{"Attributes": map[string]any{"ProcVirtualization": "Disabled", "ProcCoreDisable": 2, "EmbNicPxe": false},
				"@Redfish.SettingsApplyTime": map[string]any{"ApplyTime": "OnReset"}}
			if code, _, res := e.do("PATCH", biosSettingsURI, body, nil); code != http.StatusOK {
				t.Fatalf("PATCH Bios/Settings: %d %v", code, res)
			}
			_, _, res := e.do("GET", biosSettingsURI, nil, nil)
			pending := attrsOf(t, res)
			if pending["ProcVirtualization"] != "Disabled" || pending["ProcCoreDisable"] != float64(2) || pending["EmbNicPxe"] != false {
				t.Fatalf("pending = %v", pending)
			}
			_, _, res = e.do("GET", biosURI, nil, nil)
			if got := attrsOf(t, res)["ProcVirtualization"]; got != "Enabled" {
				t.Fatalf("current ProcVirtualization = %v before the reset, want Enabled", got)
			}
			if code, _, res := e.do("POST", resetURI, map[string]string{"ResetType": tt.resetType}, nil); code != http.StatusNoContent {
				t.Fatalf("reset %s: %d %v", tt.resetType, code, res)
			}
			_, _, res = e.do("GET", biosURI, nil, nil)
			cur := attrsOf(t, res)
			_, _, res = e.do("GET", biosSettingsURI, nil, nil)
			pending = attrsOf(t, res)
			if tt.applied {
				if cur["ProcVirtualization"] != "Disabled" || cur["ProcCoreDisable"] != float64(2) || cur["EmbNicPxe"] != false {
					t.Errorf("current after %s = %v, want the pending values", tt.resetType, cur)
				}
				if len(pending) != 0 {
					t.Errorf("pending after %s = %v, want none", tt.resetType, pending)
				}
				if cur["BootMode"] != "Uefi" {
					t.Errorf("an attribute not written changed: BootMode = %v", cur["BootMode"])
				}
			} else {
				if cur["ProcVirtualization"] != "Enabled" {
					t.Errorf("%s (on=%v) applied the pending settings: %v", tt.resetType, tt.on, cur)
				}
				if len(pending) != 3 {
					t.Errorf("%s (on=%v) dropped the pending settings: %v", tt.resetType, tt.on, pending)
				}
			}
		})
	}
}

// Each attribute must exist, not be write-only, and keep its JSON type; one bad attribute
// refuses the whole PATCH (nothing pending). Only Attributes (and OnReset) can be written.
func TestBIOSPatchRefused(t *testing.T) {
	good := map[string]any{"ProcCStates": "Disabled"}
	with := func(extra map[string]any) map[string]any {
		m := map[string]any{"ProcCStates": "Disabled"}
		for k, v := range extra {
			m[k] = v
		}
		return map[string]any{"Attributes": m}
	}
	tests := []struct {
		name string
		body any
		id   string
		msg  string
	}{
		{"string for integer", with(map[string]any{"ProcCoreDisable": "2"}), "PropertyValueTypeError", "ProcCoreDisable: a string was given, the attribute is a number"},
		{"integer for string", with(map[string]any{"BootMode": 1}), "PropertyValueTypeError", "BootMode: a number was given, the attribute is a string"},
		{"string for boolean", with(map[string]any{"EmbNicPxe": "true"}), "PropertyValueTypeError", "EmbNicPxe: a string was given, the attribute is a boolean"},
		{"null", with(map[string]any{"BootMode": nil}), "PropertyValueTypeError", "BootMode: a null was given"},
		{"unknown attribute", with(map[string]any{"NoSuch": "x"}), "PropertyValueTypeError", "NoSuch: no such attribute"},
		{"write-only", with(map[string]any{"SetupPassword": "x"}), "PropertyValueTypeError", "SetupPassword: write-only"},
		{"Attributes not an object", map[string]any{"Attributes": []any{"x"}}, "PropertyValueTypeError", "not an object"},
		{"no Attributes", map[string]any{"@odata.type": "#Bios.v1_2_0.Bios"}, "PropertyMissing", "Attributes"},
		{"other property", map[string]any{"Attributes": good, "Name": "x"}, "PropertyNotWritable", "Name"},
		{"apply time", map[string]any{"Attributes": good, "@Redfish.SettingsApplyTime": map[string]any{"ApplyTime": "Immediate"}}, "PropertyValueNotInList", "OnReset"},
		{"malformed", json.RawMessage(`{`), "MalformedJSON", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil)
			code, _, res := e.do("PATCH", biosSettingsURI, tt.body, nil)
			if code != http.StatusBadRequest || !strings.HasSuffix(messageID(res), tt.id) {
				t.Fatalf("PATCH: %d %v, want 400 %s", code, res, tt.id)
			}
			if msg, _ := res["error"].(map[string]any)["message"].(string); !strings.Contains(msg, tt.msg) {
				t.Errorf("message %q, want it to hold %q", msg, tt.msg)
			}
			if p := e.svc.PendingBIOS(); len(p) != 0 {
				t.Errorf("a refused PATCH left pending settings: %v", p)
			}
		})
	}
}

// The Bios resource is read-only, as on real BMCs: 405.
func TestBIOSResourceReadOnly(t *testing.T) {
	e := newEnv(t, nil)
	for _, method := range []string{"PATCH", "PUT", "POST"} {
		code, _, res := e.do(method, biosURI, map[string]any{"Attributes": map[string]any{"ProcCStates": "Disabled"}}, nil)
		if code != http.StatusMethodNotAllowed {
			t.Errorf("%s Bios: %d %v, want 405", method, code, res)
		}
	}
	if v, _ := e.svc.BIOSAttribute("ProcCStates"); v != "Enabled" {
		t.Errorf("ProcCStates = %v after refused writes", v)
	}
}

// In the settings layout the settings object needs If-Match (428 without, 412 when stale).
func TestBIOSSettingsIfMatch(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Layout = LayoutSettings })
	body := map[string]any{"Attributes": map[string]any{"ProcCStates": "Disabled"}}
	if code, _, res := e.do("PATCH", biosSettingsURI, body, nil); code != http.StatusPreconditionRequired {
		t.Fatalf("PATCH without If-Match: %d %v, want 428", code, res)
	}
	if code, _, res := e.do("PATCH", biosSettingsURI, body, map[string]string{"If-Match": `W/"stale"`}); code != http.StatusPreconditionFailed {
		t.Fatalf("PATCH with a stale If-Match: %d %v, want 412", code, res)
	}
	_, hdr, _ := e.do("GET", biosSettingsURI, nil, nil)
	if code, _, res := e.do("PATCH", biosSettingsURI, body, map[string]string{"If-Match": hdr.Get("ETag")}); code != http.StatusOK {
		t.Fatalf("PATCH with the ETag: %d %v", code, res)
	}
	// The pending settings changed: the old ETag is stale now.
	if code, _, _ := e.do("PATCH", biosSettingsURI, body, map[string]string{"If-Match": hdr.Get("ETag")}); code != http.StatusPreconditionFailed {
		t.Fatalf("PATCH with the ETag of before the change: %d, want 412", code)
	}
}

func TestBIOSQuirks(t *testing.T) {
	t.Run("NoBIOS", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.Quirks.NoBIOS = true })
		_, _, sys := e.do("GET", systemURI, nil, nil)
		if _, ok := sys["Bios"]; ok {
			t.Errorf("system links Bios with NoBIOS: %v", sys["Bios"])
		}
		for _, req := range []struct{ method, path string }{{"GET", biosURI}, {"GET", biosSettingsURI}, {"PATCH", biosSettingsURI}} {
			if code, _, _ := e.do(req.method, req.path, map[string]any{"Attributes": map[string]any{}}, nil); code != http.StatusNotFound {
				t.Errorf("%s %s with NoBIOS: %d, want 404", req.method, req.path, code)
			}
		}
	})
	t.Run("IgnoreBIOSSettings", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.Quirks.IgnoreBIOSSettings = true })
		body := map[string]any{"Attributes": map[string]any{"ProcCStates": "Disabled"}}
		if code, _, res := e.do("PATCH", biosSettingsURI, body, nil); code != http.StatusOK {
			t.Fatalf("PATCH: %d %v", code, res)
		}
		if p := e.svc.PendingBIOS(); p["ProcCStates"] != "Disabled" {
			t.Fatalf("pending = %v: the write should look accepted", p)
		}
		// Type checks still apply: the quirk is about applying, not validating.
		if code, _, _ := e.do("PATCH", biosSettingsURI, map[string]any{"Attributes": map[string]any{"ProcCStates": 1}}, nil); code != http.StatusBadRequest {
			t.Errorf("a wrongly typed PATCH was accepted: %d", code)
		}
		e.do("POST", resetURI, map[string]string{"ResetType": "On"}, nil)
		if v, _ := e.svc.BIOSAttribute("ProcCStates"); v != "Enabled" {
			t.Errorf("ProcCStates = %v after the reset, want Enabled (ignored)", v)
		}
		if p := e.svc.PendingBIOS(); len(p) != 0 {
			t.Errorf("pending after the reset = %v, want none (dropped)", p)
		}
	})
}

func TestCheckBIOSPatch(t *testing.T) {
	cur := map[string]any{"S": "a", "N": json.Number("1"), "B": true, "P": nil}
	got := CheckBIOSPatch(cur, map[string]any{"S": "b", "N": json.Number("5"), "B": false})
	if len(got) != 0 {
		t.Fatalf("valid patch refused: %v", got)
	}
	got = CheckBIOSPatch(cur, map[string]any{"Z": "x", "S": true, "P": "secret", "N": json.Number("2")})
	want := []string{"P: write-only attributes are not supported by this BMC", "S: a boolean was given, the attribute is a string", "Z: no such attribute"}
	if !slices.Equal(got, want) {
		t.Fatalf("CheckBIOSPatch = %q, want %q", got, want)
	}
}
