package flagconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// testFlags is a command's flags as the tests parse them: one of each kind Apply handles.
type testFlags struct {
	set     *pflag.FlagSet
	listen  string
	dsn     string
	retain  time.Duration
	n       int
	off     bool
	hosts   []string
	pools   []string
	jointok string
}

// testSpec maps the test flags to the environment.
func testSpec() Spec {
	return Spec{EnvPrefix: "BCD_", Secret: []string{"store", "join-token"}}
}

func newTestFlags() *testFlags {
	t := &testFlags{set: pflag.NewFlagSet("test", pflag.ContinueOnError)}
	t.set.StringVar(&t.listen, "listen", "127.0.0.1:7480", "API listen address")
	t.set.StringVar(&t.dsn, "store", "", "store DSN")
	t.set.DurationVar(&t.retain, "history-retention", 2160*time.Hour, "how long history is kept")
	t.set.IntVar(&t.n, "bmc-unreachable-after", 3, "failed polls")
	t.set.BoolVar(&t.off, "no-power-polling", false, "do not poll")
	t.set.StringSliceVar(&t.hosts, "gateway-host", nil, "extra names")
	t.set.StringArrayVar(&t.pools, "dhcp-pool", nil, "pools")
	t.set.StringVar(&t.jointok, "join-token", "", "token")
	AddConfigFlag(t.set, testSpec())
	return t
}

// apply parses args, then applies env and the files (path → content) as Apply does.
func apply(args []string, env map[string]string, files map[string]string) (*testFlags, error) {
	t := newTestFlags()
	if err := t.set.Parse(args); err != nil {
		return nil, err
	}
	src := Source{
		Getenv: func(k string) string { return env[k] },
		ReadFile: func(p string) ([]byte, error) {
			if c, ok := files[p]; ok {
				return []byte(c), nil
			}
			return nil, fmt.Errorf("open %s: %w", p, fs.ErrNotExist)
		},
	}
	return t, Apply(t.set, testSpec(), src)
}

// Every combination of flag, environment and file: the flag wins, then the environment, then
// the file, then the default.
func TestPrecedence(t *testing.T) {
	for _, tc := range []struct {
		flag, env, file bool
		want            string
	}{
		{false, false, false, "127.0.0.1:7480"},
		{false, false, true, "file:1"},
		{false, true, false, "env:1"},
		{false, true, true, "env:1"},
		{true, false, false, "flag:1"},
		{true, false, true, "flag:1"},
		{true, true, false, "flag:1"},
		{true, true, true, "flag:1"},
	} {
		t.Run(fmt.Sprintf("flag=%v,env=%v,file=%v", tc.flag, tc.env, tc.file), func(t *testing.T) {
			args, env, files := []string{"--config", "c.yaml"}, map[string]string{}, map[string]string{"c.yaml": "history-retention: 1h\n"}
			if tc.flag {
				args = append(args, "--listen", "flag:1")
			}
			if tc.env {
				env["BCD_LISTEN"] = "env:1"
			}
			if tc.file {
				files["c.yaml"] += "listen: file:1\n"
			}
			f, err := apply(args, env, files)
			if err != nil {
				t.Fatal(err)
			}
			if f.listen != tc.want {
				t.Errorf("listen = %q, want %q", f.listen, tc.want)
			}
			if f.retain != time.Hour {
				t.Errorf("history-retention = %s, want the file's 1h", f.retain)
			}
			if !f.set.Lookup("listen").Changed && tc.want != "127.0.0.1:7480" {
				t.Error("a flag set from env or file does not count as changed")
			}
		})
	}
}

// The config file is named by --config, else by its environment variable; the flag wins.
func TestConfigFileNamed(t *testing.T) {
	files := map[string]string{"a.yaml": "listen: a:1\n", "b.yaml": "listen: b:1\n"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"none", nil, nil, "127.0.0.1:7480"},
		{"flag", []string{"--config", "a.yaml"}, nil, "a:1"},
		{"env", nil, map[string]string{"BCD_CONFIG": "b.yaml"}, "b:1"},
		{"flag over env", []string{"--config", "a.yaml"}, map[string]string{"BCD_CONFIG": "b.yaml"}, "a:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := apply(tc.args, tc.env, files)
			if err != nil {
				t.Fatal(err)
			}
			if f.listen != tc.want {
				t.Errorf("listen = %q, want %q", f.listen, tc.want)
			}
		})
	}
}

