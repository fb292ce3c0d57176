package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/gen/bcdv1"
)

// TestPoolFastTrackWindow: the pool flag reaches the policy; a bad window is refused naming
// the field and what is accepted.
func TestPoolFastTrackWindow(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	code, out, errs := run(t, env, "-o", "json", "pool", "update", "default", "--fast-track-window", "15m")
	var resp struct {
		Pool struct {
			Policy struct {
				FastTrackWindow string `json:"fastTrackWindow"`
			} `json:"policy"`
		} `json:"pool"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &resp) != nil || resp.Pool.Policy.FastTrackWindow != "15m" {
		t.Fatalf("pool update: %d %q %q", code, out, errs)
	}
	for _, bad := range []string{"fifteen", "25h", "-1m"} {
		code, _, errs = run(t, env, "pool", "update", "default", "--fast-track-window", bad)
		if code != 2 || !strings.Contains(errs, "invalid_argument") || !strings.Contains(errs, "policy.fast_track_window") || !strings.Contains(errs, "24h") {
			t.Errorf("window %q: %d %q", bad, code, errs)
		}
	}
}

// TestNodeGetShowsTheLinger: bcd node get prints a lingering ramdisk and its power-off.
func TestNodeGetShowsTheLinger(t *testing.T) {
	for _, tc := range []struct {
		a    *bcdv1.Activity
		want string
	}{
		{&bcdv1.Activity{Workflow: "metal-commission", WorkflowState: "succeeded", RamdiskLingeringUntil: "2026-11-30T04:00:00Z"}, "lingering until 2026-11-30T04:00:00Z"},
		{&bcdv1.Activity{Workflow: "metal-commission", WorkflowState: "succeeded", RamdiskLingeringUntil: "2026-11-30T04:00:00Z", RamdiskPoweringOff: true}, "told to power its host off"},
		{&bcdv1.Activity{Workflow: "metal-commission", WorkflowState: "succeeded"}, ""},
	} {
		var out bytes.Buffer
		g := &globals{env: Env{Stdout: &out}}
		if err := g.printNode(&bcdv1.Node{Name: "n1", State: "ready", Power: "on", Activity: tc.a}); err != nil {
			t.Fatal(err)
		}
		got := out.String()
		if tc.want == "" && strings.Contains(got, "ramdisk:") || tc.want != "" && !strings.Contains(got, "ramdisk:") || !strings.Contains(got, tc.want) {
			t.Errorf("activity %v printed:\n%s\nwant a ramdisk row with %q", tc.a, got, tc.want)
		}
	}
}
