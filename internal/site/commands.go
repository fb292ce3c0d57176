package site

import (
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"bcd/internal/agentlink"
	"bcd/internal/bmc"
	"bcd/internal/netboot"
	"bcd/internal/pki"
)

// Command kinds the site agent runs.
const (
	KindBMCQuery       = "bmc.query"
	KindBMCPower       = "bmc.power"
	KindBMCBoot        = "bmc.boot"
	KindBMCRotate      = "bmc.rotate"
	KindBMCMedia       = "bmc.media"
	KindBMCBIOS        = "bmc.bios"
	KindBMCFirmware    = "bmc.firmware"
	KindBMCConsole     = "bmc.console"
	KindPrepareRamdisk = "boot.prepareRamdisk"
	KindPrepareInst    = "boot.prepareInstance"
	KindCleanUp        = "boot.cleanUp"
)

// BMCRef is a node's BMC binding as commands carry it: credentials by reference only (the
// values come encrypted to this agent in "credentials").
type BMCRef struct {
	Driver            string `json:"driver"`
	Address           string `json:"address"`
	UsernameRef       string `json:"usernameRef"`
	PasswordRef       string `json:"passwordRef"`
	InsecureTLS       bool   `json:"insecureTls,omitempty"`
	FingerprintSHA256 string `json:"fingerprintSha256,omitempty"`
}

// Credentials is the plaintext of a command's "credentials" JWE. Never log it.
type Credentials struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// LogValue keeps the password out of logs.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.Username + ":[redacted]") }

// String keeps the password out of %v.
func (c Credentials) String() string { return c.Username + ":[redacted]" }

// flexBool accepts true, "true", false, "false" and "" (workflow args are strings).
type flexBool bool

func (b *flexBool) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(data), `"`)
	switch s {
	case "true":
		*b = true
	case "false", "", "null":
		*b = false
	default:
		return fmt.Errorf("%q is not a boolean", s)
	}
	return nil
}

// commandArgs is the union of the site commands' arguments.
type commandArgs struct {
	NodeID      string  `json:"nodeId"`
	BMC         *BMCRef `json:"bmc"`
	Credentials string  `json:"credentials"` // compact JWE
	// NewCredentials (bmc.rotate) is the new {username, password}, a compact JWE to this agent.
	NewCredentials string   `json:"newCredentials"`
	Query          string   `json:"query"`
	Action         string   `json:"action"`
	Device         string   `json:"device"`
	Persistent     flexBool `json:"persistent"`
	Mode           string   `json:"mode"`
	MACs           []string `json:"macs"`
	ProductUUID    string   `json:"productUuid"`
	Token          string   `json:"token"`
	Local          string   `json:"local"`
	// boot.prepareInstance: the operator user-data, a compact JWE to this agent, and its hex
	// SHA-256 (both absent when the deploy gave none).
	UserData       string `json:"userData"`
	UserDataSHA256 string `json:"userDataSha256"`
	// bmc.bios: the pool's BIOS settings (attribute → value as text); bmc.query{query: bios}:
	// the attributes to read.
	Attributes map[string]string `json:"attributes"`
	Names      []string          `json:"names"`
	// bmc.firmware: the pool's firmware images.
	Updates []bmc.FirmwareImage `json:"updates"`
	// bmc.console: end another client's console session first.
	TakeOver flexBool `json:"takeOver"`
	// commandID is the command's own id (not an argument).
	commandID string
	// bmc.media insert: the catalog ISO.
	Image  string `json:"image"`
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// decodeArgs reads a command's arguments; errors never quote them (they carry tokens).
func decodeArgs(cmd agentlink.Command) (commandArgs, error) {
	var a commandArgs
	if err := json.Unmarshal(cmd.Args, &a); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return a, fmt.Errorf("arguments: field %s has the wrong type", te.Field)
		}
		return a, errors.New("arguments are not a JSON object of the expected shape")
	}
	a.commandID = cmd.ID
	if a.NodeID == "" {
		a.NodeID = cmd.NodeID
	}
	if a.NodeID == "" {
		return a, errors.New("arguments: nodeId is missing")
	}
	if cmd.NodeID != "" && a.NodeID != cmd.NodeID {
		return a, fmt.Errorf("arguments name node %s but the command is for node %s", a.NodeID, cmd.NodeID)
	}
	return a, nil
}