// Values of every kind, from the file and from the environment; lists take YAML lists.
func TestValues(t *testing.T) {
	file := `# the server
listen: 0.0.0.0:7480
history-retention: 720h
bmc-unreachable-after: 5
no-power-polling: true
gateway-host: [bcd.example.net, 10.0.0.1]
dhcp-pool:
  - 10.0.0.0/24,10.0.0.100-10.0.0.199
  - 10.0.1.0/24,10.0.1.100-10.0.1.199
store: "postgres://bcd:pw@db/bcd"
`
	f, err := apply([]string{"--config", "c.yaml"}, nil, map[string]string{"c.yaml": file})
	if err != nil {
		t.Fatal(err)
	}
	if f.listen != "0.0.0.0:7480" || f.retain != 720*time.Hour || f.n != 5 || !f.off || f.dsn != "postgres://bcd:pw@db/bcd" ||
		!slices.Equal(f.hosts, []string{"bcd.example.net", "10.0.0.1"}) ||
		!slices.Equal(f.pools, []string{"10.0.0.0/24,10.0.0.100-10.0.0.199", "10.0.1.0/24,10.0.1.100-10.0.1.199"}) {
		t.Errorf("from the file: %+v", *f)
	}
	// The environment sets a list as the flag given once does: comma-separated for a slice,
	// one item for an array (a pool holds a comma).
	env := map[string]string{"BCD_GATEWAY_HOST": "a,b", "BCD_DHCP_POOL": "10.0.0.0/24,10.0.0.100-10.0.0.199",
		"BCD_NO_POWER_POLLING": "true", "BCD_HISTORY_RETENTION": "1h", "BCD_BMC_UNREACHABLE_AFTER": "7"}
	f, err = apply(nil, env, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.hosts, []string{"a", "b"}) || !slices.Equal(f.pools, []string{"10.0.0.0/24,10.0.0.100-10.0.0.199"}) || !f.off || f.retain != time.Hour || f.n != 7 {
		t.Errorf("from the environment: %+v", *f)
	}
	// A list from the file replaces the default; flags given on the command line replace the file's.
	f, err = apply([]string{"--config", "c.yaml", "--gateway-host", "x"}, nil, map[string]string{"c.yaml": "gateway-host: [a, b]\n"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.hosts, []string{"x"}) {
		t.Errorf("flag over the file's list: %q", f.hosts)
	}
	// Comments only, or nothing: no keys.
	for _, c := range []string{"", "# nothing\n"} {
		if _, err := apply([]string{"--config", "c.yaml"}, nil, map[string]string{"c.yaml": c}); err != nil {
			t.Errorf("file %q: %v", c, err)
		}
	}
}

// A flag's variable is the prefix and its name in capitals, - as _ (the site agent's prefix
// BCD_SITE_ gives its documented BCD_SITE_JOIN_TOKEN).
func TestEnvNames(t *testing.T) {
	for _, tc := range []struct {
		spec       Spec
		flag, want string
	}{
		{testSpec(), "listen", "BCD_LISTEN"},
		{testSpec(), "history-retention", "BCD_HISTORY_RETENTION"},
		{testSpec(), ConfigFlag, "BCD_CONFIG"},
		{Spec{EnvPrefix: "BCD_SITE_"}, "join-token", "BCD_SITE_JOIN_TOKEN"},
	} {
		if got := tc.spec.EnvName(tc.flag); got != tc.want {
			t.Errorf("EnvName(%q) = %q, want %q", tc.flag, got, tc.want)
		}
	}
	f, err := apply(nil, map[string]string{"BCD_JOIN_TOKEN": "from env"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.jointok != "from env" {
		t.Errorf("join-token = %q, want the variable's", f.jointok)
	}
}

// Refused input: the error names the file and line (or the variable), the key, and what is
// accepted; a secret's value is never repeated. Every one is an *Error.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		file   string
		want   []string
		absent []string
	}{
		{name: "unknown key", file: "listen: a\nhistory-retension: 1h\n",
			want: []string{"c.yaml line 2", `unknown key "history-retension"`, `did you mean "history-retention"?`, "accepted keys", "gateway-host"}},
		{name: "unknown key far from all", file: "zzzzzzzzzzzz: 1\n",
			want: []string{`unknown key "zzzzzzzzzzzz"; accepted keys`}, absent: []string{"did you mean"}},
		{name: "config key", file: "config: other.yaml\n", want: []string{`unknown key "config"`}},
		{name: "bad duration", file: "listen: a\nhistory-retention: 30\n",
			want: []string{"c.yaml line 2", "history-retention", `value "30" refused`, "a duration such as 90s"}},
		{name: "bad int", file: "bmc-unreachable-after: many\n", want: []string{"line 1", "bmc-unreachable-after", "a whole number"}},
		{name: "bad bool", file: "no-power-polling: yes\n", want: []string{"no-power-polling", "true or false"}},
		{name: "list for one value", file: "listen: [a, b]\n", want: []string{"line 1", "listen takes one value, not a list"}},
		{name: "mapping value", file: "listen: {a: b}\n", want: []string{"line 1", "listen: accepted: a string, not a mapping"}},
		{name: "null value", file: "listen:\n", want: []string{"line 1", "listen has no value"}},
		{name: "twice", file: "listen: a\nlisten: b\n", want: []string{"line 2", `"listen" given again (first at line 1)`}},
		{name: "not a mapping", file: "- listen\n", want: []string{"want a mapping of flag names"}},
		{name: "not YAML", file: "listen: [a\n", want: []string{"c.yaml: not YAML"}},
		{name: "two documents", file: "listen: a\n---\nlisten: b\n", want: []string{"a second YAML document"}},
		{name: "missing file", args: []string{"--config", "nope.yaml"}, want: []string{"config file nope.yaml does not exist", "--config or $BCD_CONFIG"}},
		{name: "bad env", env: map[string]string{"BCD_HISTORY_RETENTION": "forever"},
			want: []string{"$BCD_HISTORY_RETENTION", `value "forever" refused`, "a duration"}},
		{name: "secret in file", file: "store: [postgres://u:s3cr3t@h/db]\n", want: []string{"store takes one value"}, absent: []string{"s3cr3t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if args == nil {
				args = []string{"--config", "c.yaml"}
			}
			_, err := apply(args, tc.env, map[string]string{"c.yaml": tc.file})
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.As(err, new(*Error)) {
				t.Errorf("%v is no *Error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(err.Error(), a) {
					t.Errorf("error %q has %q", err, a)
				}
			}
		})
	}
}

