package redfishbmc

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/lab/vbmc"
)

const (
	testUser = "admin"
	testPass = "s3cret-Pa55word-XYZ"
)

type env struct {
	t   *testing.T
	srv *httptest.Server
	svc *Service
	m   *vbmc.FakeMachine
	log *bytes.Buffer
}

func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	logs := &bytes.Buffer{}
	cfg := Config{Username: testUser, Password: testPass, UUID: "4c4c4544-0042-3510-8056-b4c04f4e3432",
		SerialNumber: "SN123", Manufacturer: "QEMU", Model: "Standard PC", MACs: []string{"52:54:00:12:34:56"},
		MediaDir: t.TempDir(), AllowFileImages: true,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if mod != nil {
		mod(&cfg)
	}
	m := vbmc.NewFakeMachine()
	svc, err := New(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	return &env{t: t, srv: srv, svc: svc, m: m, log: logs}
}

// do sends a request with basic auth (unless hdr sets X-Auth-Token or noAuth) and decodes JSON.
func (e *env) do(method, path string, body any, hdr map[string]string) (int, http.Header, map[string]any) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.srv.URL+path, rd)
	if _, ok := hdr["noauth"]; !ok && hdr["X-Auth-Token"] == "" {
		req.SetBasicAuth(testUser, testPass)
	}
	for k, v := range hdr {
		if k != "noauth" {
			req.Header.Set(k, v)
		}
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, resp.Header, out
}

func messageID(res map[string]any) string {
	e, _ := res["error"].(map[string]any)
	infos, _ := e["@Message.ExtendedInfo"].([]any)
	if len(infos) == 0 {
		return ""
	}
	m, _ := infos[0].(map[string]any)
	id, _ := m["MessageId"].(string)
	return id
}

func TestClassify(t *testing.T) {
	tests := []struct{ method, path, want string }{
		{"GET", systemURI, KindRead},
		{"HEAD", root + "/", KindRead},
		{"POST", resetURI, KindReset},
		{"PATCH", systemURI, KindBoot},
		{"PATCH", settingsURI + "/", KindBoot},
		{"PATCH", biosSettingsURI, KindBIOS},
		{"PATCH", biosURI, KindBIOS},
		{"GET", biosSettingsURI, KindRead},
		{"POST", cdURI + "/Actions/VirtualMedia.InsertMedia", KindMedia},
		{"POST", cdURI + "/Actions/VirtualMedia.EjectMedia", KindMedia},
		{"PATCH", accountURI, KindAccount},
		{"POST", sessionsURI, KindSession},
		{"DELETE", sessionsURI + "/3", KindSession},
		{"PUT", systemURI, KindOther},
		{"POST", systemURI, KindOther},
	}
	for _, tt := range tests {
		if got := Classify(tt.method, tt.path); got != tt.want {
			t.Errorf("Classify(%s %s) = %s, want %s", tt.method, tt.path, got, tt.want)
		}
	}
}

