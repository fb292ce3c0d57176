package redfish_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

// Against the lab's virtual BMC: values read with their types, only differing attributes
// written (typed), pending until the reset, then read back equal; the read-back catches a BMC
// that drops the settings at the reset.
func TestBIOSAgainstVirtualBMC(t *testing.T) {
	for _, layout := range []redfishbmc.Layout{redfishbmc.LayoutPlain, redfishbmc.LayoutSettings} {
		t.Run(string(layout), func(t *testing.T) {
			r := newRig(t, func(c *redfishbmc.Config) { c.Layout = layout }, nil)
			names := []string{"BootMode", "ProcCoreDisable", "EmbNicPxe", "SetupPassword", "NoSuchAttribute"}
			got, err := r.c.BIOSAttributes(ctx(t), names)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"BootMode": "Uefi", "ProcCoreDisable": "0", "EmbNicPxe": "true"}
			if !maps.Equal(got, want) {
				t.Fatalf("BIOSAttributes = %v, want %v (null and unknown absent, nothing not asked for)", got, want)
			}

			// Nothing differs: nothing is written.
			same := map[string]string{"BootMode": "Uefi", "ProcCoreDisable": "0", "EmbNicPxe": "true"}
			changed, err := r.c.SetBIOSAttributes(ctx(t), same)
			if err != nil || len(changed) != 0 || changed == nil {
				t.Fatalf("SetBIOSAttributes(current values) = %#v, %v; want an empty list", changed, err)
			}
			if n := r.svc.Count(redfishbmc.KindBIOS); n != 0 {
				t.Fatalf("%d BIOS writes for no change, want 0", n)
			}

			settings := map[string]string{"BootMode": "Uefi", "ProcCoreDisable": "2", "EmbNicPxe": "false", "SriovGlobalEnable": "Enabled"}
			changed, err = r.c.SetBIOSAttributes(ctx(t), settings)
			if err != nil {
				t.Fatal(err)
			}
			if wantChanged := []string{"EmbNicPxe", "ProcCoreDisable", "SriovGlobalEnable"}; !slices.Equal(changed, wantChanged) {
				t.Fatalf("changed = %v, want %v", changed, wantChanged)
			}
			pending := r.svc.PendingBIOS()
			wantPending := map[string]any{"ProcCoreDisable": json.Number("2"), "EmbNicPxe": false, "SriovGlobalEnable": "Enabled"}
			if !maps.Equal(pending, wantPending) {
				t.Fatalf("pending = %#v, want %#v (only the differing ones, typed)", pending, wantPending)
			}
			if n := r.svc.Count(redfishbmc.KindBIOS); n != 1 {
				t.Fatalf("%d BIOS writes, want 1", n)
			}
			// Pending, not applied: the current values are still the old ones.
			got, err = r.c.BIOSAttributes(ctx(t), slices.Collect(maps.Keys(settings)))
			if err != nil {
				t.Fatal(err)
			}
			if drift := bmc.BIOSDrift(settings, got); len(drift) != 3 {
				t.Fatalf("drift before the reset = %v, want the 3 written attributes", drift)
			}
			if err := r.note(r.c.SetPower(ctx(t), bmc.ActionCycle)); err != nil {
				t.Fatal(err)
			}
			got, err = r.c.BIOSAttributes(ctx(t), slices.Collect(maps.Keys(settings)))
			if err != nil {
				t.Fatal(err)
			}
			if drift := bmc.BIOSDrift(settings, got); len(drift) != 0 {
				t.Fatalf("drift after the reset: %v", drift)
			}
			// Applied: a second write has nothing to do.
			if changed, err := r.c.SetBIOSAttributes(ctx(t), settings); err != nil || len(changed) != 0 {
				t.Fatalf("SetBIOSAttributes after the reset = %v, %v; want nothing to change", changed, err)
			}
		})
	}
}

