// Package metal is the control plane's node service: the verbs of DESIGN §4 over the store. Each
// verb checks the provision table, then writes the node's state, its event and its reconciler
// wake-up in one transaction. Inline BMC credentials are sealed before anything is stored.
package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"bcd/internal/auth"
	"bcd/internal/batch"
	"bcd/internal/bmc"
	"bcd/internal/command"
	"bcd/internal/hardware"
	"bcd/internal/provision"
	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// Service runs the verbs.
type Service struct {
	st     *store.Store
	sealer *secrets.Sealer
	log    *slog.Logger
	wake   func()
	// profiles are deploy profiles from the configuration file.
	profiles []workflow.Profile
	// approvalTimeout is how long a batch may wait for its approvals (bcd server
	// --approval-timeout, as the engine's): Approve refuses a batch past it.
	approvalTimeout time.Duration
}

// DefaultApprovalTimeout is the approval timeout of a service nobody set one on (the engine's
// default too).
const DefaultApprovalTimeout = batch.DefaultApprovalTimeout

// SetApprovalTimeout sets how long a batch may wait for its approvals: the engine's
// ApprovalTimeout (0: DefaultApprovalTimeout).
func (s *Service) SetApprovalTimeout(d time.Duration) {
	if d <= 0 {
		d = DefaultApprovalTimeout
	}
	s.approvalTimeout = d
}

// OnWake registers what to call after a verb queued a reconciler wake-up (the engine's nudge).
func (s *Service) OnWake(f func()) { s.wake = f }

func (s *Service) woke() {
	if s.wake != nil {
		s.wake()
	}
}

// New builds the service.
func New(st *store.Store, sealer *secrets.Sealer, log *slog.Logger) *Service {
	return &Service{st: st, sealer: sealer, log: log, approvalTimeout: DefaultApprovalTimeout}
}

// Store returns the store (read paths of the API).
func (s *Service) Store() *store.Store { return s.st }

// ForbiddenError is a caller without the permission.
type ForbiddenError struct{ Msg string }

func (e *ForbiddenError) Error() string { return e.Msg }

// Require checks that the principal has permission p.
func Require(p auth.Principal, perm auth.Permission) error {
	if !auth.Allows(p.Role, perm) {
		return &ForbiddenError{Msg: fmt.Sprintf("token %q has role %s, which does not allow %s", p.Name, p.Role, perm)}
	}
	return nil
}

// BuiltinHardwareProfiles are stored at first start.
func BuiltinHardwareProfiles() []store.HardwareProfile {
	return []store.HardwareProfile{
		{Name: "redfish", LocalBoot: "exit", Drivers: map[string]string{"power": "redfish", "management": "redfish", "boot": "ipxe", "deploy": "image-stream", "inspect": "redfish", "virtual-media": "redfish"}},
		{Name: "ipmi", LocalBoot: "sanboot", Drivers: map[string]string{"power": "ipmi", "management": "ipmi", "boot": "ipxe", "deploy": "image-stream", "inspect": "ipmi"}},
	}
}

// Bootstrap prepares a new installation: the default tenant, site and pool and the built-in
// hardware profiles, and an admin token when none was ever created. It returns that token's
// secret (to be shown once) or "".
func (s *Service) Bootstrap(ctx context.Context) (adminToken string, err error) {
	plain, hash, err := auth.NewToken()
	if err != nil {
		return "", err
	}
	// One transaction under the installation lock: servers starting at once on an empty store
	// create one default tenant and mint one admin token between them.
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		adminToken = ""
		if err := tx.LockInstallation(ctx); err != nil {
			return err
		}
		tenants, err := tx.CountTenants(ctx)
		if err != nil {
			return err
		}
		if tenants == 0 {
			if err := bootstrapDefaults(ctx, tx); err != nil {
				return fmt.Errorf("creating the default tenant, site and pool: %w", err)
			}
		}
		tokens, err := tx.CountTokens(ctx)
		if err != nil || tokens > 0 {
			return err
		}
		if _, err := tx.InsertToken(ctx, store.Token{Name: "admin", Hash: hash, Role: string(auth.Admin), CreatedBy: "system"}); err != nil {
			return err
		}
		adminToken = plain
		return tx.AppendEvent(ctx, store.Event{Actor: "system", Kind: "token.create", Data: jsonObject(map[string]any{"name": "admin", "role": auth.Admin})})
	})
	if err != nil {
		return "", fmt.Errorf("bootstrapping the installation: %w", err)
	}
	return adminToken, nil
}

// bootstrapDefaults creates what a new installation starts with: the built-in hardware
// profiles and the tenant, site and pool "default".
func bootstrapDefaults(ctx context.Context, tx *store.Tx) error {
	for _, hp := range BuiltinHardwareProfiles() {
		if err := tx.PutHardwareProfile(ctx, hp); err != nil {
			return err
		}
	}
	tn, err := tx.InsertTenant(ctx, "default")
	if err != nil {
		return err
	}
	site, err := tx.InsertSite(ctx, tn.ID, "default", nil)
	if err != nil {
		return err
	}
	if _, err := tx.InsertPool(ctx, store.Pool{TenantID: tn.ID, SiteID: site.ID, Name: "default", Policy: store.PoolPolicy{HardwareProfile: "redfish"}}); err != nil {
		return err
	}
	return tx.AppendEvent(ctx, store.Event{TenantID: tn.ID, Actor: "system", Kind: "installation.created", Reason: "first start"})
}

