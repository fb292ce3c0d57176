// Package kexec boots the OS the ramdisk just wrote without a firmware reboot (boot.kexec and
// the fast-track window, seed 003 phase 0.9): it mounts the written disk's boot partition
// read-only, finds the default kernel, initrd and command line in its boot loader configuration
// (Boot Loader Specification entries, extlinux.conf, grub.cfg), loads them with kexec_file_load and
// jumps. If anything fails it falls back to a plain reboot through a hook.
//
// The parsers are pure functions over the configuration text; the mount, the kexec syscalls and
// the reboot sit behind small interfaces with dry-run implementations for tests.
package kexec

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Entry is one bootable entry of a boot loader configuration.
type Entry struct {
	ID      string   `json:"id"` // BLS file name, extlinux label, grub --id (or title)
	Title   string   `json:"title"`
	Version string   `json:"version"`
	Kernel  string   `json:"kernel"`  // path as written in the configuration
	Initrds []string `json:"initrds"` // idem, in order
	Cmdline string   `json:"cmdline"`
}

// ParseBLS parses one Boot Loader Specification type #1 entry (loader/entries/*.conf).
func ParseBLS(id, text string) (Entry, error) {
	e := Entry{ID: strings.TrimSuffix(id, ".conf")}
	var opts []string
	for n, line := range lines(text) {
		key, val := splitKey(line)
		switch key {
		case "":
			continue
		case "title":
			e.Title = val
		case "version":
			e.Version = val
		case "linux":
			e.Kernel = val
		case "initrd":
			for f := range strings.FieldsSeq(val) {
				e.Initrds = append(e.Initrds, f)
			}
		case "options":
			opts = append(opts, val)
		case "efi":
			return Entry{}, fmt.Errorf("BLS entry %s line %d: EFI program entries cannot be kexec'd", id, n+1)
		}
	}
	if e.Kernel == "" {
		return Entry{}, fmt.Errorf("BLS entry %s has no linux line", id)
	}
	e.Cmdline = strings.Join(opts, " ")
	return e, nil
}

// SelectBLS picks the default among entries: loader.conf's "default" (a glob over entry IDs)
// when it matches, otherwise the entry with the highest version (then the highest ID), which is
// what systemd-boot does for entries without sort keys.
func SelectBLS(entries []Entry, loaderConf string) (Entry, error) {
	if len(entries) == 0 {
		return Entry{}, fmt.Errorf("no BLS entries")
	}
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b Entry) int {
		return cmp.Or(-compareVersions(a.Version, b.Version), -compareVersions(a.ID, b.ID))
	})
	for _, line := range lines(loaderConf) {
		if key, val := splitKey(line); key == "default" && val != "" && val != "@saved" {
			pattern := strings.TrimSuffix(val, ".conf")
			for _, e := range sorted {
				if ok, _ := path.Match(pattern, e.ID); ok {
					return e, nil
				}
			}
		}
	}
	return sorted[0], nil
}

// compareVersions compares version strings the way people expect: runs of digits numerically.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		da, db := unicode.IsDigit(rune(a[0])), unicode.IsDigit(rune(b[0]))
		if da != db {
			if da {
				return 1
			}
			return -1
		}
		ra, rb := run(a, da), run(b, db)
		var c int
		if da {
			na, _ := strconv.ParseUint(strings.TrimLeft(ra, "0"), 10, 64)
			nb, _ := strconv.ParseUint(strings.TrimLeft(rb, "0"), 10, 64)
			c = cmp.Compare(na, nb)
		} else {
			c = strings.Compare(ra, rb)
		}
		if c != 0 {
			return c
		}
		a, b = a[len(ra):], b[len(rb):]
	}
	return cmp.Compare(len(a), len(b))
}

func run(s string, digits bool) string {
	i := 0
	for i < len(s) && unicode.IsDigit(rune(s[i])) == digits {
		i++
	}
	return s[:i]
}

// ParseExtlinux parses an extlinux.conf/syslinux.cfg and returns its entries and the default.
// Keywords are case-insensitive; "APPEND initrd=…" is honoured when there is no INITRD line.
func ParseExtlinux(text string) ([]Entry, int, error) {
	var entries []Entry
	var def string
	cur := -1
	for _, line := range lines(text) {
		key, val := splitKey(line)
		key = strings.ToLower(key)
		switch key {
		case "default", "ontimeout":
			if key == "default" || def == "" {
				def = val
			}
		case "label":
			entries = append(entries, Entry{ID: val, Title: val})
			cur = len(entries) - 1
		}
		if cur < 0 {
			continue
		}
		e := &entries[cur]
		switch key {
		case "menu":
			if rest, ok := strings.CutPrefix(val, "label "); ok || strings.HasPrefix(strings.ToLower(val), "label ") {
				if !ok {
					rest = val[len("label "):]
				}
				e.Title = strings.TrimSpace(rest)
			}
		case "kernel", "linux":
			e.Kernel = val
		case "initrd":
			e.Initrds = splitList(val)
		case "append":
			var args []string
			for f := range strings.FieldsSeq(val) {
				if v, ok := strings.CutPrefix(f, "initrd="); ok {
					if len(e.Initrds) == 0 {
						e.Initrds = splitList(v)
					}
					continue
				}
				args = append(args, f)
			}
			e.Cmdline = strings.Join(args, " ")
		}
	}
	var bootable []Entry
	defIdx := -1
	for _, e := range entries {
		if e.Kernel == "" {
			continue // e.g. "LABEL local / LOCALBOOT 0"
		}
		if def != "" && defIdx < 0 && (e.ID == def || e.Title == def) {
			defIdx = len(bootable)
		}
		bootable = append(bootable, e)
	}
	if len(bootable) == 0 {
		return nil, 0, fmt.Errorf("extlinux configuration has no entry with a kernel")
	}
	return bootable, max(defIdx, 0), nil
}

func splitList(v string) []string {
	var out []string
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// lines splits text into trimmed, non-comment lines.
func lines(text string) []string {
	var out []string
	for l := range strings.Lines(text) {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			out = append(out, "")
			continue
		}
		out = append(out, l)
	}
	return out
}

// splitKey splits "key   value" at the first run of blanks.
func splitKey(line string) (string, string) {
	i := strings.IndexFunc(line, unicode.IsSpace)
	if i < 0 {
		return line, ""
	}
	return line[:i], strings.TrimSpace(line[i:])
}