// A BMC that takes the write and drops it at the reset (IgnoreBIOSSettings) is caught by the
// read-back.
func TestBIOSIgnoredIsDetected(t *testing.T) {
	r := newRig(t, func(c *redfishbmc.Config) { c.Quirks.IgnoreBIOSSettings = true }, nil)
	settings := map[string]string{"ProcCStates": "Disabled"}
	changed, err := r.c.SetBIOSAttributes(ctx(t), settings)
	if err != nil || !slices.Equal(changed, []string{"ProcCStates"}) {
		t.Fatalf("SetBIOSAttributes = %v, %v", changed, err)
	}
	if err := r.note(r.c.SetPower(ctx(t), bmc.ActionOn)); err != nil {
		t.Fatal(err)
	}
	got, err := r.c.BIOSAttributes(ctx(t), []string{"ProcCStates"})
	if err != nil {
		t.Fatal(err)
	}
	drift := bmc.BIOSDrift(settings, got)
	if len(drift) != 1 || drift[0] != "ProcCStates: is Enabled, want Disabled" {
		t.Fatalf("drift = %q, want ProcCStates reported", drift)
	}
}

// Bad requests are refused before anything is written, with errors naming every bad attribute
// and saying what is accepted.
func TestBIOSRefused(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*redfishbmc.Config)
		want map[string]string
		errs []string
	}{
		{"missing attributes", nil, map[string]string{"ProcCStates": "Disabled", "NoSuch": "x", "procvirtualization": "Enabled"},
			[]string{"does not report BIOS attribute(s) NoSuch, procvirtualization", "case-sensitive"}},
		{"not an integer", nil, map[string]string{"ProcCStates": "Disabled", "ProcCoreDisable": "two"},
			[]string{`ProcCoreDisable: "two" is not an integer`}},
		{"fraction", nil, map[string]string{"ProcCoreDisable": "1.5"}, []string{`ProcCoreDisable: "1.5" is not an integer`}},
		{"not canonical", nil, map[string]string{"ProcCoreDisable": "+2"}, []string{`"+2" is not in canonical form: write 2`}},
		{"not a boolean", nil, map[string]string{"EmbNicPxe": "yes", "ProcCoreDisable": "x"},
			[]string{`EmbNicPxe: "yes" is not a boolean`, "write true or false", `ProcCoreDisable: "x"`}},
		{"boolean spelled otherwise", nil, map[string]string{"EmbNicPxe": "True"}, []string{`"True" is not a boolean`}},
		{"write-only", nil, map[string]string{"SetupPassword": "hunter22"}, []string{"SetupPassword: the BMC reports it as null", "not supported"}},
		{"no BIOS", func(c *redfishbmc.Config) { c.Quirks.NoBIOS = true }, map[string]string{"ProcCStates": "Disabled"},
			[]string{"exposes no BIOS resource under the system /redfish/v1/Systems/1"}},
		{"empty name", nil, map[string]string{"": "x"}, []string{"a BIOS attribute name is empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.mod, nil)
			changed, err := r.c.SetBIOSAttributes(ctx(t), tt.want)
			if err == nil {
				t.Fatalf("SetBIOSAttributes(%v) = %v, want an error", tt.want, changed)
			}
			r.note(err)
			for _, s := range append(tt.errs, "writing BIOS settings on Redfish BMC "+r.srv.URL) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not hold %q", err, s)
				}
			}
			if changed != nil {
				t.Errorf("changed = %v with an error", changed)
			}
			if n := r.svc.Count(redfishbmc.KindBIOS); n != 0 {
				t.Errorf("%d BIOS writes, want none", n)
			}
			if p := r.svc.PendingBIOS(); len(p) != 0 {
				t.Errorf("pending = %v, want none", p)
			}
		})
	}
	t.Run("read without BIOS", func(t *testing.T) {
		r := newRig(t, func(c *redfishbmc.Config) { c.Quirks.NoBIOS = true }, nil)
		_, err := r.c.BIOSAttributes(ctx(t), []string{"BootMode"})
		if err == nil || !strings.Contains(err.Error(), "reading BIOS attributes on Redfish BMC") ||
			!strings.Contains(err.Error(), "exposes no BIOS resource") {
			t.Fatalf("BIOSAttributes without BIOS: %v", err)
		}
		r.note(err)
	})
	t.Run("too many", func(t *testing.T) {
		r := newRig(t, nil, nil)
		names := make([]string, bmc.MaxBIOSSettings+1)
		for i := range names {
			names[i] = strings.Repeat("A", i+1)
		}
		if _, err := r.c.BIOSAttributes(ctx(t), names); err == nil || !strings.Contains(err.Error(), "at most 128") {
			t.Fatalf("BIOSAttributes(%d names): %v", len(names), err)
		}
	})
}