// ---------------------------------------------------------------- enroll

// EnrollInput is metal.enroll's input. Password is sealed at once.
type EnrollInput struct {
	Name, Pool  string
	BMC         BMCInput
	MACs        []string
	ProductUUID string
	Labels      map[string]string
	Reason      string
	// BootMode is the node's firmware mode (uefi, legacy; "" leaves the driver's behaviour).
	BootMode string
	// accepted: an acceptance (AcceptDiscovered), the only enrollment that may ask for an
	// in-band BMC credential (the machine waits in a discovery-mode ramdisk).
	accepted bool
	// record, when set, runs in the enrolment's transaction once the node and its event are
	// written: an error from it enrolls nothing. AcceptDiscovered records its acceptance there:
	// a node is enrolled only together with the decision that enrolled it.
	record func(ctx context.Context, tx *store.Tx, n store.Node) error
}

// BMCInput is a BMC address with inline credentials.
type BMCInput struct {
	Driver, Address, Username, Password string
	InsecureTLS                         bool
	FingerprintSHA256                   string
	// Inband: the credential is provisioned from the host over its IPMI system interface
	// (accept only): the driver is ipmi, the password is generated here and sealed, the
	// address is what the host reports. Username is optional (InbandUsername).
	Inband bool
}

// InbandUsername is the BMC user an in-band enrollment creates unless the operator names one.
const InbandUsername = "bcd"

// inbandBMC fills an in-band BMC binding: no address yet, a generated password. Only the
// username may be given.
func inbandBMC(in BMCInput, accepted bool) (BMCInput, error) {
	if !accepted {
		return BMCInput{}, invalid("bmc.inband", "is for accepting a machine that waits in a discovery-mode ramdisk (bcd node accept --inband), not for enroll")
	}
	if in.Address != "" || in.Password != "" || in.FingerprintSHA256 != "" || in.InsecureTLS {
		return BMCInput{}, invalid("bmc", "with inband the host reports the BMC's address and the password is generated: give neither (only an optional username, default %s)", InbandUsername)
	}
	if in.Driver != "" && in.Driver != "ipmi" {
		return BMCInput{}, invalid("bmc.driver", "%q: in-band provisioning is over IPMI (driver ipmi)", in.Driver)
	}
	if in.Username == "" {
		in.Username = InbandUsername
	}
	if len(in.Username) > 16 || strings.ContainsFunc(in.Username, func(r rune) bool { return r <= ' ' || r > '~' }) {
		// Not quoted: the username is sealed like the password.
		return BMCInput{}, invalid("bmc.username", "an IPMI user name is 1 to 16 printable ASCII characters without spaces")
	}
	pw, err := GeneratePassword()
	if err != nil {
		return BMCInput{}, err
	}
	in.Driver, in.Password = "ipmi", pw
	return in, nil
}