func TestApplyBootPatch(t *testing.T) {
	cur := bootState{Enabled: "Disabled", Target: "None", Mode: "UEFI"}
	tests := []struct {
		name    string
		patch   map[string]any
		want    bootState
		wantErr string
	}{
		{"once pxe", map[string]any{"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Pxe"}, bootState{"Once", "Pxe", "UEFI"}, ""},
		{"continuous hdd legacy", map[string]any{"BootSourceOverrideEnabled": "Continuous", "BootSourceOverrideTarget": "Hdd", "BootSourceOverrideMode": "Legacy"}, bootState{"Continuous", "Hdd", "Legacy"}, ""},
		{"target none disables", map[string]any{"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "None"}, bootState{"Disabled", "None", "UEFI"}, ""},
		{"empty", map[string]any{}, cur, ""},
		{"bad target", map[string]any{"BootSourceOverrideTarget": "Floppy"}, cur, "PropertyValueNotInList"},
		{"bad enabled", map[string]any{"BootSourceOverrideEnabled": "Always"}, cur, "PropertyValueNotInList"},
		{"bad mode", map[string]any{"BootSourceOverrideMode": "BIOS"}, cur, "PropertyValueNotInList"},
		{"unknown", map[string]any{"BootOrder": "x"}, cur, "PropertyUnknown"},
		{"wrong type", map[string]any{"BootSourceOverrideTarget": 3}, cur, "PropertyValueTypeError"},
	}
	for _, tt := range tests {
		got, err := ApplyBootPatch(cur, tt.patch)
		if tt.wantErr != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) || got != cur {
				t.Errorf("%s: %v, %v; want error %s and no change", tt.name, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestETagMatches(t *testing.T) {
	tests := []struct {
		ifMatch, tag string
		want         bool
	}{
		{`W/"abc"`, `W/"abc"`, true},
		{`"abc"`, `W/"abc"`, true},
		{`*`, `W/"abc"`, true},
		{`"x", W/"abc"`, `W/"abc"`, true},
		{`"abd"`, `W/"abc"`, false},
		{``, `W/"abc"`, false},
	}
	for _, tt := range tests {
		if got := ETagMatches(tt.ifMatch, tt.tag); got != tt.want {
			t.Errorf("ETagMatches(%q, %q) = %v", tt.ifMatch, tt.tag, got)
		}
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, nil)
	if code, _, _ := e.do("GET", "/redfish/v1/", nil, map[string]string{"noauth": ""}); code != 200 {
		t.Fatalf("service root without credentials: %d", code)
	}
	if code, hdr, _ := e.do("GET", systemURI, nil, map[string]string{"noauth": ""}); code != 401 || hdr.Get("WWW-Authenticate") == "" {
		t.Fatalf("system without credentials: %d", code)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+systemURI, nil)
	req.SetBasicAuth(testUser, "wrong")
	if resp, _ := http.DefaultClient.Do(req); resp.StatusCode != 401 {
		t.Fatalf("wrong password: %d", resp.StatusCode)
	} else {
		resp.Body.Close()
	}
	// Sessions.
	code, hdr, _ := e.do("POST", sessionsURI, map[string]string{"UserName": testUser, "Password": testPass}, map[string]string{"noauth": ""})
	tok, loc := hdr.Get("X-Auth-Token"), hdr.Get("Location")
	if code != 201 || tok == "" || !strings.HasPrefix(loc, sessionsURI+"/") {
		t.Fatalf("session: %d token %q location %q", code, tok, loc)
	}
	if code, _, _ := e.do("GET", systemURI, nil, map[string]string{"X-Auth-Token": tok}); code != 200 {
		t.Fatalf("with token: %d", code)
	}
	if code, _, _ := e.do("DELETE", loc, nil, map[string]string{"X-Auth-Token": tok}); code != 204 {
		t.Fatalf("logout: %d", code)
	}
	if code, _, _ := e.do("GET", systemURI, nil, map[string]string{"X-Auth-Token": tok}); code != 401 {
		t.Fatalf("token after logout: %d", code)
	}
	if code, _, _ := e.do("POST", sessionsURI, map[string]string{"UserName": testUser, "Password": "nope"}, map[string]string{"noauth": ""}); code != 401 {
		t.Fatalf("session with a wrong password: %d", code)
	}
}

func TestSystemResource(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Quirks.ResetTypes = []string{"On", "ForceOff"} })
	e.m.SetOn(true)
	code, hdr, sys := e.do("GET", systemURI, nil, nil)
	if code != 200 || hdr.Get("ETag") == "" || sys["@odata.etag"] != hdr.Get("ETag") {
		t.Fatalf("GET system: %d etag %q body etag %v", code, hdr.Get("ETag"), sys["@odata.etag"])
	}
	for k, want := range map[string]string{"PowerState": "On", "UUID": "4c4c4544-0042-3510-8056-b4c04f4e3432",
		"SerialNumber": "SN123", "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem", "@odata.id": systemURI} {
		if sys[k] != want {
			t.Errorf("%s = %v, want %s", k, sys[k], want)
		}
	}
	reset := sys["Actions"].(map[string]any)["#ComputerSystem.Reset"].(map[string]any)
	if got := reset["ResetType@Redfish.AllowableValues"].([]any); len(got) != 2 {
		t.Fatalf("advertised reset types %v", got)
	}
	if _, ok := sys["@Redfish.Settings"]; ok {
		t.Fatal("plain layout advertises @Redfish.Settings")
	}
	_, _, nic := e.do("GET", systemURI+"/EthernetInterfaces/1", nil, nil)
	if nic["MACAddress"] != "52:54:00:12:34:56" {
		t.Fatalf("NIC %v", nic)
	}
	if code, _, _ := e.do("GET", systemURI+"/EthernetInterfaces/2", nil, nil); code != 404 {
		t.Fatalf("absent NIC: %d", code)
	}
}

func TestResetTypes(t *testing.T) {
	tests := []struct {
		resetType string
		on        bool
		calls     map[string]int
		endOn     bool
	}{
		{"On", false, map[string]int{"PowerOn": 1}, true},
		{"On", true, map[string]int{}, true},
		{"ForceOff", true, map[string]int{"PowerOff": 1}, false},
		{"GracefulShutdown", true, map[string]int{"Shutdown": 1}, false},
		{"ForceRestart", true, map[string]int{"Reset": 1}, true},
		{"ForceRestart", false, map[string]int{"PowerOn": 1}, true},
		{"PowerCycle", true, map[string]int{"PowerOff": 1, "PowerOn": 1}, true},
		{"PowerCycle", false, map[string]int{"PowerOn": 1}, true},
	}
	for _, tt := range tests {
		e := newEnv(t, nil)
		e.m.SetOn(tt.on)
		code, _, res := e.do("POST", resetURI, map[string]string{"ResetType": tt.resetType}, nil)
		if code != 204 {
			t.Fatalf("%s: %d %v", tt.resetType, code, res)
		}
		for _, m := range []string{"PowerOn", "PowerOff", "Shutdown", "Reset"} {
			if e.m.Calls(m) != tt.calls[m] {
				t.Errorf("%s (on=%v): %s called %d times, want %d", tt.resetType, tt.on, m, e.m.Calls(m), tt.calls[m])
			}
		}
		if e.m.State().On != tt.endOn {
			t.Errorf("%s: on = %v, want %v", tt.resetType, e.m.State().On, tt.endOn)
		}
	}
	e := newEnv(t, func(c *Config) { c.Quirks.ResetTypes = []string{"On", "ForceOff"} })
	code, _, res := e.do("POST", resetURI, map[string]string{"ResetType": "PowerCycle"}, nil)
	if code != 400 || !strings.HasSuffix(messageID(res), "ActionParameterNotSupported") {
		t.Fatalf("unadvertised reset type: %d %v", code, res)
	}
}

func TestBootPlainAndIfMatch(t *testing.T) {
	e := newEnv(t, nil)
	boot := map[string]any{"Boot": map[string]string{"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Hdd"}}
	if code, _, res := e.do("PATCH", systemURI, boot, map[string]string{"If-Match": `W/"stale"`}); code != 412 {
		t.Fatalf("stale If-Match: %d %v", code, res)
	}
	_, hdr, _ := e.do("GET", systemURI, nil, nil)
	if code, _, res := e.do("PATCH", systemURI, boot, map[string]string{"If-Match": hdr.Get("ETag")}); code != 204 {
		t.Fatalf("PATCH: %d %v", code, res)
	}
	if e.m.State().Boot != "disk" {
		t.Fatalf("machine boot = %s", e.m.State().Boot)
	}
	_, _, sys := e.do("GET", systemURI, nil, nil)
	if b := sys["Boot"].(map[string]any); b["BootSourceOverrideTarget"] != "Hdd" || b["BootSourceOverrideEnabled"] != "Once" {
		t.Fatalf("Boot = %v", b)
	}
	// A one-time override ends with the next reset.
	e.do("POST", resetURI, map[string]string{"ResetType": "On"}, nil)
	_, _, sys = e.do("GET", systemURI, nil, nil)
	if b := sys["Boot"].(map[string]any); b["BootSourceOverrideEnabled"] != "Disabled" {
		t.Fatalf("Boot after reset = %v", b)
	}
	if code, _, _ := e.do("PATCH", systemURI, map[string]any{"PowerState": "Off"}, nil); code != 400 {
		t.Fatalf("PATCH of a read-only property: %d", code)
	}
}

func TestBootSettingsLayout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Layout = LayoutSettings })
	_, _, sys := e.do("GET", systemURI, nil, nil)
	st, ok := sys["@Redfish.Settings"].(map[string]any)
	if !ok || st["SettingsObject"].(map[string]any)["@odata.id"] != settingsURI {
		t.Fatalf("@Redfish.Settings = %v", sys["@Redfish.Settings"])
	}
	boot := map[string]any{"Boot": map[string]string{"BootSourceOverrideEnabled": "Continuous", "BootSourceOverrideTarget": "Cd"}}
	if code, _, _ := e.do("PATCH", systemURI, boot, nil); code != 400 {
		t.Fatalf("boot PATCH of the system in the settings layout: %d", code)
	}
	if code, _, _ := e.do("PATCH", settingsURI, boot, nil); code != 428 {
		t.Fatalf("settings PATCH without If-Match: %d", code)
	}
	_, hdr, _ := e.do("GET", settingsURI, nil, nil)
	if code, _, res := e.do("PATCH", settingsURI, boot, map[string]string{"If-Match": hdr.Get("ETag")}); code != 204 {
		t.Fatalf("settings PATCH: %d %v", code, res)
	}
	_, _, pend := e.do("GET", settingsURI, nil, nil)
	if pend["Boot"].(map[string]any)["BootSourceOverrideTarget"] != "Cd" {
		t.Fatalf("pending = %v", pend)
	}
	_, _, sys = e.do("GET", systemURI, nil, nil)
	if sys["Boot"].(map[string]any)["BootSourceOverrideTarget"] != "None" {
		t.Fatalf("system applied a pending setting before reset: %v", sys["Boot"])
	}
	e.do("POST", resetURI, map[string]string{"ResetType": "On"}, nil)
	_, _, sys = e.do("GET", systemURI, nil, nil)
	if sys["Boot"].(map[string]any)["BootSourceOverrideTarget"] != "Cd" || e.m.State().Boot != "cd" {
		t.Fatalf("after reset: %v, machine %s", sys["Boot"], e.m.State().Boot)
	}
}