// A write refused with 412 (the ETag moved) or 503 is retried with the ETag read again.
func TestBIOSWriteRetried(t *testing.T) {
	for _, busy := range []redfishbmc.Busy{
		{Kind: redfishbmc.KindBIOS, Count: 1, Status: 412, MessageID: "Base.1.15.PreconditionFailed"},
		{Kind: redfishbmc.KindBIOS, Count: 2, Status: 503, MessageID: "Base.1.15.ServiceTemporarilyUnavailable"},
	} {
		r := newRig(t, func(c *redfishbmc.Config) {
			c.Layout = redfishbmc.LayoutSettings
			c.Quirks.Busy = []redfishbmc.Busy{busy}
		}, nil)
		changed, err := r.c.SetBIOSAttributes(ctx(t), map[string]string{"ProcCStates": "Disabled"})
		if err != nil || !slices.Equal(changed, []string{"ProcCStates"}) {
			t.Fatalf("%d: SetBIOSAttributes = %v, %v", busy.Status, changed, r.note(err))
		}
		if n := r.svc.Count(redfishbmc.KindBIOS); n != busy.Count+1 {
			t.Fatalf("%d: %d BIOS writes, want %d", busy.Status, n, busy.Count+1)
		}
	}
}

// dialBIOS connects to a scripted BMC with a password that no message holds by chance (the
// driver hides the password wherever it appears).
func dialBIOS(t *testing.T, url string) *redfish.Client {
	t.Helper()
	c, err := redfish.New(ctx(t), bmc.Endpoint{Address: url, Username: "u", Password: pass}, quirkOpts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// biosBMC is a scripted BMC serving a Bios resource shaped like a vendor's (DMTF mockup style),
// recording each write with its If-Match header.
type biosBMC struct {
	*scripted
	mu      sync.Mutex
	ifMatch map[string]string // "PATCH path" -> If-Match
}

func (b *biosBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPatch {
		b.mu.Lock()
		b.ifMatch[r.Method+" "+r.URL.Path] = r.Header.Get("If-Match")
		b.mu.Unlock()
	}
	b.scripted.ServeHTTP(w, r)
}

// newBIOSBMC serves one system linking bios (nil: no Bios link) at /redfish/v1/Systems/1/Bios;
// settings is the settings object's document (nil: it answers GET with 404), served at
// settingsURI, which accepts PATCH.
func newBIOSBMC(bios, settings map[string]any, settingsURI string) *biosBMC {
	s := newScripted()
	s.docs["/redfish/v1/Systems"] = func() (int, any) { return 200, map[string]any{"Members": []any{ref(sys1)}} }
	system := map[string]any{"@odata.id": sys1, "PowerState": "On"}
	if bios != nil {
		system["Bios"] = ref(sys1 + "/Bios")
		s.docs[sys1+"/Bios"] = func() (int, any) { return 200, bios }
	}
	s.docs[sys1] = func() (int, any) { return 200, system }
	path := strings.TrimSuffix(settingsURI, "/") // the link may end in '/' (XCC's does)
	if settings != nil {
		s.docs[path] = func() (int, any) { return 200, settings }
	}
	s.posts["PATCH "+path] = func(map[string]any) (int, any) { return 204, nil }
	return &biosBMC{scripted: s, ifMatch: map[string]string{}}
}

// biosDoc is a Bios resource with typed attributes and, unless settings is "", a
// @Redfish.Settings naming settings with applyTimes.
func biosDoc(settings string, applyTimes ...string) map[string]any {
	d := map[string]any{"@odata.id": sys1 + "/Bios", "@odata.type": "#Bios.v1_1_0.Bios", "Id": "BIOS",
		"AttributeRegistry": "BiosAttributeRegistry.1.0.0",
		"Attributes": map[string]any{"BootMode": "Uefi", "LogicalProc": "Enabled", "NumLock": true, "SerialPortAddress": 1016,
			"TpmPpiTimeout": 2.0, "Ratio": 1.5, "AdminPassword": nil, "BootOrder": []any{"Pxe", "Hdd"}}}
	if settings != "" {
		s := map[string]any{"@odata.type": "#Settings.v1_3_5.Settings", "SettingsObject": ref(settings)}
		if applyTimes != nil {
			s["SupportedApplyTimes"] = applyTimes
		}
		d["@Redfish.Settings"] = s
	}
	return d
}

// BIOS documents shaped like vendors' (from their public Redfish references): the write goes
// to whatever settings object @Redfish.Settings names, with If-Match when that object gives an
// ETag (iLO, Huawei iBMC and AMI-based BMCs ask for it), without when it cannot be read (AMI
// MegaRAC's Bios/SD), with ApplyTime only where SupportedApplyTimes lists OnReset (iDRAC).
func TestBIOSVendorShapes(t *testing.T) {
	settingsDoc := func(uri string) map[string]any {
		return map[string]any{"@odata.id": uri, "@odata.etag": `W/"7f3a"`, "Attributes": map[string]any{}}
	}
	tests := []struct {
		name        string
		settingsURI string
		applyTimes  []string
		readable    bool
		wantApply   bool
	}{
		{"Dell iDRAC Bios/Settings with apply times", sys1 + "/Bios/Settings", []string{"Immediate", "OnReset", "AtMaintenanceWindowStart"}, true, true},
		{"HPE iLO Bios/Settings without apply times", sys1 + "/Bios/Settings", nil, true, false},
		{"Lenovo XCC Bios/Pending/ with OnReset", sys1 + "/Bios/Pending/", []string{"OnReset"}, true, true},
		{"apply times without OnReset", sys1 + "/Bios/Settings", []string{"Immediate"}, true, false},
		{"AMI MegaRAC Bios/SD, PATCH only", sys1 + "/Bios/SD", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var settings map[string]any
			if tt.readable {
				settings = settingsDoc(tt.settingsURI)
			}
			b := newBIOSBMC(biosDoc(tt.settingsURI, tt.applyTimes...), settings, tt.settingsURI)
			c := dialBIOS(t, serve(t, b))
			changed, err := c.SetBIOSAttributes(ctx(t), map[string]string{"BootMode": "Uefi", "LogicalProc": "Disabled",
				"NumLock": "false", "SerialPortAddress": "760", "TpmPpiTimeout": "2"})
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"LogicalProc", "NumLock", "SerialPortAddress"}; !slices.Equal(changed, want) {
				t.Fatalf("changed = %v, want %v", changed, want)
			}
			patches := b.requests("PATCH ")
			if len(patches) != 1 {
				t.Fatalf("PATCHes: %q, want one", patches)
			}
			path, body, _ := strings.Cut(strings.TrimPrefix(patches[0], "PATCH "), " ")
			if path != strings.TrimSuffix(tt.settingsURI, "/") {
				t.Fatalf("PATCH went to %s, want the settings object %s", path, tt.settingsURI)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSuffix(body, " [basic]")), &got); err != nil {
				t.Fatalf("PATCH body %q: %v", body, err)
			}
			// Exactly the differing ones, in the current values' JSON types.
			wantAttrs := map[string]any{"LogicalProc": "Disabled", "NumLock": false, "SerialPortAddress": float64(760)}
			if !maps.Equal(got["Attributes"].(map[string]any), wantAttrs) {
				t.Errorf("Attributes written = %#v, want %#v", got["Attributes"], wantAttrs)
			}
			at, has := got["@Redfish.SettingsApplyTime"]
			if has != tt.wantApply {
				t.Errorf("@Redfish.SettingsApplyTime present = %v, want %v", has, tt.wantApply)
			}
			if has && at.(map[string]any)["ApplyTime"] != "OnReset" {
				t.Errorf("@Redfish.SettingsApplyTime = %v", at)
			}
			wantTag := ""
			if tt.readable {
				wantTag = `W/"7f3a"`
			}
			b.mu.Lock()
			tag := b.ifMatch["PATCH "+tt.settingsURI] // as the client sent it
			b.mu.Unlock()
			if tag != wantTag {
				t.Errorf("If-Match = %q, want %q", tag, wantTag)
			}
		})
	}
}