// Enroll creates a node in enrolling and queues its reconciler.
func (s *Service) Enroll(ctx context.Context, p auth.Principal, in EnrollInput) (store.Node, error) {
	if err := Require(p, auth.Operate); err != nil {
		return store.Node{}, err
	}
	if err := ValidLookupName("name", in.Name); err != nil {
		return store.Node{}, err
	}
	if in.Pool == "" {
		return store.Node{}, invalid("pool", "is required: the name or id of the pool the node joins")
	}
	if err := ValidReason(in.Reason); err != nil {
		return store.Node{}, err
	}
	if in.BMC.Inband {
		var err error
		if in.BMC, err = inbandBMC(in.BMC, in.accepted); err != nil {
			return store.Node{}, err
		}
		if len(in.MACs) == 0 {
			return store.Node{}, invalid("macs", "an in-band enrollment needs the MAC the machine booted with")
		}
	}
	if err := ValidCredential("bmc.username", in.BMC.Username, 64); err != nil {
		return store.Node{}, err
	}
	if err := ValidCredential("bmc.password", in.BMC.Password, 256); err != nil {
		return store.Node{}, err
	}
	fp, err := NormalizeFingerprint(in.BMC.FingerprintSHA256)
	if err != nil {
		return store.Node{}, err
	}
	if len(in.MACs) > 64 {
		return store.Node{}, invalid("macs", "%d MACs: at most 64 are accepted", len(in.MACs))
	}
	macs := make([]string, 0, len(in.MACs))
	for i, m := range in.MACs {
		mac, err := NormalizeMAC(fmt.Sprintf("macs[%d]", i), m)
		if err != nil {
			return store.Node{}, err
		}
		if slices.Contains(macs, mac) {
			return store.Node{}, invalid(fmt.Sprintf("macs[%d]", i), "%s is listed twice", mac)
		}
		macs = append(macs, mac)
	}
	uuid := ""
	if in.ProductUUID != "" {
		if uuid, err = NormalizeUUID("product_uuid", in.ProductUUID); err != nil {
			return store.Node{}, err
		}
	}
	if err := ValidLabels("labels", in.Labels); err != nil {
		return store.Node{}, err
	}
	bootMode, err := ValidBootMode(in.BootMode)
	if err != nil {
		return store.Node{}, err
	}
	pool, err := s.st.Pool(ctx, in.Pool)
	if err != nil || !p.CanSeeTenant(pool.TenantID) {
		return store.Node{}, fmt.Errorf("pool %q: %w", in.Pool, store.ErrNotFound)
	}
	site, err := s.st.Site(ctx, pool.SiteID)
	if err != nil {
		return store.Node{}, fmt.Errorf("reading site of pool %s: %w", pool.Name, err)
	}

	var node store.Node
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		hp, err := tx.HardwareProfile(ctx, pool.Policy.HardwareProfile)
		if err != nil {
			return fmt.Errorf("pool %s names hardware profile %q, which does not exist: %w", pool.Name, pool.Policy.HardwareProfile, store.ErrNotFound)
		}
		driver := in.BMC.Driver
		if driver == "" {
			driver = hp.Drivers["power"]
		}
		addr := "" // in-band: the host reports it (engine: bmc.provisionInband)
		if !in.BMC.Inband {
			if addr, err = ValidBMCAddress(driver, in.BMC.Address); err != nil {
				return err
			}
		}
		at := store.NewID(s.now())
		node = store.Node{
			ID: at, TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID, Name: in.Name,
			Power: string(bmc.PowerUnknown), HardwareProfile: hp.Name, Drivers: hp.Drivers,
			BMCDriver: driver, BMCAddress: addr, BMCInsecure: in.BMC.InsecureTLS, BMCFingerprint: fp,
			ProductUUID: uuid, MACs: macs, Labels: mergeLabels(site.Labels, pool.Policy.Labels, in.Labels),
			BootMode: string(bootMode),
		}
		move := provision.EnrollMove()
		node.State, node.TargetState, node.ChainVerb = string(move.To), string(move.Target), string(provision.VerbEnroll)
		node.VerbBy = p.Actor()
		if node.BMCUsernameRef, err = s.seal(ctx, tx, node.TenantID, in.BMC.Username); err != nil {
			return err
		}
		if node.BMCPasswordRef, err = s.seal(ctx, tx, node.TenantID, in.BMC.Password); err != nil {
			return err
		}
		if err := tx.InsertNode(ctx, &node); err != nil {
			return err
		}
		if err := tx.AppendEvent(ctx, store.Event{
			TenantID: node.TenantID, NodeID: node.ID, Actor: p.Actor(), Kind: "node.enroll",
			ToState: node.State, Reason: in.Reason,
			Data: jsonObject(map[string]any{"pool": pool.Name, "bmcDriver": driver, "bmcAddress": addr, "bmcInband": in.BMC.Inband, "macs": macs, "productUuid": uuid, "bootMode": string(bootMode)}),
		}); err != nil {
			return err
		}
		if in.record != nil {
			if err := in.record(ctx, tx, node); err != nil {
				return err
			}
		}
		return tx.Wake(ctx, node.ID, "enroll", 0)
	})
	if err != nil {
		return store.Node{}, fmt.Errorf("enrolling %s: %w", in.Name, err)
	}
	s.woke()
	s.log.LogAttrs(ctx, slog.LevelInfo, "node enrolled", slog.String("node", node.ID), slog.String("name", node.Name), slog.String("pool", pool.Name), slog.String("actor", p.Actor()))
	return node, nil
}

// ---------------------------------------------------------------- update

// UpdateInput is metal.update's input: the node attributes an operator may change after
// enrollment, in any state. A nil field is left as it is.
type UpdateInput struct {
	Node string
	// BootMode: uefi, legacy, or "" for the driver's behaviour. bmc.boot commands built from
	// now on carry it; one already sent keeps its mode.
	BootMode *string
	Reason   string
}

// Update changes a node's attributes (today its boot mode) and records the change.
func (s *Service) Update(ctx context.Context, p auth.Principal, in UpdateInput) (store.Node, error) {
	if err := Require(p, auth.Operate); err != nil {
		return store.Node{}, err
	}
	if in.Node == "" {
		return store.Node{}, invalid("node", "is required: a node id or name")
	}
	if in.BootMode == nil {
		return store.Node{}, invalid("node", "nothing to update: give boot_mode (uefi, legacy, or empty for the driver's behaviour)")
	}
	mode, err := ValidBootMode(*in.BootMode)
	if err != nil {
		return store.Node{}, err
	}
	if err := ValidReason(in.Reason); err != nil {
		return store.Node{}, err
	}
	var n store.Node
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		if n, err = tx.LockNode(ctx, in.Node, p.TenantID); err != nil {
			return err
		}
		if n.BootMode == string(mode) {
			return nil
		}
		from := n.BootMode
		n.BootMode = string(mode)
		if err := tx.UpdateNode(ctx, &n); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.update",
			FromState: n.State, ToState: n.State, Reason: in.Reason,
			Data: jsonObject(map[string]any{"bootMode": map[string]string{"from": from, "to": n.BootMode}})})
	})
	if err != nil {
		return store.Node{}, fmt.Errorf("update %s: %w", in.Node, err)
	}
	return n, nil
}

func (s *Service) seal(ctx context.Context, tx *store.Tx, tenantID, value string) (string, error) {
	id := store.NewID(s.now())
	sealed, err := s.sealer.Seal(id, []byte(value))
	if err != nil {
		return "", fmt.Errorf("sealing credential: %w", err)
	}
	if err := tx.InsertSecret(ctx, id, tenantID, sealed); err != nil {
		return "", err
	}
	return secrets.Ref(id), nil
}