// A refused value of a secret flag is not repeated, from the file or the environment.
func TestSecretNotEchoed(t *testing.T) {
	set := pflag.NewFlagSet("t", pflag.ContinueOnError)
	set.Int("pin", 0, "a secret number")
	AddConfigFlag(set, testSpec())
	spec := Spec{EnvPrefix: "BCD_", Secret: []string{"pin"}}
	for _, src := range []Source{
		{Getenv: func(k string) string { return map[string]string{"BCD_PIN": "s3cr3t"}[k] }},
		{Getenv: func(k string) string { return map[string]string{"BCD_CONFIG": "c.yaml"}[k] },
			ReadFile: func(string) ([]byte, error) { return []byte("pin: s3cr3t\n"), nil }},
	} {
		err := Apply(set, spec, src)
		if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "pin: value refused") && !strings.Contains(err.Error(), "$BCD_PIN: value refused") {
			t.Errorf("secret refused: %v", err)
		}
	}
}

func TestClosest(t *testing.T) {
	names := []string{"listen", "data-dir", "gateway-listen", "history-retention"}
	for _, tc := range []struct{ key, want string }{
		{"lisen", "listen"}, {"data_dir", "data-dir"}, {"gateway_listen", "gateway-listen"}, {"x", ""}, {"store-dsn", ""},
	} {
		if got := closest(tc.key, names); got != tc.want {
			t.Errorf("closest(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}