// Without @Redfish.Settings there is nowhere to write: an error, nothing sent. With nothing to
// change, the missing settings object does not matter.
func TestBIOSNoSettingsObject(t *testing.T) {
	b := newBIOSBMC(biosDoc(""), nil, sys1+"/Bios/Settings")
	c := dialBIOS(t, serve(t, b))
	_, err := c.SetBIOSAttributes(ctx(t), map[string]string{"LogicalProc": "Disabled"})
	if err == nil || !strings.Contains(err.Error(), "the BMC offers no BIOS settings object (@Redfish.Settings)") ||
		!strings.Contains(err.Error(), "read-only through Redfish") {
		t.Fatalf("SetBIOSAttributes without a settings object: %v", err)
	}
	changed, err := c.SetBIOSAttributes(ctx(t), map[string]string{"LogicalProc": "Enabled"})
	if err != nil || len(changed) != 0 {
		t.Fatalf("SetBIOSAttributes(no change) = %v, %v", changed, err)
	}
	if p := b.requests("PATCH "); len(p) != 0 {
		t.Fatalf("PATCHes sent: %q", p)
	}
	// The write-only and the array attribute are refused, the other types read as text.
	got, err := c.BIOSAttributes(ctx(t), []string{"BootMode", "NumLock", "SerialPortAddress", "TpmPpiTimeout", "Ratio", "AdminPassword", "BootOrder"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"BootMode": "Uefi", "NumLock": "true", "SerialPortAddress": "1016", "TpmPpiTimeout": "2", "Ratio": "1.5",
		"BootOrder": `["Pxe","Hdd"]`}
	if !maps.Equal(got, want) {
		t.Fatalf("BIOSAttributes = %v, want %v", got, want)
	}
	_, err = c.SetBIOSAttributes(ctx(t), map[string]string{"BootOrder": "Pxe"})
	if err == nil || !strings.Contains(err.Error(), "BootOrder: the BMC reports it as a JSON array") {
		t.Fatalf("writing an array attribute: %v", err)
	}
}

// A system without a Bios link, and a Bios resource without attributes, are errors.
func TestBIOSMissing(t *testing.T) {
	for name, bios := range map[string]map[string]any{"no Bios link": nil, "no Attributes": {"@odata.id": sys1 + "/Bios"}} {
		t.Run(name, func(t *testing.T) {
			c := dialBIOS(t, serve(t, newBIOSBMC(bios, nil, sys1+"/Bios/Settings")))
			_, err := c.BIOSAttributes(ctx(t), []string{"BootMode"})
			if err == nil {
				t.Fatal("BIOSAttributes succeeded")
			}
			want := map[string]string{"no Bios link": "the BMC exposes no BIOS resource under the system " + sys1,
				"no Attributes": "the BMC's BIOS resource " + sys1 + "/Bios reports no Attributes"}[name]
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q, want %q", err, want)
			}
		})
	}
}