func mergeLabels(layers ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, l := range layers {
		maps.Copy(out, l)
	}
	return out
}

func jsonObject(m map[string]any) string {
	b, err := json.Marshal(m)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// ---------------------------------------------------------------- verbs

// VerbInput qualifies a verb.
type VerbInput struct {
	Node            string
	Reason          string
	ExpectedVersion uint64
	// Deploy
	Profile, Image string
	// UserData is the operator user-data for the installed OS (CheckUserData): sealed at
	// once, never logged or returned.
	UserData []byte
	// Undeploy
	Wipe string
	// Maintenance
	MaintenanceOn bool
	// Power
	PowerAction string
}

// StaleError is an expected version that no longer matches.
type StaleError struct {
	Node            string
	Expected, Found uint64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("node %s is at version %d, not %d: it changed since you read it; read it again", e.Node, e.Found, e.Expected)
}

// WipeModes are the accepted disk.wipe modes.
var WipeModes = []string{"quick", "full", "secure"}

// Apply runs verb v on a node: manage, inspect, provide, deploy, undeploy, rescue, unrescue,
// retire, recover, abort, maintenance, power. It returns the node after the move and, for power,
// the queued command's id.
func (s *Service) Apply(ctx context.Context, p auth.Principal, v provision.Verb, in VerbInput) (store.Node, string, error) {
	if err := Require(p, auth.Operate); err != nil {
		return store.Node{}, "", err
	}
	if in.Node == "" {
		return store.Node{}, "", invalid("node", "is required: a node id or name")
	}
	if err := ValidReason(in.Reason); err != nil {
		return store.Node{}, "", err
	}
	var action bmc.PowerAction
	switch v {
	case provision.VerbDeploy:
		if err := s.checkDeploy(ctx, &in.Profile, in.Image, in.UserData); err != nil {
			return store.Node{}, "", err
		}
	case provision.VerbUndeploy:
		if in.Wipe == "" {
			in.Wipe = "quick"
		}
		if !slices.Contains(WipeModes, in.Wipe) {
			return store.Node{}, "", invalid("wipe", "unknown wipe mode %q: accepted are %s", truncate(in.Wipe), strings.Join(WipeModes, ", "))
		}
	case provision.VerbPower:
		a, err := bmc.ParsePowerAction(in.PowerAction)
		if err != nil {
			return store.Node{}, "", invalid("action", "%s", err.Error())
		}
		action = a
	case provision.VerbEnroll, provision.VerbDelete:
		return store.Node{}, "", fmt.Errorf("verb %s has its own call", v)
	}

	var node store.Node
	var commandID string
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, in.Node, p.TenantID)
		if err != nil {
			return err
		}
		if in.ExpectedVersion != 0 && in.ExpectedVersion != n.Version {
			return &StaleError{Node: n.Name, Expected: in.ExpectedVersion, Found: n.Version}
		}
		move, err := provision.Decide(PNode(n), v)
		if err != nil {
			return err
		}
		from := n.State
		data := map[string]any{}
		if v == provision.VerbMaintenance {
			if n.Maintenance == in.MaintenanceOn {
				return invalid("on", "maintenance is already %s", onOff(n.Maintenance))
			}
			n.Maintenance = in.MaintenanceOn
			n.MaintenanceReason = ""
			if in.MaintenanceOn {
				n.MaintenanceReason = in.Reason
			}
			move.Wakes = !in.MaintenanceOn // work held by maintenance resumes
			data["maintenance"] = in.MaintenanceOn
		}
		if v == provision.VerbPower {
			kind, _ := command.Lookup("bmc.power")
			c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: kind.Name, Subject: "bmc:" + n.BMCAddress,
				Args: jsonObject(map[string]any{"action": string(action), "bmc": n.BMC()}), RunsOn: string(kind.RunsOn),
				Destructive: kind.Destructive, Reroutable: kind.Reroutable, Generation: n.IdentityGeneration,
				Deadline: tx.At() + (5 * time.Minute).Microseconds()}
			// Where approvals are required the command waits, held, for its one-node batch.
			batchID, err := s.directBatch(ctx, tx, p, n, &c, in.Reason)
			if err != nil {
				return err
			}
			if batchID != "" {
				c.Deadline = tx.At() + (24 * time.Hour).Microseconds()
				data["batch"] = batchID
			}
			if err := tx.InsertCommand(ctx, &c); err != nil {
				return err
			}
			commandID = c.ID
			data["action"], data["command"] = string(action), commandID
		} else {
			applyMove(&n, v, move)
			// Turning maintenance off resumes the chain as it was: who asked for it, and from
			// where (a rejected batch returns the node there), stay.
			if move.Wakes && v != provision.VerbAbort && v != provision.VerbMaintenance {
				n.VerbFrom, n.VerbBy = from, p.Actor()
			}
			// A verb that ends the node's chain (abort) or starts another (recover, retire, …)
			// takes the node out of the batch its chain ran under: the next chain's destructive
			// work needs its own approval, not the one given for this chain. (The aborted
			// workflow's cleanup keeps its own batch.)
			var left, pinned string
			if n.BatchID != "" && v != provision.VerbMaintenance && (move.Wakes || v == provision.VerbAbort) {
				left, n.BatchID = n.BatchID, ""
			}
			switch v {
			case provision.VerbDeploy:
				// The image is pinned as the catalog holds it now, in the verb's transaction:
				// what was asked is what is written (a replaced image fails the write instead).
				img, err := tx.VerifiedImage(ctx, in.Image)
				if err != nil {
					return invalid("image", "%s: deploy writes only catalog images whose signature verifies", err.Error())
				}
				n.DeployProfile, n.DeployImage, pinned = in.Profile, in.Image, batch.ImageDigest(img)
				data["profile"], data["image"], data["imageDigest"] = in.Profile, in.Image, pinned
			case provision.VerbUndeploy:
				n.WipeMode = in.Wipe
				data["wipe"] = in.Wipe
			}
			if move.Fault != "" {
				data["fault"] = string(move.Fault)
			}
			if err := tx.UpdateNode(ctx, &n); err != nil {
				return err
			}
			if v == provision.VerbDeploy {
				if err := tx.PinDeployImage(ctx, n.ID, pinned); err != nil {
					return err
				}
				// The user-data replaces any earlier one (whose secret goes); only its size and
				// digest reach the event.
				ud, err := s.sealUserData(ctx, tx, n, in.Profile, in.UserData)
				if err != nil {
					return err
				}
				if ud != (store.UserData{}) || n.UserDataRef != "" {
					if err := tx.SetNodeUserData(ctx, &n, ud); err != nil {
						return err
					}
				}
				if ud.Ref != "" {
					data["userDataSize"], data["userDataSha256"] = ud.Size, ud.SHA256
				}
			}
			if left != "" {
				if err := leaveBatch(ctx, tx, n, left); err != nil {
					return err
				}
				data["leftBatch"] = left
			}
			if v == provision.VerbAbort {
				if err := tx.RequestWorkflowAbort(ctx, n.ID); err != nil {
					return err
				}
			}
		}
		if err := tx.AppendEvent(ctx, store.Event{
			TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node." + string(v),
			FromState: from, ToState: n.State, Reason: in.Reason, Data: jsonObject(data),
		}); err != nil {
			return err
		}
		if move.Wakes {
			if err := tx.Wake(ctx, n.ID, string(v), 0); err != nil {
				return err
			}
		}
		node = n
		return nil
	})
	if err != nil {
		return store.Node{}, "", fmt.Errorf("%s %s: %w", v, in.Node, err)
	}
	s.woke()
	s.log.LogAttrs(ctx, slog.LevelInfo, "node verb applied", slog.String("verb", string(v)), slog.String("node", node.ID), slog.String("state", node.State), slog.String("actor", p.Actor()))
	return node, commandID, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// applyMove writes an accepted move into the node row.
