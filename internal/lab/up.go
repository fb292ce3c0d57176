package lab

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"bcd/internal/lab/qmp"
	"bcd/internal/lab/vbmc"
)

// Timeouts of Up and Down.
const (
	DefaultReadyTimeout = 2 * time.Minute
	supervisorStopWait  = 60 * time.Second // > the supervisor's own QEMU stop timeout × a few VMs
	killWait            = 10 * time.Second
	statusTimeout       = 3 * time.Second
)

// UpConfig says how to start the supervisor.
type UpConfig struct {
	// Supervisor is the command that runs Supervise for a lab directory: Up appends
	// "--dir DIR --ready-fd 3" and runs it inside the namespace, e.g. {"/usr/bin/bcd", "lab",
	// "supervise"}.
	Supervisor []string
	Env        []string      // added to the supervisor's environment
	Ready      time.Duration // how long to wait for the lab to be ready; 0: DefaultReadyTimeout
	Log        *slog.Logger
	// Site, when set, runs a site agent in the lab (PlanSite) serving ShareDir's files.
	Site     *SiteOptions
	ShareDir string
}

// Supervisor is the lab's supervisor process as started by Up. Its parent may exit (the
// supervisor lives in its own session, `bcd lab up` returns) or wait for it (tests).
type Supervisor struct {
	PID  int
	done chan struct{}
	err  error
}

// Done is closed once the supervisor exited (while the process that started it still runs).
func (s *Supervisor) Done() <-chan struct{} { return s.done }

// Err is the supervisor's exit status, valid after Done.
func (s *Supervisor) Err() error { return s.err }

// Up plans the lab, creates its namespace and directory, starts the supervisor inside the
// namespace and returns once the lab is ready (state.json written). On failure nothing of the
// lab is left running.
func Up(ctx context.Context, o Options, cfg UpConfig) (*Supervisor, State, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Supervisor) == 0 {
		return nil, State{}, errors.New("bringing lab up: no supervisor command")
	}
	spec, err := Plan(o)
	if err != nil {
		return nil, State{}, err
	}
	if cfg.Site != nil {
		if spec, err = PlanSite(spec, cfg.ShareDir, *cfg.Site); err != nil {
			return nil, State{}, err
		}
	}
	if err := checkHost(spec); err != nil {
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	if st, err := ReadState(spec.Dir); err == nil && processAlive(st.SupervisorPID) {
		return nil, State{}, fmt.Errorf("bringing lab up: a lab already runs in %s (supervisor pid %d): bcd lab down first", spec.Dir, st.SupervisorPID)
	}
	if namespaceExists(spec.NetNS) {
		return nil, State{}, fmt.Errorf("bringing lab up: network namespace %s exists: bcd lab down --dir DIR, or ip netns del %s", spec.NetNS, spec.NetNS)
	}
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	_ = os.Remove(filepath.Join(spec.Dir, StateFile))
	if err := writeJSON(filepath.Join(spec.Dir, SpecFile), spec, 0o644); err != nil {
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	creds, err := NewCredentials(spec)
	if err != nil {
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	if err := writeJSON(spec.Credentials, creds, 0o600); err != nil {
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}

	if err := runStep(ctx, Step{Argv: []string{"ip", "netns", "add", spec.NetNS}}); err != nil {
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	sup, err := startSupervisor(ctx, spec, cfg, log)
	if err != nil {
		_ = runStep(context.Background(), Step{Argv: []string{"ip", "netns", "del", spec.NetNS}})
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	st, err := ReadState(spec.Dir)
	if err != nil {
		_ = Down(context.Background(), spec.Dir, log)
		return nil, State{}, fmt.Errorf("bringing lab up: %w", err)
	}
	log.InfoContext(ctx, "lab up", "dir", spec.Dir, "netns", spec.NetNS, "vms", len(st.VMs), "supervisor", sup.PID)
	return sup, st, nil
}

// checkHost finds the programs and firmware the lab needs, naming the Debian package of each.
func checkHost(s Spec) error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces, taps)")
	}
	var missing []string
	for _, p := range []struct{ prog, pkg string }{{"ip", "iproute2"}, {s.QEMU, "qemu-system-x86"}} {
		if _, err := exec.LookPath(p.prog); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian %s)", p.prog, p.pkg))
		}
	}
	files := []struct{ path, pkg string }{{"/usr/lib/ipxe/qemu/pxe-virtio.rom", "ipxe-qemu"}}
	for _, vm := range s.VMs {
		if vm.Firmware == FirmwareUEFI {
			files = append(files, struct{ path, pkg string }{s.OVMFCode, "ovmf"}, struct{ path, pkg string }{s.OVMFVars, "ovmf"},
				struct{ path, pkg string }{"/usr/lib/ipxe/qemu/efi-virtio.rom", "ipxe-qemu"})
			break
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f.path); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian %s)", f.path, f.pkg))
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		missing = append(missing, "/dev/net/tun")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing: %s (apt-get install --no-install-recommends qemu-system-x86 ipxe-qemu ovmf)", strings.Join(missing, ", "))
	}
	return nil
}

