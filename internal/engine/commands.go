package engine

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/command"
	"bcd/internal/hardware"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// buildCommand builds the command of a step: what only the control plane can put in it (the
// BMC binding with credential references, the node's MACs, the image) and the properties of its
// kind.
func (r *run) buildCommand(wf *store.Workflow, st workflow.Step, kindName string) (store.Command, error) {
	kind, err := command.Lookup(kindName)
	if err != nil {
		return store.Command{}, err
	}
	n := r.n
	args := map[string]any{}
	for k, v := range st.Args {
		args[k] = v
	}
	subject := n.ID
	if kind.Name == "deploy.image" {
		// Re-checked when the command is built: a signer revoked, or a field changed, since
		// the verb refuses the image before any byte is written.
		img, err := r.tx.VerifiedImage(r.ctx, n.DeployImage)
		if err != nil {
			return store.Command{}, fmt.Errorf("refusing to write image %s: %w", n.DeployImage, err)
		}
		if err := r.checkImagePin(img); err != nil {
			return store.Command{}, fmt.Errorf("refusing to write image %s: %w", n.DeployImage, err)
		}
		args["image"], args["url"], args["size"] = img.Name, img.URL, img.Size
		args["format"], args["compression"] = img.Format, img.Compression
		if img.SHA256 != "" {
			args["sha256"] = img.SHA256
		}
		if img.SHA512 != "" {
			args["sha512"] = img.SHA512
		}
	}
	if kind.Name == "bmc.media" {
		args["macs"] = n.MACs
		if st.Args["action"] == "insert" {
			img, err := r.tx.VerifiedImage(r.ctx, st.Args["image"])
			if err != nil {
				return store.Command{}, fmt.Errorf("refusing to insert media %q: %w", st.Args["image"], err)
			}
			if err := r.checkImagePin(img); err != nil {
				return store.Command{}, fmt.Errorf("refusing to insert media %s: %w", img.Name, err)
			}
			if img.Format != "iso" || img.SHA256 == "" {
				return store.Command{}, fmt.Errorf("refusing to insert media %s: it is a %s image, not an iso with a sha256", img.Name, img.Format)
			}
			args["image"], args["url"], args["sha256"] = img.Name, img.URL, img.SHA256
		}
	}
	if kind.Name == "bmc.boot" {
		// The node's firmware mode unless the step names one (bootMode on enroll or update).
		if m := bmc.CommandBootMode(st.Args["mode"], bmc.BootMode(n.BootMode)); m != bmc.BootModeUnchanged {
			args["mode"] = string(m)
		}
	}
	if kind.Name == "bmc.bios" || kind.Name == "bmc.query" && st.Args["query"] == "bios" {
		if err := r.biosArgs(kind.Name, args); err != nil {
			return store.Command{}, err
		}
	}
	if kind.Name == "bmc.firmware" {
		if err := r.firmwareUpdateArgs(args); err != nil {
			return store.Command{}, err
		}
	}
	if kind.Name == "bmc.provisionInband" {
		// The credential's references; outgoing encrypts the values to the node's ramdisk.
		args["bmc"] = n.BMC()
	}
	if kind.Name == "deploy.configDrive" {
		// What the ramdisk checks the site's documents against before writing them: its node's
		// meta-data, and the user-data this deploy gave ("": bcd's empty default).
		args["nodeId"], args["userDataSha256"] = n.ID, n.UserDataSHA256
	}
	if kind.RunsOn == command.OnSite {
		args["nodeId"] = n.ID
		if strings.HasPrefix(kind.Name, "bmc.") {
			args["bmc"] = n.BMC()
			subject = "bmc:" + n.BMCAddress
		}
		if strings.HasPrefix(kind.Name, "boot.") {
			args["macs"] = n.MACs
			args["productUuid"] = n.ProductUUID
		}
		if kind.Name == "boot.prepareInstance" && n.UserDataRef != "" {
			// The reference only: the claim encrypts the value to the agent that takes it.
			args["userDataRef"], args["userDataSha256"] = n.UserDataRef, n.UserDataSHA256
		}
	}
	b, err := mapJSON(args)
	if err != nil {
		return store.Command{}, fmt.Errorf("encoding arguments of %s: %w", kind.Name, err)
	}
	return store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: kind.Name, Subject: subject, Args: string(b),
		WorkflowID: wf.ID, BatchID: wf.BatchID, StepIndex: wf.StepIndex, RunsOn: string(kind.RunsOn), Destructive: kind.Destructive,
		Attested: kind.Attested, Reroutable: kind.Reroutable, Generation: n.IdentityGeneration, Deadline: wf.StepDeadline}, nil
}