func applyMove(n *store.Node, v provision.Verb, m provision.Move) {
	n.State = string(m.To)
	n.TargetState = string(m.Target)
	if m.Wakes && v != provision.VerbAbort && v != provision.VerbRecover {
		n.ChainVerb = string(v)
	}
	if m.MaintenanceOn {
		n.Maintenance = true
		n.MaintenanceReason = fmt.Sprintf("%s: %s", v, m.Fault)
		n.FailedFrom = string(m.FailedFrom)
		n.FaultCode = string(m.Fault)
	}
	if m.ClearFault {
		n.FailedFrom, n.FaultCode, n.FaultMsg = "", "", ""
		n.Maintenance, n.MaintenanceReason = false, ""
		if m.To == provision.Releasing {
			n.ChainVerb = string(provision.VerbUndeploy)
			if n.WipeMode == "" {
				n.WipeMode = "quick"
			}
		}
	}
}

// PNode is what the provision table needs of a node row.
func PNode(n store.Node) provision.Node {
	return provision.Node{State: provision.State(n.State), Target: provision.State(n.TargetState), FailedFrom: provision.State(n.FailedFrom), Maintenance: n.Maintenance}
}

// Delete removes a node in a state where that is safe.
func (s *Service) Delete(ctx context.Context, p auth.Principal, ref, reason string) error {
	if err := Require(p, auth.Operate); err != nil {
		return err
	}
	if ref == "" {
		return invalid("node", "is required: a node id or name")
	}
	if err := ValidReason(reason); err != nil {
		return err
	}
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, ref, p.TenantID)
		if err != nil {
			return err
		}
		if _, err := provision.Decide(PNode(n), provision.VerbDelete); err != nil {
			return err
		}
		if err := tx.DeleteNode(ctx, n); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.delete", FromState: n.State, Reason: reason,
			Data: jsonObject(map[string]any{"name": n.Name})})
	})
	if err != nil {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	return nil
}

// Get reads a node visible to p.
func (s *Service) Get(ctx context.Context, p auth.Principal, ref string) (store.Node, error) {
	if err := Require(p, auth.Read); err != nil {
		return store.Node{}, err
	}
	if ref == "" {
		return store.Node{}, invalid("node", "is required: a node id or name")
	}
	return s.st.Node(ctx, ref, p.TenantID)
}

// ListInput filters a listing. Require (hardware requirements, as "gpus>=1") keeps the nodes
// whose stored inventory meets every one.
type ListInput struct {
	Tenant, State, Pool, Site, Maintenance string
	Labels                                 []string
	Require                                []string
	PageSize                               int
	PageToken                              string
}

// MaxPageSize bounds one page.
const MaxPageSize = 10000