func TestBIOSText(t *testing.T) {
	tests := []struct {
		raw  string
		want string
		ok   bool
	}{
		{`"Enabled"`, "Enabled", true},
		{`""`, "", true},
		{`"a\"b"`, `a"b`, true},
		{`0`, "0", true},
		{`-42`, "-42", true},
		{`2.0`, "2", true},
		{`1e3`, "1000", true},
		{`1.25`, "1.25", true},
		{`9223372036854775807`, "9223372036854775807", true},
		{`true`, "true", true},
		{`false`, "false", true},
		{`null`, "", false},
		{``, "", false},
		{` { "a" : 1 } `, `{"a":1}`, true},
		{`tru`, "", false},
	}
	for _, tt := range tests {
		got, ok := redfish.BIOSText(json.RawMessage(tt.raw))
		if got != tt.want || ok != tt.ok {
			t.Errorf("BIOSText(%s) = %q, %v; want %q, %v", tt.raw, got, ok, tt.want, tt.ok)
		}
	}
}

func TestPlanBIOS(t *testing.T) {
	cur := map[string]json.RawMessage{"S": json.RawMessage(`"a"`), "N": json.RawMessage(`3`), "F": json.RawMessage(`3.0`),
		"B": json.RawMessage(`false`), "P": json.RawMessage(`null`)}
	patch, changed, err := redfish.PlanBIOS(cur, map[string]string{"S": "b", "N": "3", "F": "4", "B": "true"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"S": "b", "F": int64(4), "B": true}; !maps.Equal(patch, want) {
		t.Fatalf("patch = %#v, want %#v", patch, want)
	}
	if !slices.Equal(changed, []string{"B", "F", "S"}) {
		t.Fatalf("changed = %v", changed)
	}
	// Every problem named at once, nothing planned.
	patch, changed, err = redfish.PlanBIOS(cur, map[string]string{"S": "ok", "X": "1", "N": "3.5", "P": "secret", "B": "1"})
	if err == nil || patch != nil || changed != nil {
		t.Fatalf("PlanBIOS = %v, %v, %v; want an error alone", patch, changed, err)
	}
	for _, s := range []string{"does not report BIOS attribute(s) X", `B: "1" is not a boolean`, `N: "3.5" is not an integer`, "P: the BMC reports it as null"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not hold %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q quotes a value written to a write-only attribute", err)
	}
}
