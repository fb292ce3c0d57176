package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"bcd/internal/lab/qmp"
	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

// Timeouts of the supervisor.
const (
	qmpReadyTimeout = 30 * time.Second // QEMU creates its QMP sockets within a second or two
	qemuStopTimeout = 15 * time.Second // SIGTERM → exit; then SIGKILL
	pollInterval    = 50 * time.Millisecond
)

// Supervise runs the lab of dir: it must run inside the lab's network namespace (Up starts it
// with `ip netns exec`). It sets up the bridge and taps, sends router advertisements, starts
// every VM as its child and serves every VM's BMCs; it writes state.json, then one line
// "ready\n" to ready (which may be nil), and runs until ctx ends. Then it stops the VMs (SIGTERM,
// then SIGKILL after qemuStopTimeout), waits for each, and removes the links it made.
//
// hostNS (may be nil when the lab has no uplinks) is the host's network namespace.
func Supervise(ctx context.Context, dir string, log *slog.Logger, ready io.Writer, hostNS *os.File) (err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	spec, err := ReadSpec(dir)
	if err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}
	creds, err := ReadCredentials(spec.Credentials)
	if err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}
	if err := checkInNamespace(spec.NetNS); err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}

	// Links: created now, removed at the end whatever happens. Teardown uses a fresh context:
	// ctx is over by then.
	defer func() {
		tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, st := range NetworkTeardown(spec) {
			if terr := runStep(tctx, st); terr != nil {
				log.Debug("lab teardown step failed", "step", st.String(), "err", terr)
			}
		}
	}()
	for _, st := range NetworkSetup(spec) {
		if err := runStep(ctx, st); err != nil {
			return fmt.Errorf("supervising lab: network setup: %w", err)
		}
	}
	if err := prepareFiles(spec); err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}

	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stopBG()
		wg.Wait()
	}()
	wg.Go(func() {
		if err := advertise(bg, spec.Bridge, spec.BridgeIPv6, log); err != nil {
			log.Error("router advertisements stopped", "err", err)
		}
	})

	var vms []*runningVM
	defer func() {
		// VMs stop before the BMCs' context ends (deferred above): a BMC action in flight then
		// fails cleanly against a closed QMP socket.
		for _, v := range vms {
			v.stop(log)
		}
	}()
	if err := serveUplinks(bg, &wg, spec, hostNS, log); err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}
	if err := serveFiles(bg, &wg, spec.Files, log); err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}
	state := State{Spec: spec, SupervisorPID: os.Getpid(), Started: time.Now().UTC()}
	for _, vm := range spec.VMs {
		cred, ok := creds.For(vm.Name)
		if !ok {
			return fmt.Errorf("supervising lab: no credential for %s in %s", vm.Name, spec.Credentials)
		}
		v, err := startVM(ctx, spec, vm, log.With("vm", vm.Name))
		if err != nil {
			return fmt.Errorf("supervising lab: %w", err)
		}
		vms = append(vms, v)
		vs, err := v.serveBMCs(ctx, bg, &wg, cred, log.With("vm", vm.Name))
		if err != nil {
			return fmt.Errorf("supervising lab: %w", err)
		}
		state.VMs = append(state.VMs, vs)
	}
	if spec.Site != nil {
		// Stopped (deferred above) before the VMs' BMCs and the uplinks go.
		siteCtx, stopSite := context.WithCancel(bg)
		siteDone := make(chan struct{})
		go func() {
			defer close(siteDone)
			runSiteAgent(siteCtx, spec.Site, log.With("component", "site"))
		}()
		defer func() {
			stopSite()
			<-siteDone
		}()
	}
	if err := writeJSON(filepath.Join(dir, StateFile), state, 0o644); err != nil {
		return fmt.Errorf("supervising lab: %w", err)
	}
	log.Info("lab ready", "vms", len(vms), "netns", spec.NetNS, "bridge", spec.BridgeIPv4.String())
	if ready != nil {
		if _, err := io.WriteString(ready, "ready\n"); err != nil {
			log.Warn("could not report readiness", "err", err)
		}
		if c, ok := ready.(io.Closer); ok {
			_ = c.Close()
		}
	}

	exited := make(chan *runningVM, len(vms))
	for _, v := range vms {
		go func() {
			<-v.done
			exited <- v
		}()
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("lab stopping")
			return nil
		case v := <-exited:
			// A VM's QEMU ended on its own (a crash: power is the BMC's, -no-shutdown keeps QEMU up).
			log.Error("QEMU exited unexpectedly", "vm", v.vm.Name, "err", v.err, "log", v.vm.QEMULog)
		}
	}
}