// NewCredentials makes a fresh random BMC account per VM (user admin, 16 random characters:
// within IPMI's 20-byte limit).
func NewCredentials(s Spec) (Credentials, error) {
	var c Credentials
	for _, vm := range s.VMs {
		pw, err := randomPassword(16)
		if err != nil {
			return Credentials{}, fmt.Errorf("generating BMC password: %w", err)
		}
		c.VMs = append(c.VMs, Credential{VM: vm.Name, Username: "admin", Password: pw})
	}
	return c, nil
}

func randomPassword(n int) (string, error) {
	const alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// startSupervisor runs the supervisor in the namespace, in its own session, logging to
// supervisor.log, and waits for its "ready" line on a pipe (fd 3 in the child).
func startSupervisor(ctx context.Context, s Spec, cfg UpConfig, log *slog.Logger) (*Supervisor, error) {
	logPath := filepath.Join(s.Dir, SupervisorLog)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening supervisor log: %w", err)
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating readiness pipe: %w", err)
	}
	defer pr.Close()
	argv := append([]string{"ip", "netns", "exec", s.NetNS}, cfg.Supervisor...)
	argv = append(argv, "--dir", s.Dir, "--ready-fd", "3", "--host-netns-fd", "4")
	// The host's network namespace, for the uplinks (the supervisor runs in the lab's).
	hostNS, err := os.Open("/proc/self/ns/net")
	if err != nil {
		_ = pw.Close()
		return nil, fmt.Errorf("opening the host's network namespace: %w", err)
	}
	defer hostNS.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw, hostNS}
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.Dir = s.Dir
	// Its own session: the supervisor outlives `bcd lab up` and the terminal's signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	_ = pw.Close()
	if err != nil {
		return nil, fmt.Errorf("starting supervisor: %w", err)
	}
	sup := &Supervisor{PID: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		sup.err = cmd.Wait()
		close(sup.done)
	}()
	log.InfoContext(ctx, "lab supervisor started", "pid", sup.PID, "log", logPath)

	timeout := cfg.Ready
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(pr).ReadString('\n')
		line <- l
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	fail := func(why string) (*Supervisor, error) {
		_ = syscall.Kill(sup.PID, syscall.SIGTERM)
		waitExit(sup.PID, supervisorStopWait)
		return nil, fmt.Errorf("lab supervisor %s; its log %s ends with:\n%s", why, logPath, Tail(logPath, 20))
	}
	select {
	case l := <-line:
		if strings.TrimSpace(l) != "ready" {
			<-sup.done
			return fail(fmt.Sprintf("exited before the lab was ready (%v)", sup.err))
		}
		return sup, nil
	case <-t.C:
		return fail(fmt.Sprintf("not ready after %s", timeout))
	case <-ctx.Done():
		return fail("start cancelled")
	}
}

