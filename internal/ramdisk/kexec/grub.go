package kexec

import (
	"fmt"
	"strconv"
	"strings"
)

// grubItem is a top-level menu item: an entry, or a submenu of entries.
type grubItem struct {
	entry   *Entry
	title   string
	id      string
	submenu []Entry
}

// ParseGrub parses the menu entries of a grub.cfg ("linux"/"initrd" lines inside "menuentry"
// blocks, one level of "submenu") and returns every entry in order plus the default one per "set
// default=": an index, "N>M" into a submenu, a title or --id, or "saved" (savedEntry, from grubenv).
// Scripting (if/for/functions) is skipped, not evaluated.
func ParseGrub(text, savedEntry string) ([]Entry, Entry, error) {
	var items []grubItem
	var def string
	type block int
	const (
		blockOther block = iota
		blockEntry
		blockSubmenu
	)
	var stack []block
	var cur *Entry
	inSubmenu := func() bool {
		for _, b := range stack {
			if b == blockSubmenu {
				return true
			}
		}
		return false
	}
	for n, line := range lines(text) {
		words, err := shellWords(line)
		if err != nil {
			return nil, Entry{}, fmt.Errorf("grub.cfg line %d: %w", n+1, err)
		}
		if len(words) == 0 {
			continue
		}
		opens := words[len(words)-1] == "{"
		if opens {
			words = words[:len(words)-1]
		}
		switch {
		case len(words) == 0: // a lone "{"
			stack = append(stack, blockOther)
		case words[0] == "}":
			if len(stack) == 0 {
				return nil, Entry{}, fmt.Errorf("grub.cfg line %d: unbalanced }", n+1)
			}
			if stack[len(stack)-1] == blockEntry {
				cur = nil
			}
			stack = stack[:len(stack)-1]
		case words[0] == "set" && len(words) >= 2 && strings.HasPrefix(words[1], "default=") && len(stack) == 0:
			def = strings.TrimPrefix(words[1], "default=")
		case (words[0] == "menuentry" || words[0] == "submenu") && opens:
			if len(words) < 2 {
				return nil, Entry{}, fmt.Errorf("grub.cfg line %d: %s without a title", n+1, words[0])
			}
			id := words[1]
			for i := 2; i+1 < len(words); i++ {
				if words[i] == "--id" || words[i] == "$menuentry_id_option" {
					id = words[i+1]
				}
			}
			if words[0] == "submenu" {
				if inSubmenu() || cur != nil {
					return nil, Entry{}, fmt.Errorf("grub.cfg line %d: nested submenus are not supported", n+1)
				}
				items = append(items, grubItem{title: words[1], id: id})
				stack = append(stack, blockSubmenu)
				continue
			}
			if cur != nil {
				return nil, Entry{}, fmt.Errorf("grub.cfg line %d: menuentry inside a menuentry", n+1)
			}
			e := Entry{ID: id, Title: words[1]}
			if inSubmenu() {
				last := &items[len(items)-1]
				last.submenu = append(last.submenu, e)
				cur = &last.submenu[len(last.submenu)-1]
			} else {
				items = append(items, grubItem{entry: &e, title: e.Title, id: id})
				cur = items[len(items)-1].entry
			}
			stack = append(stack, blockEntry)
		case opens:
			stack = append(stack, blockOther) // function bodies and the like
		case cur != nil && (words[0] == "linux" || words[0] == "linuxefi" || words[0] == "linux16"):
			if len(words) < 2 {
				return nil, Entry{}, fmt.Errorf("grub.cfg line %d: linux without a path", n+1)
			}
			cur.Kernel = stripGrubDevice(words[1])
			cur.Cmdline = strings.Join(words[2:], " ")
		case cur != nil && (words[0] == "initrd" || words[0] == "initrdefi" || words[0] == "initrd16"):
			cur.Initrds = nil
			for _, w := range words[1:] {
				cur.Initrds = append(cur.Initrds, stripGrubDevice(w))
			}
		}
	}
	if len(stack) != 0 {
		return nil, Entry{}, fmt.Errorf("grub.cfg: %d unclosed blocks", len(stack))
	}
	var all []Entry
	for _, it := range items {
		if it.entry != nil {
			all = append(all, *it.entry)
		}
		all = append(all, it.submenu...)
	}
	chosen, err := grubDefault(items, def, savedEntry)
	if err != nil {
		return all, Entry{}, err
	}
	if chosen.Kernel == "" {
		return all, Entry{}, fmt.Errorf("grub default entry %q has no linux line", chosen.Title)
	}
	return all, chosen, nil
}

func grubDefault(items []grubItem, def, saved string) (Entry, error) {
	if len(items) == 0 {
		return Entry{}, fmt.Errorf("grub.cfg has no menu entries")
	}
	if def == "saved" || def == "${saved_entry}" || def == "$saved_entry" {
		def = saved
	}
	if def == "" {
		def = "0"
	}
	pick := func(it grubItem, sub string) (Entry, bool) {
		if it.entry != nil {
			return *it.entry, sub == ""
		}
		if len(it.submenu) == 0 {
			return Entry{}, false
		}
		if sub == "" {
			return it.submenu[0], true
		}
		if i, err := strconv.Atoi(sub); err == nil {
			if i >= 0 && i < len(it.submenu) {
				return it.submenu[i], true
			}
			return Entry{}, false
		}
		for _, e := range it.submenu {
			if e.Title == sub || e.ID == sub {
				return e, true
			}
		}
		return Entry{}, false
	}
	top, sub, _ := strings.Cut(def, ">")
	if i, err := strconv.Atoi(top); err == nil {
		if i < 0 || i >= len(items) {
			return Entry{}, fmt.Errorf("grub default %q is out of range (%d items)", def, len(items))
		}
		if e, ok := pick(items[i], sub); ok {
			return e, nil
		}
		return Entry{}, fmt.Errorf("grub default %q does not name an entry", def)
	}
	for _, it := range items {
		if it.title == top || it.id == top {
			if e, ok := pick(it, sub); ok {
				return e, nil
			}
		}
		// A bare title or id of an entry inside a submenu is accepted too.
		if sub == "" {
			for _, e := range it.submenu {
				if e.Title == top || e.ID == top {
					return e, nil
				}
			}
		}
	}
	return Entry{}, fmt.Errorf("grub default %q does not name an entry", def)
}

// stripGrubDevice turns "(hd0,gpt2)/vmlinuz" or "($root)/vmlinuz" into "/vmlinuz".
func stripGrubDevice(p string) string {
	if strings.HasPrefix(p, "(") {
		if i := strings.IndexByte(p, ')'); i >= 0 {
			return p[i+1:]
		}
	}
	return p
}

// shellWords splits a grub script line into words, honouring single and double quotes and
// backslash escapes. A trailing comment is dropped.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else if c == '\\' && quote == '"' && i+1 < len(line) {
				i++
				cur.WriteByte(line[i])
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
