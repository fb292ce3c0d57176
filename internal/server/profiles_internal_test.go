package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/workflow"
)

// The profiles file takes deploy profiles and overrides of built-in profiles side by side; the
// overridden built-in is what workflow.Find then gives; a bad override is refused naming the
// file and what may be overridden.
func TestLoadProfilesWithOverrides(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{
		"gpu": {"steps": [{"use": "metal.ensureRamdisk"}, {"use": "deploy.image", "args": {"image": "$image"}}, {"use": "boot.kexec"}]},
		"metal-commission": {"override": {"diag.dcgm": {"args": {"level": "0"}}, "disk.wipe": {"args": {"mode": "secure"}, "timeout": "30h"}}},
		"metal-inspect": {"override": {"inventory.refresh": {"retries": 0}}}
	}`)
	ps, err := loadProfiles(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 {
		t.Fatalf("profiles %+v", ps)
	}
	p, err := workflow.Find("metal-commission", ps)
	if err != nil {
		t.Fatal(err)
	}
	r, err := workflow.Resolve(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range r.Steps {
		if st.Use == "diag.dcgm" || st.Use == "disk.wipe" {
			got = append(got, st.String()+" "+st.Timeout.String())
		}
	}
	if g := strings.Join(got, ", "); g != "diag.dcgm?skippedByOverride{level: 0} 2h0m0s, disk.wipe{mode: secure} 30h0m0s" {
		t.Errorf("effective commissioning: %s", g)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"metal-commission": {"steps": [{"use": "power.off"}]}}`, "is built in: it takes only {\"override\""},
		{`{"metal-retire": {"override": {"disk.wipe": {"args": {"mode": "quick"}}}}}`, "argument mode cannot be overridden: may be overridden in metal-retire: disk.wipe: timeout 1s-48h, retries 0-10; power.off: timeout 1s-48h, retries 0-10"},
		{`{"metal-commission": {"override": {"diag.dcgm": {"args": {"level": "9"}}}}}`, "accepted are 0, 1, 2, 3, 4"},
		{`{"metal-commission": {"override": {"boot.prepareRamdisk": {"timeout": "1h"}}}}`, "step boot.prepareRamdisk cannot be overridden"},
	} {
		path := write("bad.json", bad.body)
		_, err := loadProfiles(path)
		if err == nil || !strings.Contains(err.Error(), "profiles file "+path) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.body, err, bad.want)
		}
	}
}
