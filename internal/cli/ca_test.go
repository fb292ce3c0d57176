package cli

import (
	"strings"
	"testing"
)

// TestCACommands: bcd ca walks a rotation through its stages and says where it stands; a
// stage out of order is refused with what to run instead; no key material is printed.
func TestCACommands(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	for _, step := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ca", "status"}, 0, "agent CA rotation: steady"},
		{[]string{"ca", "finish"}, 4, "bcd ca rotate stages a new CA"},
		{[]string{"ca", "rotate", "--reason", "yearly"}, 0, "agent CA rotation: staged"},
		{[]string{"doctor"}, 0, "agent CA rotation: staged"},
		{[]string{"ca", "rotate"}, 4, "bcd ca activate"},
		{[]string{"ca", "activate"}, 0, "agent CA rotation: overlap"},
		{[]string{"ca", "finish", "--reason", "done"}, 0, "agent CA rotation: steady"},
	} {
		code, out, errs := run(t, env, step.args...)
		if code != step.code || !strings.Contains(out+errs, step.want) {
			t.Fatalf("%v: exit %d, want %d, output %q %q; want it to say %q", step.args, code, step.code, out, errs, step.want)
		}
		if strings.Contains(out+errs, "PRIVATE KEY") {
			t.Fatalf("%v prints key material", step.args)
		}
	}
}