// RamdiskConfig is what the site puts in ramdisk boot entries.
type RamdiskConfig struct {
	Kernel     netboot.Artifact
	Initrd     netboot.Artifact
	GatewayURL string   // bcd.gateway= (the gateway as machines reach it)
	ExtraArgs  []string // further kernel parameters
	// CAPEM is the control plane's CA, passed to the ramdisk as bcd.ca= so it can verify the
	// gateway before it has joined.
	CAPEM []byte
	// CA, when set, is the CA bundle to pass instead, read when an entry is built: the one the
	// agent holds now, which follows a rotation of the agent CA (caSource).
	CA func() []byte
}

// caPEM is the CA bundle an entry built now carries.
func (r RamdiskConfig) caPEM() []byte {
	if r.CA != nil {
		if b := r.CA(); len(b) > 0 {
			return b
		}
	}
	return r.CAPEM
}

// configured reports whether a kernel and an initrd are set.
func (r RamdiskConfig) configured() bool { return r.Kernel.URL != "" && r.Initrd.URL != "" }

// DiscoveryEntry builds the entry machines with no entry boot when the site's discovery boot is
// on: the ramdisk with no token (the script adds bcd.mode=discovery, where to report and the
// boot MAC). Pure.
func DiscoveryEntry(r RamdiskConfig) (netboot.Entry, error) {
	if !r.configured() {
		return netboot.Entry{}, errors.New("this site agent has no ramdisk configured (--ramdisk-kernel, --ramdisk-initrd and their sha256)")
	}
	e := netboot.Entry{Kind: netboot.KindDiscovery, Kernel: r.Kernel, Initrd: r.Initrd, GatewayURL: r.GatewayURL, ExtraArgs: slices.Clone(r.ExtraArgs)}
	if err := e.Validate(); err != nil {
		return netboot.Entry{}, fmt.Errorf("discovery entry: %w", err)
	}
	return e, nil
}

// RamdiskEntry builds a node's ramdisk boot entry. Pure.
func RamdiskEntry(r RamdiskConfig, token string) (netboot.Entry, error) {
	if !r.configured() {
		return netboot.Entry{}, errors.New("this site agent has no ramdisk configured (--ramdisk-kernel, --ramdisk-initrd and their sha256)")
	}
	e := netboot.Entry{Kind: netboot.KindRamdisk, Kernel: r.Kernel, Initrd: r.Initrd, GatewayURL: r.GatewayURL,
		Token: token, ExtraArgs: slices.Clone(r.ExtraArgs)}
	if ca := r.caPEM(); len(ca) > 0 {
		e.CA = base64.RawURLEncoding.EncodeToString(ca)
	}
	if err := e.Validate(); err != nil {
		return netboot.Entry{}, fmt.Errorf("ramdisk entry: %w", err)
	}
	return e, nil
}

// LocalEntry builds a local-boot entry: method from the command ("" takes the site default,
// itself "" meaning exit). Pure.
func LocalEntry(method, siteDefault string) (netboot.Entry, error) {
	m := netboot.LocalMethod(method)
	if m == "" {
		m = netboot.LocalMethod(siteDefault)
	}
	if m == "" {
		m = netboot.LocalExit
	}
	e := netboot.Entry{Kind: netboot.KindLocal, Local: m}
	if err := e.Validate(); err != nil {
		return netboot.Entry{}, fmt.Errorf("local boot entry: %w", err)
	}
	return e, nil
}

// canonicalMACs parses and lower-cases MACs, dropping duplicates; at least one is required.
func canonicalMACs(in []string) ([]string, error) {
	if len(in) == 0 {
		return nil, errors.New("arguments: macs is empty: the node has no known MAC")
	}
	out := make([]string, 0, len(in))
	for i, s := range in {
		m, err := netboot.ParseMAC(strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "-", ":")))
		if err != nil {
			return nil, fmt.Errorf("arguments: mac %d: %w", i, err)
		}
		if !slices.Contains(out, m.String()) {
			out = append(out, m.String())
		}
	}
	return out, nil
}

// ArtifactFetcher is what the commands need of the artifact cache.
type ArtifactFetcher interface {
	Fetch(ctx context.Context, a netboot.Artifact) error
}

