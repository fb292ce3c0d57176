// Package lab runs bcd's test and demo lab: QEMU virtual machines (TCG, no KVM needed) on a
// bridge inside a network namespace of their own, each with a virtual BMC (Redfish over TLS and
// IPMI) that drives the VM through QMP. Nothing of the lab touches the host's networks: the
// bridge, the taps, the BMC listeners and the VMs all live in the namespace (DESIGN §9).
//
// Life of a lab:
//
//   - Up (host side) plans the lab (the pure Plan), writes spec.json and credentials.json
//     (0600) into the lab directory, creates the namespace, and starts the supervisor inside it
//     (`ip netns exec NS bcd lab supervise --dir DIR`), detached in its own session. It returns
//     once the supervisor reports ready; the supervisor has then written state.json.
//   - Supervise (inside the namespace) sets up the bridge (IPv4 + an IPv6 ULA), one tap per VM,
//     sends IPv6 router advertisements (Debian's 2019 iPXE otherwise waits ~13 s for a router:
//     LAB-NOTES gotcha 1), starts every QEMU as its own child (powered off: -S) and serves the
//     BMCs. On SIGTERM it stops the QEMUs, waits for them and removes the links.
//   - Down (any shell) signals the supervisor recorded in state.json, waits for it to exit,
//     makes sure no recorded QEMU survives, and deletes the namespace.
//
// state.json (State) is the interface for everything else: BMC addresses, credential file,
// MACs, the bridge's addresses, console logs and the namespace to run site services in.
package lab

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// Firmware is what a VM boots with.
type Firmware string

const (
	FirmwareBIOS Firmware = "bios" // SeaBIOS + QEMU's iPXE NIC ROM
	FirmwareUEFI Firmware = "uefi" // OVMF (pflash, VARS copied per VM) + iPXE EFI ROM
)

// FirmwareChoice is the --firmware flag: one firmware for every VM, or alternating.
type FirmwareChoice string

const (
	ChoiceBIOS  FirmwareChoice = "bios"
	ChoiceUEFI  FirmwareChoice = "uefi"
	ChoiceMixed FirmwareChoice = "mixed" // even VMs BIOS, odd VMs UEFI
)

// DiskBus is how a VM's disk is attached.
type DiskBus string

const (
	DiskVirtio DiskBus = "virtio"
	DiskNVMe   DiskBus = "nvme"
	DiskMixed  DiskBus = "mixed" // a choice of Options only: even VMs virtio, odd VMs NVMe
)

// QEMU device ids the virtual BMCs act on (boot order, media).
const (
	NICDeviceID  = "nic0"
	DiskDeviceID = "disk0"
	CDDeviceID   = "cd0"
)

// File names inside the lab directory.
const (
	SpecFile        = "spec.json"
	StateFile       = "state.json"
	CredentialsFile = "credentials.json"
	SupervisorLog   = "supervisor.log"
)

// VM is one planned virtual machine. Paths are absolute.
type VM struct {
	Index    int      `json:"index"`
	Name     string   `json:"name"`
	Firmware Firmware `json:"firmware"`
	MAC      string   `json:"mac"`  // lower-case, colon separated; stable per index
	UUID     string   `json:"uuid"` // SMBIOS system UUID (canonical form)
	Serial   string   `json:"serial"`
	Tap      string   `json:"tap"` // tap device on the bridge, inside the namespace

	MemoryMiB int     `json:"memoryMiB"`
	DiskBus   DiskBus `json:"diskBus"`
	DiskSize  int64   `json:"diskSizeBytes"`

	Dir        string `json:"dir"`
	Disk       string `json:"disk"`       // raw, sparse
	OVMFVars   string `json:"ovmfVars"`   // UEFI only: this VM's copy of OVMF_VARS
	QMPSocket  string `json:"qmpSocket"`  // owned by the VM's BMCs: do not connect to it
	QMPMonitor string `json:"qmpMonitor"` // a second QMP monitor for status and tests (short connections)
	// InbandSocket: the guest's KCS IPMI interface (QEMU ipmi-bmc-extern) is forwarded here to
	// the VM's IPMI BMC, which listens on it (OpenIPMI VM protocol): in-band BMC provisioning.
	InbandSocket string `json:"inbandSocket"`
	Console      string `json:"console"` // serial console log
	// SerialSocket: QEMU serves the VM's serial port on this unix socket (one client at a time;
	// all output is logged to Console all the same). The VM's IPMI BMC connects to it while a
	// SOL payload is active.
	SerialSocket string `json:"serialSocket"`
	QEMULog      string `json:"qemuLog"` // QEMU's own stdout/stderr

	RedfishAddr string `json:"redfishAddr"` // host:port on the bridge (HTTPS)
	IPMIAddr    string `json:"ipmiAddr"`    // host:port on the bridge (UDP, RMCP+)
}