// checkInNamespace refuses to run outside the lab's namespace: the supervisor would create a
// bridge on the host otherwise.
func checkInNamespace(name string) error {
	var self, want syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return fmt.Errorf("checking network namespace: %w", err)
	}
	if err := syscall.Stat(filepath.Join("/run/netns", name), &want); err != nil {
		return fmt.Errorf("checking network namespace %s: %w", name, err)
	}
	if self.Ino != want.Ino || self.Dev != want.Dev {
		return fmt.Errorf("not running inside network namespace %s (start the supervisor with ip netns exec %s)", name, name)
	}
	return nil
}

// prepareFiles creates the lab's per-VM files: directories, sparse disks, OVMF variable stores,
// SeaBIOS's serial-console blob. Existing disks are kept (a lab brought up again keeps what its
// VMs wrote).
func prepareFiles(s Spec) error {
	if err := os.WriteFile(SerconFile(s.Dir), SerconBlob(), 0o644); err != nil {
		return fmt.Errorf("writing SeaBIOS console blob: %w", err)
	}
	for _, vm := range s.VMs {
		if err := os.MkdirAll(filepath.Join(vm.Dir, "media"), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", vm.Dir, err)
		}
		f, err := os.OpenFile(vm.Disk, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("creating disk of %s: %w", vm.Name, err)
		}
		fi, err := f.Stat()
		if err == nil && fi.Size() < vm.DiskSize {
			err = f.Truncate(vm.DiskSize)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sizing disk of %s: %w", vm.Name, err)
		}
		if vm.Firmware == FirmwareUEFI {
			if _, err := os.Stat(vm.OVMFVars); errors.Is(err, os.ErrNotExist) {
				if err := copyFile(s.OVMFVars, vm.OVMFVars); err != nil {
					return fmt.Errorf("copying OVMF variables for %s: %w", vm.Name, err)
				}
			}
		}
		for _, sock := range []string{vm.QMPSocket, vm.QMPMonitor} {
			if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("removing stale QMP socket of %s: %w", vm.Name, err)
			}
		}
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		_ = os.Remove(to)
		return err
	}
	return out.Close()
}

// runningVM is one QEMU child and its BMCs.
type runningVM struct {
	vm      VM
	cmd     *exec.Cmd
	done    chan struct{} // closed when Wait returned
	err     error         // Wait's result, valid after done
	machine *vbmc.QEMUMachine
	redfish *redfishbmc.Server
	ipmi    *ipmibmc.BMC
}

// startVM starts QEMU for vm and waits until its QMP monitor answers.
func startVM(ctx context.Context, s Spec, vm VM, log *slog.Logger) (*runningVM, error) {
	logf, err := os.OpenFile(vm.QEMULog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", vm.Name, err)
	}
	defer logf.Close() // the child holds its own descriptor
	// Not CommandContext: the VM outlives ctx's cancellation until stop() ends it in order.
	cmd := exec.Command(s.QEMU, QEMUArgs(s, vm)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group (a Ctrl-C on the supervisor's terminal is the supervisor's to handle);
	// killed if the supervisor dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting QEMU for %s: %w", vm.Name, err)
	}
	v := &runningVM{vm: vm, cmd: cmd, done: make(chan struct{})}
	go func() {
		v.err = cmd.Wait()
		close(v.done)
	}()
	log.Info("QEMU started", "pid", cmd.Process.Pid, "firmware", vm.Firmware, "mac", vm.MAC, "console", vm.Console)
	if err := waitQMP(ctx, vm.QMPMonitor, v.done); err != nil {
		v.stop(log)
		return nil, fmt.Errorf("starting %s (see %s): %w", vm.Name, vm.QEMULog, err)
	}
	return v, nil
}

// waitQMP polls until the QMP monitor at path answers query-status, QEMU exits, or the wait
// times out.
func waitQMP(ctx context.Context, path string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, qmpReadyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := qmp.Dial(dctx, path)
			if err == nil {
				_, err = c.QueryStatus(dctx)
				_ = c.Close()
			}
			dcancel()
			if err == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("QEMU exited at start")
		case <-ctx.Done():
			return fmt.Errorf("waiting for QMP socket %s: %w", path, ctx.Err())
		case <-tick.C:
		}
	}
}