// handler runs the site commands: a table from kind to function, built once.
type handler struct {
	kinds    map[string]func(ctx context.Context, a commandArgs) (any, error)
	drivers  map[string]DriverFactory
	locks    *bmcLocks
	entries  *Entries
	mounts   *mediaMounts
	cache    ArtifactFetcher
	ramdisk  RamdiskConfig
	local    string
	key      func(ctx context.Context) (crypto.Signer, error)
	baseURL  string // the boot HTTP base URL (a BMC's virtual media fetches the cached ISO there)
	changed  func() // the entry table changed (status)
	watch    func(nodeID string, ref BMCRef, jwe string)
	console  ConsoleDialer // nil: no consoles
	consoles atomic.Int64  // console sessions running
	metrics  *metrics      // nil: nothing counted
	log      *slog.Logger
}

type handlerDeps struct {
	drivers map[string]DriverFactory
	locks   *bmcLocks
	entries *Entries
	mounts  *mediaMounts // nil: kept in memory
	cache   ArtifactFetcher
	ramdisk RamdiskConfig
	local   string
	key     func(ctx context.Context) (crypto.Signer, error)
	changed func()
	watch   func(nodeID string, ref BMCRef, jwe string) // power polling; nil: none
	console ConsoleDialer                               // nil: no consoles
	log     *slog.Logger
}

func newHandler(d handlerDeps) *handler {
	h := &handler{drivers: d.drivers, locks: d.locks, entries: d.entries, mounts: d.mounts, cache: d.cache, ramdisk: d.ramdisk,
		local: d.local, key: d.key, changed: d.changed, watch: d.watch, console: d.console, log: d.log}
	if h.mounts == nil {
		h.mounts, _ = openMediaMounts("") // in memory: no error
	}
	if h.changed == nil {
		h.changed = func() {}
	}
	if h.watch == nil {
		h.watch = func(string, BMCRef, string) {}
	}
	h.kinds = map[string]func(context.Context, commandArgs) (any, error){
		KindBMCQuery:       h.bmcQuery,
		KindBMCPower:       h.bmcPower,
		KindBMCBoot:        h.bmcBoot,
		KindBMCRotate:      h.bmcRotate,
		KindBMCMedia:       h.bmcMedia,
		KindBMCBIOS:        h.bmcBIOS,
		KindBMCFirmware:    h.bmcFirmware,
		KindBMCConsole:     h.bmcConsole,
		KindPrepareRamdisk: h.prepareRamdisk,
		KindPrepareInst:    h.prepareInstance,
		KindCleanUp:        h.cleanUp,
	}
	return h
}

// Kinds lists the command kinds the agent runs (its capabilities).
func (h *handler) Kinds() []string { return slices.Sorted(maps.Keys(h.kinds)) }

// Run implements agentlink.Handler. Errors name the kind and the node; nothing from the
// arguments that could be secret (credentials, tokens) is logged or quoted.
func (h *handler) Run(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) (_ []byte, err error) {
	run, ok := h.kinds[cmd.Kind]
	done := h.metrics.commandStarted(cmd.Kind, ok)
	defer func() { done(err) }()
	if !ok {
		return nil, fmt.Errorf("command kind %q is not run by site agents: they run %s", cmd.Kind, strings.Join(h.Kinds(), ", "))
	}
	a, err := decodeArgs(cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cmd.Kind, err)
	}
	log := h.log.With("command", cmd.ID, "kind", cmd.Kind, "node", a.NodeID)
	res, err := run(ctx, a)
	if err != nil {
		log.WarnContext(ctx, "site command failed", "err", err)
		return nil, fmt.Errorf("%s of node %s: %w", cmd.Kind, a.NodeID, err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("%s of node %s: encoding the result: %w", cmd.Kind, a.NodeID, err)
	}
	log.InfoContext(ctx, "site command done")
	return b, nil
}