// Results the engine reads. Agents may send more fields.
type powerResult struct {
	Power string `json:"power"`
}

type oobResult struct {
	SystemUUID string   `json:"systemUuid"`
	MACs       []string `json:"macs"`
	Power      string   `json:"power"`
}

type inventoryResult struct {
	SystemUUID string   `json:"systemUuid"`
	MACs       []string `json:"macs"`
}

// WipeResult is what disk.wipe reports, per disk.
type WipeResult struct {
	Disks []struct {
		Device   string `json:"device"`
		Method   string `json:"method"`
		Verified bool   `json:"verified"`
	} `json:"disks"`
}

// hardwareChanged records a node.hardware.changed event when an inventory differs in hardware
// from the one the node reported before (hardware.Diff): a DIMM, a disk or a GPU lost, a disk
// or a NIC replaced, a board swapped. A first inventory, or one the same byte for byte, is
// compared with nothing.
func (r *run) hardwareChanged(c store.Command) error {
	prev, had, err := r.tx.Inventory(r.ctx, r.n.ID)
	if err != nil || !had || prev.JSON == c.Result {
		return err
	}
	var before, after inventory.Inventory
	if json.Unmarshal([]byte(prev.JSON), &before) != nil || json.Unmarshal([]byte(c.Result), &after) != nil {
		return nil // (an inventory this server cannot read is compared with nothing)
	}
	changes := hardware.Diff(before, after)
	if len(changes) == 0 {
		return nil
	}
	what := make([]string, len(changes))
	for i, ch := range changes {
		what[i] = ch.What
	}
	return r.event("node.hardware.changed", r.n.State, r.n.State, "the inventory differs from the one reported before in "+strings.Join(what, ", "),
		map[string]any{"command": c.ID, "changes": changes, "previousAt": store.Micros(prev.UpdatedAt).UTC().Format(time.RFC3339)})
}

// checkHardware compares an inventory with the node's pool's hardware requirements as they are
// now: a machine that does not meet them fails the step with HARDWARE_MISMATCH, saying what it
// has instead (its inventory is kept, for bcd node inventory).
func (r *run) checkHardware(c store.Command) error {
	p, ok, err := r.nodePool()
	if err != nil || !ok || len(p.Policy.HardwareRequirements) == 0 {
		return err
	}
	reqs, err := hardware.ParseAll(p.Policy.HardwareRequirements)
	if err != nil {
		return fmt.Errorf("pool %s's hardware requirements: %w", p.Name, err)
	}
	var inv inventory.Inventory
	if err := json.Unmarshal([]byte(c.Result), &inv); err != nil {
		return fmt.Errorf("inventory result: %w", err)
	}
	if unmet := hardware.Unmets(hardware.Summarize(inv), reqs); len(unmet) > 0 {
		return &driftError{fault: provision.FaultHardwareMismatch, what: "the machine does not meet pool " + p.Name + "'s hardware requirements", lines: unmet,
			hint: "bcd node inventory shows what it has: repair it and bcd node recover, or move it to a pool it fits"}
	}
	return nil
}

