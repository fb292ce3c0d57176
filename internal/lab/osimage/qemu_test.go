package osimage

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/osagent"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/agent"
	"bcd/internal/ramdisk/build"
)

const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// pipeEnv makes the test binary a TCP pipe (stdin/stdout ↔ the address in its argument): QEMU's
// guestfwd=…-cmd: starts it for each connection the VM opens to a forwarded address, so the VM
// reaches the test's servers on loopback while its network stays restrict=on.
const pipeEnv = "BCD_OSIMAGE_TEST_PIPE"

func TestMain(m *testing.M) {
	if os.Getenv(pipeEnv) == "1" && len(os.Args) == 2 {
		os.Exit(pipe(os.Args[1]))
	}
	os.Exit(m.Run())
}

func pipe(addr string) int {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 1
	}
	defer c.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(os.Stdout, c)
		close(done)
	}()
	_, _ = io.Copy(c, os.Stdin)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	<-done
	return 0
}

// Addresses the VM uses (QEMU's user network): where the test's metadata server and gateway
// appear. (The default metadata URL, port 80 of the DHCP server identifier, is QEMU's host
// address 10.0.2.2, which guestfwd cannot take: the test image names the URL with bcd.metadata=.)
const (
	vmMetadata = "10.0.2.101"
	vmGateway  = "10.0.2.100"
)

// TestBootQEMU builds the lab OS image from the Debian kernel package (out/cache, fetched by
// scripts/ramdisk/kernel-deb) and the current code, boots it from its disk under SeaBIOS and
// under OVMF (TCG, user-mode network with restrict=on; guestfwd pipes 10.0.2.101:80 to a
// metadata server and 10.0.2.100 to a real gateway, both on loopback), and waits for
// the OS agent's lines: boot loader → kernel → bcd in OS mode → DHCP → metadata (404 first) →
// joined as the node. The gateway must have seen a hello with role:os, and the disk must come
// back unchanged (the agent keeps its identity in RAM by default).
func TestBootQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		requirement(t, "qemu-system-x86_64 not installed (apt-get install --no-install-recommends qemu-system-x86)")
	}
	if m := DefaultTools().Missing(); len(m) > 0 {
		requirement(t, "missing %v", m)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	bin, deb, dir, m := buildImage(ctx, t, root)

	for _, fw := range []string{"bios", "uefi"} {
		t.Run(fw, func(t *testing.T) {
			if fw == "uefi" {
				if _, err := os.Stat(ovmfCode); err != nil {
					requirement(t, "%s missing (apt-get install --no-install-recommends ovmf)", ovmfCode)
				}
			}
			vmDir := t.TempDir()
			disk := filepath.Join(vmDir, "disk.img")
			copyFile(t, filepath.Join(dir, DiskFile), disk)
			v := newVMNet(t)
			args := append(vmArgs(disk, 512), v.netdev...)
			if fw == "uefi" {
				vars := filepath.Join(vmDir, "OVMF_VARS.fd")
				copyFile(t, ovmfVars, vars)
				args = append(args, "-drive", "if=pflash,format=raw,readonly=on,file="+ovmfCode, "-drive", "if=pflash,format=raw,file="+vars)
			}
			first := "SYSLINUX 6." // BIOS syslinux's banner
			if fw == "uefi" {
				first = "BdsDxe: starting Boot" // OVMF picked the disk (EFI syslinux draws on the screen)
			}
			marks := append([]string{first, "Command line: BOOT_IMAGE=/vmlinuz " + m.Cmdline}, v.osMarks()...)
			at := bootAndWatch(ctx, t, qemu, args, marks, nil, v.instanceToken, 240*time.Second, v.waitHello(ctx, t))
			t.Logf("%s: boot loader %.1fs, kernel %.1fs, %q %.1fs, network up %.1fs, joined %.1fs (TCG)", fw, at[0].Seconds(),
				at[1].Seconds(), osagent.MarkerStart, at[2].Seconds(), at[4].Seconds(), at[len(at)-1].Seconds())
			v.checkHellos(t, engine.RoleOS)
			if got := fileSHA(t, disk); got != m.DiskSHA256 {
				t.Errorf("the OS changed its disk: sha256 %s, the image's is %s", got, m.DiskSHA256)
			}
		})
	}

	// The deploy's last step: the ramdisk (booted directly, joined with a discovery token) is
	// sent boot.kexec, finds syslinux.cfg on the image's FAT partition, kexecs its kernel and
	// initrd, and the installed OS joins as the same node.
	t.Run("kexec", func(t *testing.T) {
		kernel, initrd := buildRamdisk(ctx, t, bin, deb)
		disk := filepath.Join(t.TempDir(), "disk.img")
		copyFile(t, filepath.Join(dir, DiskFile), disk)
		// The ramdisk picks a disk of at least 4 GiB for images: the image at its start, sparse.
		if err := os.Truncate(disk, 4<<30+1<<20); err != nil {
			t.Fatal(err)
		}
		v := newVMNet(t)
		ramdiskToken := v.env.Identities.NodeToken("n1", time.Hour)
		cmdline := "console=ttyS0 panic=-1 bcd.gateway=" + v.gatewayURL + " bcd.token=" + ramdiskToken + " bcd.ca=" + agent.EncodeCA(v.env.CA.CertPEM())
		args := append(vmArgs(disk, 1024), v.netdev...)
		args = append(args, "-kernel", kernel, "-initrd", initrd, "-append", cmdline)
		node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}
		sendKexec := func() {
			v.env.Queue.Enqueue(node, gateway.Command{ID: "kexec-1", Kind: agent.KindKexec, NodeID: "n1", Generation: 1, Args: []byte(`{}`)})
		}
		marks := append([]string{agent.MarkerJoined + " node=n1", "kexec target found", "Command line: " + m.Cmdline}, v.osMarks()...)
		at := bootAndWatch(ctx, t, qemu, args, marks, map[int]func(){0: sendKexec}, v.instanceToken, 300*time.Second, v.waitHello(ctx, t))
		t.Logf("kexec: ramdisk joined %.1fs, kexec target %.1fs, OS kernel %.1fs, OS joined %.1fs (TCG)",
			at[0].Seconds(), at[1].Seconds(), at[2].Seconds(), at[len(at)-1].Seconds())
		v.checkHellos(t, engine.RoleOS)
		if got := prefixSHA(t, disk, m.Size); got != m.DiskSHA256 {
			t.Errorf("the image on the disk changed: sha256 %s, the image's is %s", got, m.DiskSHA256)
		}
	})
}

