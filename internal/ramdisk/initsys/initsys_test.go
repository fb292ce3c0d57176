package initsys

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeSys struct {
	mu        sync.Mutex
	console   bytes.Buffer
	mounts    []string
	loaded    []string
	params    map[string]string // by module path
	files     map[string][]byte
	failMount string
	failLoad  map[string]error
	hostname  string
	up        []string
	powered   chan bool
}

func (f *fakeSys) Mount(m Mount) error {
	if m.Target == f.failMount {
		return errors.New("EPERM")
	}
	f.mounts = append(f.mounts, m.Target)
	return nil
}
func (f *fakeSys) LoadModule(p, params string) error {
	if err := f.failLoad[p]; err != nil {
		return err
	}
	f.loaded = append(f.loaded, p)
	if params != "" {
		if f.params == nil {
			f.params = map[string]string{}
		}
		f.params[p] = params
	}
	return nil
}
func (f *fakeSys) Console() (io.Writer, error)    { return &lockedWriter{mu: &f.mu, w: &f.console}, nil }
func (f *fakeSys) SetHostname(n string) error     { f.hostname = n; return nil }
func (f *fakeSys) LinkUp(n string) error          { f.up = append(f.up, n); return nil }
func (f *fakeSys) KernelRelease() (string, error) { return "6.1.0-99-amd64", nil }
func (f *fakeSys) ReadFile(n string) ([]byte, error) {
	if b, ok := f.files[n]; ok {
		return b, nil
	}
	return nil, os.ErrNotExist
}
func (f *fakeSys) PowerOff(reboot bool) error {
	f.powered <- reboot
	return errors.New("fake: still running")
}

func (f *fakeSys) text() string { f.mu.Lock(); defer f.mu.Unlock(); return f.console.String() }

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newFake() *fakeSys {
	return &fakeSys{powered: make(chan bool, 1), failLoad: map[string]error{}, files: map[string][]byte{
		"/lib/modules/6.1.0-99-amd64/load-order": []byte("virtio_ring.ko\nvirtio.ko\n# comment\n\nipmi_si.ko\n"),
	}}
}