// List returns a page of nodes and the token of the next page ("" at the end).
func (s *Service) List(ctx context.Context, p auth.Principal, in ListInput) ([]store.Node, string, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, "", err
	}
	limit, err := pageLimit("page_size", in.PageSize, 500, MaxPageSize)
	if err != nil {
		return nil, "", err
	}
	f := store.NodeFilter{TenantID: p.TenantID, Limit: limit}
	if in.Tenant != "" {
		tn, err := s.st.Tenant(ctx, in.Tenant)
		if err != nil || !p.CanSeeTenant(tn.ID) {
			return nil, "", fmt.Errorf("tenant %q: %w", in.Tenant, store.ErrNotFound)
		}
		f.TenantID = tn.ID
	}
	if in.State != "" {
		st, err := provision.ParseState(in.State)
		if err != nil {
			return nil, "", invalid("state", "%s", err.Error())
		}
		f.State = string(st)
	}
	if in.Pool != "" {
		pool, err := s.st.Pool(ctx, in.Pool)
		if err != nil || !p.CanSeeTenant(pool.TenantID) {
			return nil, "", invalid("pool", "no pool named %q", truncate(in.Pool))
		}
		f.PoolID = pool.ID
	}
	if in.Site != "" {
		site, err := s.st.Site(ctx, in.Site)
		if err != nil || !p.CanSeeTenant(site.TenantID) {
			return nil, "", invalid("site", "no site named %q", truncate(in.Site))
		}
		f.SiteID = site.ID
	}
	switch in.Maintenance {
	case "":
	case "true", "false":
		b := in.Maintenance == "true"
		f.Maintenance = &b
	default:
		return nil, "", invalid("maintenance", "%q: accepted are true, false or empty", truncate(in.Maintenance))
	}
	labels, err := ParseSelectors("labels", in.Labels)
	if err != nil {
		return nil, "", err
	}
	f.Labels = append(f.Labels, labels...)
	reqs, err := hardware.ParseAll(in.Require)
	if err != nil {
		return nil, "", invalid("require", "%s", err)
	}
	if in.PageToken != "" {
		after, err := decodePageToken(in.PageToken)
		if err != nil {
			return nil, "", err
		}
		f.AfterID = after
	}
	page := f.Limit
	f.Limit++ // one more tells whether a next page exists
	var nodes []store.Node
	for {
		read, err := s.st.Nodes(ctx, f)
		if err != nil {
			return nil, "", err
		}
		end := len(read) < f.Limit
		if len(read) > 0 {
			f.AfterID = read[len(read)-1].ID
		}
		// With requirements, the nodes that meet them, read on until the page is full or the
		// nodes end (what did not meet them is read again by the next page's call: nothing is
		// skipped).
		if read, _, err = s.meeting(ctx, read, reqs); err != nil {
			return nil, "", err
		}
		nodes = append(nodes, read...)
		if len(nodes) > page || end {
			break
		}
	}
	next := ""
	if len(nodes) > page {
		nodes = nodes[:page]
		next = encodePageToken(nodes[len(nodes)-1].ID)
	}
	return nodes, next, nil
}

// EventQuery is what an event listing asks for.
type EventQuery struct {
	Node    string // id or name (a deleted node's raw id); empty: every event visible
	AfterID uint64 // the first Limit events after it
	Limit   int    // 0: 500
	// Kinds keeps the events of these kinds: a kind ("node.fail") or every kind under a
	// prefix ("node.*"); at most MaxEventKinds.
	Kinds []string
	// Newest: the last Limit events before BeforeID (0: the newest), oldest first; AfterID is
	// ignored. Following, with no cursor: start at the newest Limit events, not the first.
	Newest   bool
	BeforeID uint64
	Cursor   string // following: an earlier answer's cursor
}

// MaxEventKinds is how many kinds an event listing may name.
const MaxEventKinds = 16

// Events lists events, of one node or of every node visible to p.
func (s *Service) Events(ctx context.Context, p auth.Principal, nodeRef string, afterID uint64, limit int) ([]store.Event, error) {
	return s.ListEvents(ctx, p, EventQuery{Node: nodeRef, AfterID: afterID, Limit: limit})
}

// ListEvents lists the events q selects that p may see, in id order.
func (s *Service) ListEvents(ctx context.Context, p auth.Principal, q EventQuery) ([]store.Event, error) {
	f, err := s.eventFilter(ctx, p, q)
	if err != nil {
		return nil, err
	}
	if q.AfterID > math.MaxInt64 && !q.Newest {
		return nil, nil // ids are int64 in the store: none is larger (the query would wrap it negative)
	}
	f.AfterID = q.AfterID
	return s.st.Events(ctx, f)
}

// FollowEvents returns the events committed after those cursor covers ("": from the start),
// in commit order, and the cursor that covers them (store.EventsSince): a follower never
// passes over an event that commits late.
func (s *Service) FollowEvents(ctx context.Context, p auth.Principal, nodeRef, cursor string, limit int) ([]store.Event, string, error) {
	return s.Follow(ctx, p, EventQuery{Node: nodeRef, Cursor: cursor, Limit: limit})
}

