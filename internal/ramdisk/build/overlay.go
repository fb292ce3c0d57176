package build

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"bcd/internal/ramdisk/initsys"
)

// protected are the initramfs paths an overlay can never replace (nor put anything under):
// the bcd binary PID 1 runs, and the link to it.
var protected = []struct{ Name, What string }{
	{"init", "the ramdisk's /init (the bcd binary)"},
	{"bin/bcd", "/bin/bcd (the link to the bcd binary)"},
}

// AddOverlay adds the tree under root (an operator's directory: DCGM, a GPU driver's modules
// and libraries) to the archive: directories, regular files and symbolic links, their
// permission bits kept (setuid, setgid and sticky included), owned by root. A symlink is copied
// as a link, never followed; a relative target that climbs above the initramfs root is refused.
// Device nodes, FIFOs and sockets are refused, as is anything that would replace or shadow
// /init or /bin/bcd, or a file already in the archive (built in, or from an earlier overlay).
// A directory already in the archive keeps its mode (/tmp stays 1777). Every error names the
// path in the overlay.
//
// One file is merged rather than refused: an overlay's lib/modules/<release>/load-order, where
// the ramdisk has one for that kernel release, is appended to it, so that PID 1 loads the
// overlay's modules (a GPU driver built for that kernel) after the ramdisk's own. Each of its
// lines names a module file the overlay puts in that directory, not one already listed.
func AddOverlay(a *Archive, root string) error {
	resolved, err := filepath.EvalSymlinks(root)
	if err != nil {
		return fmt.Errorf("overlay %s: %w", root, err)
	}
	if st, err := os.Stat(resolved); err != nil || !st.IsDir() {
		return fmt.Errorf("overlay %s: not a directory", root)
	}
	type order struct {
		name    string // the ramdisk's load-order file
		modules []string
	}
	var orders []order
	err = filepath.WalkDir(resolved, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("overlay %s: %w", root, err)
		}
		rel, err := filepath.Rel(resolved, p)
		if err != nil {
			return fmt.Errorf("overlay %s: %w", root, err)
		}
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		if old, ok := a.entries[name]; ok && isLoadOrder(name) && old.typ() == TypeRegular && d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err == nil {
				var mods []string
				if mods, err = initsys.ParseLoadOrder(data); err == nil {
					orders = append(orders, order{name, mods})
					return nil
				}
			}
			return fmt.Errorf("overlay %s: %s: %w", root, name, err)
		}
		if err := overlayEntry(a, p, name, d); err != nil {
			return fmt.Errorf("overlay %s: %s: %w", root, name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, o := range orders {
		e := a.entries[o.name]
		listed, err := initsys.ParseLoadOrder(e.Data)
		if err != nil {
			return fmt.Errorf("overlay %s: %s: the ramdisk's: %w", root, o.name, err)
		}
		data := slices.Clone(e.Data)
		for _, m := range o.modules {
			file := path.Join(path.Dir(o.name), m)
			if slices.Contains(listed, m) {
				return fmt.Errorf("overlay %s: %s: module %s is listed already", root, o.name, m)
			}
			if f, ok := a.entries[file]; !ok || f.typ() != TypeRegular {
				return fmt.Errorf("overlay %s: %s: module %s is not in the overlay (put the file at %s)", root, o.name, m, file)
			}
			listed = append(listed, m)
			data = append(data, m+"\n"...)
		}
		e.Data = data
		a.entries[o.name] = e
	}
	return nil
}

// isLoadOrder reports whether name is a kernel release's module load order in the initramfs.
func isLoadOrder(name string) bool {
	dir, file := path.Split(name)
	release := strings.TrimSuffix(strings.TrimPrefix(dir, ModulesDir+"/"), "/")
	return file == LoadOrderFile && dir == ModulesDir+"/"+release+"/" && release != "" && !strings.Contains(release, "/")
}

// overlayEntry adds one entry of an overlay: file is its path on disk, name its path in the
// archive.
func overlayEntry(a *Archive, file, name string, d fs.DirEntry) error {
	for _, p := range protected {
		if name == p.Name || strings.HasPrefix(name, p.Name+"/") {
			return fmt.Errorf("would replace %s", p.What)
		}
	}
	info, err := d.Info()
	if err != nil {
		return err
	}
	perm := unixPerm(info.Mode())
	if old, ok := a.entries[name]; ok {
		if old.typ() == TypeDir && d.IsDir() {
			return nil // the ramdisk's directory keeps its mode
		}
		return errors.New("already in the ramdisk (built in, or from an earlier overlay): an overlay adds files, it does not replace them")
	}
	switch t := info.Mode().Type(); {
	case t == 0:
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		return a.AddFile(name, perm, data)
	case t == fs.ModeDir:
		return a.AddDir(name, perm)
	case t == fs.ModeSymlink:
		target, err := os.Readlink(file)
		if err != nil {
			return err
		}
		if !path.IsAbs(target) {
			if j := path.Join(path.Dir(name), target); j == ".." || strings.HasPrefix(j, "../") {
				return fmt.Errorf("symlink to %q points outside the ramdisk's root", target)
			}
		}
		return a.AddSymlink(name, target)
	default:
		return fmt.Errorf("is a %s: an overlay holds only files, directories and symlinks", typeName(t))
	}
}

func typeName(t fs.FileMode) string {
	switch {
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "block device"
	case t&fs.ModeNamedPipe != 0:
		return "FIFO"
	case t&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file (" + t.String() + ")"
}

// unixPerm is the permission bits of m as a cpio mode holds them.
func unixPerm(m fs.FileMode) uint32 {
	perm := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		perm |= 0o1000
	}
	return perm
}
