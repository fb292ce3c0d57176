package netboot

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"bcd/internal/osagent/osjoin"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/kexec"
)

const guestToken = "bcdi_GuestTokenAbCdEf0123456789"

// guestDoc is a /metadata document as the site agent serves it, with a real CA.
func guestDoc(t *testing.T, node string) string {
	t.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"nodeId": node, "gateway": "https://gw.example:8443", "instanceToken": guestToken, "ca": string(ca.CertPEM())})
	return string(b)
}

// fakeRejoiner answers err and records the joins asked of it.
type fakeRejoiner struct {
	mu    sync.Mutex
	err   error
	joins []string
}

func (f *fakeRejoiner) Join(_ context.Context, md osjoin.Metadata) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.joins = append(f.joins, md.NodeID+" "+md.InstanceToken)
	return f.err
}

func guestHandler(t *testing.T, md fakeMetadata, rj Rejoiner, logs *strings.Builder) *Handler {
	t.Helper()
	cfg := HandlerConfig{BaseURL: "http://10.0.0.1:8080", Entries: fakeEntries{}, Discovery: &fakeDiscovery{},
		Artifacts: fakeArtifacts{}, Metadata: md, Rejoin: rj, Now: func() time.Time { return fixedNow }}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	h, err := NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func post(h http.Handler, target, remote, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", target, nil)
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// The guest endpoints answer, like /metadata, only the address the node's MAC booted from, and
// 404 until the instance is published (no metadata for the address, or a document without an
// instance token).
func TestGuestEndpointsBindingAndPublication(t *testing.T) {
	md := fakeMetadata{
		netip.MustParseAddr("10.0.0.50"): guestDoc(t, "node-50"),
		netip.MustParseAddr("10.0.0.60"): `{"nodeId":"node-60"}`, // deployed before: no instance token
	}
	rj := &fakeRejoiner{}
	h := guestHandler(t, md, rj, nil)
	vendor, _ := VendorData("http://10.0.0.1:8080")
	ign, _ := IgnitionConfig("http://10.0.0.1:8080")
	paths := []struct{ path, body string }{
		{"/cloud-init/meta-data", "instance-id: \"node-50\"\n"},
		{"/cloud-init/user-data", UserData},
		{"/cloud-init/vendor-data", vendor},
		{"/ignition.json", string(ign)},
	}
	for _, p := range paths {
		for _, tc := range []struct {
			name, remote string
			status       int
		}{
			{"bound address", "10.0.0.50:4000", 200},
			{"bound address, IPv4-mapped", "[::ffff:10.0.0.50]:4000", 200},
			{"another address", "10.0.0.51:4000", 404},
			{"not published", "10.0.0.60:4000", 404},
		} {
			t.Run(p.path+"/"+tc.name, func(t *testing.T) {
				rec := get(h, p.path, tc.remote)
				if rec.Code != tc.status {
					t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
				}
				if tc.status == 200 && rec.Body.String() != p.body {
					t.Fatalf("body:\n%s\nwant:\n%s", rec.Body, p.body)
				}
			})
		}
	}
	// Without a metadata source, nothing is published.
	none := guestHandler(t, nil, rj, nil)
	if rec := get(none, "/cloud-init/meta-data", "10.0.0.50:1"); rec.Code != 404 {
		t.Fatalf("no metadata source: %d", rec.Code)
	}
}

// POST /rejoin: 404 where /metadata would be, 401 without the address's current instance token
// (the join is not attempted), and the join's outcome: 204, 401 for a spent token, 503 with
// Retry-After while the gateway is unreachable.
func TestRejoinAnswers(t *testing.T) {
	md := fakeMetadata{netip.MustParseAddr("10.0.0.50"): guestDoc(t, "node-50")}
	for _, tc := range []struct {
		name, remote, auth string
		joinErr            error
		status             int
		joined             bool
		say                string
	}{
		{"joined", "10.0.0.50:1", "Bearer " + guestToken, nil, 204, true, ""},
		{"another address", "10.0.0.51:1", "Bearer " + guestToken, nil, 404, false, ""},
		{"no authorization", "10.0.0.50:1", "", nil, 401, false, "instance token"},
		{"wrong token", "10.0.0.50:1", "Bearer bcdi_other", nil, 401, false, "instance token"},
		{"basic, not bearer", "10.0.0.50:1", "Basic " + guestToken, nil, 401, false, "instance token"},
		{"spent", "10.0.0.50:1", "Bearer " + guestToken, fmt.Errorf("joining: %w", osjoin.ErrSpent), 401, true, "prepare the instance again"},
		{"gateway unreachable", "10.0.0.50:1", "Bearer " + guestToken, fmt.Errorf("joining: %w", osjoin.ErrUnreachable), 503, true, "try again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rj := &fakeRejoiner{err: tc.joinErr}
			var logs strings.Builder
			h := guestHandler(t, md, rj, &logs)
			rec := post(h, RejoinPath, tc.remote, tc.auth)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if !strings.Contains(rec.Body.String(), tc.say) {
				t.Fatalf("body %q lacks %q", rec.Body, tc.say)
			}
			if got := len(rj.joins) == 1; got != tc.joined {
				t.Fatalf("joins %d, want joined %t", len(rj.joins), tc.joined)
			}
			if tc.joined && rj.joins[0] != "node-50 "+guestToken {
				t.Fatalf("joined with %q", rj.joins[0])
			}
			if ra := rec.Header().Get("Retry-After"); (tc.status == 503) != (ra == "10") {
				t.Fatalf("Retry-After %q with status %d", ra, tc.status)
			}
			if strings.Contains(logs.String(), guestToken) || strings.Contains(rec.Body.String(), guestToken) {
				t.Fatalf("the token leaked:\nlog: %s\nbody: %s", logs.String(), rec.Body)
			}
		})
	}
	if rec := get(guestHandler(t, md, &fakeRejoiner{}, nil), RejoinPath, "10.0.0.50:1"); rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /rejoin: %d", rec.Code)
	}
}