// Follow returns the events q selects committed after those q.Cursor covers (none: from the
// start, or the newest q.Limit with q.Newest), in commit order, and the cursor that covers
// them, and what was looked at: a follower of rare kinds is not answered a stretch twice.
func (s *Service) Follow(ctx context.Context, p auth.Principal, q EventQuery) ([]store.Event, string, error) {
	f, err := s.eventFilter(ctx, p, q)
	if err != nil {
		return nil, "", err
	}
	evs, next, err := s.st.EventsSince(ctx, f, q.Cursor)
	if errors.Is(err, store.ErrBadCursor) {
		return nil, "", invalid("after_cursor", "%q is not a cursor this server gave: pass the cursor of an earlier answer, or none to start from the first event", q.Cursor)
	}
	return evs, next, err
}

// attestedKinds are the command kinds whose results the node signs (Attestations lists them),
// from the command kind table.
func attestedKinds() []string {
	var out []string
	for _, k := range command.Kinds() {
		if k.Attested {
			out = append(out, k.Name)
		}
	}
	return out
}

// NodeCommand is a command and the profile of the workflow that sent it ("" for none).
type NodeCommand struct {
	store.Command
	Profile string
}

// Commands lists the node's commands (of one workflow when workflowID is set), newest first:
// at most limit (0: 50, up to 1000), each with its workflow's profile. A deleted node's are
// found by its raw id; a caller of one tenant sees its own nodes' only.
func (s *Service) Commands(ctx context.Context, p auth.Principal, nodeRef, workflowID string, limit int) ([]NodeCommand, error) {
	if nodeRef == "" {
		return nil, invalid("node", "is required: a node id or name")
	}
	limit, err := pageLimit("limit", limit, 50, 1000)
	if err != nil {
		return nil, err
	}
	if workflowID != "" && !uuidRe.MatchString(workflowID) {
		return nil, invalid("workflow", "%q is not a workflow id: the id of one of the node's workflows (bcd node get shows the latest; events name each)", truncate(workflowID))
	}
	f, err := s.eventFilter(ctx, p, EventQuery{Node: nodeRef, Limit: 1})
	if err != nil {
		return nil, err
	}
	cmds, err := s.st.NodeCommands(ctx, f.NodeID, workflowID, limit)
	if err != nil {
		return nil, err
	}
	// The workflows these came from: among the node's newest, as many as the commands and a
	// few that sent none (a rescue of a node whose ramdisk is up); one older shows by its id.
	wfs, err := s.st.Workflows(ctx, f.NodeID, len(cmds)+16)
	if err != nil {
		return nil, err
	}
	profiles := make(map[string]string, len(wfs))
	for _, w := range wfs {
		profiles[w.ID] = w.Profile
	}
	var out []NodeCommand
	for _, c := range cmds {
		if p.TenantID == "" || c.TenantID == p.TenantID {
			out = append(out, NodeCommand{Command: c, Profile: profiles[c.WorkflowID]})
		}
	}
	return out, nil
}

// Attestations lists the node's node-signed results (succeeded wipes and diagnostics), newest
// first; kind narrows them to one of attestedKinds. A deleted node's are found by its raw id.
func (s *Service) Attestations(ctx context.Context, p auth.Principal, nodeRef, kind string, limit int) ([]store.Command, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	if nodeRef == "" {
		return nil, invalid("node", "is required: a node id or name")
	}
	kinds := attestedKinds()
	if kind != "" {
		if !slices.Contains(kinds, kind) {
			return nil, invalid("kind", "%q is not an attested kind: accepted are %s (or none for both)", kind, strings.Join(kinds, ", "))
		}
		kinds = []string{kind}
	}
	limit, err := pageLimit("limit", limit, 50, 1000)
	if err != nil {
		return nil, err
	}
	f, err := s.eventFilter(ctx, p, EventQuery{Node: nodeRef, Limit: 1})
	if err != nil {
		return nil, err
	}
	cmds, err := s.st.AttestedResults(ctx, f.NodeID, kinds, limit)
	if err != nil {
		return nil, err
	}
	// A caller of one tenant sees its own nodes' only (a raw id of another's finds none).
	out := cmds[:0]
	for _, c := range cmds {
		if p.TenantID == "" || c.TenantID == p.TenantID {
			out = append(out, c)
		}
	}
	return out, nil
}

// pageLimit checks how many a listing asks for (field, n): 0 is the default def, else 1 to
// max. Pure.
func pageLimit(field string, n, def, max int) (int, error) {
	if n == 0 {
		return def, nil
	}
	if n < 0 || n > max {
		return 0, invalid(field, "%d is out of range: accepted are 1-%d (0 for the default of %d)", n, max, def)
	}
	return n, nil
}

// eventFilter checks an events request and selects its events: the caller's tenant, the node.
func (s *Service) eventFilter(ctx context.Context, p auth.Principal, q EventQuery) (store.EventFilter, error) {
	if err := Require(p, auth.Read); err != nil {
		return store.EventFilter{}, err
	}
	limit, err := pageLimit("limit", q.Limit, 500, MaxPageSize)
	if err != nil {
		return store.EventFilter{}, err
	}
	if len(q.Kinds) > MaxEventKinds {
		return store.EventFilter{}, invalid("kinds", "%d kinds: accepted are at most %d (a prefix such as node.* names every kind under it)", len(q.Kinds), MaxEventKinds)
	}
	for _, k := range q.Kinds {
		if err := store.EventKindPattern(k); err != nil {
			return store.EventFilter{}, invalid("kinds", "%s", err.Error())
		}
	}
	if q.BeforeID > 0 && !q.Newest {
		return store.EventFilter{}, invalid("before_id", "is for the newest events (newest): with after_id the events after it are listed")
	}
	f := store.EventFilter{TenantID: p.TenantID, Limit: limit, Kinds: slices.Clone(q.Kinds), Newest: q.Newest, BeforeID: min(q.BeforeID, math.MaxInt64)}
	if q.Node != "" {
		n, err := s.st.Node(ctx, q.Node, p.TenantID)
		if err != nil {
			// A deleted node keeps its events: accept a raw id.
			if !errors.Is(err, store.ErrNotFound) || !uuidRe.MatchString(q.Node) {
				return store.EventFilter{}, err
			}
			f.NodeID = q.Node
		} else {
			f.NodeID = n.ID
		}
	}
	return f, nil
}

