package netboot

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// fakeUserData answers user-data by node; an error for the nodes in unavailable.
type fakeUserData struct {
	data        map[string]string
	unavailable map[string]bool
}

func (f fakeUserData) UserData(_ context.Context, node string) ([]byte, error) {
	if f.unavailable[node] {
		return nil, ErrUserDataUnavailable
	}
	if d, ok := f.data[node]; ok {
		return []byte(d), nil
	}
	return nil, nil
}

const (
	operatorCloudConfig = "#cloud-config\nssh_authorized_keys: [\"ssh-ed25519 AAAA op-Secret-77\"]\n"
	operatorIgnition    = `{"ignition":{"version":"3.3.0"},"passwd":{"users":[{"name":"core","passwordHash":"op-Secret-77"}]}}`
)

// The guest endpoints with operator user-data: /cloud-init/user-data serves it exactly (bcd's
// default for a node without), /ignition-user.json serves it (404 without), and /ignition.json
// merges it with its SHA-512; each only at the node's bound address, 404 before publication;
// user-data set but not held answers 503 (never bcd's default) and the log holds no byte of it.
func TestGuestUserData(t *testing.T) {
	const base = "http://10.0.0.1:8080"
	md := fakeMetadata{
		netip.MustParseAddr("10.0.0.50"): guestDoc(t, "node-cc"),
		netip.MustParseAddr("10.0.0.51"): guestDoc(t, "node-ign"),
		netip.MustParseAddr("10.0.0.52"): guestDoc(t, "node-plain"),
		netip.MustParseAddr("10.0.0.53"): guestDoc(t, "node-lost"),
		netip.MustParseAddr("10.0.0.60"): `{"nodeId":"node-cc"}`, // not published
	}
	ud := fakeUserData{data: map[string]string{"node-cc": operatorCloudConfig, "node-ign": operatorIgnition},
		unavailable: map[string]bool{"node-lost": true}}
	var logs strings.Builder
	cfg := HandlerConfig{BaseURL: base, Entries: fakeEntries{}, Discovery: &fakeDiscovery{}, Artifacts: fakeArtifacts{},
		Metadata: md, UserData: ud, Rejoin: &fakeRejoiner{}, Now: func() time.Time { return fixedNow },
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	h, err := NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	plainIgn, _ := IgnitionConfig(base)
	cases := []struct {
		name, path, remote string
		status             int
		body               string // "" : not checked
	}{
		{"cloud-init user-data", "/cloud-init/user-data", "10.0.0.50:1", 200, operatorCloudConfig},
		{"cloud-init user-data, another address", "/cloud-init/user-data", "10.0.0.59:1", 404, ""},
		{"cloud-init user-data, not published", "/cloud-init/user-data", "10.0.0.60:1", 404, ""},
		{"cloud-init user-data, none given", "/cloud-init/user-data", "10.0.0.52:1", 200, UserData},
		{"cloud-init user-data, not held", "/cloud-init/user-data", "10.0.0.53:1", 503, ""},
		{"vendor-data stays bcd's", "/cloud-init/vendor-data", "10.0.0.50:1", 200, ""},
		{"ignition user", IgnitionUserPath, "10.0.0.51:1", 200, operatorIgnition},
		{"ignition user, another address", IgnitionUserPath, "10.0.0.59:1", 404, ""},
		{"ignition user, not published", IgnitionUserPath, "10.0.0.60:1", 404, ""},
		{"ignition user, none given", IgnitionUserPath, "10.0.0.52:1", 404, ""},
		{"ignition user, not held", IgnitionUserPath, "10.0.0.53:1", 503, ""},
		{"ignition.json, none given", IgnitionPath, "10.0.0.52:1", 200, string(plainIgn)},
		{"ignition user, cloud-init's user-data", IgnitionUserPath, "10.0.0.50:1", 404, ""},
		{"ignition.json, cloud-init's user-data: no merge", IgnitionPath, "10.0.0.50:1", 200, string(plainIgn)},
		{"ignition.json, not held", IgnitionPath, "10.0.0.53:1", 503, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := get(h, c.path, c.remote)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.status, rec.Body)
			}
			if c.body != "" && rec.Body.String() != c.body {
				t.Fatalf("body:\n%s\nwant:\n%s", rec.Body, c.body)
			}
			if c.status == 503 && strings.Contains(rec.Body.String(), "op-Secret") {
				t.Fatal("the 503 quotes user-data")
			}
		})
	}

	// /ignition.json merges the operator's config from this site, verified by its SHA-512, and
	// keeps bcd's rejoin unit.
	rec := get(h, IgnitionPath, "10.0.0.51:1")
	var doc struct {
		Ignition struct {
			Version string `json:"version"`
			Config  struct {
				Merge []struct {
					Source       string `json:"source"`
					Verification struct {
						Hash string `json:"hash"`
					} `json:"verification"`
				} `json:"merge"`
			} `json:"config"`
		} `json:"ignition"`
		Systemd struct {
			Units []struct {
				Name string `json:"name"`
			} `json:"units"`
		} `json:"systemd"`
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &doc) != nil {
		t.Fatalf("ignition.json: %d %s", rec.Code, rec.Body)
	}
	sum := sha512.Sum512([]byte(operatorIgnition))
	m := doc.Ignition.Config.Merge
	if doc.Ignition.Version != IgnitionSpec || len(m) != 1 || m[0].Source != base+IgnitionUserPath || m[0].Verification.Hash != "sha512-"+hex.EncodeToString(sum[:]) {
		t.Fatalf("ignition.json merges %+v (version %s), want %s%s with sha512-%x", m, doc.Ignition.Version, base, IgnitionUserPath, sum)
	}
	if len(doc.Systemd.Units) != 1 || doc.Systemd.Units[0].Name != IgnitionUnit {
		t.Fatalf("ignition.json lost bcd's rejoin unit: %+v", doc.Systemd.Units)
	}
	if strings.Contains(rec.Body.String(), "op-Secret") {
		t.Fatal("ignition.json holds the operator's config itself, not its reference")
	}
	if strings.Contains(logs.String(), "op-Secret") || !strings.Contains(logs.String(), "node-lost") {
		t.Fatalf("logs hold user-data, or do not name the node whose user-data is not held:\n%s", logs.String())
	}
}