// endpoint decrypts the command's credentials into the endpoint of its BMC. The result holds
// the password: keep it only for the call.
func (h *handler) endpoint(ctx context.Context, a commandArgs) (BMCRef, Credentials, bmc.Endpoint, error) {
	if a.BMC == nil || a.BMC.Address == "" || a.BMC.Driver == "" {
		return BMCRef{}, Credentials{}, bmc.Endpoint{}, errors.New("arguments: bmc (driver, address) is missing")
	}
	if a.Credentials == "" {
		return BMCRef{}, Credentials{}, bmc.Endpoint{}, errors.New("arguments: credentials are missing (the control plane sends them encrypted to this agent)")
	}
	key, err := h.key(ctx)
	if err != nil {
		return BMCRef{}, Credentials{}, bmc.Endpoint{}, fmt.Errorf("decrypting BMC credentials: %w", err)
	}
	plain, err := pki.DecryptAsAgent(key, a.Credentials)
	if err != nil {
		return BMCRef{}, Credentials{}, bmc.Endpoint{}, fmt.Errorf("decrypting BMC credentials: %w", err)
	}
	var c Credentials
	if err := json.Unmarshal(plain, &c); err != nil || c.Username == "" {
		return BMCRef{}, Credentials{}, bmc.Endpoint{}, errors.New("decrypting BMC credentials: the plaintext is not {username, password}")
	}
	ep := bmc.Endpoint{Address: a.BMC.Address, Username: c.Username, Password: c.Password,
		Insecure: a.BMC.InsecureTLS, FingerprintSHA256: a.BMC.FingerprintSHA256}
	return *a.BMC, c, ep, nil
}

// onBMC runs fn against the command's BMC, one call in flight per BMC.
func (h *handler) onBMC(ctx context.Context, a commandArgs, what, capability string, fn func(ctx context.Context, drv any) error) error {
	ref, _, ep, err := h.endpoint(ctx, a)
	if err != nil {
		return err
	}
	release, err := h.locks.Lock(ctx, bmcKey(ref.Driver, ref.Address))
	if err != nil {
		return err
	}
	defer release()
	if err := withDriverCounted(ctx, h.drivers, ref.Driver, ep, what, capability, h.metrics, fn); err != nil {
		return err
	}
	h.watch(a.NodeID, ref, a.Credentials) // still encrypted: decrypted again for each poll
	return nil
}

// readPower is the poller's probe; the poller holds the BMC's lock.
func (h *handler) readPower(ctx context.Context, ref BMCRef, jwe string) (bmc.PowerState, error) {
	_, _, ep, err := h.endpoint(ctx, commandArgs{BMC: &ref, Credentials: jwe})
	if err != nil {
		return "", err
	}
	var p bmc.PowerState
	err = withDriverCounted(ctx, h.drivers, ref.Driver, ep, "get power", capGetPower, h.metrics, func(ctx context.Context, drv any) error {
		var err error
		p, err = drv.(bmc.PowerGetter).GetPower(ctx)
		return err
	})
	return p, err
}

type powerResult struct {
	Power bmc.PowerState `json:"power"`
}

func (h *handler) bmcQuery(ctx context.Context, a commandArgs) (any, error) {
	switch a.Query {
	case "power":
		var res powerResult
		err := h.onBMC(ctx, a, "get power", capGetPower, func(ctx context.Context, drv any) error {
			p, err := drv.(bmc.PowerGetter).GetPower(ctx)
			res.Power = p
			return err
		})
		return res, err
	case "inventory":
		var inv bmc.OOBInventory
		err := h.onBMC(ctx, a, "inspect", capInspect, func(ctx context.Context, drv any) error {
			var err error
			inv, err = drv.(bmc.Inspector).Inspect(ctx)
			return err
		})
		if inv.MACs == nil {
			inv.MACs = []string{}
		}
		return inv, err
	case "firmware":
		var res firmwareResult
		err := h.onBMC(ctx, a, "read firmware versions", capFirmware, func(ctx context.Context, drv any) error {
			var err error
			res.Firmware, err = drv.(bmc.FirmwareReader).Firmware(ctx)
			return err
		})
		if res.Firmware == nil {
			res.Firmware = []bmc.Firmware{}
		}
		return res, err
	case "bios":
		if len(a.Names) == 0 || len(a.Names) > bmc.MaxBIOSSettings {
			return nil, fmt.Errorf("arguments: names: %d BIOS attributes to read; 1-%d are accepted", len(a.Names), bmc.MaxBIOSSettings)
		}
		res := bmc.BIOSReadResult{Attributes: map[string]string{}}
		err := h.onBMC(ctx, a, "read BIOS settings", capBIOS, func(ctx context.Context, drv any) error {
			got, err := drv.(bmc.BIOSSetter).BIOSAttributes(ctx, a.Names)
			for _, name := range a.Names {
				if v, ok := got[name]; ok {
					res.Attributes[name] = v
				}
			}
			return err
		})
		return res, err
	}
	return nil, fmt.Errorf("arguments: query %q: accepted are power, inventory, firmware, bios", a.Query)
}