func TestParseLoadOrder(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"a.ko\nb.ko\n", []string{"a.ko", "b.ko"}, false},
		{"  a.ko  \n#x\n\n", []string{"a.ko"}, false},
		{"", nil, false},
		{"../etc/passwd.ko\n", nil, true},
		{"a\n", nil, true},
		{"/abs.ko\n", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseLoadOrder([]byte(tc.in))
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("ParseLoadOrder(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestInit(t *testing.T) {
	f := newFake()
	f.failLoad["/lib/modules/6.1.0-99-amd64/ipmi_si.ko"] = errors.New("no such device")
	console, _, err := Init(t.Context(), f, Config{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if console == nil {
		t.Fatal("no console")
	}
	if want := []string{"/dev", "/proc", "/sys", "/run", "/tmp", "/dev/pts"}; !slices.Equal(f.mounts, want) {
		t.Errorf("mounts %v, want %v", f.mounts, want)
	}
	if want := []string{"/lib/modules/6.1.0-99-amd64/virtio_ring.ko", "/lib/modules/6.1.0-99-amd64/virtio.ko"}; !slices.Equal(f.loaded, want) {
		t.Errorf("loaded %v, want %v", f.loaded, want)
	}
	out := f.text()
	if !strings.Contains(out, "module=ipmi_si") || !strings.HasSuffix(out, MarkerInitOK+"\n") {
		t.Errorf("console:\n%s", out)
	}
	if f.hostname != "bcd-ramdisk" || !slices.Equal(f.up, []string{"lo"}) {
		t.Errorf("hostname %q, up %v", f.hostname, f.up)
	}
}

// The kernel command line's parameters for loadable modules reach the modules as they load
// (the ramdisk's libata.ignore_hpa=1 would otherwise do nothing: libata is a module here).
func TestInitPassesModuleParameters(t *testing.T) {
	f := newFake()
	f.files["/lib/modules/6.1.0-99-amd64/load-order"] = []byte("libata.ko\nvirtio-net.ko\nipmi_si.ko\n")
	f.files["/proc/cmdline"] = []byte("console=ttyS0 libata.ignore_hpa=1 virtio_net.napi-tx=0 bcd.gateway=https://g -- libata.noacpi=1\n")
	if _, _, err := Init(t.Context(), f, Config{}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/lib/modules/6.1.0-99-amd64/libata.ko":     "ignore_hpa=1",
		"/lib/modules/6.1.0-99-amd64/virtio-net.ko": "napi_tx=0",
	}
	if len(f.params) != len(want) {
		t.Errorf("parameters %v, want %v", f.params, want)
	}
	for p, v := range want {
		if f.params[p] != v {
			t.Errorf("%s loaded with %q, want %q", p, f.params[p], v)
		}
	}
}

func TestModuleParams(t *testing.T) {
	tests := []struct {
		cmdline string
		want    map[string]string
	}{
		{"", map[string]string{}},
		{"console=ttyS0 quiet", map[string]string{}},
		{"libata.ignore_hpa=1", map[string]string{"libata": "ignore_hpa=1"}},
		{"libata.ignore_hpa=1 libata.force=1.5Gbps", map[string]string{"libata": "ignore_hpa=1 force=1.5Gbps"}},
		{"virtio-net.napi-tx=0", map[string]string{"virtio_net": "napi_tx=0"}},
		{"usbcore.nousb", map[string]string{"usbcore": "nousb"}},
		{`dyndbg.x="file a.c +p" b.y=2`, map[string]string{"dyndbg": `x="file a.c +p"`, "b": "y=2"}},
		{"a=b.c=d .x=1 m.=2 ip=10.0.0.1", map[string]string{}},
		{"m.p=1 -- m.q=2", map[string]string{"m": "p=1"}},
	}
	for _, tt := range tests {
		got := ModuleParams(tt.cmdline)
		if len(got) != len(tt.want) {
			t.Errorf("%q: %v, want %v", tt.cmdline, got, tt.want)
			continue
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%q: %s=%q, want %q", tt.cmdline, k, got[k], v)
			}
		}
	}
}

func TestInitFatalMount(t *testing.T) {
	f := newFake()
	f.failMount = "/sys"
	_, _, err := Init(t.Context(), f, Config{}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "mounting sysfs on /sys") {
		t.Fatalf("err = %v", err)
	}
}

// TestRunFatal: a fatal start-up error is printed, and after the delay the machine is powered
// off; Run itself keeps going (PID 1 never returns) until its context ends.
func TestRunFatal(t *testing.T) {
	for _, reboot := range []bool{false, true} {
		f := newFake()
		f.failMount = "/proc"
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			Run(ctx, f, Config{FatalDelay: 10 * time.Millisecond, FatalReboot: reboot}, NewReaper())
			close(done)
		}()
		select {
		case got := <-f.powered:
			if got != reboot {
				t.Errorf("reboot = %v, want %v", got, reboot)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no power-off after a fatal error")
		}
		select {
		case <-done:
			t.Fatal("Run returned while its context is live")
		default:
		}
		cancel()
		<-done
		if out := f.text(); !strings.Contains(out, MarkerFatal+" mounting proc on /proc") {
			t.Errorf("console:\n%s", out)
		}
	}
}

func TestRunAgent(t *testing.T) {
	f := newFake()
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		Run(ctx, f, Config{Agent: func(ctx context.Context, console io.Writer, _ *slog.Logger) error {
			io.WriteString(console, "agent here\n")
			close(started)
			<-ctx.Done()
			return nil
		}}, NewReaper())
		close(done)
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("agent not started")
	}
	cancel()
	<-done
	if out := f.text(); !strings.Contains(out, MarkerInitOK+"\nagent here\n") {
		t.Errorf("console:\n%s", out)
	}
}

func TestReaperPausedDuringExec(t *testing.T) {
	calls := 0
	r := &Reaper{wait: func() (int, error) {
		calls++
		if calls <= 2 {
			return 100 + calls, nil
		}
		return 0, nil
	}}
	r.holds = 1
	if n := r.ReapAll(); n != 0 || calls != 0 {
		t.Fatalf("reaped %d (%d waits) while an Exec runs", n, calls)
	}
	r.holds = 0
	if n := r.ReapAll(); n != 2 {
		t.Fatalf("reaped %d, want 2", n)
	}
}

// PID 1 gets no PATH from the kernel: the usual one is set, and one given (ramdisk-arg
// PATH=…, which the kernel hands to init's environment) is kept.
func TestDefaultPath(t *testing.T) {
	for given, want := range map[string]string{
		"":                     "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"/opt/nvidia/bin:/bin": "/opt/nvidia/bin:/bin",
	} {
		if got := DefaultPath(given); got != want {
			t.Errorf("DefaultPath(%q) = %q, want %q", given, got, want)
		}
	}
}
