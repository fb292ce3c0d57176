// Package initsys is PID 1 of the bcd ramdisk: it mounts the kernel file systems, gives
// itself a console, loads the kernel modules in the order the build wrote, reaps orphans,
// sets the hostname, brings up lo, then runs the agent. It never returns: a fatal error is
// printed on the console and the machine powers off (or reboots) after a delay, so a broken
// ramdisk never turns into a kernel panic loop.
//
// Side effects sit behind the System interface; Linux is the real one, tested by booting
// QEMU (see the ramdiskcmd tests); unit tests use a fake.
package initsys

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"
)

// Console markers the QEMU boot test and operators watch for.
const (
	MarkerInitOK = "bcd-ramdisk: init ok"
	MarkerFatal  = "bcd-ramdisk: FATAL:"
)

// Mount is one file system PID 1 mounts.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
	Perm                   os.FileMode
}

// Mounter mounts a file system.
type Mounter interface {
	Mount(m Mount) error
}

// ModuleLoader loads one kernel module file (finit_module) with its parameters
// ("name=value name2=value2", or "").
type ModuleLoader interface {
	LoadModule(path, params string) error
}

// System is everything PID 1 does to the machine.
type System interface {
	Mounter
	ModuleLoader
	// Console reopens stdin, stdout and stderr on /dev/console and returns it for writing.
	Console() (io.Writer, error)
	SetHostname(name string) error
	LinkUp(name string) error
	KernelRelease() (string, error)
	ReadFile(name string) ([]byte, error)
	// PowerOff powers the machine off (reboot=false) or reboots it; it returns only on error.
	PowerOff(reboot bool) error
}

// Config of the init system.
type Config struct {
	Hostname   string        // default "bcd-ramdisk"
	FatalDelay time.Duration // how long a fatal error stays on the console; default 60 s
	// FatalReboot reboots instead of powering off after a fatal error.
	FatalReboot bool
	// Agent runs after start-up; it should run until ctx ends. When it returns an error, the
	// error is fatal; when it returns nil, PID 1 keeps running (reaping) until ctx ends.
	Agent func(ctx context.Context, console io.Writer, log *slog.Logger) error
}

// StandardMounts are the file systems of the ramdisk, in order.
func StandardMounts() []Mount {
	const nosuid, nodev, noexec = 0x2, 0x4, 0x8 // MS_NOSUID, MS_NODEV, MS_NOEXEC
	return []Mount{
		{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: nosuid, Data: "mode=0755", Perm: 0o755},
		{Source: "proc", Target: "/proc", FSType: "proc", Flags: nosuid | nodev | noexec, Perm: 0o555},
		{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: nosuid | nodev | noexec, Perm: 0o555},
		{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: nosuid | nodev, Data: "mode=0755", Perm: 0o755},
		{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: nosuid | nodev, Data: "mode=1777", Perm: 0o1777},
		{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: nosuid | noexec, Data: "gid=5,mode=0620,ptmxmode=0666", Perm: 0o755},
	}
}

// MountAll mounts every file system in order; a file system already mounted is fine.
func MountAll(sys Mounter, mounts []Mount) error {
	for _, m := range mounts {
		if err := sys.Mount(m); err != nil {
			return fmt.Errorf("mounting %s on %s: %w", m.FSType, m.Target, err)
		}
	}
	return nil
}

// ModuleResult is the outcome of loading one module.
type ModuleResult struct {
	Name string
	Err  error // nil when loaded or already loaded
}

// ParseLoadOrder reads the load-order file: module file names, one a line; blank lines and
// #-comments ignored; no path separators allowed.
func ParseLoadOrder(data []byte) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.ContainsAny(line, "/\x00") || line == "." || line == ".." || !strings.HasSuffix(line, ".ko") {
			return nil, fmt.Errorf("load order line %d: %q is not a module file name", n, line)
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading load order: %w", err)
	}
	return out, nil
}

// LoadModules loads the modules in order, each with its parameters from params (by module
// name, as ModuleParams gives them). A module that fails (a driver for hardware that is absent
// may refuse to load) does not stop the others: every outcome is returned.
func LoadModules(ctx context.Context, l ModuleLoader, dir string, files []string, params map[string]string) []ModuleResult {
	out := make([]ModuleResult, 0, len(files))
	for _, f := range files {
		name := strings.TrimSuffix(f, ".ko")
		if ctx.Err() != nil {
			out = append(out, ModuleResult{Name: name, Err: ctx.Err()})
			continue
		}
		out = append(out, ModuleResult{Name: name, Err: l.LoadModule(path.Join(dir, f), params[moduleKey(name)])})
	}
	return out
}

// moduleKey is a module's name as the kernel compares it: '-' and '_' are the same.
func moduleKey(name string) string { return strings.ReplaceAll(name, "-", "_") }