// Tail returns the last n lines of the file at path (for error messages).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Down stops the lab of dir from any shell: it signals the supervisor (which stops its VMs and
// removes its links), waits for it, kills any recorded QEMU that survived, deletes the
// namespace and removes state.json. A lab that is already down is not an error.
func Down(ctx context.Context, dir string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	spec, err := ReadSpec(dir)
	if err != nil {
		return fmt.Errorf("bringing lab down: %w", err)
	}
	var errs []error
	if st, err := ReadState(dir); err == nil {
		if processAlive(st.SupervisorPID) && cmdlineHas(st.SupervisorPID, dir) {
			log.InfoContext(ctx, "stopping lab supervisor", "pid", st.SupervisorPID)
			_ = syscall.Kill(st.SupervisorPID, syscall.SIGTERM)
			if !waitExit(st.SupervisorPID, supervisorStopWait) {
				log.WarnContext(ctx, "lab supervisor did not stop: killing it", "pid", st.SupervisorPID)
				_ = syscall.Kill(st.SupervisorPID, syscall.SIGKILL)
				waitExit(st.SupervisorPID, killWait)
			}
		}
		for _, vm := range st.VMs {
			// The supervisor's children die with it (Pdeathsig); this is the last guard, by PID,
			// only for a process that is still this VM's QEMU.
			if processAlive(vm.PID) && cmdlineHas(vm.PID, vm.QMPSocket) {
				log.WarnContext(ctx, "QEMU survived its supervisor: killing it", "vm", vm.Name, "pid", vm.PID)
				_ = syscall.Kill(vm.PID, syscall.SIGKILL)
				if !waitExit(vm.PID, killWait) {
					errs = append(errs, fmt.Errorf("QEMU of %s (pid %d) does not die", vm.Name, vm.PID))
				}
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if namespaceExists(spec.NetNS) {
		if err := runStep(ctx, Step{Argv: []string{"ip", "netns", "del", spec.NetNS}}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(filepath.Join(dir, StateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bringing lab down: %w", err)
	}
	log.InfoContext(ctx, "lab down", "dir", dir, "netns", spec.NetNS)
	return nil
}

func namespaceExists(name string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", name))
	return err == nil
}

// processAlive reports whether pid runs: a zombie (exited, not yet reaped) is dead
// (LAB-NOTES gotcha 9).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) S …: comm may hold spaces and parentheses; the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	state := s[i+2]
	return state != 'Z' && state != 'X'
}

// cmdlineHas reports whether pid's command line contains s (a guard against PID reuse).
func cmdlineHas(pid int, s string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return err == nil && strings.Contains(string(b), s)
}

// waitExit polls until pid is gone, or timeout; it reports whether it is gone.
func waitExit(pid int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for processAlive(pid) {
		select {
		case <-deadline.C:
			return !processAlive(pid)
		case <-tick.C:
		}
	}
	return true
}

// VMStatus is one row of `bcd lab status`.
type VMStatus struct {
	Name       string   `json:"name"`
	Firmware   Firmware `json:"firmware"`
	MAC        string   `json:"mac"`
	Power      string   `json:"power"`      // on, off, unknown
	RunState   string   `json:"runState"`   // QEMU's query-status, or the error reading it
	PID        int      `json:"pid"`        // QEMU
	RedfishURL string   `json:"redfishURL"` // https://…
	IPMIAddr   string   `json:"ipmiAddr"`
	Console    string   `json:"console"`
}

// LabStatus is `bcd lab status`.
type LabStatus struct {
	Dir           string     `json:"dir"`
	NetNS         string     `json:"netns"`
	Running       bool       `json:"running"`
	SupervisorPID int        `json:"supervisorPid,omitempty"`
	Bridge        string     `json:"bridge"`
	Credentials   string     `json:"credentials"`
	VMs           []VMStatus `json:"vms"`
}

// Status reads the lab of dir and asks every VM's QEMU for its run state (through the second
// QMP monitor: the first belongs to the BMCs).
func Status(ctx context.Context, dir string) (LabStatus, error) {
	st, err := ReadState(dir)
	if errors.Is(err, os.ErrNotExist) {
		spec, serr := ReadSpec(dir)
		if serr != nil {
			return LabStatus{}, fmt.Errorf("reading lab status: no lab in %s: %w", dir, serr)
		}
		return LabStatus{Dir: dir, NetNS: spec.NetNS, Bridge: spec.BridgeIPv4.String(), Credentials: spec.Credentials}, nil
	}
	if err != nil {
		return LabStatus{}, fmt.Errorf("reading lab status: %w", err)
	}
	ls := LabStatus{Dir: dir, NetNS: st.NetNS, Running: processAlive(st.SupervisorPID), SupervisorPID: st.SupervisorPID,
		Bridge: st.BridgeIPv4.String(), Credentials: st.Credentials}
	for _, vm := range st.VMs {
		vs := VMStatus{Name: vm.Name, Firmware: vm.Firmware, MAC: vm.MAC, Power: "unknown", PID: vm.PID,
			RedfishURL: vm.RedfishURL, IPMIAddr: vm.IPMIAddr, Console: vm.Console}
		if ls.Running {
			run, err := runState(ctx, vm.QMPMonitor)
			if err != nil {
				vs.RunState = err.Error()
			} else {
				vs.RunState = run
				vs.Power = "off"
				if vbmc.PoweredOnStatus(run) {
					vs.Power = "on"
				}
			}
		}
		ls.VMs = append(ls.VMs, vs)
	}
	return ls, nil
}

func runState(ctx context.Context, monitor string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	c, err := qmp.Dial(ctx, monitor)
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.QueryStatus(ctx)
	if err != nil {
		return "", fmt.Errorf("querying %s: %w", monitor, err)
	}
	return s.Status, nil
}

// Command returns a command that runs name with args inside the lab's namespace (`ip netns exec`),
// e.g. `bcd site` on the lab's bridge, or ipmitool against a BMC.
func Command(ctx context.Context, netns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, name}, args...)...)
}
