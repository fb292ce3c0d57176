package agent

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/diag"
	"bcd/internal/ramdisk/image"
	"bcd/internal/ramdisk/inband"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/kexec"
	"bcd/internal/ramdisk/wipe"
)

// Command kinds the ramdisk runs.
const (
	KindInventory = "inventory.refresh"
	KindWipe      = "disk.wipe"
	KindDeploy    = "deploy.image"
	KindKexec     = "boot.kexec"
	KindDiag      = "diag.dcgm"
	KindPowerOff  = "ramdisk.powerOff"
	KindInbandBMC = "bmc.provisionInband"
)

// PowerOffer powers the machine off (reboot(LINUX_REBOOT_CMD_POWER_OFF) on the real one).
type PowerOffer interface {
	PowerOff(ctx context.Context) error
}

// ImageTarget is a disk opened for writing an image.
type ImageTarget interface {
	image.Target
	io.Closer
}

// Deps are the side effects the commands have: the real machine (LinuxDeps) or fakes.
type Deps struct {
	Log *slog.Logger
	// Inventory collects the machine's inventory (inventory.Collect).
	Inventory func(ctx context.Context) (inventory.Inventory, error)
	// Wipe opens disks for disk.wipe; WipeRequest tunes the read-back (Mode comes from the args).
	Wipe        wipe.Opener
	WipeRequest wipe.Request
	// OpenTarget opens the selected disk for deploy.image.
	OpenTarget func(ctx context.Context, path string) (ImageTarget, error)
	Image      image.Options
	// OpenDisk opens the deployed disk for deploy.configDrive; HTTP reads the node's NoCloud
	// documents from the site (default: a plain client; the calls have their own deadline).
	OpenDisk func(ctx context.Context, path string) (DiskDevice, error)
	HTTP     *http.Client
	// Kexec: the written disk's name goes into KexecConfig.Disk.
	KexecConfig kexec.Config
	Mounter     kexec.Mounter
	Kexec       kexec.Kexec
	Rebooter    kexec.Rebooter
	// Diag runs dcgmi; Dcgmi is its path ("" → dcgmi on PATH).
	Diag  diag.Runner
	Dcgmi string
	// PowerOff ends a lingering ramdisk (ramdisk.powerOff), PowerOffDelay after the command
	// returned its result, so that the result reaches the gateway first (default 2s).
	PowerOff      PowerOffer
	PowerOffDelay time.Duration
	// IPMI opens the host's IPMI system interface for bmc.provisionInband (the kernel's
	// /dev/ipmi0 in LinuxDeps); nil: the command fails saying there is none.
	IPMI func(ctx context.Context) (inband.Transport, io.Closer, error)
}

type commandFunc func(ctx context.Context, args []byte, report func(agentlink.Progress)) ([]byte, error)

// Commands is the ramdisk's agentlink.Handler: a table from command kind to function.
type Commands struct {
	d     Deps
	table map[string]commandFunc

	mu       sync.Mutex
	deployed inventory.Disk // the disk deploy.image wrote in this boot, for boot.kexec
	running  int            // commands running now (ramdisk.powerOff refuses while others run)
	// poweringOff is set once ramdisk.powerOff was accepted: no command starts after it.
	poweringOff bool
	key         crypto.Signer // the node key (SetKey): secrets arrive encrypted to its certificate
	site        string        // the site agent's boot HTTP URL (SetSite): boot.kexec's default guestSite
}

// SetSite gives the commands the site agent's boot HTTP URL from the kernel command line
// (BootParams.SiteURL; "" when the site agent gave none): boot.kexec points a cloud-init or
// Ignition guest at it when its command names no guestSite.
func (c *Commands) SetSite(url string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.site = url
}

// SetKey gives the commands the node key the agent joins with: bmc.provisionInband's
// credential is encrypted to its certificate.
func (c *Commands) SetKey(k crypto.Signer) {
	c.mu.Lock()
	c.key = k
	c.mu.Unlock()
}

var _ agentlink.Handler = (*Commands)(nil)

