package cli

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestCLIReferenceMatchesHelp: docs/cli.md says it is `bcd COMMAND --help`, one line per
// command and per flag. Every command of the help is there with its line, and its flags are
// exactly those the command has, with their help and default; nothing else is there.
func TestCLIReferenceMatchesHelp(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{} // command line → its flag lines
	cur := ""
	for _, l := range strings.Split(string(doc), "\n") {
		switch {
		case strings.HasPrefix(l, "`bcd "):
			cur = l
			documented[cur] = []string{}
		case strings.HasPrefix(l, "#"):
			cur = ""
		case cur != "" && strings.HasPrefix(l, "- `"):
			documented[cur] = append(documented[cur], l)
		}
	}
	root := newRoot(Env{Getenv: func(string) string { return "" }, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	helped := map[string][]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		if c.Runnable() && c.HasParent() {
			line := "`" + c.Parent().CommandPath() + " " + c.Use + "`: " + c.Short
			var flags []string
			c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
				if !f.Hidden && f.Name != "help" {
					flags = append(flags, flagLine(f))
				}
			})
			slices.Sort(flags)
			helped[line] = flags
		}
		for _, s := range c.Commands() {
			if s.Name() != "help" && s.Name() != "completion" {
				walk(s)
			}
		}
	}
	walk(root)
	for line, flags := range helped {
		doc, ok := documented[line]
		if !ok {
			t.Errorf("docs/cli.md lacks the command line\n%s", line)
			continue
		}
		slices.Sort(doc)
		if !slices.Equal(doc, flags) {
			t.Errorf("%s\nflags in docs/cli.md:\n%s\nflags in its help:\n%s", line, strings.Join(doc, "\n"), strings.Join(flags, "\n"))
		}
	}
	for line := range documented {
		if _, ok := helped[line]; !ok {
			t.Errorf("docs/cli.md documents a command line the help does not have:\n%s", line)
		}
	}
}

// flagLine is a flag as docs/cli.md lists it: "- `--name type` usage (default x)".
func flagLine(f *pflag.Flag) string {
	name, usage := pflag.UnquoteUsage(f)
	s := "- `--" + f.Name
	if f.Shorthand != "" {
		s = "- `-" + f.Shorthand + ", --" + f.Name
	}
	if name != "" {
		s += " " + name
	}
	s += "` " + usage
	switch f.DefValue {
	case "", "false", "0", "[]", "0s":
	default:
		if name == "string" {
			s += fmt.Sprintf(" (default %q)", f.DefValue)
		} else {
			s += fmt.Sprintf(" (default %s)", f.DefValue)
		}
	}
	return s
}