// OpenSecret opens a sealed secret by its secret:// reference (for the engine, which sends BMC
// credentials to a site agent only encrypted to that agent).
func (s *Service) OpenSecret(ctx context.Context, ref string) ([]byte, error) {
	id, err := secrets.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	sealed, err := s.st.Sealed(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.sealer.Open(id, sealed)
}

// knownDeployProfile checks that a deploy names a profile that exists: operator-defined (API) or
// built in ("default").
func (s *Service) knownDeployProfile(ctx context.Context, name string) error {
	stored, err := s.st.Profiles(ctx)
	if err != nil {
		return err
	}
	if _, ok := stored[name]; ok && !workflow.Overridable(name) { // an override of metal-* is no deploy profile
		return nil
	}
	if p, err := workflow.Find(name, s.profiles); err == nil && !strings.HasPrefix(p.Name, "metal-") {
		return nil
	}
	names := []string{"default"}
	for n := range stored {
		if !workflow.Overridable(n) {
			names = append(names, n)
		}
	}
	for _, p := range s.profiles {
		if !workflow.Overridable(p.Name) {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return invalid("profile", "unknown deploy profile %q: defined are %s", truncate(name), strings.Join(names, ", "))
}

// SetProfiles registers deploy profiles from the server's configuration file.
func (s *Service) SetProfiles(p []workflow.Profile) { s.profiles = p }

// Activity is what a node is doing now: its latest workflow's current step and command.
type Activity struct {
	Workflow, WorkflowState, Phase string
	Step, Steps                    int
	StepName                       string
	CommandKind, CommandState      string
	ProgressDone, ProgressTotal    int64
	ProgressMessage                string
	Error                          string
	// RamdiskLingeringUntil is when a lingering ramdisk (fast track) is told to power its host
	// off, 0 when none lingers; RamdiskPoweringOff: it was told and has not confirmed yet.
	RamdiskLingeringUntil int64
	RamdiskPoweringOff    bool
}

// Addresses returns the DHCP leases (full mode) of node's MACs still running at its site, as
// the site's boot-lease holder last reported them.
func (s *Service) Addresses(ctx context.Context, p auth.Principal, n store.Node) ([]store.DHCPLease, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	return s.st.NodeAddresses(ctx, n.ID)
}

// Activity returns node's activity; a node that never ran a workflow has none (zero value).
func (s *Service) Activity(ctx context.Context, p auth.Principal, n store.Node) (Activity, error) {
	if err := Require(p, auth.Read); err != nil {
		return Activity{}, err
	}
	wfs, err := s.st.Workflows(ctx, n.ID, 1)
	if err != nil || len(wfs) == 0 {
		return Activity{}, err
	}
	wf := wfs[0]
	a := Activity{Workflow: wf.Profile, WorkflowState: wf.State, Phase: wf.Phase, Step: wf.StepIndex, Error: wf.Error,
		RamdiskLingeringUntil: n.LingerUntil, RamdiskPoweringOff: n.LingerCommand != ""}
	var steps []workflow.Step
	src := wf.Steps
	if wf.Phase == "cleanup" {
		src = wf.Cleanup
	}
	if err := json.Unmarshal([]byte(src), &steps); err == nil {
		a.Steps = len(steps)
		if wf.StepIndex >= 0 && wf.StepIndex < len(steps) {
			a.StepName = steps[wf.StepIndex].String()
		}
	}
	if wf.CurrentCommand == "" {
		return a, nil
	}
	c, err := s.st.Command(ctx, wf.CurrentCommand)
	if err != nil {
		return a, nil // the command row is informative only
	}
	a.CommandKind, a.CommandState = c.Kind, c.State
	if c.Progress != "" {
		var pr struct {
			Done    int64  `json:"done"`
			Total   int64  `json:"total"`
			Message string `json:"message"`
		}
		if json.Unmarshal([]byte(c.Progress), &pr) == nil {
			a.ProgressDone, a.ProgressTotal, a.ProgressMessage = pr.Done, pr.Total, pr.Message
		}
	}
	return a, nil
}

// leaveBatch: node n has left batch id (its row already written). A pending batch no node is
// parked on any more is cancelled, as the reconciler does for a node that comes to rest.
func leaveBatch(ctx context.Context, tx *store.Tx, n store.Node, id string) error {
	cancelled, err := tx.CancelDeserted(ctx, id)
	if err != nil || !cancelled {
		return err
	}
	return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: "reconciler", Kind: "batch.cancelled", FromState: n.State, ToState: n.State,
		Reason: "every node left the batch before it was approved", Data: jsonObject(map[string]any{"batch": id})})
}
