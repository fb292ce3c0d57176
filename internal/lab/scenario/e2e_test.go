package scenario

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/engine"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/lab"
	"bcd/internal/server"
)

// requirement fails the test under CI (CI=true) and skips it elsewhere.
func requirement(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI requirement missing: "+format, args...)
	}
	t.Skipf(format, args...)
}

// TestEndToEnd takes two real PXE-booting VMs (one SeaBIOS with a virtio disk enrolled by
// Redfish, one OVMF with an NVMe disk enrolled by IPMI) through their life against an in-process control plane, with the real site
// agent, ramdisk and lab OS image:
//
//	enroll → inspecting → commissioning → ready → deploy → deployed → (VM 0: rescue → unrescue →
//	deployed) → undeploy → releasing → ready
//
// It asserts the states, the inventory, the disk contents (the image written, then wiped), the
// events and that no command ran twice. On failure the consoles and agent logs are kept in
// out/e2e-artifacts.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	if os.Geteuid() != 0 {
		requirement(t, "the lab needs root")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		requirement(t, "qemu-system-x86_64 not installed")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "out")
	if v := os.Getenv("BCD_E2E_OUT"); v != "" {
		out = v
	}
	ramdiskDir, imageDir := filepath.Join(out, "ramdisk"), filepath.Join(out, "lab")
	for _, f := range []string{filepath.Join(ramdiskDir, "vmlinuz"), filepath.Join(ramdiskDir, "initramfs.cpio.gz"), filepath.Join(imageDir, "manifest.json")} {
		if _, err := os.Stat(f); err != nil {
			requirement(t, "%s missing: make ramdisk lab-image", f)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Minute)
	defer cancel()
	tmp := t.TempDir()

	bin := filepath.Join(tmp, "bcd")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/bcd")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building bcd: %v\n%s", err, b)
	}

	logf, err := os.Create(filepath.Join(tmp, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// VM 1's disk is NVMe: the deploy finds the image's partition as nvme0n1p1 and the release
	// wipes the namespace, with its hidden-capacity checks on a real NVMe controller.
	labOpts := lab.Options{VMs: 2, Firmware: lab.ChoiceMixed, DiskBus: lab.DiskMixed, Dir: filepath.Join(tmp, "lab"), NetNS: "bcde2e"}
	// A fast-track window longer than the test: commissioning leaves the ramdisk up and the
	// deploy runs in it (no power cycle, no ramdisk boot), which is asserted below.
	srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", DataDir: filepath.Join(tmp, "server"),
		GatewayHosts: []string{lab.DefaultBridgeIPv4().Addr().String()}, Engine: engine.Config{FastTrackWindow: time.Hour}},
		slog.New(slog.NewJSONHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	srvCtx, stopServer := context.WithCancel(context.Background())
	go func() { served <- srv.Serve(srvCtx) }()
	defer func() {
		stopServer()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	}()
	c := NewClient(srv.URL(), srv.FirstAdminToken())

	// The lab: a file share with the ramdisk and the image, a site agent, two VMs.
	share := filepath.Join(tmp, "share")
	if err := os.MkdirAll(share, 0o755); err != nil {
		t.Fatal(err)
	}
	_, manifest, err := LabImage(imageDir, "http://unused/")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(ramdiskDir, "vmlinuz"), filepath.Join(ramdiskDir, "initramfs.cpio.gz"), filepath.Join(imageDir, manifest.File)} {
		if err := os.Symlink(f, filepath.Join(share, filepath.Base(f))); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := filepath.Join(tmp, "site-join-token")
	ca, err := c.JoinToken(ctx, "default", tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(tmp, "ca.pem")
	if err := os.WriteFile(caFile, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	gwPort, err := portOf(srv.GatewayURL())
	if err != nil {
		t.Fatal(err)
	}
	_, st, err := lab.Up(ctx, labOpts, lab.UpConfig{Supervisor: []string{bin, "lab", "supervise"}, ShareDir: share,
		Site: &lab.SiteOptions{Site: "default", Binary: bin, GatewayPort: gwPort, CAFile: caFile, JoinTokenFile: tokenFile,
			Kernel: "vmlinuz", Initrd: "initramfs.cpio.gz"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			keepArtifacts(t, out, labOpts.Dir, tmp)
		}
		if err := lab.Down(context.Background(), labOpts.Dir, slog.New(slog.DiscardHandler)); err != nil {
			t.Errorf("lab down: %v", err)
		}
	}()
	img, _, err := LabImage(imageDir, st.Files.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddSignedImage(ctx, img); err != nil {
		t.Fatal(err)
	}
	creds, err := lab.ReadCredentials(st.Credentials)
	if err != nil {
		t.Fatal(err)
	}

	// The Redfish VM (0) commissions in a pool with BIOS settings its virtual BMC holds other
	// values of: written as pending settings, applied by the reset that boots the ramdisk, read
	// back once it is up. The IPMI VM (1) in the default pool.
	biosSettings := map[string]string{"SriovGlobalEnable": "Enabled", "ProcCStates": "Disabled"}
	if _, err := c.Inventory.CreatePool(ctx, connect.NewRequest(&bcdv1.CreatePoolRequest{Name: "bios", Site: "default",
		Policy: &bcdv1.PoolPolicy{HardwareProfile: "redfish", BiosSettings: biosSettings}})); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nodes, err := c.EnrollLabInto(ctx, st, creds, func(i int) string {
		if DriverFor(i) == Redfish {
			return "bios"
		}
		return "default"
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.NodeID
	}
	view := &View{W: testWriter{t}, Start: start}
	phase := func(name, want string, limit time.Duration, nodeIDs ...string) {
		t.Helper()
		pctx, pcancel := context.WithTimeout(ctx, limit)
		defer pcancel()
		began := time.Now()
		if err := c.Wait(pctx, nodeIDs, want, view.Update); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("phase %-28s %6.1f s", name, time.Since(began).Seconds())
	}
	phase("enroll → ready", "ready", 15*time.Minute, ids...)

	// The BIOS settings were written, applied by a reset of the VM and read back.
	if err := biosApplied(ctx, c, nodes[0].NodeID, biosSettings); err != nil {
		t.Errorf("%s: %v", nodes[0].VM.Name, err)
	}

	// Inspection matched the VMs: MACs and product UUIDs as QEMU has them.
	for _, n := range nodes {
		got := get(ctx, t, c, n.NodeID)
		if got.ProductUuid != n.VM.UUID || !contains(got.Macs, n.VM.MAC) {
			t.Errorf("%s: inventory gave uuid %q macs %v, want %s and %s", n.VM.Name, got.ProductUuid, got.Macs, n.VM.UUID, n.VM.MAC)
		}
	}

	// The inventories read back as QEMU made the VMs (firmware, disk bus and size, memory, NIC),
	// and a listing with a hardware requirement picks the NVMe VM alone.
	for _, n := range nodes {
		if err := inventoryMatches(ctx, c, n.NodeID, n.VM.VM); err != nil {
			t.Errorf("%s: %v", n.VM.Name, err)
		}
	}
	if resp, err := c.Nodes.List(ctx, connect.NewRequest(&bcdv1.ListNodesRequest{Require: []string{"disks.nvme>=1"}})); err != nil {
		t.Errorf("nodes with an NVMe disk: %v", err)
	} else if len(resp.Msg.Nodes) != 1 || resp.Msg.Nodes[0].Id != nodes[1].NodeID {
		t.Errorf("nodes with an NVMe disk: %d listed, want %s (%s) alone", len(resp.Msg.Nodes), nodes[1].VM.Name, nodes[1].VM.DiskBus)
	}

	// VM 0 deploys with a config drive and the operator's user-data: the ramdisk reads the
	// node's NoCloud documents from the site agent, as a guest would, and writes them to a FAT
	// partition after the image's own. VM 1 deploys with the built-in profile.
	if _, err := c.Inventory.PutDeployProfile(ctx, connect.NewRequest(&bcdv1.PutDeployProfileRequest{Profile: &bcdv1.DeployProfile{Name: "lab-drive",
		Definition: `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},{"use":"management.setBootDevice","args":{"device":"disk","persistent":"true"}},` +
			`{"use":"boot.prepareInstance"},{"use":"deploy.configDrive"},{"use":"boot.kexec"}],"cleanup":[{"use":"boot.cleanUp"}]}`}})); err != nil {
		t.Fatal(err)
	}
	userData := []byte("#cloud-config\nhostname: lab-0\n")
	if _, err := c.Nodes.Deploy(ctx, connect.NewRequest(&bcdv1.DeployRequest{Node: ids[0], Image: img.Name, Profile: "lab-drive", UserData: userData, Reason: "lab scenario"})); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[1:] {
		if err := c.Verb(ctx, "deploy", id, img.Name); err != nil {
			t.Fatal(err)
		}
	}
	phase("deploy → deployed", "deployed", 15*time.Minute, ids...)
	for i, n := range nodes {
		if err := deployFastTracked(ctx, c, n.NodeID); err != nil {
			t.Errorf("%s: %v", n.VM.Name, err)
		}
		if err := imageWritten(ctx, c, n.NodeID); err != nil {
			t.Errorf("%s: %v", n.VM.Name, err)
		}
		drive := i == 0
		if err := diskHas(n.VM.Disk, manifest.Size, manifest.DiskSHA256, drive); err != nil {
			t.Errorf("%s after deploy: %v", n.VM.Name, err)
		}
		if drive {
			seen, err := configDriveHas(n.VM.Disk, map[string][]byte{"meta-data": []byte("instance-id: \"" + n.NodeID + "\"\n"), "user-data": userData})
			if err != nil {
				t.Errorf("%s: config drive: %v", n.VM.Name, err)
			}
			t.Logf("%s: config drive: %s", n.VM.Name, seen)
		}
		waitConsole(ctx, t, n.VM.Console, "bcd os: joined")
		// The site agent's DHCP leased the VM its address; its renewals of the boot lease told
		// the control plane, which shows it on the node.
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := get(ctx, t, c, n.NodeID)
			if len(got.Addresses) > 0 && strings.EqualFold(got.Addresses[0].Mac, n.VM.MAC) {
				t.Logf("%s: address %s (until %s)", n.VM.Name, got.Addresses[0].Ip, got.Addresses[0].ExpiresAt)
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: addresses %v, want the lease of %s", n.VM.Name, got.Addresses, n.VM.MAC)
				break
			}
			time.Sleep(time.Second)
		}
	}

	if err := c.Verb(ctx, "rescue", ids[0], ""); err != nil {
		t.Fatal(err)
	}
	phase("rescue", "rescue", 10*time.Minute, ids[0])
	if err := c.Verb(ctx, "unrescue", ids[0], ""); err != nil {
		t.Fatal(err)
	}
	phase("unrescue → deployed", "deployed", 10*time.Minute, ids[0])

	// The operator watches the IPMI VM's serial console through its BMC's Serial-over-LAN (site
	// agent, gateway, API) while the release boots it into the ramdisk and wipes it.
	sol := nodes[1]
	watch, err := c.WatchConsole(ctx, sol.NodeID, "e2e: watch the release")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if err := c.Verb(ctx, "undeploy", id, ""); err != nil {
			t.Fatal(err)
		}
	}
	phase("undeploy → ready", "ready", 15*time.Minute, ids...)
	if seen := watch.Stop(); !strings.Contains(seen, `msg="command started"`) || !strings.Contains(seen, "disk.wipe") {
		t.Errorf("%s: the console session showed %d bytes without the ramdisk's wipe (last: %q)", sol.VM.Name, len(seen), tail(seen, 400))
	} else {
		t.Logf("%s: %d bytes of its serial console seen over Serial-over-LAN during the release", sol.VM.Name, len(seen))
	}
	t.Logf("whole life of both VMs: %.1f s", time.Since(start).Seconds())
	for _, n := range nodes {
		if err := diskWiped(n.VM.Disk, n.VM.DiskSize); err != nil {
			t.Errorf("%s after undeploy: %v", n.VM.Name, err)
		}
		// Every wipe is proven: signed, verified, on the disk of the VM's bus, with its
		// hidden-capacity check recorded (NVMe: the controller's namespaces were read).
		disk := map[lab.DiskBus]string{lab.DiskVirtio: "vda", lab.DiskNVMe: "nvme0n1"}[n.VM.DiskBus]
		if err := wipesProven(ctx, c, n.NodeID, disk, n.VM.DiskBus == lab.DiskNVMe); err != nil {
			t.Errorf("%s: %v", n.VM.Name, err)
		}
	}

	// The event log tells the life of each node.
	want := map[int][]string{
		0: {"enrolling", "inspecting", "commissioning", "ready", "deploying", "deployed", "rescue", "deployed", "releasing", "ready"},
		1: {"enrolling", "inspecting", "commissioning", "ready", "deploying", "deployed", "releasing", "ready"},
	}
	for i, n := range nodes {
		got := stateChanges(ctx, t, c, n.NodeID)
		if !subsequence(want[i], got) {
			t.Errorf("%s went through %v, want %v in order", n.VM.Name, got, want[i])
		}
	}
	// No command ran twice: each command id was started once by the ramdisks and finished once
	// by the site agent.
	for _, f := range []string{nodes[0].VM.Console, nodes[1].VM.Console} {
		assertOnce(t, f, regexp.MustCompile(`msg="command started" command=(\S+)`))
	}
	assertOnce(t, filepath.Join(labOpts.Dir, "site.log"), regexp.MustCompile(`"msg":"site command done","command":"([^"]+)"`))
}

// wipesProven checks a node's disk.wipe attestations (commissioning's and the release's): each
// verified by the control plane, each erasing and reading back disk, with a hidden-capacity check
// that ran (when checked) and found nothing.
func wipesProven(ctx context.Context, c *Client, node, disk string, checked bool) error {
	resp, err := c.Nodes.Attestations(ctx, connect.NewRequest(&bcdv1.ListAttestationsRequest{Node: node, Kind: "disk.wipe"}))
	if err != nil {
		return fmt.Errorf("listing wipe attestations: %w", err)
	}
	if n := len(resp.Msg.Attestations); n < 2 {
		return fmt.Errorf("%d disk.wipe attestations, want commissioning's and the release's", n)
	}
	for _, a := range resp.Msg.Attestations {
		if !a.Verified {
			return fmt.Errorf("wipe %s not verified: %s", a.CommandId, a.VerifyError)
		}
		var res struct {
			Disks []struct {
				Name           string `json:"name"`
				Verified       bool   `json:"verified"`
				HiddenCapacity struct {
					Checked bool   `json:"checked"`
					Found   bool   `json:"found"`
					Detail  string `json:"detail"`
				} `json:"hiddenCapacity"`
			} `json:"disks"`
		}
		if err := json.Unmarshal([]byte(a.Result), &res); err != nil {
			return fmt.Errorf("wipe %s: result: %w", a.CommandId, err)
		}
		if len(res.Disks) != 1 || filepath.Base(res.Disks[0].Name) != disk || !res.Disks[0].Verified {
			return fmt.Errorf("wipe %s erased %+v, want %s read back as zeros", a.CommandId, res.Disks, disk)
		}
		if h := res.Disks[0].HiddenCapacity; h.Found || h.Checked != checked {
			return fmt.Errorf("wipe %s: hidden capacity %+v, want checked %t and nothing found", a.CommandId, h, checked)
		}
	}
	return nil
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func portOf(gatewayURL string) (int, error) {
	u, err := url.Parse(gatewayURL)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// imageWritten checks, through the node's commands (bcd node commands), that its deploy's
// ramdisk took deploy.image and wrote it: succeeded, with the agent and the times it was taken
// and ended.
func imageWritten(ctx context.Context, c *Client, nodeID string) error {
	resp, err := c.Nodes.Commands(ctx, connect.NewRequest(&bcdv1.ListCommandsRequest{Node: nodeID}))
	if err != nil {
		return fmt.Errorf("listing the commands: %w", err)
	}
	for _, cmd := range resp.Msg.Commands {
		if cmd.Kind != "deploy.image" { // (the newest: this deploy's, whichever its profile)
			continue
		}
		if cmd.State != "succeeded" || !strings.HasPrefix(cmd.Agent, "node:") || cmd.DeliveredAt == "" || cmd.FinishedAt == "" || cmd.Profile == "" {
			return fmt.Errorf("its deploy.image command: %+v, want succeeded on the node's ramdisk, with its times and its workflow's profile", cmd)
		}
		return nil
	}
	return fmt.Errorf("no deploy.image command among its %d newest", len(resp.Msg.Commands))
}

// inventoryMatches checks what the node's ramdisk reported against the VM QEMU runs: its
// firmware, its one disk (bus and size), its memory (the kernel keeps some for itself) and its
// NIC.
func inventoryMatches(ctx context.Context, c *Client, nodeID string, vm lab.VM) error {
	resp, err := c.Nodes.Inventory(ctx, connect.NewRequest(&bcdv1.GetNodeInventoryRequest{Node: nodeID}))
	if err != nil {
		return fmt.Errorf("reading the inventory: %w", err)
	}
	f := resp.Msg.GetFacts()
	nvme := int32(0)
	if vm.DiskBus == lab.DiskNVMe {
		nvme = 1
	}
	memory := uint64(vm.MemoryMiB) << 20
	switch {
	case f.BootMode != string(vm.Firmware):
		return fmt.Errorf("boot mode %q, want %q", f.BootMode, vm.Firmware)
	case f.Disks != 1 || f.LargestDiskBytes != uint64(vm.DiskSize) || f.Nvme != nvme:
		return fmt.Errorf("%d disks, the largest %d bytes, %d on NVMe: want the VM's %s disk of %d bytes", f.Disks, f.LargestDiskBytes, f.Nvme, vm.DiskBus, vm.DiskSize)
	case f.MemoryBytes > memory || f.MemoryBytes < memory/2:
		return fmt.Errorf("memory %d bytes, want at most the VM's %d and more than half of it", f.MemoryBytes, memory)
	case f.Nics < 1 || f.Sockets < 1 || f.Threads < 1:
		return fmt.Errorf("%d NICs, %d sockets, %d threads: want one of each at least", f.Nics, f.Sockets, f.Threads)
	case !strings.Contains(resp.Msg.Inventory, `"mac":"`+vm.MAC+`"`):
		return fmt.Errorf("no NIC with the VM's MAC %s in %.500s", vm.MAC, resp.Msg.Inventory)
	}
	return nil
}

func get(ctx context.Context, t *testing.T, c *Client, id string) *bcdv1.Node {
	t.Helper()
	resp, err := c.Nodes.Get(ctx, connect.NewRequest(&bcdv1.GetNodeRequest{Node: id}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Node
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// diskHas checks that the first size bytes of the VM's disk are the image (by digest).
func diskHas(disk string, size int64, sha string, configDrive bool) error {
	f, err := os.Open(disk)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	head := make([]byte, 512)
	if _, err := f.ReadAt(head, 0); err != nil {
		return fmt.Errorf("reading %s: %w", disk, err)
	}
	if configDrive {
		// The image has one partition; the config drive added the second entry.
		if bytes.Equal(head[462:478], make([]byte, 16)) {
			return errors.New("the partition table has no second entry: no config drive was added")
		}
		clear(head[462:478])
	}
	h.Write(head)
	if _, err := io.CopyN(h, io.NewSectionReader(f, 512, size-512), size-512); err != nil {
		return fmt.Errorf("reading %s: %w", disk, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return fmt.Errorf("first %d bytes of the disk have sha256 %s, want the image's %s", size, got, sha)
	}
	return nil
}

// configDriveHas checks the config drive on a disk the lab image was deployed to: the MBR's
// second partition is FAT16 (LBA), labelled CIDATA, and holds want's files (read with mtools,
// independently of bcd's writer) and a vendor-data.
func configDriveHas(disk string, want map[string][]byte) (seen string, err error) {
	f, err := os.Open(disk)
	if err != nil {
		return "", err
	}
	head := make([]byte, 512)
	_, err = f.ReadAt(head, 0)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", disk, err)
	}
	e := head[462:478]
	if e[4] != 0x0e {
		return "", fmt.Errorf("partition 2 has type %#02x, want 0x0e (FAT16 LBA)", e[4])
	}
	start := int64(binary.LittleEndian.Uint32(e[8:])) * 512
	at := fmt.Sprintf("%s@@%d", disk, start)
	seen = fmt.Sprintf("partition 2 at byte %d, %d bytes", start, int64(binary.LittleEndian.Uint32(e[12:]))*512)
	label, err := exec.Command("mlabel", "-s", "-i", at, "::").CombinedOutput()
	if err != nil || !strings.Contains(string(label), "CIDATA") {
		return seen, fmt.Errorf("mlabel: %v: %s", err, label)
	}
	for _, name := range []string{"meta-data", "user-data", "vendor-data"} {
		got, err := exec.Command("mtype", "-i", at, "::"+name).Output()
		if err != nil {
			return seen, fmt.Errorf("mtype %s: %w", name, err)
		}
		if w, ok := want[name]; ok && !bytes.Equal(got, w) {
			return seen, fmt.Errorf("%s holds %q, want %q", name, got, w)
		}
		if name == "vendor-data" && !bytes.Contains(got, []byte("bcd-rejoin.sh")) {
			return seen, fmt.Errorf("vendor-data holds no rejoin script: %q", got)
		}
		seen += fmt.Sprintf(", %s %d bytes", name, len(got))
	}
	return seen + ", label CIDATA (read with mtools)", nil
}

// diskWiped checks a quick wipe: the first and last MiB read as zeros.
func diskWiped(disk string, size int64) error {
	f, err := os.Open(disk)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for _, off := range []int64{0, size - int64(len(buf))} {
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("reading %s at %d: %w", disk, off, err)
		}
		if !bytes.Equal(buf, make([]byte, len(buf))) {
			return fmt.Errorf("the MiB at offset %d is not zero", off)
		}
	}
	return nil
}

// waitConsole waits (up to 3 minutes) for a line containing marker in a console log.
// biosApplied checks a node's node.bios events: one that wrote every attribute of want as
// pending, then a read-back after the boot with want's values and no drift.
func biosApplied(ctx context.Context, c *Client, node string, want map[string]string) error {
	resp, err := c.Nodes.Events(ctx, connect.NewRequest(&bcdv1.ListEventsRequest{Node: node, Limit: 1000}))
	if err != nil {
		return fmt.Errorf("listing events: %w", err)
	}
	written := false
	for _, ev := range resp.Msg.Events {
		if ev.Kind != "node.bios" {
			continue
		}
		var d struct {
			Written    []string          `json:"written"`
			Pending    bool              `json:"pending"`
			Attributes map[string]string `json:"attributes"`
			Drift      []string          `json:"drift"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &d); err != nil {
			return fmt.Errorf("node.bios event %q: %w", ev.Data, err)
		}
		switch {
		case d.Pending && len(d.Written) == len(want):
			written = true
		case d.Attributes != nil && written:
			for k, v := range want {
				if d.Attributes[k] != v {
					return fmt.Errorf("BIOS read back after the boot: %v, want %v (drift %v)", d.Attributes, want, d.Drift)
				}
			}
			return nil
		}
	}
	return fmt.Errorf("no node.bios events that wrote %v and read them back applied", want)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func waitConsole(ctx context.Context, t *testing.T, path, marker string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Contains(b, []byte(marker)) {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Errorf("%s: no %q on the console", path, marker)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func stateChanges(ctx context.Context, t *testing.T, c *Client, id string) []string {
	t.Helper()
	resp, err := c.Nodes.Events(ctx, connect.NewRequest(&bcdv1.ListEventsRequest{Node: id, Limit: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, e := range resp.Msg.Events {
		if e.ToState != "" && (len(states) == 0 || states[len(states)-1] != e.ToState) {
			states = append(states, e.ToState)
		}
	}
	return states
}

// deployFastTracked checks that the node's deploy ran in the ramdisk commissioning left up:
// the deploy took the lingering ramdisk, and from the deploying transition to deployed its
// workflow skipped power.cycle (fast track) and ran none.
func deployFastTracked(ctx context.Context, c *Client, id string) error {
	resp, err := c.Nodes.Events(ctx, connect.NewRequest(&bcdv1.ListEventsRequest{Node: id, Limit: 1000}))
	if err != nil {
		return err
	}
	deploying, taken, skipped := false, false, false
	for _, e := range resp.Msg.Events {
		switch {
		case e.ToState == "deploying" && e.FromState != "deploying":
			deploying = true
		case e.ToState == "deployed":
			deploying = false
		case !deploying:
		case e.Kind == "node.ramdisk.linger.end":
			taken = strings.Contains(e.Reason, "takes the lingering ramdisk")
		case e.Kind == "workflow.step" && strings.Contains(e.Data, `"use":"power.cycle{`): // not power.cycle?noMacs
			if !strings.Contains(e.Data, `"result":"skipped"`) {
				return fmt.Errorf("the deploy power-cycled the node (fast track expected): %s", e.Data)
			}
			skipped = true
		}
	}
	if !taken || !skipped {
		return fmt.Errorf("the deploy was not fast-tracked (took the lingering ramdisk %v, skipped its power cycle %v)", taken, skipped)
	}
	return nil
}

// subsequence reports whether want appears in got in order (other states may come between).
func subsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func assertOnce(t *testing.T, path string, re *regexp.Regexp) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Errorf("reading %s: %v", path, err)
		return
	}
	defer f.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			seen[m[1]]++
		}
	}
	if len(seen) == 0 {
		t.Errorf("%s: no command lines matched %s", path, re)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s: command %s ran %d times", path, id, n)
		}
	}
}

// keepArtifacts copies the consoles and logs of a failed run to out/e2e-artifacts/<time>.
func keepArtifacts(t *testing.T, out, labDir, tmp string) {
	dst := filepath.Join(out, "e2e-artifacts", time.Now().UTC().Format("20060102T150405Z"))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Logf("keeping artifacts: %v", err)
		return
	}
	var files []string
	for _, pat := range []string{filepath.Join(labDir, "*", "console.log"), filepath.Join(labDir, "*", "qemu.log"),
		filepath.Join(labDir, "*.log"), filepath.Join(tmp, "server.log")} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(filepath.Dir(labDir), f)
		if strings.HasPrefix(rel, "..") {
			rel = filepath.Base(f)
		}
		name := strings.ReplaceAll(rel, string(filepath.Separator), "_")
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.WriteFile(filepath.Join(dst, name), b, 0o644)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Logf("keeping %s: %v", f, err)
		}
	}
	js, _ := json.Marshal(files)
	t.Logf("console logs and agent logs kept in %s: %s", dst, js)
}