func TestQuirks(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Quirks.IgnoreBootOverride = true
		c.Quirks.Busy = []Busy{{Kind: KindReset, Count: 1, Status: 503, MessageID: "Base.1.15.NodeBusy"},
			{Kind: KindReset, Count: 1, Status: 409, MessageID: "Base.1.15.ResetInProgress"}}
	})
	boot := map[string]any{"Boot": map[string]string{"BootSourceOverrideEnabled": "Once", "BootSourceOverrideTarget": "Hdd"}}
	if code, _, _ := e.do("PATCH", systemURI, boot, nil); code != 204 || e.m.Calls("SetBootDevice") != 0 {
		t.Fatalf("ignored override: %d, machine calls %d", code, e.m.Calls("SetBootDevice"))
	}
	on := map[string]string{"ResetType": "On"}
	code, hdr, res := e.do("POST", resetURI, on, nil)
	if code != 503 || messageID(res) != "Base.1.15.NodeBusy" || hdr.Get("Retry-After") == "" {
		t.Fatalf("first reset: %d %v", code, res)
	}
	if code, _, res := e.do("POST", resetURI, on, nil); code != 409 || messageID(res) != "Base.1.15.ResetInProgress" {
		t.Fatalf("second reset: %d %v", code, res)
	}
	if code, _, _ := e.do("POST", resetURI, on, nil); code != 204 || !e.m.State().On {
		t.Fatalf("third reset: %d", code)
	}
	if e.svc.Count(KindReset) != 3 || e.m.Calls("PowerOn") != 1 {
		t.Fatalf("counts: service %d, machine %d", e.svc.Count(KindReset), e.m.Calls("PowerOn"))
	}
}

