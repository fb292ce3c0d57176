package netboot

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func discoveryEntry() Entry {
	e := ramdiskEntry()
	e.Kind, e.Token = KindDiscovery, ""
	return e
}

func TestDiscoveryEntryValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Entry)
		want string
	}{
		{"ok", func(*Entry) {}, ""},
		{"with a token", func(e *Entry) { e.Token = tok }, "no token"},
		{"no gateway", func(e *Entry) { e.GatewayURL = "" }, "gateway URL"},
		{"no kernel", func(e *Entry) { e.Kernel = Artifact{} }, "kernel"},
		{"with an ISO", func(e *Entry) { e.ISO = Artifact{Name: "x.iso", URL: "http://o/x.iso", SHA256: shaK} }, "no local method or ISO"},
	} {
		e := discoveryEntry()
		tc.mod(&e)
		err := e.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestDiscoveryScript: the discovery boot is the ramdisk with no token, told to report to the
// site with the MAC it booted with; all from validated values.
func TestDiscoveryScript(t *testing.T) {
	e := discoveryEntry()
	s, err := Script(&e, testReq(), ScriptParams{BaseURL: "http://10.0.0.1:8080", RetryAfter: 10e9})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kernel --name vmlinuz http://10.0.0.1:8080/artifacts/" + shaK + "/vmlinuz initrd=initrd.img bcd.gateway=https://gw.example:8443/agent console=ttyS0,115200n8 quiet bcd.mode=discovery bcd.report=http://10.0.0.1:8080/discovery bcd.bootmac=52:54:00:12:34:56 || goto failed",
		"initrd --name initrd.img",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "bcd.token") {
		t.Errorf("a discovery script carries a token:\n%s", s)
	}
}

func TestHandlerDiscoveryBoot(t *testing.T) {
	disc := &fakeDiscovery{}
	boot := discoveryEntry()
	arts := fakeArtifacts{}
	h, err := NewHandler(HandlerConfig{BaseURL: "http://10.0.0.1:8080", Entries: fakeEntries{"52:54:00:00:00:02": {Kind: KindLocal, Local: LocalExit}},
		Discovery: disc, Artifacts: arts, DiscoveryBoot: &boot})
	if err != nil {
		t.Fatal(err)
	}
	q := ScriptPath + "?mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64"
	// Artifacts not cached yet: the machine waits (and is recorded).
	if body := get(h, q, "10.0.0.9:1234").Body.String(); !strings.Contains(body, string(WaitArtifacts)) {
		t.Fatalf("before the cache has the ramdisk:\n%s", body)
	}
	arts[shaK], arts[shaI] = true, true
	if body := get(h, q, "10.0.0.9:1234").Body.String(); !strings.Contains(body, "bcd.mode=discovery") || strings.Contains(body, "bcd.token") {
		t.Fatalf("an unknown machine is not booted in discovery mode:\n%s", body)
	}
	if len(disc.seen) != 2 || disc.seen[1].UUID != "4c4c4544-0042-3510-8057-b4c04f4b4d32" {
		t.Fatalf("discoveries %+v", disc.seen)
	}
	// A machine with an entry gets its entry.
	if body := get(h, ScriptPath+"?mac=52:54:00:00:00:02&uuid=&arch=x86_64", "10.0.0.9:1234").Body.String(); !strings.Contains(body, "exit") || strings.Contains(body, "discovery") {
		t.Fatalf("a machine with an entry:\n%s", body)
	}
	bad := Entry{Kind: KindRamdisk}
	if _, err := NewHandler(HandlerConfig{BaseURL: "http://10.0.0.1:8080", Entries: fakeEntries{}, Discovery: disc, Artifacts: arts, DiscoveryBoot: &bad}); err == nil {
		t.Error("a ramdisk entry was accepted as the discovery boot")
	}
}

