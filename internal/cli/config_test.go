package cli

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"bcd/internal/flagconfig"
	"bcd/internal/site/sitecmd"
)

// processes are the long-running commands that read a config file, with their example config
// (shipped in deploy/systemd, shown in docs/operations.md) and environment mapping.
func processes() []struct {
	path    []string
	example string
	spec    flagconfig.Spec
} {
	return []struct {
		path    []string
		example string
		spec    flagconfig.Spec
	}{
		{[]string{"server"}, "server.yaml", serverSpec()},
		{[]string{"site", "run"}, "site.yaml", sitecmd.Spec()},
	}
}

// processCmd is the command at path of a new root, its flags parsed from args.
func processCmd(t *testing.T, path, args []string) *cobra.Command {
	t.Helper()
	root := newRoot(Env{Getenv: func(string) string { return "" }, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	cmd, rest, err := root.Find(append(slices.Clone(path), args...))
	if err != nil {
		t.Fatalf("%q: %v", path, err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("%q %q: %v", path, args, err)
	}
	return cmd
}

// values are cmd's own flags' values, --config aside.
func values(cmd *cobra.Command) map[string]string {
	out := map[string]string{}
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name != flagconfig.ConfigFlag && f.Name != "help" {
			out[f.Name] = f.Value.String()
		}
	})
	return out
}

// A config file sets what it says: the flags it gives a process are those of the same values
// on the command line, and the example files shipped and shown in docs/operations.md parse.
func TestConfigFileSetsWhatItSays(t *testing.T) {
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range processes() {
		t.Run(p.example, func(t *testing.T) {
			file := filepath.Join("../../deploy/systemd", p.example)
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(ops, append(append([]byte("```yaml\n"), b...), "```"...)) {
				t.Errorf("docs/operations.md does not show deploy/systemd/%s as it is", p.example)
			}
			var m yaml.Node
			if err := yaml.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			var args []string // the same values as flags
			kv := m.Content[0].Content
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1].Kind == yaml.SequenceNode {
					for _, item := range kv[i+1].Content {
						args = append(args, "--"+kv[i].Value+"="+item.Value)
					}
					continue
				}
				args = append(args, "--"+kv[i].Value+"="+kv[i+1].Value)
			}
			fromFile := processCmd(t, p.path, []string{"--config", file})
			if err := flagconfig.Apply(fromFile.LocalFlags(), p.spec, flagconfig.Source{Getenv: func(string) string { return "" }, ReadFile: os.ReadFile}); err != nil {
				t.Fatal(err)
			}
			fromFlags := processCmd(t, p.path, args)
			defaults := values(processCmd(t, p.path, nil))
			got, want := values(fromFile), values(fromFlags)
			for name, w := range want {
				if got[name] != w {
					t.Errorf("--%s from the file = %q, from the command line %q", name, got[name], w)
				}
			}
			changed := 0
			for name := range want {
				if want[name] != defaults[name] {
					changed++
				}
			}
			if changed < 3 {
				t.Errorf("the example changes %d flags from their defaults", changed)
			}
		})
	}
}

// Refused configuration ends with exit code 2 (usage), naming the file, the key or the
// variable; a value of --store is not repeated.
func TestConfigRefusedExitUsage(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing.yaml")
	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		want   []string
		absent string
	}{
		{name: "server missing file", args: []string{"server", "--config", missing},
			want: []string{"config file " + missing + " does not exist"}},
		{name: "server missing file from env", env: map[string]string{"BCD_CONFIG": missing}, args: []string{"server"},
			want: []string{"does not exist", "$BCD_CONFIG"}},
		{name: "site run missing file", args: []string{"site", "run", "--config", missing},
			want: []string{"does not exist", "$BCD_SITE_CONFIG"}},
		{name: "unknown key", args: []string{"server", "--config", write("u.yaml", "listen: 127.0.0.1:0\nhistory_retention: 1h\n")},
			want: []string{"u.yaml line 2", `unknown key "history_retention" (did you mean "history-retention"?)`}},
		{name: "bad value", args: []string{"server", "--config", write("b.yaml", "approval-timeout: a week\n")},
			want: []string{"b.yaml line 1", "approval-timeout", "a duration such as 90s"}},
		{name: "bad env", env: map[string]string{"BCD_HISTORY_RETENTION": "90 days"}, args: []string{"server"},
			want: []string{"$BCD_HISTORY_RETENTION", `"90 days"`}},
		{name: "secret not repeated", args: []string{"server", "--config", write("s.yaml", "store: [postgres://bcd:hunter2@db/bcd]\n")},
			want: []string{"s.yaml line 1", "store takes one value"}, absent: "hunter2"},
		{name: "env checked after the file", env: map[string]string{"BCD_HISTORY_RETENTION": "1m"}, args: []string{"server", "--config", write("r.yaml", "history-retention: 720h\n")},
			want: []string{"--history-retention 1m0s: use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := run(t, tc.env, tc.args...)
			if code != exitUsage {
				t.Errorf("exit code %d, want %d\n%s", code, exitUsage, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr %q lacks %q", errs, w)
				}
			}
			if tc.absent != "" && strings.Contains(errs, tc.absent) {
				t.Errorf("stderr %q repeats %q", errs, tc.absent)
			}
		})
	}
}