func TestVirtualMedia(t *testing.T) {
	iso := []byte("fake iso content")
	img := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/boot.iso" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(iso)
	}))
	defer img.Close()
	e := newEnv(t, nil)
	if code, _, res := e.do("POST", cdURI+"/Actions/VirtualMedia.InsertMedia", map[string]any{"Image": img.URL + "/boot.iso"}, nil); code != 204 {
		t.Fatalf("insert: %d %v", code, res)
	}
	local := e.m.State().Media
	if b, err := os.ReadFile(local); err != nil || !bytes.Equal(b, iso) {
		t.Fatalf("fetched image %s: %q %v", local, b, err)
	}
	_, _, cd := e.do("GET", cdURI, nil, nil)
	if cd["Inserted"] != true || cd["Image"] != img.URL+"/boot.iso" || cd["ImageName"] != "boot.iso" {
		t.Fatalf("CD = %v", cd)
	}
	if code, _, _ := e.do("POST", cdURI+"/Actions/VirtualMedia.EjectMedia", map[string]any{}, nil); code != 204 || e.m.State().Media != "" {
		t.Fatalf("eject: %d", code)
	}
	if code, _, _ := e.do("POST", cdURI+"/Actions/VirtualMedia.InsertMedia", map[string]any{"Image": img.URL + "/absent.iso"}, nil); code != 400 {
		t.Fatalf("insert of a missing image: %d", code)
	}
	f := filepath.Join(t.TempDir(), "local.iso")
	_ = os.WriteFile(f, iso, 0o600)
	if code, _, _ := e.do("POST", cdURI+"/Actions/VirtualMedia.InsertMedia", map[string]any{"Image": "file://" + f}, nil); code != 204 || e.m.State().Media != f {
		t.Fatalf("insert of a file URL: %d %s", code, e.m.State().Media)
	}
}