// bmcBIOS writes the BIOS settings that differ as pending settings, applied by the BMC at the
// next reset. Its result says which it wrote (Pending: the control plane boots the node anew
// rather than use a ramdisk that is up).
func (h *handler) bmcBIOS(ctx context.Context, a commandArgs) (any, error) {
	if len(a.Attributes) == 0 || len(a.Attributes) > bmc.MaxBIOSSettings {
		return nil, fmt.Errorf("arguments: attributes: %d BIOS settings; 1-%d are accepted", len(a.Attributes), bmc.MaxBIOSSettings)
	}
	res := bmc.BIOSWriteResult{Changed: []string{}}
	err := h.onBMC(ctx, a, "write BIOS settings", capBIOS, func(ctx context.Context, drv any) error {
		changed, err := drv.(bmc.BIOSSetter).SetBIOSAttributes(ctx, a.Attributes)
		if len(changed) > 0 {
			res.Changed, res.Pending = changed, true
		}
		return err
	})
	if err == nil && res.Pending {
		h.log.InfoContext(ctx, "BIOS settings written, pending until the next reset", "node", a.NodeID, "attributes", res.Changed)
	}
	return res, err
}

// firmwareResult is bmc.query{query: firmware}'s result: the components the BMC reports.
type firmwareResult struct {
	Firmware []bmc.Firmware `json:"firmware"`
}

func (h *handler) bmcPower(ctx context.Context, a commandArgs) (any, error) {
	action, err := bmc.ParsePowerAction(a.Action)
	if err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	var res powerResult
	err = h.onBMC(ctx, a, "set power "+string(action), capSetPower, func(ctx context.Context, drv any) error {
		if err := drv.(bmc.PowerSetter).SetPower(ctx, action); err != nil {
			return err
		}
		g, ok := drv.(bmc.PowerGetter)
		if !ok {
			res.Power = bmc.PowerUnknown
			return nil
		}
		p, err := g.GetPower(ctx)
		if err != nil {
			return fmt.Errorf("reading power after %s: %w", action, err)
		}
		res.Power = p
		return nil
	})
	return res, err
}

type bootResult struct {
	Device     bmc.BootDevice `json:"device"`
	Persistent bool           `json:"persistent"`
	Mode       bmc.BootMode   `json:"mode,omitempty"`
}

// bootOptions validates a bmc.boot command's arguments. Pure.
func bootOptions(a commandArgs) (bmc.BootDevice, bmc.BootOptions, error) {
	dev, err := bmc.ParseBootDevice(a.Device)
	if err != nil {
		return "", bmc.BootOptions{}, fmt.Errorf("arguments: %w", err)
	}
	opts := bmc.BootOptions{Persistent: bool(a.Persistent)}
	switch bmc.BootMode(a.Mode) {
	case bmc.BootModeUnchanged, bmc.BootModeUEFI, bmc.BootModeLegacy:
		opts.Mode = bmc.BootMode(a.Mode)
	default:
		return "", bmc.BootOptions{}, fmt.Errorf("arguments: boot mode %q: accepted are uefi, legacy or none", a.Mode)
	}
	return dev, opts, nil
}

func (h *handler) bmcBoot(ctx context.Context, a commandArgs) (any, error) {
	dev, opts, err := bootOptions(a)
	if err != nil {
		return nil, err
	}
	if dev == bmc.BootCD && h.entries.KindOf(a.NodeID) == netboot.KindSanboot {
		// The ISO is not in virtual media but in an iPXE sanboot entry: boot from the network.
		dev = bmc.BootPXE
	}
	err = h.onBMC(ctx, a, "set boot device "+string(dev), capBoot, func(ctx context.Context, drv any) error {
		// The driver reads the override back and fails when the BMC did not apply it.
		return drv.(bmc.BootDeviceSetter).SetBootDevice(ctx, dev, opts)
	})
	if err != nil {
		return nil, err
	}
	return bootResult{Device: dev, Persistent: opts.Persistent, Mode: opts.Mode}, nil
}

// rotateResult is what bmc.rotate reports; agentlink signs it with this agent's key (the
// control plane makes the new credential current only on a site-signed verified: true).
type rotateResult struct {
	Verified bool `json:"verified"`
}