// NewCommands builds the command table over d.
func NewCommands(d Deps) *Commands {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Inventory == nil {
		d.Inventory = func(ctx context.Context) (inventory.Inventory, error) {
			return inventory.Collect(ctx, inventory.Roots{}, inventory.Options{})
		}
	}
	c := &Commands{d: d}
	c.table = map[string]commandFunc{
		KindInventory:   c.inventoryRefresh,
		KindWipe:        c.diskWipe,
		KindDeploy:      c.deployImage,
		KindKexec:       c.bootKexec,
		KindDiag:        c.diagDCGM,
		KindPowerOff:    c.powerOff,
		KindInbandBMC:   c.provisionInband,
		KindConfigDrive: c.configDrive,
	}
	if c.d.HTTP == nil {
		c.d.HTTP = &http.Client{}
	}
	if c.d.PowerOffDelay <= 0 {
		c.d.PowerOffDelay = 2 * time.Second
	}
	return c
}

// Kinds lists the command kinds c runs, sorted.
func (c *Commands) Kinds() []string {
	ks := make([]string, 0, len(c.table))
	for k := range c.table {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Run implements agentlink.Handler. A panic in a command fails that command: the agent is
// PID 1, and its death would be a kernel panic.
func (c *Commands) Run(ctx context.Context, cmd agentlink.Command, report func(agentlink.Progress)) (res []byte, err error) {
	f, ok := c.table[cmd.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown command kind %q: this ramdisk runs %s", cmd.Kind, strings.Join(c.Kinds(), ", "))
	}
	log := c.d.Log.With(slog.String("command", cmd.ID), slog.String("kind", cmd.Kind))
	defer func() {
		if p := recover(); p != nil {
			log.ErrorContext(ctx, "command panicked", "panic", p, "stack", string(debug.Stack()))
			res, err = nil, fmt.Errorf("%s: internal error: %v", cmd.Kind, p)
		}
	}()
	c.mu.Lock()
	if c.poweringOff {
		c.mu.Unlock()
		return nil, fmt.Errorf("%s: this ramdisk is powering its host off", cmd.Kind)
	}
	c.running++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running--
		c.mu.Unlock()
	}()
	log.InfoContext(ctx, "command started")
	res, err = f(ctx, cmd.Args, throttle(report, progressEvery))
	if err != nil {
		log.WarnContext(ctx, "command failed", "err", err)
		return res, fmt.Errorf("%s: %w", cmd.Kind, err)
	}
	log.InfoContext(ctx, "command succeeded", "resultBytes", len(res))
	return res, nil
}

// progressEvery is how often a running command reports progress at most.
const progressEvery = time.Second

// throttle passes on the first report, then at most one per interval, and always the
// completion of a piece of work (done == total): a wipe reports every 8 MiB written.
func throttle(report func(agentlink.Progress), every time.Duration) func(agentlink.Progress) {
	var mu sync.Mutex
	var last time.Time
	return func(p agentlink.Progress) {
		mu.Lock()
		now := time.Now()
		pass := last.IsZero() || now.Sub(last) >= every || (p.Total > 0 && p.Done >= p.Total)
		if pass {
			last = now
		}
		mu.Unlock()
		if pass {
			report(p)
		}
	}
}

// decodeArgs reads a command's JSON arguments into v; none is the same as {}. Fields the
// control plane adds that the ramdisk does not know are ignored.
func decodeArgs(args []byte, v any) error {
	if len(bytes.TrimSpace(args)) == 0 {
		return nil
	}
	if err := json.Unmarshal(args, v); err != nil {
		return fmt.Errorf("reading the arguments: %w", err)
	}
	return nil
}

// flexInt accepts a JSON number or a decimal string (workflow step arguments are strings).
type flexInt int64

func (f *flexInt) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("%s is not an integer", b)
	}
	*f = flexInt(n)
	return nil
}

// InventoryResult is inventory.refresh's result: the engine reads systemUuid and macs.
type InventoryResult struct {
	SystemUUID string   `json:"systemUuid"`
	MACs       []string `json:"macs"`
	inventory.Inventory
}

// NewInventoryResult puts the identity the engine checks at the top of the inventory: the DMI
// product UUID and every physical NIC's MAC, lower case, in inventory order.
func NewInventoryResult(inv inventory.Inventory) InventoryResult {
	r := InventoryResult{SystemUUID: inv.DMI.ProductUUID, MACs: []string{}, Inventory: inv}
	for _, n := range inv.NICs {
		m := strings.ToLower(n.MAC)
		if m != "" && !slices.Contains(r.MACs, m) {
			r.MACs = append(r.MACs, m)
		}
	}
	return r
}

