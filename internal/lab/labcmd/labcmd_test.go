package labcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"bcd/internal/lab"
)

func TestSupervisorArgvFollowsTheTree(t *testing.T) {
	tests := []struct {
		name  string
		mount func(l *cobra.Command) *cobra.Command // returns the root
		want  []string
	}{
		{"under root", func(l *cobra.Command) *cobra.Command {
			root := &cobra.Command{Use: "bcd"}
			root.AddCommand(l)
			return root
		}, []string{"lab", "supervise"}},
		{"nested", func(l *cobra.Command) *cobra.Command {
			root, dev := &cobra.Command{Use: "bcd"}, &cobra.Command{Use: "dev"}
			root.AddCommand(dev)
			dev.AddCommand(l)
			return root
		}, []string{"dev", "lab", "supervise"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := Command()
			tt.mount(l)
			var up *cobra.Command
			for _, c := range l.Commands() {
				if c.Name() == "up" {
					up = c
				}
			}
			argv, err := supervisorArgv(up)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(argv[1:], tt.want) || !filepath.IsAbs(argv[0]) {
				t.Errorf("argv = %q, want <exe> %q", argv, tt.want)
			}
		})
	}
}

func TestStatusOutput(t *testing.T) {
	dir := t.TempDir()
	spec, err := lab.Plan(lab.Options{VMs: 2, Firmware: lab.ChoiceMixed, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := jsonOf(spec)
	if err := os.WriteFile(filepath.Join(dir, lab.SpecFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want []string
		err  string
	}{
		{args: []string{"status", "--dir", dir}, want: []string{"lab " + dir + ": down", "netns bcdlab", "bridge 172.30.0.1/24"}},
		{args: []string{"status", "--dir", dir, "-o", "json"}, want: []string{`"running": false`, `"netns": "bcdlab"`}},
		{args: []string{"status", "--dir", dir, "-o", "yaml"}, err: "accepted are table, json"},
		{args: []string{"status", "--dir", filepath.Join(dir, "nothing")}, err: "no lab in"},
		{args: []string{"up", "--vms", "0", "--dir", dir}, err: "0 VMs"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			root := &cobra.Command{Use: "bcd", SilenceUsage: true, SilenceErrors: true}
			root.AddCommand(Command())
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(append([]string{"lab"}, tt.args...))
			err := root.ExecuteContext(context.Background())
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	st := lab.LabStatus{Dir: "/lab", NetNS: "bcdlab", Running: true, SupervisorPID: 42, Bridge: "172.30.0.1/24", Credentials: "/lab/credentials.json",
		VMs: []lab.VMStatus{{Name: "lab-0", Firmware: lab.FirmwareBIOS, MAC: "02:bc:d1:ab:00:00", Power: "on",
			RedfishURL: "https://172.30.0.1:8000", IPMIAddr: "172.30.0.1:6230", Console: "/lab/lab-0/console.log"}}}
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "running (supervisor pid 42)") ||
		strings.Join(strings.Fields(lines[2]), " ") != "lab-0 bios 02:bc:d1:ab:00:00 on https://172.30.0.1:8000 172.30.0.1:6230 /lab/lab-0/console.log" {
		t.Errorf("table:\n%s", b.String())
	}
}

func jsonOf(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }
