// Package flagconfig fills the flags of a long-running process (bcd server, bcd site run) that
// its command line did not set: from the flag's environment variable, else from the process's
// config file (YAML, keys are the flags' names). Precedence: flag > environment > file >
// default.
package flagconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// ConfigFlag is the flag naming the config file; its environment variable is Spec.EnvName of it.
const ConfigFlag = "config"

// Spec is how one command's flags map to the environment.
type Spec struct {
	// EnvPrefix makes a flag's environment variable: EnvPrefix + the name in capitals, - as _.
	EnvPrefix string
	// Secret are the flags whose values no error repeats (a DSN with a password, a token).
	Secret []string
}

// EnvName is the environment variable of flag.
func (s Spec) EnvName(flag string) string {
	return s.EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Source is where Apply reads the environment and the config file.
type Source struct {
	Getenv   func(string) string
	ReadFile func(string) ([]byte, error)
}

// Error is a value of the environment or of the config file that was refused, or a config
// file that could not be read or parsed: the same command line fails again (a usage error).
type Error struct{ err error }

func (e *Error) Error() string { return e.err.Error() }
func (e *Error) Unwrap() error { return e.err }

func errorf(format string, a ...any) error { return &Error{err: fmt.Errorf(format, a...)} }

// AddConfigFlag adds --config to fs, documenting its environment variable.
func AddConfigFlag(set *pflag.FlagSet, s Spec) {
	set.String(ConfigFlag, "", "YAML file of these flags' values, keyed by flag name (lists as YAML lists); a flag given, then its env variable ("+s.EnvPrefix+"NAME, in capitals with - as _), override it (env "+s.EnvName(ConfigFlag)+")")
}

// skipped are flags no environment variable or config key sets.
func skipped(name string) bool { return name == ConfigFlag || name == "help" }

// Apply sets every flag of fs (a command's own flags, after parsing) that the command line did
// not set: from its environment variable when that is not empty, else from the config file
// (--config, or its environment variable) when the file has its key. A key of the file that is
// no flag is refused, as is a value the flag does not accept; a missing or unreadable file is
// an error. A flag set this way counts as changed.
func Apply(set *pflag.FlagSet, s Spec, src Source) error {
	path := ""
	if f := set.Lookup(ConfigFlag); f != nil {
		path = f.Value.String()
		if !f.Changed {
			path = src.Getenv(s.EnvName(ConfigFlag))
		}
	}
	var file map[string]entry
	if path != "" {
		b, err := src.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return errorf("config file %s does not exist (--%s or $%s names it)", path, ConfigFlag, s.EnvName(ConfigFlag))
		case err != nil:
			return errorf("reading config file: %w", err)
		}
		if file, err = parse(path, b, set); err != nil {
			return err
		}
	}
	var errs []error
	set.VisitAll(func(f *pflag.Flag) {
		if f.Changed || skipped(f.Name) {
			return
		}
		secret := slices.Contains(s.Secret, f.Name)
		if v := src.Getenv(s.EnvName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, errorf("$%s: %s", s.EnvName(f.Name), refusal(f, v, secret, err)))
				return
			}
			f.Changed = true
			return
		}
		e, ok := file[f.Name]
		if !ok {
			return
		}
		if err := e.set(f); err != nil {
			errs = append(errs, errorf("config file %s line %d: %s: %s", path, e.line, f.Name, refusal(f, e.shown(), secret, err)))
			return
		}
		f.Changed = true
	})
	return errors.Join(errs...)
}

// entry is one key of the config file: a scalar, or a list for a list flag.
type entry struct {
	line   int
	list   bool
	values []string
}

func (e entry) shown() string {
	if e.list {
		return "[" + strings.Join(e.values, ", ") + "]"
	}
	return e.values[0]
}

// set gives f the entry: a list replaces a list flag's value, a scalar is set as the command
// line would set it.
func (e entry) set(f *pflag.Flag) error {
	if !e.list {
		return f.Value.Set(e.values[0])
	}
	sv, ok := f.Value.(pflag.SliceValue)
	if !ok {
		return errors.New("a list where one value was expected")
	}
	return sv.Replace(e.values)
}

// refusal says a value was refused and what the flag accepts; a secret's value is not repeated.
func refusal(f *pflag.Flag, v string, secret bool, err error) string {
	what := fmt.Sprintf("value %q refused (%v)", v, err)
	if secret {
		what = "value refused"
	}
	return fmt.Sprintf("%s; accepted: %s (--%s: %s)", what, accepts(f.Value.Type()), f.Name, f.Usage)
}

// accepts is what a flag of a pflag type takes, as an operator writes it.
func accepts(typ string) string {
	switch typ {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "a whole number"
	case "float32", "float64":
		return "a number"
	case "duration":
		return "a duration such as 90s, 15m or 720h"
	case "stringSlice":
		return "a list of strings (a YAML list, or one comma-separated string)"
	case "stringArray":
		return "a list of strings (a YAML list; one string is one item)"
	}
	return "a " + typ
}

// parse reads a config file: one YAML mapping whose keys are flags of fs, each given once,
// with a scalar, or a list for a list flag. A key that is no flag is refused, naming the
// closest one and the accepted ones.
func parse(path string, b []byte, set *pflag.FlagSet) (map[string]entry, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // an empty file: no keys
		}
		return nil, errorf("config file %s: not YAML: %v", path, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		return nil, errorf("config file %s line %d: a second YAML document; one mapping of flag names to values is accepted", path, more.Line)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil // comments only
	}
	if root.Kind != yaml.MappingNode {
		return nil, errorf("config file %s line %d: want a mapping of flag names to values (listen: 127.0.0.1:7480)", path, root.Line)
	}
	var names []string
	set.VisitAll(func(f *pflag.Flag) {
		if !skipped(f.Name) {
			names = append(names, f.Name)
		}
	})
	out := map[string]entry{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, errorf("config file %s line %d: a key must be a flag's name", path, k.Line)
		}
		f := set.Lookup(k.Value)
		if f == nil || skipped(k.Value) {
			hint := ""
			if c := closest(k.Value, names); c != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", c)
			}
			return nil, errorf("config file %s line %d: unknown key %q%s; accepted keys are the flags' names: %s", path, k.Line, k.Value, hint, strings.Join(names, ", "))
		}
		if prev, ok := out[k.Value]; ok {
			return nil, errorf("config file %s line %d: key %q given again (first at line %d)", path, k.Line, k.Value, prev.line)
		}
		e := entry{line: k.Line}
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Tag == "!!null" {
				return nil, errorf("config file %s line %d: %s has no value; accepted: %s (\"\" for an empty string)", path, k.Line, k.Value, accepts(f.Value.Type()))
			}
			e.values = []string{v.Value}
		case yaml.SequenceNode:
			e.list, e.values = true, []string{}
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return nil, errorf("config file %s line %d: %s: a list item must be a single value", path, item.Line, k.Value)
				}
				e.values = append(e.values, item.Value)
			}
		default:
			return nil, errorf("config file %s line %d: %s: accepted: %s, not a mapping", path, k.Line, k.Value, accepts(f.Value.Type()))
		}
		if e.list {
			if _, ok := f.Value.(pflag.SliceValue); !ok {
				return nil, errorf("config file %s line %d: %s takes one value, not a list; accepted: %s", path, k.Line, k.Value, accepts(f.Value.Type()))
			}
		}
		out[k.Value] = e
	}
	return out, nil
}

// closest is the name nearest to key by edit distance, if near enough to be a typo.
func closest(key string, names []string) string {
	best, bestD := "", len(key)/2+2
	for _, n := range names {
		if d := distance(key, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