// The snippets' exact text for a base URL, and that they parse: vendor-data as a
// #cloud-config YAML document whose write_files carries the script, the Ignition config as
// spec-3 JSON whose file is the same script and whose unit runs it.
func TestGuestSnippets(t *testing.T) {
	const base = "http://10.0.0.1:8080"
	script, err := RejoinScript(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"#!/bin/sh\n",
		"base='http://10.0.0.1:8080'\n",
		`token=$(get "$base/metadata" | sed -n 's/.*"instanceToken":"\([^"]*\)".*/\1/p')`,
		`printf 'Authorization: Bearer %s\n' "$1" | curl -sS -o /dev/null -w '%{http_code}' --max-time 30 -X POST -H @- "$base/rejoin"`,
		`wget -q -T 30 -O /dev/null --post-data= --header="Authorization: Bearer $1" "$base/rejoin"`,
		"204) echo", "401) echo",
	} {
		if !strings.Contains(script, want) {
			t.Fatalf("script lacks %q:\n%s", want, script)
		}
	}
	if sh, err := exec.LookPath("sh"); err == nil {
		if out, err := exec.Command(sh, "-n", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("sh -n: %v: %s", err, out)
		}
	}

	vendor, err := VendorData(base)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(vendor, "#cloud-config\n") {
		t.Fatalf("vendor-data does not start with #cloud-config:\n%s", vendor)
	}
	var cc struct {
		WriteFiles []struct {
			Path, Owner, Permissions, Content string
		} `yaml:"write_files"`
	}
	dec := yaml.NewDecoder(strings.NewReader(vendor))
	dec.KnownFields(true)
	if err := dec.Decode(&cc); err != nil {
		t.Fatalf("vendor-data is not YAML of write_files: %v\n%s", err, vendor)
	}
	if len(cc.WriteFiles) != 1 || cc.WriteFiles[0].Path != CloudInitScriptPath || cc.WriteFiles[0].Permissions != "0755" ||
		cc.WriteFiles[0].Owner != "root:root" || cc.WriteFiles[0].Content != script {
		t.Fatalf("vendor-data write_files %+v, want the script at %s", cc.WriteFiles, CloudInitScriptPath)
	}
	var empty any
	if err := yaml.Unmarshal([]byte(UserData), &empty); err != nil || !strings.HasPrefix(UserData, "#cloud-config\n") {
		t.Fatalf("user-data %q: %v", UserData, err)
	}
	var meta map[string]string
	for _, id := range []string{"node-1", `odd:"id"#x`} {
		if err := yaml.Unmarshal([]byte(MetaData(id)), &meta); err != nil || meta["instance-id"] != id || len(meta) != 1 {
			t.Fatalf("meta-data of %q: %v %v", id, meta, err)
		}
	}

	ign, err := IgnitionConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Ignition struct{ Version string } `json:"ignition"`
		Storage  struct {
			Files []struct {
				Path      string `json:"path"`
				Mode      int    `json:"mode"`
				Overwrite bool   `json:"overwrite"`
				Contents  struct {
					Source string `json:"source"`
				} `json:"contents"`
			} `json:"files"`
		} `json:"storage"`
		Systemd struct {
			Units []struct {
				Name     string `json:"name"`
				Enabled  bool   `json:"enabled"`
				Contents string `json:"contents"`
			} `json:"units"`
		} `json:"systemd"`
	}
	jd := json.NewDecoder(strings.NewReader(string(ign)))
	jd.DisallowUnknownFields()
	if err := jd.Decode(&cfg); err != nil {
		t.Fatalf("ignition config: %v\n%s", err, ign)
	}
	if !strings.HasPrefix(cfg.Ignition.Version, "3.") || len(cfg.Storage.Files) != 1 || len(cfg.Systemd.Units) != 1 {
		t.Fatalf("ignition config structure:\n%s", ign)
	}
	f := cfg.Storage.Files[0]
	data, ok := strings.CutPrefix(f.Contents.Source, "data:text/plain;charset=utf-8;base64,")
	got, derr := base64.StdEncoding.DecodeString(data)
	if f.Path != IgnitionScriptPath || f.Mode != 0o755 || !ok || derr != nil || string(got) != script {
		t.Fatalf("ignition file %s mode %o: script %q (%v)", f.Path, f.Mode, got, derr)
	}
	u := cfg.Systemd.Units[0]
	for _, want := range []string{"Type=oneshot\n", "ExecStart=" + IgnitionScriptPath + "\n", "After=network-online.target\n", "WantedBy=multi-user.target\n"} {
		if u.Name != IgnitionUnit || !u.Enabled || !strings.Contains(u.Contents, want) {
			t.Fatalf("ignition unit %s enabled %t lacks %q:\n%s", u.Name, u.Enabled, want, u.Contents)
		}
	}

	// A base URL that is not a site URL renders nothing.
	for _, bad := range []string{"", "http://10.0.0.1:8080/", "ftp://x", "http://x/'; rm -rf /"} {
		if _, err := RejoinScript(bad); err == nil {
			t.Fatalf("base %q accepted", bad)
		}
	}
}

