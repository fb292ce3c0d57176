package scenario

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"bcd/internal/lab"
)

// Demo is `bcd lab demo`: a control plane, a lab with a site agent and VMs, and the VMs taken
// from enroll to deployed while the operator watches. Everything keeps running afterwards;
// DemoDown stops it.
type Demo struct {
	Dir        string // everything of the demo: server data, lab, logs
	Binary     string // the bcd binary
	RamdiskDir string // make ramdisk's output (vmlinuz, initramfs.cpio.gz)
	ImageDir   string // make lab-image's output (manifest.json, os.img.zst, signer)
	VMs        int
	Firmware   lab.FirmwareChoice
	APIListen  string // 127.0.0.1:7480
	GWPort     int    // 7443 on 127.0.0.1
	Out        io.Writer
	Terminal   bool
	Log        *slog.Logger
}

// Files of a demo directory.
const (
	demoServerPID = "server.pid"
	demoTokenFile = "admin-token"
)

func (d Demo) path(name string) string { return filepath.Join(d.Dir, name) }

// Run brings the demo up and drives the VMs to deployed.
func (d Demo) Run(ctx context.Context) error {
	if pid, ok := readPID(d.path(demoServerPID)); ok && alive(pid) {
		return fmt.Errorf("a demo already runs from %s (server pid %d): make demo-down first", d.Dir, pid)
	}
	if st, err := lab.Status(ctx, d.path("lab")); err == nil && st.Running {
		return fmt.Errorf("a lab runs in %s (supervisor pid %d): make demo-down first", d.path("lab"), st.SupervisorPID)
	}
	// A fresh start: the previous demo's server data and lab (disks, the site agent's identity,
	// which the new control plane would not know) go.
	for _, dir := range []string{d.path("server"), d.path("lab")} {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("clearing the previous demo's %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(d.path("share"), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", d.Dir, err)
	}
	_, manifest, err := LabImage(d.ImageDir, "http://unused/")
	if err != nil {
		return err
	}
	for _, f := range []string{filepath.Join(d.RamdiskDir, "vmlinuz"), filepath.Join(d.RamdiskDir, "initramfs.cpio.gz"), filepath.Join(d.ImageDir, manifest.File)} {
		abs, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("demo needs %s (make ramdisk lab-image): %w", abs, err)
		}
		link := filepath.Join(d.path("share"), filepath.Base(f))
		_ = os.Remove(link)
		if err := os.Symlink(abs, link); err != nil {
			return fmt.Errorf("sharing %s with the lab: %w", f, err)
		}
	}

	fmt.Fprintf(d.Out, "starting bcd server (data %s, log %s)\n", d.path("server"), d.path("server.log"))
	token, err := d.startServer(ctx)
	if err != nil {
		return err
	}
	api := "http://" + d.APIListen
	c := NewClient(api, token)
	tokenFile := d.path("site-join-token")
	ca, err := c.JoinToken(ctx, "default", tokenFile)
	if err != nil {
		return err
	}
	caFile := d.path("ca.pem")
	if err := os.WriteFile(caFile, ca, 0o644); err != nil {
		return fmt.Errorf("writing the CA: %w", err)
	}

	labDir := d.path("lab")
	fmt.Fprintf(d.Out, "starting the lab: %d VMs (%s) in network namespace %s, site agent inside it (log %s)\n",
		d.VMs, d.Firmware, lab.DefaultNetNS, filepath.Join(labDir, "site.log"))
	_, st, err := lab.Up(ctx, lab.Options{VMs: d.VMs, Firmware: d.Firmware, Dir: labDir}, lab.UpConfig{
		Supervisor: []string{d.Binary, "lab", "supervise"}, ShareDir: d.path("share"), Log: d.Log,
		Site: &lab.SiteOptions{Site: "default", Binary: d.Binary, GatewayPort: d.GWPort, CAFile: caFile, JoinTokenFile: tokenFile,
			Kernel: "vmlinuz", Initrd: "initramfs.cpio.gz"}})
	if err != nil {
		return err
	}
	img, _, err := LabImage(d.ImageDir, st.Files.URL())
	if err != nil {
		return err
	}
	if err := c.AddSignedImage(ctx, img); err != nil {
		return err
	}
	fmt.Fprintf(d.Out, "image %s (signed by %s) in the catalog, served at %s\n", img.Name, img.Signer, img.URL)
	creds, err := lab.ReadCredentials(st.Credentials)
	if err != nil {
		return err
	}
	start := time.Now()
	nodes, err := c.EnrollLab(ctx, st, creds, "default")
	if err != nil {
		return err
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.NodeID
		fmt.Fprintf(d.Out, "enrolled %s (%s firmware) by its %s BMC\n", n.VM.Name, n.VM.Firmware, n.Driver)
	}
	view := &View{W: d.Out, Terminal: d.Terminal, Start: start}
	var times []string
	phase := func(name, want string) error {
		began := time.Now()
		fmt.Fprintf(d.Out, "\n%s\n", name)
		view.drawn = 0
		if err := c.Wait(ctx, ids, want, view.Update); err != nil {
			return fmt.Errorf("%s: %w (consoles: %s/lab-*/console.log)", name, err, labDir)
		}
		times = append(times, fmt.Sprintf("  %-54s %5.0f s", name, time.Since(began).Seconds()))
		return nil
	}
	if err := phase("enroll → inspect → commission (wipe) → ready", "ready"); err != nil {
		return err
	}
	for _, id := range ids {
		if err := c.Verb(ctx, "deploy", id, img.Name); err != nil {
			return err
		}
	}
	if err := phase("deploy (stream the signed image, kexec) → deployed", "deployed"); err != nil {
		return err
	}
	fmt.Fprintf(d.Out, "\ntimes:\n%s\n  %-54s %5.0f s\n", strings.Join(times, "\n"), "total", time.Since(start).Seconds())
	fmt.Fprintf(d.Out, `
Everything keeps running. The API is at %[1]s; the admin token (also kept in %[2]s, 0600):

  export BCD_SERVER=%[1]s BCD_TOKEN=%[6]s
  %[3]s node list
  %[3]s node get lab-0
  %[3]s node events lab-0 --last 20 --kind 'workflow.*'
  %[3]s node commands lab-0         # what each step sent, to which agent, how long it took
  %[3]s node inventory lab-1        # the hardware its ramdisk reported at inspection
  %[3]s node list --require boot=uefi
  %[3]s events --follow --last 10
  %[3]s node undeploy lab-1         # wipe it (attested) and return it to ready
  %[3]s node rescue lab-0           # boot it into the ramdisk, then: node unrescue lab-0
  %[3]s node console lab-1          # its serial console over IPMI Serial-over-LAN (~. leaves)
  %[3]s lab status --dir %[4]s
  %[3]s doctor

Consoles: %[4]s/lab-*/console.log; site agent: %[4]s/site.log; server: %[5]s.
Stop it all with: make demo-down
`, api, d.path(demoTokenFile), d.Binary, labDir, d.path("server.log"), token)
	return nil
}