// takeResult reads a succeeded command's result into the node.
func (r *run) takeResult(wf *store.Workflow, st workflow.Step, c store.Command) error {
	if c.Attested {
		if err := r.e.verifyAttested(c, r.n.IdentityGeneration); err != nil {
			return err
		}
	}
	if c.Kind == "bmc.power" && c.DeliveredAt > wf.BootEpoch {
		// What joins from now on belongs to this boot: a connection made before the agent took
		// the power action (a slow kexec's OS joining after the fallback cycle was queued) is
		// from before the reset, and its stream dies with it.
		wf.BootEpoch = c.DeliveredAt
		if err := r.saveWorkflow(wf); err != nil {
			return err
		}
	}
	switch {
	case c.Kind == "bmc.query" && st.Args["query"] == "power", c.Kind == "bmc.power":
		var res powerResult
		if c.Result != "" {
			if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
				return fmt.Errorf("%s result is not JSON: %w", c.Kind, err)
			}
		}
		if res.Power != "" {
			r.n.Power = res.Power
			return r.tx.SetPower(r.ctx, r.n.ID, res.Power)
		}
	case c.Kind == "bmc.query" && st.Args["query"] == "firmware":
		return r.checkFirmware(c)
	case c.Kind == "bmc.query" && st.Args["query"] == "bios":
		return r.checkBIOS(c)
	case c.Kind == "bmc.bios":
		return r.takeBIOSWrite(c)
	case c.Kind == "bmc.firmware":
		return r.takeFirmwareUpdate(c)
	case c.Kind == "bmc.query" && st.Args["query"] == "inventory":
		var res oobResult
		if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
			return fmt.Errorf("inspect.oob result is not JSON: %w", err)
		}
		for _, mac := range res.MACs {
			if err := r.tx.AddNodeMAC(r.ctx, &r.n, strings.ToLower(mac)); err != nil {
				return err
			}
		}
		if res.SystemUUID != "" {
			if err := r.tx.SetProductUUID(r.ctx, r.n.ID, res.SystemUUID); err != nil {
				return err
			}
		}
	case c.Kind == "inventory.refresh":
		var res inventoryResult
		if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
			return fmt.Errorf("inventory result is not JSON: %w", err)
		}
		if err := InventoryMatches(r.n, res.SystemUUID, res.MACs); err != nil {
			return err
		}
		if err := r.hardwareChanged(c); err != nil {
			return err
		}
		if err := r.tx.PutInventory(r.ctx, r.n.ID, json.RawMessage(c.Result)); err != nil {
			return err
		}
		return r.checkHardware(c)
	case c.Kind == "disk.wipe":
		return wipeVerified(c)
	case c.Kind == "bmc.media":
		// A sanboot entry (no virtual media) is the site's boot entry of the node from now on:
		// kept so that a new boot-lease holder is given it, and caches and verifies the ISO.
		e, ok, err := MediaEntry(c)
		if err != nil || !ok {
			return err
		}
		return r.tx.PutBootEntry(r.ctx, &e)
	case c.Kind == "bmc.provisionInband":
		addr, res, err := InbandAddress(c.Result)
		if err != nil {
			return err
		}
		if err := r.tx.SetBMCAddress(r.ctx, r.n.ID, addr); err != nil {
			return err
		}
		r.n.BMCAddress = addr
		return r.event("node.bmc.inband", r.n.State, r.n.State, "the BMC credential was provisioned in-band",
			map[string]any{"bmcAddress": addr, "userId": res.UserID, "channel": res.Channel, "reused": res.Reused, "command": c.ID})
	}
	return nil
}

// inbandResult is what a ramdisk reports for bmc.provisionInband (never the password).
type inbandResult struct {
	Address  string `json:"address"`
	Channel  int    `json:"channel"`
	UserID   int    `json:"userId"`
	Username string `json:"username"`
	Reused   bool   `json:"reused"`
}