// bmcRotate applies the new password through the driver's credential operation (Redfish
// AccountService PATCH, IPMI Set User Password), which then logs in with it: verified only when
// that login worked. Power polling goes on with the new credential.
func (h *handler) bmcRotate(ctx context.Context, a commandArgs) (any, error) {
	if a.NewCredentials == "" {
		return nil, errors.New("arguments: newCredentials are missing (the control plane sends them encrypted to this agent)")
	}
	ref, _, ep, err := h.endpoint(ctx, a)
	if err != nil {
		return nil, err
	}
	key, err := h.key(ctx)
	if err != nil {
		return nil, fmt.Errorf("decrypting the new BMC credential: %w", err)
	}
	plain, err := pki.DecryptAsAgent(key, a.NewCredentials)
	if err != nil {
		return nil, fmt.Errorf("decrypting the new BMC credential: %w", err)
	}
	var next Credentials
	if err := json.Unmarshal(plain, &next); err != nil || next.Password == "" || next.Username != ep.Username {
		return nil, errors.New("decrypting the new BMC credential: the plaintext is not {username, password} for the same user")
	}
	release, err := h.locks.Lock(ctx, bmcKey(ref.Driver, ref.Address))
	if err != nil {
		return nil, err
	}
	defer release()
	err = withDriverCounted(ctx, h.drivers, ref.Driver, ep, "rotate credential", capRotate, h.metrics, func(ctx context.Context, drv any) error {
		return drv.(bmc.CredentialRotator).RotateCredential(ctx, next.Password)
	})
	if err != nil {
		return nil, redact(err, next.Password)
	}
	h.watch(a.NodeID, ref, a.NewCredentials)
	return rotateResult{Verified: true}, nil
}

type empty struct{}

func (h *handler) prepareRamdisk(ctx context.Context, a commandArgs) (any, error) {
	macs, err := canonicalMACs(a.MACs)
	if err != nil {
		return nil, err
	}
	if a.Token == "" {
		return nil, errors.New("arguments: token is missing")
	}
	entry, err := RamdiskEntry(h.ramdisk, a.Token)
	if err != nil {
		return nil, err
	}
	// Installed first: the HTTP handler makes the machine wait until the artifacts are cached.
	if err := h.entries.Install(a.NodeID, macs, entry); err != nil {
		return nil, err
	}
	h.changed()
	for _, art := range entry.Artifacts() {
		if err := h.cache.Fetch(ctx, art); err != nil {
			return nil, fmt.Errorf("caching the ramdisk: %w", err)
		}
	}
	return empty{}, nil
}

func (h *handler) prepareInstance(ctx context.Context, a commandArgs) (any, error) {
	macs, err := canonicalMACs(a.MACs)
	if err != nil {
		return nil, err
	}
	entry, err := LocalEntry(a.Local, h.local)
	if err != nil {
		return nil, err
	}
	userData, err := h.openUserData(ctx, a.UserData, a.UserDataSHA256)
	if err != nil {
		return nil, err
	}
	if a.Token != "" {
		if err := h.entries.SetInstance(a.NodeID, macs, a.Token, userData); err != nil {
			return nil, err
		}
	}
	if err := h.entries.Install(a.NodeID, macs, entry); err != nil {
		return nil, err
	}
	h.changed()
	return empty{}, nil
}

// openUserData decrypts a node's user-data sent to this agent (a compact JWE; "" none) and
// checks it against its digest. Errors never hold the value.
func (h *handler) openUserData(ctx context.Context, jwe, digest string) ([]byte, error) {
	if jwe == "" {
		if digest != "" {
			return nil, errors.New("arguments: userDataSha256 without userData (the control plane sends it encrypted to this agent)")
		}
		return nil, nil
	}
	key, err := h.key(ctx)
	if err != nil {
		return nil, fmt.Errorf("decrypting the node's user-data: %w", err)
	}
	b, err := pki.DecryptAsAgent(key, jwe)
	if err != nil {
		return nil, fmt.Errorf("decrypting the node's user-data: %w", err)
	}
	if digest != "" && userDataDigest(b) != strings.ToLower(digest) {
		return nil, errors.New("decrypting the node's user-data: its SHA-256 is not the one the command names")
	}
	return b, nil
}

func (h *handler) cleanUp(_ context.Context, a commandArgs) (any, error) {
	var macs []string
	if len(a.MACs) > 0 {
		var err error
		if macs, err = canonicalMACs(a.MACs); err != nil {
			return nil, err
		}
	}
	if err := h.entries.Remove(a.NodeID, macs); err != nil {
		return nil, err
	}
	h.changed()
	return empty{}, nil
}
