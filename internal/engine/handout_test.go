package engine

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"bcd/internal/pki"
	"bcd/internal/store"
)

// What a claimed command carries to its agent is made before the writer: its credentials (or
// user-data) and, for a boot entry's command, a new join token, merged into its arguments; the
// candidates themselves (the rows' arguments) are left as they were.
func TestHandoutsCarryWhatOnlyTheAgentGets(t *testing.T) {
	cands := []store.Command{
		{ID: "power", Kind: "bmc.power", Args: `{"op":"on"}`},
		{ID: "ramdisk", Kind: "boot.prepareRamdisk", Args: `{"macs":["aa"]}`},
		{ID: "instance", Kind: "boot.prepareInstance", Args: `{"image":"i"}`},
		{ID: "query", Kind: "bmc.query", Args: `{}`},
	}
	creds := map[string]map[string]any{
		"power":    {"credentials": "jwe-1"},
		"instance": {"userData": "jwe-2"},
	}
	hand, err := handouts(cands, creds)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id        string
		keys      []string // the arguments' keys the agent gets ("": the row's arguments)
		tokenKind string   // "": no token
		prefix    string
	}{
		{id: "power", keys: []string{"credentials", "op"}},
		{id: "ramdisk", keys: []string{"macs", "token"}, tokenKind: "node", prefix: pki.DiscoveryTokenPrefix},
		{id: "instance", keys: []string{"image", "token", "userData"}, tokenKind: "os", prefix: pki.InstanceTokenPrefix},
		{id: "query"},
	} {
		h, ok := hand[tc.id]
		if !ok {
			t.Fatalf("%s: no handout", tc.id)
		}
		if tc.keys == nil {
			if h.args != "" || h.token != nil {
				t.Errorf("%s: handout %+v, want the row's arguments and no token", tc.id, h)
			}
			continue
		}
		var args map[string]any
		if err := json.Unmarshal([]byte(h.args), &args); err != nil {
			t.Fatalf("%s: arguments %q: %v", tc.id, h.args, err)
		}
		if keys := slices.Sorted(maps.Keys(args)); !slices.Equal(keys, tc.keys) {
			t.Errorf("%s: arguments %s, want the keys %v", tc.id, h.args, tc.keys)
		}
		switch {
		case tc.tokenKind == "" && h.token != nil:
			t.Errorf("%s: a join token handed out for a command that boots nothing", tc.id)
		case tc.tokenKind != "" && h.token == nil:
			t.Errorf("%s: no join token", tc.id)
		case tc.tokenKind != "":
			if h.token.kind != tc.tokenKind || !strings.HasPrefix(h.token.plain, tc.prefix) || args["token"] != h.token.plain ||
				string(pki.HashToken(h.token.plain)) != string(h.token.hash) {
				t.Errorf("%s: token %+v in arguments %s, want a %s token (prefix %q) whose hash is kept", tc.id, h.token, h.args, tc.tokenKind, tc.prefix)
			}
		}
	}
	if hand["ramdisk"].token.plain == hand["instance"].token.plain {
		t.Error("two commands got the same token")
	}
	for i, want := range []string{`{"op":"on"}`, `{"macs":["aa"]}`, `{"image":"i"}`, `{}`} {
		if cands[i].Args != want {
			t.Errorf("candidate %s's arguments became %s", cands[i].ID, cands[i].Args)
		}
	}
}

// Which boot entries carry a join token, of which prefix and stored kind.
func TestEntryTokenOfEachBootEntry(t *testing.T) {
	for _, tc := range []struct {
		entry, prefix, kind string
		ok                  bool
	}{
		{store.BootEntryRamdisk, pki.DiscoveryTokenPrefix, "node", true},
		{store.BootEntryInstance, pki.InstanceTokenPrefix, "os", true},
		{store.BootEntryRemoved, "", "", false},
		{"", "", "", false},
	} {
		prefix, kind, ok := entryToken(tc.entry)
		if prefix != tc.prefix || kind != tc.kind || ok != tc.ok {
			t.Errorf("entryToken(%q) = %q, %q, %v; want %q, %q, %v", tc.entry, prefix, kind, ok, tc.prefix, tc.kind, tc.ok)
		}
	}
}