func vmArgs(disk string, memMiB int) []string {
	return []string{"-machine", "q35", "-accel", "tcg", "-m", strconv.Itoa(memMiB), "-nographic", "-no-reboot", "-nodefaults",
		"-serial", "stdio", "-monitor", "none",
		"-drive", "file=" + disk + ",format=raw,if=virtio", "-device", "virtio-rng-pci"}
}

// vmNet is a VM's view of the test's services: a real gateway at 10.0.2.100 and a metadata
// server at 10.0.2.101:80 (404 on the first read, then node n1 with a fresh instance token),
// both on loopback, reached through guestfwd on a restrict=on user network.
type vmNet struct {
	env           *gatewaytest.Env
	gatewayURL    string // as the VM sees it
	instanceToken string
	netdev        []string // QEMU arguments
}

func newVMNet(t *testing.T) *vmNet {
	t.Helper()
	env := gatewaytest.StartFor(t, gateway.Config{PollInterval: 100 * time.Millisecond}, vmGateway)
	_, gwPort, _ := net.SplitHostPort(strings.TrimPrefix(env.URL, "https://"))
	v := &vmNet{env: env, gatewayURL: "https://" + vmGateway + ":" + gwPort, instanceToken: env.Identities.InstanceToken("n1", time.Hour)}
	doc, _ := json.Marshal(osagent.Metadata{NodeID: "n1", Gateway: v.gatewayURL, InstanceToken: v.instanceToken, CA: string(env.CA.CertPEM())})
	var reads atomic.Int32
	md := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metadata" || reads.Add(1) == 1 { // the first read: not published yet
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(doc)
	}))
	t.Cleanup(md.Close)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fwd := func(guest, host string) string { return ",guestfwd=tcp:" + guest + "-cmd:" + self + " " + host }
	v.netdev = []string{"-netdev", "user,id=n0,restrict=on" + fwd(vmMetadata+":80", strings.TrimPrefix(md.URL, "http://")) +
		fwd(vmGateway+":"+gwPort, strings.TrimPrefix(env.URL, "https://")), "-device", "virtio-net-pci,netdev=n0"}
	return v
}

// osMarks are the OS agent's console lines up to the join, in order.
func (v *vmNet) osMarks() []string {
	return []string{
		osagent.MarkerStart,
		"bcd os: identity kept in RAM",
		"bcd os: network up ip=eth0:10.0.2.15/24 metadata=http://" + vmMetadata + "/metadata",
		"bcd os: metadata not published yet (404",
		"bcd os: metadata: node n1, gateway " + v.gatewayURL,
		osagent.MarkerJoined + " n1",
	}
}

// waitHello waits (VM still up) for the OS agent's hello: joined is printed once the gateway
// certified the node, the stream's hello follows.
func (v *vmNet) waitHello(ctx context.Context, t *testing.T) func() {
	return func() {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := v.env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool {
			return slices.ContainsFunc(c.Hellos, func(h gateway.Hello) bool { return slices.Contains(h.Capabilities, engine.RoleOS) })
		}); err != nil {
			t.Errorf("no hello from the OS agent: %v", err)
		}
	}
}