// InbandAddress reads a bmc.provisionInband result: the BMC's LAN address the host reported,
// an IP address with an optional port (a ramdisk is not trusted to name anything else). Pure.
func InbandAddress(result string) (string, inbandResult, error) {
	var res inbandResult
	if err := json.Unmarshal([]byte(result), &res); err != nil {
		return "", res, fmt.Errorf("bmc.provisionInband result is not JSON: %w", err)
	}
	if ap, err := netip.ParseAddrPort(res.Address); err == nil {
		if a := ap.Addr().Unmap(); bmcAddress(a) && ap.Port() != 0 {
			return netip.AddrPortFrom(a, ap.Port()).String(), res, nil
		}
	} else if a, err := netip.ParseAddr(res.Address); err == nil && a.Zone() == "" && bmcAddress(a.Unmap()) {
		return a.Unmap().String(), res, nil
	}
	return "", res, fmt.Errorf("bmc.provisionInband reported BMC address %q: accepted is a unicast IP address a BMC can have "+
		"(not loopback, link-local, unspecified, multicast or broadcast), with an optional port", truncate(res.Address, 64))
}

// bmcAddress says whether a (unmapped) can be a BMC's address on the management network: the
// site agent sends the node's BMC credential there. Pure.
func bmcAddress(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() && !a.IsLinkLocalUnicast() &&
		!a.IsLinkLocalMulticast() && !a.IsInterfaceLocalMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// InventoryMatches checks the ramdisk's self-reported identity against the node: the product
// UUID in any byte order (SMBIOS UUIDs are mixed-endian) and every known MAC present.
func InventoryMatches(n store.Node, uuid string, macs []string) error {
	if n.ProductUUID != "" && uuid != "" && !SameSMBIOSUUID(n.ProductUUID, uuid) {
		return fmt.Errorf("the ramdisk reports product UUID %s, the node has %s: is this the right machine?", uuid, n.ProductUUID)
	}
	have := map[string]bool{}
	for _, m := range macs {
		have[strings.ToLower(m)] = true
	}
	for _, m := range n.MACs {
		if !have[m] {
			return fmt.Errorf("the ramdisk does not report NIC %s of the node (it reports %v): is this the right machine?", m, macs)
		}
	}
	return nil
}

// SameSMBIOSUUID compares two UUIDs allowing the first three fields to be byte-swapped.
func SameSMBIOSUUID(a, b string) bool {
	a, b = strings.ToLower(a), strings.ToLower(b)
	return a == b || swapUUID(a) == b
}

// swapUUID byte-swaps the first three fields of a UUID (the SMBIOS mixed-endian order); text
// that is not a UUID comes back unchanged. Pure.
func swapUUID(u string) string {
	f := strings.Split(u, "-")
	if len(f) != 5 || len(f[0]) != 8 || len(f[1]) != 4 || len(f[2]) != 4 {
		return u
	}
	rev := func(h string) string {
		var out []byte
		for i := len(h) - 2; i >= 0; i -= 2 {
			out = append(out, h[i], h[i+1])
		}
		return string(out)
	}
	return rev(f[0]) + "-" + rev(f[1]) + "-" + rev(f[2]) + "-" + f[3] + "-" + f[4]
}

func wipeVerified(c store.Command) error {
	var res WipeResult
	if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
		return fmt.Errorf("wipe result is not JSON: %w", err)
	}
	if len(res.Disks) == 0 {
		return fmt.Errorf("the wipe reports no disk: nothing was proven erased")
	}
	for _, d := range res.Disks {
		if !d.Verified {
			return fmt.Errorf("read-back of %s after the wipe did not verify", d.Device)
		}
	}
	return nil
}

// NodeSignedResult checks a stored attested result (nodeSignedResults in DESIGN §7).
func (e *Engine) NodeSignedResult(c store.Command, currentGeneration uint64) error {
	return e.verifyAttested(c, currentGeneration)
}