// ModuleParams returns the parameters the kernel command line gives loadable modules
// ("module.param=value", "module.flag"), joined per module as finit_module takes them. The
// kernel applies such parameters itself only to built-in modules; for a module loaded later,
// the loader passes them (as modprobe does). Quoted values keep their spaces; words after "--"
// belong to init and are not read.
func ModuleParams(cmdline string) map[string]string {
	out := map[string]string{}
	for _, w := range CmdlineWords(cmdline) {
		if w == "--" {
			break
		}
		key, _, _ := strings.Cut(w, "=")
		mod, param, ok := strings.Cut(key, ".")
		if !ok || mod == "" || param == "" {
			continue
		}
		arg := moduleKey(param) + w[len(key):]
		mod = moduleKey(mod)
		if prev := out[mod]; prev != "" {
			arg = prev + " " + arg
		}
		out[mod] = arg
	}
	return out
}

// CmdlineWords splits a kernel command line as the kernel does (next_arg): on spaces outside
// double quotes. A quoted value keeps its quotes, as finit_module's parser expects them.
func CmdlineWords(s string) []string {
	var out []string
	var w strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			w.WriteRune(r)
		case !quoted && (r == ' ' || r == '\t' || r == '\n'):
			if w.Len() > 0 {
				out = append(out, w.String())
				w.Reset()
			}
		default:
			w.WriteRune(r)
		}
	}
	if w.Len() > 0 {
		out = append(out, w.String())
	}
	return out
}

// Init is PID 1's start-up, up to and including the "init ok" marker. It returns the console
// to write on; errors are fatal.
func Init(ctx context.Context, sys System, cfg Config, log *slog.Logger) (io.Writer, *slog.Logger, error) {
	if err := MountAll(sys, StandardMounts()[:1]); err != nil {
		return nil, log, err
	}
	console, err := sys.Console()
	if err != nil {
		return nil, log, fmt.Errorf("opening /dev/console: %w", err)
	}
	log = slog.New(slog.NewTextHandler(console, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := MountAll(sys, StandardMounts()[1:]); err != nil {
		return console, log, err
	}
	rel, err := sys.KernelRelease()
	if err != nil {
		return console, log, fmt.Errorf("reading kernel release: %w", err)
	}
	dir := path.Join("/lib/modules", rel)
	data, err := sys.ReadFile(path.Join(dir, "load-order"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		log.WarnContext(ctx, "no modules for this kernel in the initramfs", "release", rel)
	case err != nil:
		return console, log, fmt.Errorf("reading module load order: %w", err)
	default:
		files, err := ParseLoadOrder(data)
		if err != nil {
			return console, log, err
		}
		var params map[string]string
		if cmdline, err := sys.ReadFile("/proc/cmdline"); err != nil {
			log.WarnContext(ctx, "modules load without the kernel command line's parameters", "err", err)
		} else {
			params = ModuleParams(string(cmdline))
		}
		start := time.Now()
		loaded, failed := 0, 0
		for _, r := range LoadModules(ctx, sys, dir, files, params) {
			if r.Err != nil {
				failed++
				log.WarnContext(ctx, "module not loaded", "module", r.Name, "err", r.Err)
				continue
			}
			loaded++
		}
		log.InfoContext(ctx, "modules loaded", "loaded", loaded, "failed", failed, "took", time.Since(start).Round(time.Millisecond))
	}
	host := cfg.Hostname
	if host == "" {
		host = "bcd-ramdisk"
	}
	if err := sys.SetHostname(host); err != nil {
		return console, log, fmt.Errorf("setting hostname: %w", err)
	}
	if err := sys.LinkUp("lo"); err != nil {
		return console, log, fmt.Errorf("bringing up lo: %w", err)
	}
	fmt.Fprintln(console, MarkerInitOK)
	return console, log, nil
}

// Fatal prints err on the console, waits delay (or until ctx ends) and powers off or
// reboots. If that fails too, it waits forever rather than return: PID 1 must not exit.
func Fatal(ctx context.Context, sys System, console io.Writer, cfg Config, err error) {
	if console == nil {
		console = os.Stderr
	}
	delay := cfg.FatalDelay
	if delay <= 0 {
		delay = 60 * time.Second
	}
	action := "powering off"
	if cfg.FatalReboot {
		action = "rebooting"
	}
	fmt.Fprintf(console, "%s %v\n%s in %s\n", MarkerFatal, err, "bcd-ramdisk: "+action, delay)
	t := time.NewTimer(delay)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	if perr := sys.PowerOff(cfg.FatalReboot); perr != nil {
		fmt.Fprintf(console, "%s %s failed: %v; halting here\n", MarkerFatal, action, perr)
	}
}
