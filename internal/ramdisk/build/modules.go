package build

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// Modinfo is what the build needs from a kernel module's .modinfo section.
type Modinfo struct {
	Name     string   // name= (the module's name, underscores)
	Depends  []string // depends=, in the order listed
	Vermagic string   // vermagic=
}

// ParseModinfo reads the .modinfo section of a kernel module (an ELF relocatable object):
// NUL-separated key=value strings.
func ParseModinfo(r io.ReaderAt) (Modinfo, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return Modinfo{}, fmt.Errorf("reading module ELF: %w", err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return Modinfo{}, fmt.Errorf("reading module ELF: no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return Modinfo{}, fmt.Errorf("reading module .modinfo: %w", err)
	}
	return parseModinfoSection(data), nil
}

func parseModinfoSection(data []byte) Modinfo {
	var mi Modinfo
	for _, field := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(field), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			mi.Name = v
		case "vermagic":
			mi.Vermagic = v
		case "depends":
			for d := range strings.SplitSeq(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.Depends = append(mi.Depends, ModuleName(d))
				}
			}
		}
	}
	return mi
}

// ModuleName normalises a module name or file path to the kernel's spelling: base name
// without .ko (or .ko.xz/.ko.zst), dashes as underscores.
func ModuleName(s string) string {
	s = path.Base(s)
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// LoadOrder returns the modules to load for roots, dependencies first: a depth-first walk
// over deps (module → the modules it depends on), roots in the order given, each module
// once. A root or dependency absent from deps, and a dependency cycle, are errors that name
// the modules involved.
func LoadOrder(deps map[string][]string, roots []string) ([]string, error) {
	const (
		unseen = iota
		visiting
		done
	)
	state := map[string]int{}
	var order, stack []string
	var visit func(name, neededBy string) error
	visit = func(name, neededBy string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			i := slices.Index(stack, name)
			cycle := append(slices.Clone(stack[i:]), name)
			return fmt.Errorf("module dependency cycle: %s", strings.Join(cycle, " -> "))
		}
		d, ok := deps[name]
		if !ok {
			if neededBy == "" {
				return fmt.Errorf("module %s: not found in the kernel package", name)
			}
			return fmt.Errorf("module %s (needed by %s): not found in the kernel package", name, neededBy)
		}
		state[name] = visiting
		stack = append(stack, name)
		for _, dep := range d {
			if err := visit(dep, name); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, r := range roots {
		if err := visit(ModuleName(r), ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}