func (c *Commands) collect(ctx context.Context) (inventory.Inventory, error) {
	inv, err := c.d.Inventory(ctx)
	if err != nil {
		return inventory.Inventory{}, fmt.Errorf("collecting the inventory: %w", err)
	}
	return inv, nil
}

func (c *Commands) inventoryRefresh(ctx context.Context, _ []byte, _ func(agentlink.Progress)) ([]byte, error) {
	inv, err := c.collect(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(NewInventoryResult(inv))
}

// DiskWipe is one disk of disk.wipe's result: the engine reads device (the /dev path),
// method and verified; the rest is the wipe package's record of the disk.
type DiskWipe struct {
	Device   string `json:"device"`
	Name     string `json:"name"`
	Verified bool   `json:"verified"` // the read-back found only zeros
	wipe.Result
}

// WipeResult is disk.wipe's result. It has no maps, so its JSON encoding is deterministic:
// those bytes are what the node signs. Skipped names every block device the wipe left alone and
// why (read-only removable media, optical drives, RAM and loop devices, ...), so that the signed
// result says what was not erased as well as what was. The disks are listed again after the
// wipe (RecheckDisks): one that appeared meanwhile is in Disks, not verified.
type WipeResult struct {
	Mode    wipe.Mode     `json:"mode"`
	Disks   []DiskWipe    `json:"disks"`
	Skipped []SkippedDisk `json:"skipped"`
}

// SkippedDisk is a block device disk.wipe did not erase.
type SkippedDisk struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// NewWipeResult pairs wipe results with the inventory disks they came from (in order) and
// lists the devices that were skipped.
func NewWipeResult(mode wipe.Mode, disks []inventory.Disk, results []wipe.Result, skipped []SkippedDisk) WipeResult {
	out := WipeResult{Mode: mode, Disks: make([]DiskWipe, len(results)), Skipped: slices.Clone(skipped)}
	if out.Skipped == nil {
		out.Skipped = []SkippedDisk{}
	}
	for i, r := range results {
		if r.Attempts == nil {
			r.Attempts = []wipe.Attempt{}
		}
		if r.Verification.Regions == nil {
			r.Verification.Regions = []wipe.Extent{}
		}
		d := DiskWipe{Name: r.Device, Result: r,
			Verified: r.Error == "" && r.Verification.Passed && r.Verification.AllZero && r.Verification.FirstNonZero < 0}
		if i < len(disks) {
			d.Device = disks[i].Path
		}
		out.Disks[i] = d
	}
	return out
}

// fail marks the disk as not proven erased, saying why in its error.
func (d *DiskWipe) fail(why string) {
	d.Verified = false
	if d.Error == "" {
		d.Error = why
	} else if !strings.Contains(d.Error, why) {
		d.Error += "; " + why
	}
}

// RecheckDisks compares the disks wiped (before, in the order of res.Disks) with the inventory
// taken after the wipe, and records in res what changed meanwhile: a disk gone, or whose serial,
// WWN, size or path changed, is marked not verified (the disk erased may not be the one the
// result names); a disk the wipe would have erased that appeared is added, not verified (it was
// not wiped); a device it would have skipped that appeared is added to the skipped list. The
// error names every such disk; nil when nothing changed.
func RecheckDisks(res *WipeResult, before []inventory.Disk, after inventory.Inventory) error {
	now := make(map[string]inventory.Disk, len(after.Disks))
	for _, d := range after.Disks {
		now[d.Name] = d
	}
	var errs []error
	wiped := make(map[string]bool, len(before))
	for i, d := range before {
		wiped[d.Name] = true
		if i >= len(res.Disks) {
			break
		}
		a, ok := now[d.Name]
		switch {
		case !ok:
			res.Disks[i].fail("disappeared during the wipe")
			errs = append(errs, fmt.Errorf("%s disappeared during the wipe: the disk erased may not be the one named", d.Name))
		case a.Serial != d.Serial || a.WWN != d.WWN || a.SizeBytes != d.SizeBytes || a.Path != d.Path:
			why := fmt.Sprintf("changed during the wipe (serial %q wwn %q size %d path %s, now serial %q wwn %q size %d path %s)",
				d.Serial, d.WWN, d.SizeBytes, d.Path, a.Serial, a.WWN, a.SizeBytes, a.Path)
			res.Disks[i].fail(why)
			errs = append(errs, fmt.Errorf("%s %s: the disk erased may not be the one named", d.Name, why))
		}
	}
	targets, skipped := WipeTargets(after)
	for _, a := range targets {
		if wiped[a.Name] {
			continue
		}
		const why = "appeared during the wipe: not wiped"
		res.Disks = append(res.Disks, DiskWipe{Device: a.Path, Name: a.Name, Result: wipe.Result{
			Device: a.Name, Serial: a.Serial, WWN: a.WWN, SizeBytes: int64(a.SizeBytes), Mode: res.Mode,
			Attempts: []wipe.Attempt{}, Error: why,
			Verification: wipe.Verification{Regions: []wipe.Extent{}, FirstNonZero: -1, Error: "not verified: the wipe did not run"},
		}})
		errs = append(errs, fmt.Errorf("%s appeared during the wipe and was not wiped", a.Name))
	}
	for _, s := range skipped {
		if wiped[s.Name] || slices.ContainsFunc(res.Skipped, func(k SkippedDisk) bool { return k.Name == s.Name }) {
			continue
		}
		res.Skipped = append(res.Skipped, SkippedDisk{Name: s.Name, Reason: "appeared during the wipe; " + s.Reason})
	}
	return errors.Join(errs...)
}

// WipeTargets are the disks disk.wipe erases: every disk of the inventory, removable ones (SD
// cards, USB sticks: an OS can be written to them) included. A read-only removable device (a
// CD-ROM, a BMC's virtual media, a write-protected card) cannot be written, by the wipe or by
// anyone: it is skipped, and named in the result with the reason, as is every block device the
// inventory did not report as a disk. A read-only fixed disk stays in: opening it fails, and
// so does the wipe (fail closed), except an eMMC boot partition (mmcblkNbootM), which the
// kernel keeps read-only by default: the wipe's opener makes it writable for the wipe and
// read-only again after (wipe.OpenOptions.UnlockBootPartitions).
func WipeTargets(inv inventory.Inventory) (targets []inventory.Disk, skipped []SkippedDisk) {
	for _, d := range inv.Disks {
		if d.Removable && d.ReadOnly {
			skipped = append(skipped, SkippedDisk{Name: d.Name,
				Reason: "read-only removable device (CD-ROM, virtual media or write-protected card): it cannot be written"})
			continue
		}
		targets = append(targets, d)
	}
	for _, s := range inv.Skipped {
		if s.Kind == "disk" {
			skipped = append(skipped, SkippedDisk{Name: s.Name, Reason: "not a disk the wipe writes (inventory: " + s.Reason + ")"})
		}
	}
	return targets, skipped
}

// pciStorageSubclasses names the subclasses of PCI class 01 (mass storage controller).
var pciStorageSubclasses = map[string]string{
	"00": "SCSI storage controller", "01": "IDE controller", "02": "floppy controller",
	"03": "IPI bus controller", "04": "RAID controller", "05": "ATA controller",
	"06": "SATA controller", "07": "SAS controller", "08": "NVMe controller",
	"09": "UFS controller", "80": "mass storage controller",
}

// CheckStorageControllers fails when a mass-storage PCI controller (class 01xxxx) has no driver
// bound: the ramdisk lacks its driver, so the disks behind it are not in the inventory and a
// wipe of the disks it does see would prove nothing about them.
func CheckStorageControllers(pci []inventory.PCIDevice) error {
	var errs []error
	for _, d := range pci {
		if !strings.HasPrefix(d.Class, "01") || d.Driver != "" {
			continue
		}
		what := "mass storage controller"
		if len(d.Class) >= 4 {
			what = cmp.Or(pciStorageSubclasses[d.Class[2:4]], what)
		}
		errs = append(errs, fmt.Errorf("%s %s (PCI %s:%s, class %s) has no driver bound: the disks behind it cannot be seen, so they cannot be wiped by this ramdisk (its driver must be added to the ramdisk's modules)",
			what, d.Address, d.Vendor, d.Device, d.Class))
	}
	return errors.Join(errs...)
}

func (c *Commands) diskWipe(ctx context.Context, args []byte, report func(agentlink.Progress)) ([]byte, error) {
	var a struct {
		Mode string `json:"mode"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	mode, err := wipe.ParseMode(a.Mode)
	if err != nil {
		return nil, fmt.Errorf("wipe mode: %w", err)
	}
	inv, err := c.collect(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckStorageControllers(inv.PCI); err != nil {
		return nil, fmt.Errorf("refusing to wipe: %w", err)
	}
	disks, skipped := WipeTargets(inv)
	for _, s := range skipped {
		c.d.Log.InfoContext(ctx, "not wiped", "device", s.Name, "reason", s.Reason)
	}
	if len(disks) == 0 {
		return nil, errors.New("no writable disk in the inventory: nothing can be proven erased")
	}
	req := c.d.WipeRequest
	req.Mode = mode
	progress := func(device string, done, total int64) {
		report(agentlink.Progress{Done: done, Total: total, Message: "wiping " + device})
	}
	results, werr := wipe.WipeAll(ctx, c.d.Log, disks, c.d.Wipe, req, progress)
	res := NewWipeResult(mode, disks, results, skipped)
	// The disks again, now that the wipe is over: one that appeared meanwhile was not wiped,
	// and one whose identity changed under its name is not the disk the result names.
	after, aerr := c.collect(ctx)
	if aerr != nil {
		aerr = fmt.Errorf("listing the disks again after the wipe: %w", aerr)
		for i := range res.Disks {
			res.Disks[i].fail("the disks could not be listed again after the wipe: this disk may not be the one erased")
		}
	} else {
		aerr = RecheckDisks(&res, disks, after)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("encoding the wipe result: %w", errors.Join(err, werr, aerr))
	}
	if werr != nil || aerr != nil {
		return b, errors.Join(werr, aerr)
	}
	for _, d := range res.Disks {
		if !d.Verified { // WipeAll fails such a disk too; never report success without proof
			return b, fmt.Errorf("the read-back of %s did not verify", d.Device)
		}
	}
	return b, nil
}

// DeployArgs are deploy.image's arguments.
type DeployArgs struct {
	Image           string      `json:"image"`
	URL             string      `json:"url"`
	Format          string      `json:"format"`
	Compression     string      `json:"compression"`
	SHA256          string      `json:"sha256"`
	SHA512          string      `json:"sha512"`
	Size            flexInt     `json:"size"`
	RootDeviceHints image.Hints `json:"rootDeviceHints"`
}

// DeployResult is deploy.image's result.
type DeployResult struct {
	Image          string `json:"image"`
	Device         string `json:"device"`
	Bytes          int64  `json:"bytes"` // written to the disk
	SHA256         string `json:"sha256,omitempty"`
	SHA512         string `json:"sha512,omitempty"`
	BytesRead      int64  `json:"bytesRead"`
	DurationMillis int64  `json:"durationMillis"`
}

func (c *Commands) deployImage(ctx context.Context, args []byte, report func(agentlink.Progress)) ([]byte, error) {
	var a DeployArgs
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	// Refused before the disk is touched.
	if a.URL == "" {
		return nil, fmt.Errorf("image %q: the command carries no url (the control plane does not send the image's location yet)", a.Image)
	}
	if a.SHA256 == "" && a.SHA512 == "" {
		return nil, fmt.Errorf("image %q: the command carries no sha256 or sha512: images are only written with a digest to check", a.Image)
	}
	inv, err := c.collect(ctx)
	if err != nil {
		return nil, err
	}
	disk, err := image.SelectDisk(inv.Disks, a.RootDeviceHints)
	if err != nil {
		return nil, err
	}
	c.d.Log.InfoContext(ctx, "deploying image", "image", a.Image, "disk", disk.Name, "path", disk.Path)
	if err := mkdir(c.d.Image.TempDir); err != nil {
		return nil, err
	}
	t, err := c.d.OpenTarget(ctx, disk.Path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", disk.Path, err)
	}
	spec := image.Spec{URL: a.URL, Format: image.Format(a.Format), Compression: image.Compression(a.Compression),
		SHA256: a.SHA256, SHA512: a.SHA512, Size: int64(a.Size)}
	progress := func(stage image.Stage, done, total int64, _ float64) {
		msg := "writing " + a.Image + " to " + disk.Path
		if stage == image.Staging {
			// A qcow2 is checked whole before its conversion writes anything: total is the
			// most the staging takes, not what it will take.
			msg, total = "staging "+a.Image+" (qcow2) in memory before writing it to "+disk.Path, 0
		}
		report(agentlink.Progress{Done: done, Total: total, Message: msg})
	}
	res, err := image.Fetch(ctx, c.d.Log, spec, t, c.d.Image, progress)
	if cerr := t.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("closing %s: %w", disk.Path, cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("writing image %q to %s: %w", a.Image, disk.Path, err)
	}
	c.mu.Lock()
	c.deployed = disk
	c.mu.Unlock()
	out := DeployResult{Image: a.Image, Device: disk.Path, Bytes: res.BytesWritten, BytesRead: res.BytesRead, DurationMillis: res.DurationMillis}
	if res.Algorithm == "sha512" {
		out.SHA512 = res.Digest
	} else {
		out.SHA256 = res.Digest
	}
	return json.Marshal(out)
}

func (c *Commands) bootKexec(ctx context.Context, args []byte, _ func(agentlink.Progress)) ([]byte, error) {
	var a struct {
		RootDeviceHints image.Hints `json:"rootDeviceHints"`
		// Guest and GuestSite: kernel parameters pointing the booted image at the site's
		// datasource (kexec.GuestArgs; docs/drivers/cloud-init.md).
		Guest     string `json:"guest"`
		GuestSite string `json:"guestSite"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	guest, err := kexec.ParseGuest(a.Guest)
	if err != nil {
		return nil, fmt.Errorf("boot.kexec: %w", err)
	}
	site, from := c.guestSite(a.GuestSite)
	appendArgs, err := kexec.GuestArgs(guest, site)
	switch {
	case err != nil && site == "":
		return nil, fmt.Errorf("boot.kexec guest %s needs the site's boot HTTP URL (http://host:port): the command has no guestSite and the ramdisk's command line no %s (its site agent is older than that key): %w", guest, netboot.CmdlineSiteKey, err)
	case err != nil:
		return nil, fmt.Errorf("boot.kexec guest %s: the site's boot HTTP URL from %s: %w", guest, from, err)
	}
	disk, err := c.deployedDisk(ctx, a.RootDeviceHints)
	if err != nil {
		return nil, err
	}
	cfg := c.d.KexecConfig
	cfg.Disk = disk.Name
	cfg.Append = append(slices.Clone(cfg.Append), appendArgs...)
	if err := mkdir(cfg.MountDir); err != nil {
		return nil, err
	}
	// On the real machine Boot does not return when it succeeds; a dry run does.
	if err := kexec.Boot(ctx, c.d.Log, cfg, c.d.Mounter, c.d.Kexec, c.d.Rebooter); err != nil {
		return nil, fmt.Errorf("booting %s: %w", disk.Path, err)
	}
	return json.Marshal(struct {
		Device  string `json:"device"`
		Booting bool   `json:"booting"`
	}{disk.Path, true})
}

// guestSite is the site's boot HTTP URL a command names (guestSite), else the ramdisk command
// line's, and where it came from (for errors).
func (c *Commands) guestSite(fromCommand string) (site, from string) {
	if fromCommand != "" {
		return fromCommand, "the command's guestSite"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.site, "the ramdisk command line's " + netboot.CmdlineSiteKey
}

// deployedDisk is the disk deploy.image wrote in this boot, else (nothing written in this boot)
// the disk it would write.
func (c *Commands) deployedDisk(ctx context.Context, hints image.Hints) (inventory.Disk, error) {
	c.mu.Lock()
	disk := c.deployed
	c.mu.Unlock()
	if disk.Name != "" {
		return disk, nil
	}
	inv, err := c.collect(ctx)
	if err != nil {
		return inventory.Disk{}, err
	}
	return image.SelectDisk(inv.Disks, hints)
}

// PowerOffResult is ramdisk.powerOff's result.
type PowerOffResult struct {
	PoweringOff bool   `json:"poweringOff"`
	In          string `json:"in"` // how long after the result the host goes down
}

// powerOff ends a lingering ramdisk (the fast-track window passed with no workflow): it refuses
// while another command runs (the control plane sends it only to an idle ramdisk; a workflow
// that started meanwhile must not lose its ramdisk), else accepts no further command, returns,
// and powers the host off PowerOffDelay later.
func (c *Commands) powerOff(ctx context.Context, args []byte, _ func(agentlink.Progress)) ([]byte, error) {
	if err := decodeArgs(args, &struct{}{}); err != nil {
		return nil, err
	}
	if c.d.PowerOff == nil {
		return nil, errors.New("this ramdisk cannot power its host off (no power-off configured)")
	}
	c.mu.Lock()
	if c.running > 1 {
		n := c.running - 1
		c.mu.Unlock()
		return nil, fmt.Errorf("refusing to power off: %d other command(s) running", n)
	}
	c.poweringOff = true
	c.mu.Unlock()
	delay := c.d.PowerOffDelay
	c.d.Log.InfoContext(ctx, "fast-track window over: powering the host off", "in", delay)
	go func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		<-t.C
		if err := c.d.PowerOff.PowerOff(context.WithoutCancel(ctx)); err != nil {
			c.d.Log.Error("powering the host off", "err", err)
			c.mu.Lock()
			c.poweringOff = false // still up: usable again
			c.mu.Unlock()
		}
	}()
	return json.Marshal(PowerOffResult{PoweringOff: true, In: delay.String()})
}

// DiagResult is diag.dcgm's result: result is "pass", "fail" or "not applicable" (no NVIDIA
// GPU), then the diag package's record.
type DiagResult struct {
	Verdict string `json:"result"`
	diag.Result
}

func (c *Commands) diagDCGM(ctx context.Context, args []byte, _ func(agentlink.Progress)) ([]byte, error) {
	var a struct {
		Level flexInt `json:"level"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	inv, err := c.collect(ctx)
	if err != nil {
		return nil, err
	}
	res, derr := diag.Run(ctx, c.d.Diag, inv, diag.Config{Dcgmi: c.d.Dcgmi, Level: int(a.Level)})
	out := DiagResult{Verdict: "fail", Result: res}
	switch {
	case res.Status == diag.StatusNotApplicable:
		out.Verdict = "not applicable"
	case res.Passed() && derr == nil:
		out.Verdict = "pass"
	}
	if out.Tests == nil {
		out.Tests = []diag.TestResult{}
	}
	if out.GPUs == nil {
		out.GPUs = []string{}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encoding the diagnostics result: %w", errors.Join(err, derr))
	}
	return b, derr
}

// mkdir makes a working directory when one is configured.
func mkdir(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	return nil
}

// inbandArgs are bmc.provisionInband's arguments: the credential (JSON {username, password})
// encrypted to this node's certificate, and optionally the LAN channel.
type inbandArgs struct {
	Credentials string  `json:"credentials"`
	Channel     flexInt `json:"channel"`
}

// provisionInband creates the node's BMC user over the host's IPMI interface and reports the
// BMC's address and the user slot. The password lives only for the call: it is in no result,
// log line or error.
func (c *Commands) provisionInband(ctx context.Context, raw []byte, _ func(agentlink.Progress)) ([]byte, error) {
	var a inbandArgs
	if err := decodeArgs(raw, &a); err != nil {
		return nil, err
	}
	if a.Credentials == "" {
		return nil, errors.New("arguments: credentials are missing (the control plane sends them encrypted to this node's certificate)")
	}
	if a.Channel < 0 || a.Channel > 11 {
		return nil, fmt.Errorf("arguments: channel %d: accepted are 1 to 11, or 0 to find the LAN channel", a.Channel)
	}
	c.mu.Lock()
	key := c.key
	c.mu.Unlock()
	if key == nil {
		return nil, errors.New("no node key to decrypt the credential with")
	}
	plain, err := pki.DecryptAsAgent(key, a.Credentials)
	if err != nil {
		return nil, fmt.Errorf("decrypting the BMC credential: %w", err)
	}
	var cred struct{ Username, Password string }
	if err := json.Unmarshal(plain, &cred); err != nil || cred.Username == "" || cred.Password == "" {
		return nil, errors.New("decrypting the BMC credential: the plaintext is not {username, password}")
	}
	if c.d.IPMI == nil {
		return nil, errors.New("this ramdisk has no IPMI system interface")
	}
	t, closer, err := c.d.IPMI(ctx)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	res, err := inband.Provision(ctx, t, inband.Request{Username: cred.Username, Password: cred.Password, Channel: byte(a.Channel)})
	if err != nil {
		return nil, err
	}
	c.d.Log.InfoContext(ctx, "BMC credential provisioned in-band", "address", res.Address, "user", res.Username, "userId", res.UserID, "channel", res.Channel, "reused", res.Reused)
	return json.Marshal(res)
}