// The script, run by sh with the machine's curl against a loopback site: it reads the token
// from /metadata, sends it as a bearer token on standard input, and exits 0 on 204, 1 at once
// on 401.
func TestRejoinScriptRuns(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	for _, tc := range []struct {
		name   string
		status int
		exit   int
	}{
		{"joined", 204, 0},
		{"spent", 401, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var auths []string
			mux := http.NewServeMux()
			mux.HandleFunc("GET /metadata", func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, `{"nodeId":"n1","gateway":"https://gw","instanceToken":%q,"ca":""}`, guestToken)
			})
			mux.HandleFunc("POST /rejoin", func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				auths = append(auths, r.Header.Get("Authorization"))
				mu.Unlock()
				w.WriteHeader(tc.status)
			})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: mux}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			script, err := RejoinScript("http://" + ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "rejoin.sh")
			if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, sh, p).CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if code != tc.exit || len(auths) != 1 || auths[0] != "Bearer "+guestToken {
				t.Fatalf("exit %d (want %d), authorizations %q: %s", code, tc.exit, auths, out)
			}
		})
	}
}

// The kernel parameters the ramdisk appends (kexec.GuestArgs) name these endpoints.
func TestGuestArgsNameTheseEndpoints(t *testing.T) {
	const site = "http://10.0.0.1:8080"
	ci, err := kexec.GuestArgs(kexec.GuestCloudInit, site)
	if err != nil || !slices.Equal(ci, []string{"ds=nocloud-net;s=" + site + CloudInitPath}) {
		t.Fatalf("cloud-init args %q (%v) do not seed from %s", ci, err, CloudInitPath)
	}
	ign, err := kexec.GuestArgs(kexec.GuestIgnition, site)
	if err != nil || !slices.Contains(ign, "ignition.config.url="+site+IgnitionPath) {
		t.Fatalf("ignition args %q (%v) do not name %s", ign, err, IgnitionPath)
	}
}