// startServer starts `bcd server` detached (its own session: it outlives the demo command),
// waits for its admin token and API, and records its pid.
func (d Demo) startServer(ctx context.Context) (string, error) {
	outPath := d.path("server.out")
	outf, err := os.Create(outPath)
	if err != nil {
		return "", fmt.Errorf("starting the server: %w", err)
	}
	defer outf.Close()
	logf, err := os.OpenFile(d.path("server.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "", fmt.Errorf("starting the server: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(d.Binary, "server", "--data-dir", d.path("server"), "--listen", d.APIListen,
		"--gateway-listen", "127.0.0.1:"+strconv.Itoa(d.GWPort), "--gateway-host", lab.DefaultBridgeIPv4().Addr().String())
	cmd.Stdout, cmd.Stderr = outf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = append(os.Environ(), "BCD_TOKEN=") // not inherited into anything it prints
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting the server: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := os.WriteFile(d.path(demoServerPID), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("recording the server's pid: %w", err)
	}
	tokenRE := regexp.MustCompile(`BCD_TOKEN=(bcda_[a-z0-9]+)`)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if tok := findIn(outPath, tokenRE); tok != "" {
			if conn, err := net.DialTimeout("tcp", d.APIListen, time.Second); err == nil {
				_ = conn.Close()
				if err := os.WriteFile(d.path(demoTokenFile), []byte(tok+"\n"), 0o600); err != nil {
					return "", fmt.Errorf("keeping the admin token: %w", err)
				}
				return tok, nil
			}
		}
		select {
		case err := <-exited:
			return "", fmt.Errorf("bcd server exited at start (%v); see %s", err, d.path("server.log"))
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("bcd server did not start within 2 minutes; see %s", d.path("server.log"))
		}
	}
}

func findIn(path string, re *regexp.Regexp) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			return m[1]
		}
	}
	return ""
}

// DemoDown stops the demo of dir: the lab (VMs, BMCs, site agent, namespace), then the server.
func DemoDown(ctx context.Context, dir string, log *slog.Logger) error {
	var errs []error
	if _, err := os.Stat(filepath.Join(dir, "lab", lab.SpecFile)); err == nil {
		if err := lab.Down(ctx, filepath.Join(dir, "lab"), log); err != nil {
			errs = append(errs, err)
		}
	}
	pidFile := filepath.Join(dir, demoServerPID)
	if pid, ok := readPID(pidFile); ok && alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(30 * time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		log.Info("bcd server stopped", "pid", pid)
	}
	_ = os.Remove(pidFile)
	return errors.Join(errs...)
}

func readPID(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// alive reports whether pid runs and is a bcd server (not a recycled pid).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// A zombie (state Z) has exited.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return false
		}
	}
	return strings.Contains(string(b), "server")
}