// serveBMCs starts the VM's Redfish (TLS) and IPMI BMCs on the bridge; both drive one
// QEMUMachine (QEMU's QMP socket takes one client at a time). They run until bg ends.
func (v *runningVM) serveBMCs(ctx, bg context.Context, wg *sync.WaitGroup, cred Credential, log *slog.Logger) (VMState, error) {
	vm := v.vm
	m, err := vbmc.NewQEMUMachine(vbmc.QEMUConfig{QMPSocket: vm.QMPSocket, NICDevice: NICDeviceID,
		DiskDevice: DiskDeviceID, CDDevice: CDDeviceID, BootDevice: vbmc.DevicePXE}, log)
	if err != nil {
		return VMState{}, fmt.Errorf("BMC of %s: %w", vm.Name, err)
	}
	v.machine = m
	svc, err := redfishbmc.New(redfishbmc.Config{
		Username: cred.Username, Password: cred.Password,
		UUID: vm.UUID, SerialNumber: vm.Serial, Manufacturer: "bcd", Model: "bcd lab VM", MACs: []string{vm.MAC},
		// A BIOS version to check a pool's firmware baseline against (firmware.check) and to
		// update (firmware.update with a redfishbmc.FirmwareImage); QEMU's firmware is not
		// touched.
		BiosVersion: "bcd-lab-" + string(vm.Firmware) + "-1.0",
		MediaDir:    filepath.Join(vm.Dir, "media"), AllowFileImages: true, Log: log,
	}, m)
	if err != nil {
		return VMState{}, fmt.Errorf("Redfish BMC of %s: %w", vm.Name, err)
	}
	srv, err := redfishbmc.Serve(bg, redfishbmc.ServeConfig{Addr: vm.RedfishAddr, TLS: true, Log: log}, svc)
	if err != nil {
		return VMState{}, fmt.Errorf("Redfish BMC of %s: %w", vm.Name, err)
	}
	v.redfish = srv
	certFile := filepath.Join(vm.Dir, "redfish-cert.pem")
	if err := os.WriteFile(certFile, srv.Cert.PEM, 0o644); err != nil {
		return VMState{}, fmt.Errorf("writing Redfish certificate of %s: %w", vm.Name, err)
	}
	_ = os.Remove(vm.InbandSocket) // a previous run's
	inband, err := net.Listen("unix", vm.InbandSocket)
	if err != nil {
		return VMState{}, fmt.Errorf("IPMI BMC of %s: in-band socket: %w", vm.Name, err)
	}
	ib, err := ipmibmc.New(ipmibmc.Config{Addr: vm.IPMIAddr, Username: cred.Username, Password: cred.Password,
		GUID: vm.UUID, Logger: log, InbandListener: inband, SerialSocket: vm.SerialSocket}, m)
	if err != nil {
		_ = inband.Close()
		return VMState{}, fmt.Errorf("IPMI BMC of %s: %w", vm.Name, err)
	}
	v.ipmi = ib
	wg.Go(func() {
		if err := ib.Serve(bg); err != nil {
			log.Error("IPMI BMC stopped", "err", err)
		}
	})
	return VMState{VM: vm, PID: v.cmd.Process.Pid, RedfishURL: srv.URL,
		RedfishFingerprint: srv.Cert.FingerprintSHA256, RedfishCertFile: certFile}, nil
}

// stop ends the VM: its BMCs first, then QEMU (SIGTERM, SIGKILL after qemuStopTimeout), and
// waits for the process.
func (v *runningVM) stop(log *slog.Logger) {
	if v.redfish != nil {
		_ = v.redfish.Close()
	}
	if v.ipmi != nil {
		_ = v.ipmi.Close()
	}
	if v.machine != nil {
		_ = v.machine.Close()
	}
	select {
	case <-v.done:
		return
	default:
	}
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(qemuStopTimeout)
	defer t.Stop()
	select {
	case <-v.done:
	case <-t.C:
		log.Warn("QEMU ignored SIGTERM: killing it", "vm", v.vm.Name, "pid", v.cmd.Process.Pid)
		_ = v.cmd.Process.Kill()
		<-v.done
	}
	log.Info("QEMU stopped", "vm", v.vm.Name, "pid", v.cmd.Process.Pid)
}