// verifyAttested is nodeSignedResults: it rebuilds the signing input from the stored row and
// checks the node's signature against the CA, the node and its current identity generation.
func (e *Engine) verifyAttested(c store.Command, currentGeneration uint64) error {
	if e.acceptIngested {
		return nil
	}
	return e.checkSigned(c, currentGeneration)
}

// VerifyRecorded checks a stored node-attested result as an auditor does, at any later time:
// the signature over the input rebuilt from the row, the signer's certificate as it was when
// the result arrived, and that it names the node at the identity generation the command was
// sent for (not the node's generation now: a later release has revoked it). The certificate may
// chain to a CA a finished rotation retired (pki.VerifyRecordedStatement): proofs made before a
// rotation still verify after it. Tests' acceptance of unsigned results
// (AcceptIngestedAttestationForTests) does not reach it.
func (e *Engine) VerifyRecorded(c store.Command) error {
	return e.checkSignedBy(c, c.Generation, pki.VerifyRecordedStatement)
}

// CAPEM is every agent CA an audit of stored results accepts (pki.CA.AuditPEM): the ones
// trusted now and those rotations retired, which node certificates chain to.
func (e *Engine) CAPEM() []byte {
	if e.ca == nil {
		return nil
	}
	return e.ca.AuditPEM()
}

// RecordedStatement rebuilds, from a stored command row, the statement its signer signed
// (pki.SigningInput of it is what the signature covers).
func RecordedStatement(c store.Command) pki.Statement {
	return pki.Statement{CommandID: c.ID, NodeID: c.NodeID, Kind: c.Kind, Generation: c.Generation, ResultSHA256: pki.ResultDigest([]byte(c.Result))}
}

// receivedAt is when a stored result arrived (now, for one not finished yet): the time its
// signer's certificate must have been valid at.
func receivedAt(c store.Command) time.Time {
	if c.FinishedAt == 0 {
		return time.Now()
	}
	return time.UnixMicro(c.FinishedAt)
}

func (e *Engine) checkSigned(c store.Command, currentGeneration uint64) error {
	return e.checkSignedBy(c, currentGeneration, pki.VerifyStatement)
}

// checkSignedBy checks c's attestation with verify (pki.VerifyStatement for results as they
// arrive, pki.VerifyRecordedStatement for audits).
func (e *Engine) checkSignedBy(c store.Command, currentGeneration uint64, verify func(*pki.CA, []byte, pki.Statement, []byte, uint64, time.Time) error) error {
	if len(c.ResultSig) == 0 || len(c.SignerCert) == 0 {
		return fmt.Errorf("%s result of command %s is not signed by the node", c.Kind, c.ID)
	}
	if e.ca == nil {
		return fmt.Errorf("no CA configured to verify attested results")
	}
	st, at := RecordedStatement(c), receivedAt(c)
	if err := verify(e.ca, c.SignerCert, st, c.ResultSig, currentGeneration, at); err != nil {
		return fmt.Errorf("%s result of command %s does not verify: %w", c.Kind, c.ID, err)
	}
	return nil
}

// verifiedWipe: releasing completes only with an attested wipe whose every disk read back.
func (r *run) verifiedWipe(wf *store.Workflow) error {
	cmds, err := r.tx.CommandsOfWorkflow(r.ctx, wf, "disk.wipe")
	if err != nil {
		return err
	}
	for i := len(cmds) - 1; i >= 0; i-- {
		c := cmds[i]
		if c.State != string(command.Succeeded) {
			continue
		}
		if err := r.e.verifyAttested(c, r.n.IdentityGeneration); err != nil {
			return err
		}
		return wipeVerified(c)
	}
	return fmt.Errorf("workflow %s (%s) has no succeeded wipe", wf.ID, wf.Profile)
}

// AcceptIngestedAttestationForTests makes attested results count without signatures. It exists
// for tests of other parts only; nothing in configuration or the API reaches it.
func (e *Engine) AcceptIngestedAttestationForTests() { e.acceptIngested = true }