// The environment variables docs/operations.md names for the processes' flags are those read.
func TestDocumentedEnvNames(t *testing.T) {
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	server := processCmd(t, []string{"server"}, nil).LocalFlags()
	site := processCmd(t, []string{"site", "run"}, nil).LocalFlags()
	row := regexp.MustCompile("^\\| ((?:`--[a-z0-9-]+`(?:, )?)+)[^|]*\\| ((?:`BCD_[A-Z0-9_]+`(?:, )?)+) \\|")
	checked := 0
	for _, l := range strings.Split(string(ops), "\n") {
		m := row.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		flags, envs := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		if len(flags) != len(envs) {
			continue
		}
		for i := range flags {
			flag, env := strings.Trim(flags[i], "`-"), strings.Trim(envs[i], "`")
			spec, set := serverSpec(), server
			if strings.HasPrefix(env, "BCD_SITE_") {
				spec, set = sitecmd.Spec(), site
			}
			if set.Lookup(flag) == nil {
				continue // another command's flag
			}
			if got := spec.EnvName(flag); got != env {
				t.Errorf("docs/operations.md: --%s is read from $%s; the code reads $%s", flag, env, got)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Errorf("checked %d documented variables: the tables were not found", checked)
	}
	if got := sitecmd.Spec().EnvName("join-token"); got != sitecmd.JoinTokenEnv {
		t.Errorf("--join-token is read from $%s, documented as $%s", got, sitecmd.JoinTokenEnv)
	}
}

// unit is a systemd unit file: its keys by "Section.Key", every value of a key given again.
func unit(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, section := map[string][]string{}, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("%s: line %q is no KEY=VALUE", path, l)
			}
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The systemd units shipped run commands and flags bcd has, with the config file shipped beside
// them, and what docs/operations.md says of them (90 s to stop, restarted on failure); with
// systemd-analyze installed, systemd finds nothing to warn about in them.
func TestSystemdUnits(t *testing.T) {
	for _, tc := range []struct {
		unit, config string
		path         []string
	}{
		{"bcd-server.service", "server.yaml", []string{"server"}},
		{"bcd-site.service", "site.yaml", []string{"site", "run"}},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			file := filepath.Join("../../deploy/systemd", tc.unit)
			u := unit(t, file)
			for key, want := range map[string]string{
				"Service.Type":               "simple", // bcd sends no sd_notify
				"Service.Restart":            "on-failure",
				"Service.TimeoutStopSec":     "90s",
				"Service.NoNewPrivileges":    "yes",
				"Service.ProtectSystem":      "strict",
				"Service.EnvironmentFile":    "-/etc/bcd/" + strings.TrimSuffix(tc.config, ".yaml") + ".env",
				"Install.WantedBy":           "multi-user.target",
				"Service.StateDirectoryMode": "0700",
			} {
				if got := u[key]; len(got) != 1 || got[0] != want {
					t.Errorf("%s = %q, want %q", key, got, want)
				}
			}
			exec := u["Service.ExecStart"]
			if len(exec) != 1 {
				t.Fatalf("ExecStart %q", exec)
			}
			argv := strings.Fields(exec[0])
			if argv[0] != "/usr/local/bin/bcd" {
				t.Errorf("ExecStart runs %s", argv[0])
			}
			cmd := processCmd(t, tc.path, argv[1+len(tc.path):]) // fails on a flag bcd lacks
			if got := cmd.CommandPath(); got != "bcd "+strings.Join(tc.path, " ") {
				t.Errorf("ExecStart runs %q", got)
			}
			if got, _ := cmd.Flags().GetString(flagconfig.ConfigFlag); got != "/etc/bcd/"+tc.config {
				t.Errorf("ExecStart's --config %q, want /etc/bcd/%s", got, tc.config)
			}
			if _, err := os.Stat(filepath.Join("../../deploy/systemd", tc.config)); err != nil {
				t.Errorf("the config file ExecStart names is not shipped: %v", err)
			}
			// The data dir of the example config is the unit's writable state directory.
			dataDir := processCmd(t, tc.path, []string{"--config", filepath.Join("../../deploy/systemd", tc.config)})
			if err := flagconfig.Apply(dataDir.LocalFlags(), flagconfig.Spec{EnvPrefix: "X_"}, flagconfig.Source{Getenv: func(string) string { return "" }, ReadFile: os.ReadFile}); err != nil {
				t.Fatal(err)
			}
			dd, _ := dataDir.Flags().GetString("data-dir")
			if rw := u["Service.ReadWritePaths"]; len(rw) != 1 || rw[0] != dd || "/var/lib/"+u["Service.StateDirectory"][0] != dd {
				t.Errorf("data-dir %s; ReadWritePaths %q, StateDirectory %q", dd, rw, u["Service.StateDirectory"])
			}
			systemdVerify(t, file)
		})
	}
}

// systemdVerify runs systemd-analyze verify on the unit, its ExecStart pointed at an executable
// that exists, and fails on any warning about it.
func systemdVerify(t *testing.T, file string) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: unit not verified by systemd")
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), filepath.Base(file))
	if err := os.WriteFile(tmp, bytes.ReplaceAll(b, []byte("ExecStart=/usr/local/bin/bcd "), []byte("ExecStart="+self+" ")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), analyze, "verify", "--man=no", tmp).CombinedOutput()
	var warned []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, filepath.Base(file)) {
			warned = append(warned, l)
		}
	}
	if err != nil || len(warned) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", file, err, out)
	}
}