func (v *vmNet) checkHellos(t *testing.T, capability string) {
	t.Helper()
	hellos := v.env.Queue.Counts().Hellos
	if !slices.ContainsFunc(hellos, func(h gateway.Hello) bool {
		return slices.Contains(h.Capabilities, capability) && h.AgentVersion == "bcd-os"
	}) {
		t.Errorf("the gateway's hellos %+v: want one from bcd-os with %s", hellos, capability)
	}
}

// bootAndWatch runs QEMU (as a pipe-capable environment: see pipeEnv) until every mark appeared
// on the serial console, in order, calling on[i] right after mark i; then runs then (if not nil)
// with the VM still up, and returns when each mark appeared. QEMU is killed at the end. A line
// that contains secret is an error.
func bootAndWatch(ctx context.Context, t *testing.T, qemu string, args, marks []string, on map[int]func(), secret string, limit time.Duration, then func()) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	vm := exec.CommandContext(ctx, qemu, args...)
	vm.Env = append(os.Environ(), pipeEnv+"=1")
	out, err := vm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	vm.Stderr = vm.Stdout
	start := time.Now()
	if err := vm.Start(); err != nil {
		t.Fatalf("starting QEMU: %v", err)
	}
	lines := make(chan string)
	waited := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
			}
		}
		_, _ = io.Copy(io.Discard, out)
		close(lines)
		waited <- vm.Wait()
	}()
	defer func() {
		close(stop)
		_ = vm.Process.Kill()
		<-waited
	}()
	console := &strings.Builder{}
	at := make([]time.Duration, 0, len(marks))
	for len(at) < len(marks) {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("QEMU exited before %q; console:\n%s", marks[len(at)], console)
			}
			console.WriteString(line + "\n")
			if secret != "" && strings.Contains(line, secret) {
				t.Errorf("the console shows the instance token: %q", line)
			}
			if strings.Contains(line, "FATAL") || strings.Contains(line, "Kernel panic") {
				t.Fatalf("%q; console:\n%s", line, console)
			}
			if strings.Contains(line, marks[len(at)]) {
				at = append(at, time.Since(start))
				if f := on[len(at)-1]; f != nil {
					f()
				}
			}
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %q; console:\n%s", marks[len(at)], console)
		}
	}
	if then != nil {
		go func() { // keep draining the console while then runs
			for range lines {
			}
		}()
		then()
	}
	return at
}

// buildImage builds the image with a non-race static bcd (parsing every module of the package
// under the race detector takes minutes) into a temporary directory.
func buildImage(ctx context.Context, t *testing.T, root string) (bin, deb, dir string, m Manifest) {
	t.Helper()
	fetch := exec.CommandContext(ctx, filepath.Join(root, "scripts/ramdisk/kernel-deb"), filepath.Join(root, "out/cache"))
	fetch.Stderr = os.Stderr
	debOut, err := fetch.Output()
	deb = strings.TrimSpace(string(debOut))
	if err != nil || deb == "" {
		requirement(t, "no Debian kernel package (scripts/ramdisk/kernel-deb): %v", err)
	}
	dir = t.TempDir()
	bin = filepath.Join(dir, "bcd")
	gb := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", bin, "./cmd/bcd")
	gb.Dir = root
	gb.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := gb.CombinedOutput(); err != nil {
		t.Fatalf("building bcd: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "out")
	t0 := time.Now()
	bc := exec.CommandContext(ctx, bin, "lab", "image", "build", "--kernel-deb", deb, "--binary", bin, "--out", out,
		"--cmdline", "bcd.metadata=http://"+vmMetadata+"/metadata")
	report, err := bc.CombinedOutput()
	if err != nil {
		t.Fatalf("building the image: %v\n%s", err, report)
	}
	t.Logf("image built in %.1fs:\n%s", time.Since(t0).Seconds(), report)
	b, err := os.ReadFile(filepath.Join(out, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return bin, deb, out, m
}

// buildRamdisk builds the ramdisk from the same binary and kernel package.
func buildRamdisk(ctx context.Context, t *testing.T, bin, deb string) (kernel, initrd string) {
	t.Helper()
	out := t.TempDir()
	t0 := time.Now()
	bc := exec.CommandContext(ctx, bin, "ramdisk", "build", "--kernel-deb", deb, "--binary", bin, "--out", out)
	if report, err := bc.CombinedOutput(); err != nil {
		t.Fatalf("building the ramdisk: %v\n%s", err, report)
	}
	t.Logf("ramdisk built in %.1fs", time.Since(t0).Seconds())
	return filepath.Join(out, build.KernelFile), filepath.Join(out, build.InitramfsFile)
}

// prefixSHA is the SHA-256 of the first n bytes of the file at p.
func prefixSHA(t *testing.T, p string, n int64) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