func TestAccountPasswordAndNoSecretInLogs(t *testing.T) {
	e := newEnv(t, nil)
	newPass := "n3w-Pa55word-QRS"
	if code, _, _ := e.do("PATCH", accountURI, map[string]string{"Password": "short"}, nil); code != 400 {
		t.Fatalf("short password: %d", code)
	}
	if code, _, res := e.do("PATCH", accountURI, map[string]string{"Password": newPass}, nil); code != 204 {
		t.Fatalf("password change: %d %v", code, res)
	}
	if code, _, _ := e.do("GET", systemURI, nil, nil); code != 401 {
		t.Fatalf("old password still accepted: %d", code)
	}
	req, _ := http.NewRequest("GET", e.srv.URL+systemURI, nil)
	req.SetBasicAuth(testUser, newPass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("new password: %v %v", resp, err)
	}
	resp.Body.Close()
	_, _, acct := e.do("GET", accountURI, nil, map[string]string{"Authorization": "Basic " + basic(testUser, newPass)})
	if acct["Password"] != nil {
		t.Fatalf("account shows its password: %v", acct["Password"])
	}
	for _, p := range []string{testPass, newPass} {
		if strings.Contains(e.log.String(), p) {
			t.Fatalf("password %q in logs:\n%s", p, e.log.String())
		}
	}
	if !strings.Contains(e.log.String(), "redfish request") {
		t.Fatal("no request was logged: the check above proves nothing")
	}
}

func basic(u, p string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(u, p)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

func TestServeTLS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc, err := New(Config{Username: testUser, Password: testPass}, vbmc.NewFakeMachine())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Serve(ctx, ServeConfig{Addr: "127.0.0.1:0", TLS: true}, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.URL, "https://127.0.0.1:") || len(srv.Cert.FingerprintSHA256) != 64 {
		t.Fatalf("URL %s fingerprint %q", srv.URL, srv.Cert.FingerprintSHA256)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Get(srv.URL + "/redfish/v1/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("service root over TLS: %d", resp.StatusCode)
	}
	client.CloseIdleConnections()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRedfishtool drives the service with DMTF's redfishtool, an independent client.
func TestRedfishtool(t *testing.T) {
	bin, err := exec.LookPath("redfishtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redfishtool is not installed (Debian package redfishtool): CI must install it")
		}
		t.Skip("redfishtool not installed (apt-get install --no-install-recommends redfishtool)")
	}
	e := newEnv(t, nil)
	e.m.SetOn(true)
	host := strings.TrimPrefix(e.srv.URL, "http://")
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*1e9)
		defer cancel()
		full := append([]string{"-r", host, "-S", "Never", "-u", testUser, "-p", testPass}, args...)
		out, err := exec.CommandContext(ctx, bin, full...).CombinedOutput()
		if err != nil {
			t.Fatalf("redfishtool %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run("Systems"); !strings.Contains(out, systemURI) {
		t.Fatalf("Systems collection:\n%s", out)
	}
	if out := run("Systems", "-I", "1"); !strings.Contains(out, `"PowerState": "On"`) || !strings.Contains(out, "SN123") {
		t.Fatalf("system:\n%s", out)
	}
	run("Systems", "-I", "1", "reset", "ForceOff")
	if e.m.State().On {
		t.Fatal("redfishtool ForceOff left the machine on")
	}
	run("Systems", "-I", "1", "setBootOverride", "Once", "Pxe")
	if e.m.State().Boot != "pxe" || e.m.Calls("SetBootDevice") != 1 {
		t.Fatalf("redfishtool setBootOverride: machine boot %s", e.m.State().Boot)
	}
	if out := run("-A", "Session", "Managers", "-I", "1"); !strings.Contains(out, managerURI) {
		t.Fatalf("manager over a session:\n%s", out)
	}
	// BIOS settings: read the Bios resource, write its settings object, apply at a reset.
	if out := run("raw", "GET", biosURI); !strings.Contains(out, `"ProcCStates": "Enabled"`) || !strings.Contains(out, biosSettingsURI) {
		t.Fatalf("Bios resource:\n%s", out)
	}
	run("raw", "PATCH", biosSettingsURI, "-d", `{"Attributes": {"ProcCStates": "Disabled", "ProcCoreDisable": 1}}`)
	run("Systems", "-I", "1", "reset", "On")
	if out := run("raw", "GET", biosURI); !strings.Contains(out, `"ProcCStates": "Disabled"`) || !strings.Contains(out, `"ProcCoreDisable": 1`) {
		t.Fatalf("Bios resource after the reset:\n%s", out)
	}
}