func TestHandlerDiscoveryReport(t *testing.T) {
	h, disc := newTestHandler(t, fakeEntries{}, fakeArtifacts{})
	post := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", DiscoveryPath, strings.NewReader(body))
		req.RemoteAddr = "10.0.0.9:1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, tc := range []struct {
		name, body string
		code       int
		want       string
	}{
		{"ok", `{"bootMac":"52:54:00:AB:CD:EF", "systemUuid":"4C4C4544-0042-3510-8057-B4C04F4B4D32", "macs":["52:54:00:ab:cd:ef"], "disks":[{"name":"vda"}]}`, http.StatusNoContent, ""},
		{"no UUID", `{"bootMac":"52:54:00:ab:cd:ef","macs":[]}`, http.StatusNoContent, ""},
		{"not JSON", `bootMac=52:54:00:ab:cd:ef`, http.StatusBadRequest, "not a JSON object"},
		{"an array", `[1,2]`, http.StatusBadRequest, "not a JSON object"},
		{"no boot MAC", `{"systemUuid":"4c4c4544-0042-3510-8057-b4c04f4b4d32"}`, http.StatusBadRequest, "bootMac"},
		{"bad boot MAC", `{"bootMac":"52:54:00:ab:cd"}`, http.StatusBadRequest, "bootMac"},
		{"bad UUID", `{"bootMac":"52:54:00:ab:cd:ef","systemUuid":"nope"}`, http.StatusBadRequest, "systemUuid"},
		{"bad NIC", `{"bootMac":"52:54:00:ab:cd:ef","macs":["zz"]}`, http.StatusBadRequest, "macs[0]"},
		{"too big", `{"bootMac":"52:54:00:ab:cd:ef","pad":"` + strings.Repeat("x", MaxDiscoveryReport) + `"}`, http.StatusBadRequest, "at most"},
	} {
		before := len(disc.seen)
		rec := post(tc.body)
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: %d %q, want %d %q", tc.name, rec.Code, rec.Body.String(), tc.code, tc.want)
			continue
		}
		recorded := len(disc.seen) > before
		if recorded != (tc.code == http.StatusNoContent) {
			t.Errorf("%s: recorded %v", tc.name, recorded)
		}
		if tc.name == "ok" {
			d := disc.seen[len(disc.seen)-1]
			if d.MAC.String() != "52:54:00:ab:cd:ef" || d.UUID != "" || !strings.Contains(string(d.Inventory), `"disks":[{"name":"vda"}]`) || strings.Contains(string(d.Inventory), " ") {
				t.Errorf("recorded %+v %s", d, d.Inventory)
			}
		}
	}
	if rec := get(h, DiscoveryPath, "10.0.0.9:1"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d", DiscoveryPath, rec.Code)
	}
}

// FuzzParseDiscoveryReport: whatever a machine posts, the parser never panics, and what it
// accepts is a bounded, compact JSON object with a canonical boot MAC and UUID.
func FuzzParseDiscoveryReport(f *testing.F) {
	for _, s := range []string{
		`{"bootMac":"52:54:00:ab:cd:ef","systemUuid":"4C4C4544-0042-3510-8057-B4C04F4B4D32","macs":["52:54:00:ab:cd:ef"]}`,
		`{"bootMac":"52-54-00-ab-cd-ef"}`, `{"bootMac":""}`, `[]`, `null`, `{"bootMac":"52:54:00:ab:cd:ef","macs":null,"x":{"y":[1,2,{}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		mac, uuid, doc, err := ParseDiscoveryReport(body)
		if err != nil {
			return
		}
		if hw, err := ParseMAC(mac); err != nil || hw.String() != mac {
			t.Fatalf("accepted boot MAC %q is not canonical", mac)
		}
		if uuid != "" {
			if u, err := ParseUUID(uuid); err != nil || u != uuid {
				t.Fatalf("accepted UUID %q is not canonical", uuid)
			}
		}
		if len(doc) > MaxDiscoveryReport || !json.Valid(doc) || bytes.ContainsAny(doc, "\n\t") {
			t.Fatalf("accepted document is not bounded compact JSON: %q", doc)
		}
	})
}

// TestHandlerDecision: a waiting discovery-mode ramdisk learns it was accepted once a ramdisk
// entry exists for its boot MAC (the command line with the token, as the boot script has it);
// until then, and for any other entry, 204; nothing is recorded as a discovery.
func TestHandlerDecision(t *testing.T) {
	ramdisk := ramdiskEntry()
	entries := fakeEntries{
		"52:54:00:12:34:56": ramdisk,
		"52:54:00:00:00:02": {Kind: KindLocal, Local: LocalExit},
		"52:54:00:00:00:03": {Kind: KindRamdisk}, // invalid
	}
	h, disc := newTestHandler(t, entries, fakeArtifacts{})
	h.rejects = fakeRejections{"52:54:00:00:00:07": true, "52:54:00:12:34:56": true}
	want, err := ramdisk.cmdline(h.params.BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(want, " "+CmdlineSiteKey+"="+h.params.BaseURL+" ") {
		t.Fatalf("the accepted machine's command line lacks the site's URL: %q", want)
	}
	for _, tc := range []struct {
		query string
		code  int
		body  string
	}{
		{"mac=52:54:00:12:34:56", 200, want},
		{"mac=52-54-00-12-34-56", 400, "colon-separated"},
		{"mac=52:54:00:00:00:02", 204, ""},
		{"mac=52:54:00:00:00:03", 204, ""},
		{"mac=52:54:00:99:99:99", 204, ""},
		{"mac=52:54:00:00:00:07", 410, "rejected"},
		{"mac=nope", 400, "mac"},
		{"", 400, "mac"},
	} {
		rec := get(h, DecisionPath+"?"+tc.query, "10.0.0.9:1")
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.body) || (tc.code == 200 && rec.Body.String() != tc.body) {
			t.Errorf("%s: %d %q, want %d %q", tc.query, rec.Code, rec.Body.String(), tc.code, tc.body)
		}
	}
	if !strings.Contains(want, CmdlineTokenKey+"=") {
		t.Fatalf("the decision carries no token: %q", want)
	}
	if len(disc.seen) != 0 {
		t.Errorf("decision polls were recorded as discoveries: %d", len(disc.seen))
	}
}

type fakeRejections map[string]bool

func (f fakeRejections) Rejected(_ context.Context, mac net.HardwareAddr) bool {
	return f[mac.String()]
}