// Spec is the planned lab: what Up writes to spec.json and the supervisor builds.
type Spec struct {
	Dir   string `json:"dir"`
	NetNS string `json:"netns"`

	Bridge     string       `json:"bridge"`
	BridgeIPv4 netip.Prefix `json:"bridgeIPv4"` // e.g. 172.30.0.1/24: the bridge's address and subnet
	BridgeIPv6 netip.Prefix `json:"bridgeIPv6"` // e.g. fd62:6364:6c61::1/64, advertised ra-only
	// DHCPRange is a suggestion for the site's full-mode DHCP pool: free of the bridge and BMC
	// addresses.
	DHCPStart netip.Addr `json:"dhcpStart"`
	DHCPEnd   netip.Addr `json:"dhcpEnd"`

	QEMU     string `json:"qemu"`     // qemu-system-x86_64
	OVMFCode string `json:"ovmfCode"` // /usr/share/OVMF/OVMF_CODE_4M.fd
	OVMFVars string `json:"ovmfVars"` // template copied per VM

	Credentials string `json:"credentials"` // path of credentials.json (0600)
	VMs         []VM   `json:"vms"`

	// Services beside the VMs (PlanSite): a file share, uplinks to the host's loopback, and a
	// site agent the supervisor runs.
	Files   *FileShare `json:"files,omitempty"`
	Uplinks []Uplink   `json:"uplinks,omitempty"`
	Site    *SiteAgent `json:"site,omitempty"`
}

// VMState is a VM as the running lab has it.
type VMState struct {
	VM
	PID                int    `json:"pid"`                // the QEMU process (a child of the supervisor)
	RedfishURL         string `json:"redfishURL"`         // https://172.30.0.1:8000
	RedfishFingerprint string `json:"redfishFingerprint"` // hex SHA-256 of the BMC certificate's DER
	RedfishCertFile    string `json:"redfishCertFile"`    // PEM of that certificate (a CA bundle for clients)
}

// State is state.json: written by the supervisor once every VM runs and every BMC listens.
// Its VMs (with runtime facts) take the place of Spec.VMs in the file and in Go.
type State struct {
	Spec
	SupervisorPID int       `json:"supervisorPid"`
	Started       time.Time `json:"started"`
	VMs           []VMState `json:"vms"`
}

// Credential is one BMC account of a VM. The file holding them is 0600 and never logged.
type Credential struct {
	VM       string `json:"vm"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// String never shows the password.
func (c Credential) String() string { return fmt.Sprintf("%s: %s@…", c.VM, c.Username) }

// Credentials are every VM's BMC credentials (the same account on its Redfish and IPMI BMC).
type Credentials struct {
	VMs []Credential `json:"vms"`
}

// For returns the credential of the named VM.
func (c Credentials) For(vm string) (Credential, bool) {
	for _, cr := range c.VMs {
		if cr.VM == vm {
			return cr, true
		}
	}
	return Credential{}, false
}

// ReadSpec reads dir/spec.json.
func ReadSpec(dir string) (Spec, error) {
	var s Spec
	return s, readJSON(filepath.Join(dir, SpecFile), &s)
}

// ReadState reads dir/state.json.
func ReadState(dir string) (State, error) {
	var s State
	return s, readJSON(filepath.Join(dir, StateFile), &s)
}

// ReadCredentials reads the credentials file at path.
func ReadCredentials(path string) (Credentials, error) {
	var c Credentials
	return c, readJSON(path, &c)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading lab file: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding lab file %s: %w", path, err)
	}
	return nil
}

// writeJSON writes v to path atomically (temp file + rename) with mode perm.
func writeJSON(path string, v any, perm os.FileMode) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", filepath.Base(path), err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
