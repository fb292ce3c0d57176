package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"bcd/internal/bmc"

	"github.com/stmcginnis/gofish"
)

type odataRef struct {
	ID string `json:"@odata.id"`
}

type collectionDoc struct {
	Members  []odataRef `json:"Members"`
	NextLink string     `json:"Members@odata.nextLink"`
}

type bootDoc struct {
	Enabled        string   `json:"BootSourceOverrideEnabled"`
	Target         string   `json:"BootSourceOverrideTarget"`
	Mode           string   `json:"BootSourceOverrideMode"`
	AllowedTargets []string `json:"BootSourceOverrideTarget@Redfish.AllowableValues"`
}

type systemDoc struct {
	ID           string  `json:"@odata.id"`
	SystemType   string  `json:"SystemType"`
	UUID         string  `json:"UUID"`
	SerialNumber string  `json:"SerialNumber"`
	Manufacturer string  `json:"Manufacturer"`
	Model        string  `json:"Model"`
	PowerState   string  `json:"PowerState"`
	BiosVersion  string  `json:"BiosVersion"`
	Boot         bootDoc `json:"Boot"`
	Actions      struct {
		Reset struct {
			Target     string   `json:"target"`
			Allowed    []string `json:"ResetType@Redfish.AllowableValues"`
			ActionInfo string   `json:"@Redfish.ActionInfo"`
		} `json:"#ComputerSystem.Reset"`
	} `json:"Actions"`
	Settings *struct {
		SettingsObject odataRef `json:"SettingsObject"`
	} `json:"@Redfish.Settings"`
	EthernetInterfaces odataRef `json:"EthernetInterfaces"`
	VirtualMedia       odataRef `json:"VirtualMedia"`
	Links              struct {
		ManagedBy []odataRef `json:"ManagedBy"`
	} `json:"Links"`
}

// maxCollectionPages bounds how many Members@odata.nextLink pages of one collection are read.
const maxCollectionPages = 100

// members lists a collection's member URIs, following Members@odata.nextLink.
func (c *Client) members(ctx context.Context, uri string) ([]string, error) {
	var ids []string
	seen := map[string]bool{}
	for page := uri; page != ""; {
		if seen[page] || len(seen) >= maxCollectionPages {
			return nil, fmt.Errorf("reading collection %s: its Members@odata.nextLink pages loop or exceed %d", uri, maxCollectionPages)
		}
		seen[page] = true
		var col collectionDoc
		if _, err := c.getJSON(ctx, page, &col); err != nil {
			return nil, err
		}
		for _, m := range col.Members {
			if m.ID != "" {
				ids = append(ids, m.ID)
			}
		}
		page = col.NextLink
	}
	return ids, nil
}

// sameURI compares two resource URIs, ignoring a trailing slash.
func sameURI(a, b string) bool { return strings.TrimSuffix(a, "/") == strings.TrimSuffix(b, "/") }

// systemURI finds (once) the ComputerSystem the driver acts on: the one the BMC address names
// (/redfish/v1/Systems/ID, a multi-node chassis), which must be listed; else the only member of
// the Systems collection, else the only one whose SystemType is Physical, else the only one of
// those a manager names in Links.ManagerForServers. A choice that stays ambiguous is an error
// naming the candidates: acting on the wrong system (a GPU baseboard, a partition, the next node
// of the chassis) powers off the wrong thing.
func (c *Client) systemURI(ctx context.Context) (string, error) {
	c.mu.Lock()
	uri := c.system
	c.mu.Unlock()
	if uri != "" {
		return uri, nil
	}
	ids, err := c.members(ctx, SystemsCollection)
	if err != nil {
		return "", err
	}
	uri, err = c.chooseSystem(ctx, ids)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.system = uri
	c.mu.Unlock()
	return uri, nil
}

func (c *Client) pickSystem(ctx context.Context, ids []string) (string, error) {
	switch len(ids) {
	case 0:
		return "", errors.New("the BMC lists no ComputerSystem")
	case 1:
		return ids[0], nil
	}
	var physical []string
	for _, id := range ids {
		var doc struct {
			SystemType string `json:"SystemType"`
		}
		if _, err := c.getJSON(ctx, id, &doc); err != nil {
			return "", fmt.Errorf("reading ComputerSystem %s to choose among %d: %w", id, len(ids), err)
		}
		if strings.EqualFold(doc.SystemType, "Physical") {
			physical = append(physical, id)
		}
	}
	candidates := ids
	if len(physical) > 0 {
		candidates = physical
	}
	if len(candidates) == 1 {
		c.log.InfoContext(ctx, "redfish: several ComputerSystems, using the only physical one", "system", candidates[0], "systems", ids)
		return candidates[0], nil
	}
	managers, err := c.members(ctx, "/redfish/v1/Managers")
	if err != nil {
		return "", fmt.Errorf("listing managers to choose among ComputerSystems %s: %w", strings.Join(candidates, ", "), err)
	}
	var named []string
	for _, mgr := range managers {
		var doc struct {
			Links struct {
				ManagerForServers []odataRef `json:"ManagerForServers"`
			} `json:"Links"`
		}
		if _, err := c.getJSON(ctx, mgr, &doc); err != nil {
			return "", fmt.Errorf("reading manager %s to choose among ComputerSystems %s: %w", mgr, strings.Join(candidates, ", "), err)
		}
		for _, srv := range doc.Links.ManagerForServers {
			for _, cand := range candidates {
				if sameURI(srv.ID, cand) && !slices.Contains(named, cand) {
					named = append(named, cand)
				}
			}
		}
	}
	if len(named) == 1 {
		c.log.InfoContext(ctx, "redfish: several ComputerSystems, using the one a manager serves", "system", named[0], "systems", ids)
		return named[0], nil
	}
	return "", fmt.Errorf("the BMC lists %d ComputerSystems and none is singled out as the host "+
		"(by SystemType Physical, then by the managers' Links.ManagerForServers): candidates %s; "+
		"name the node's system in its BMC address (https://HOST[:PORT]%s/ID)",
		len(ids), strings.Join(candidates, ", "), SystemsCollection)
}

func (c *Client) getSystem(ctx context.Context) (systemDoc, string, error) {
	var sys systemDoc
	uri, err := c.systemURI(ctx)
	if err != nil {
		return sys, "", err
	}
	tag, err := c.getJSON(ctx, uri, &sys)
	if sys.ID == "" {
		sys.ID = uri
	}
	return sys, tag, err
}

// GetPower reads the system's power state.
func (c *Client) GetPower(ctx context.Context) (bmc.PowerState, error) {
	var sys systemDoc
	err := c.retry(ctx, "reading power", func(ctx context.Context) (err error) {
		sys, _, err = c.getSystem(ctx)
		return err
	})
	if err != nil {
		return bmc.PowerUnknown, err
	}
	return PowerFromRedfish(sys.PowerState), nil
}

// SetPower carries out action with the reset types the system advertises (in the action's
// ResetType@Redfish.AllowableValues, else its @Redfish.ActionInfo, else the DMTF defaults).
// A system in transition (PoweringOn, PoweringOff) is waited out before planning. After on and
// off (and the On ending a cycle) it waits, up to SettleTimeout, for the system to report the new
// state; a state that does not settle is logged, not an error: the caller reads what it is.
func (c *Client) SetPower(ctx context.Context, action bmc.PowerAction) error {
	what := fmt.Sprintf("power %s", action)
	if _, err := bmc.ParsePowerAction(string(action)); err != nil {
		return fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err)
	}
	var sys systemDoc
	if err := c.retry(ctx, what+": reading the system", func(ctx context.Context) (err error) {
		sys, _, err = c.getSystem(ctx)
		return err
	}); err != nil {
		return err
	}
	state := sys.PowerState
	if transitional(state) {
		c.log.InfoContext(ctx, "redfish system in a power transition; waiting before acting", "action", action, "power_state", state)
		var err error
		if state, err = c.awaitPowerState(ctx, c.opts.SettleTimeout, func(s string) bool { return !transitional(s) }); err != nil {
			c.log.WarnContext(ctx, "redfish power transition did not end; acting as on an unknown state", "action", action, "err", err)
			if ctx.Err() != nil {
				return fmt.Errorf("%s on Redfish BMC %s: waiting for a power transition to end: %w", what, c.base, ctx.Err())
			}
		}
	}
	allowed := c.resetTypes(ctx, what, sys)
	plan, err := PlanPower(action, allowed, planState(state))
	if err != nil {
		return fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err)
	}
	target := actionTarget(sys.Actions.Reset.Target, sys.ID, "ComputerSystem.Reset")
	for i := 0; i < len(plan); i++ {
		step := plan[i]
		if step == StepWaitOff {
			if err := c.waitOff(ctx, what); err != nil {
				return err
			}
			continue
		}
		err := c.retry(ctx, fmt.Sprintf("%s: ComputerSystem.Reset %s", what, step), func(ctx context.Context) error {
			return c.send(ctx, http.MethodPost, target, map[string]string{"ResetType": step}, "")
		})
		if err != nil && (step == resetPowerCycle || step == resetForceRestart) && NotSupported(err) {
			fallback, ferr := offThenOn(withDefaults(allowed))
			if ferr != nil {
				return fmt.Errorf("%w (and no fallback: %v)", err, ferr)
			}
			c.log.WarnContext(ctx, "redfish BMC refused a reset type; falling back to ForceOff, wait for Off, On",
				"action", action, "reset_type", step, "reason", BMCMessage(err))
			plan = append(plan[:i:i], fallback...)
			i--
			continue
		}
		if err != nil {
			return err
		}
		c.log.InfoContext(ctx, "redfish reset sent", "action", action, "reset_type", step)
	}
	if len(plan) > 0 && sys.PowerState != "" {
		c.settle(ctx, action, plan[len(plan)-1])
	}
	return nil
}

func withDefaults(allowed []string) []string {
	if len(allowed) == 0 {
		return defaultResetTypes()
	}
	return allowed
}

// resetTypes is what the system allows for ComputerSystem.Reset: the action's
// ResetType@Redfish.AllowableValues, else the ResetType parameter of its @Redfish.ActionInfo
// (OpenBMC and others publish them only there), else nil (the DMTF defaults). An ActionInfo
// that cannot be read is logged and the defaults are used.
func (c *Client) resetTypes(ctx context.Context, what string, sys systemDoc) []string {
	reset := sys.Actions.Reset
	if len(reset.Allowed) > 0 || reset.ActionInfo == "" {
		return reset.Allowed
	}
	var info struct {
		Parameters []struct {
			Name            string   `json:"Name"`
			AllowableValues []string `json:"AllowableValues"`
		} `json:"Parameters"`
	}
	err := c.retry(ctx, what+": reading the reset action info", func(ctx context.Context) error {
		_, err := c.getJSON(ctx, reset.ActionInfo, &info)
		return err
	})
	if err != nil {
		c.log.WarnContext(ctx, "redfish reset ActionInfo unreadable; assuming the DMTF reset types", "action_info", reset.ActionInfo, "err", err)
		return nil
	}
	for _, p := range info.Parameters {
		if p.Name == "ResetType" {
			return p.AllowableValues
		}
	}
	return nil
}

// settle waits, up to SettleTimeout, for the state the last reset step leads to; a system that
// does not get there is logged (the caller's next read reports what it is).
func (c *Client) settle(ctx context.Context, action bmc.PowerAction, last string) {
	want := ""
	switch last {
	case resetOn, resetForceOn:
		want = stateOn
	case resetForceOff:
		want = stateOff
	default:
		return // PowerCycle, ForceRestart, GracefulShutdown: not awaited (the OS or the BMC decides)
	}
	got, err := c.awaitPowerState(ctx, c.opts.SettleTimeout, func(s string) bool { return s == want })
	if err != nil {
		c.log.WarnContext(ctx, "redfish system did not report the new power state", "action", action,
			"reset_type", last, "want", want, "power_state", got, "err", err)
	}
}

// errNoPowerState ends a wait on a system that does not report PowerState at all.
var errNoPowerState = errors.New("the system reports no PowerState to wait on")

// awaitPowerState polls the system's PowerState every PollInterval until done accepts it (nil
// error), bound passes or ctx ends; it returns the last state read. Failed reads (a BMC is often
// busy during a power transition) are retried until the bound; a system that reports no
// PowerState at all cannot be waited for: errNoPowerState at once.
func (c *Client) awaitPowerState(ctx context.Context, bound time.Duration, done func(string) bool) (string, error) {
	deadline := time.Now().Add(bound)
	last := ""
	var readErr error
	for {
		sys, _, err := c.getSystem(ctx)
		readErr = err
		if err == nil {
			last = sys.PowerState
			if done(last) {
				return last, nil
			}
			if last == "" {
				return last, errNoPowerState
			}
		}
		wait := min(c.opts.PollInterval, time.Until(deadline))
		if wait <= 0 {
			if readErr != nil {
				return last, fmt.Errorf("still %q after %s; last read failed: %s", last, bound, c.redactor().message(readErr))
			}
			return last, fmt.Errorf("still %q after %s", last, bound)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return last, ctx.Err()
		case <-t.C:
		}
	}
}

// waitOff waits, up to PowerOffWait, for the system to report Off (not PoweringOff: many BMCs
// refuse On during the transition). Unlike settling, not getting there is an error: the next step
// would be refused or lost. A system without PowerState cannot be waited for: On follows at once
// (and is retried while the BMC says it is busy).
func (c *Client) waitOff(ctx context.Context, what string) error {
	_, err := c.awaitPowerState(ctx, c.opts.PowerOffWait, func(s string) bool { return s == stateOff })
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNoPowerState):
		c.log.WarnContext(ctx, "redfish system reports no PowerState; sending On without waiting for Off")
		return nil
	}
	return fmt.Errorf("%s on Redfish BMC %s: waiting for the system to report Off after ForceOff: %w", what, c.base, err)
}

// SetBootDevice writes the boot override (to the settings resource with If-Match when the system
// advertises one), then reads it back: a BMC that ignored the write is an error naming what it
// reports instead.
func (c *Client) SetBootDevice(ctx context.Context, dev bmc.BootDevice, opts bmc.BootOptions) error {
	what := fmt.Sprintf("setting boot device %s", dev)
	patch, err := BootPatch(dev, opts)
	if err != nil {
		return fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err)
	}
	var writeURI string
	err = c.retry(ctx, what, func(ctx context.Context) error {
		sys, tag, err := c.getSystem(ctx)
		if err != nil {
			return err
		}
		if allowed := sys.Boot.AllowedTargets; len(allowed) > 0 && !slices.Contains(allowed, patch["BootSourceOverrideTarget"]) {
			return fmt.Errorf("the BMC does not offer boot target %s (allowed: %s)", patch["BootSourceOverrideTarget"], strings.Join(allowed, ", "))
		}
		writeURI = sys.ID
		if sys.Settings != nil && sys.Settings.SettingsObject.ID != "" {
			writeURI = sys.Settings.SettingsObject.ID
			var cur struct{}
			if tag, err = c.getJSON(ctx, writeURI, &cur); err != nil {
				return err
			}
		}
		return c.send(ctx, http.MethodPatch, writeURI, map[string]any{"Boot": patch}, tag)
	})
	if err != nil {
		return err
	}
	// Read back what the BMC will apply.
	var got struct {
		Boot bootDoc `json:"Boot"`
	}
	if err := c.retry(ctx, what+": reading it back", func(ctx context.Context) error {
		_, err := c.getJSON(ctx, writeURI, &got)
		return err
	}); err != nil {
		return err
	}
	if mismatch := bootMismatch(patch, got.Boot); mismatch != "" {
		return fmt.Errorf("%s on Redfish BMC %s: the BMC accepted the write but did not apply it: it reports %s (at %s)",
			what, c.base, mismatch, writeURI)
	}
	c.log.InfoContext(ctx, "redfish boot override set", "device", dev, "persistent", opts.Persistent, "mode", opts.Mode)
	return nil
}

// bootMismatch names the properties whose read-back differs from what was written.
func bootMismatch(want map[string]string, got bootDoc) string {
	have := map[string]string{"BootSourceOverrideTarget": got.Target, "BootSourceOverrideEnabled": got.Enabled,
		"BootSourceOverrideMode": got.Mode}
	var diffs []string
	for _, k := range []string{"BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode"} {
		if w, ok := want[k]; ok && have[k] != w {
			diffs = append(diffs, fmt.Sprintf("%s=%q (wanted %q)", k, have[k], w))
		}
	}
	return strings.Join(diffs, ", ")
}

// Inspect reads the out-of-band inventory.
func (c *Client) Inspect(ctx context.Context) (bmc.OOBInventory, error) {
	var inv bmc.OOBInventory
	err := c.retry(ctx, "reading inventory", func(ctx context.Context) error {
		sys, _, err := c.getSystem(ctx)
		if err != nil {
			return err
		}
		inv = bmc.OOBInventory{SystemUUID: strings.ToLower(sys.UUID), SerialNumber: sys.SerialNumber,
			Manufacturer: sys.Manufacturer, Model: sys.Model, Power: PowerFromRedfish(sys.PowerState)}
		if sys.EthernetInterfaces.ID == "" {
			return nil
		}
		nics, err := c.members(ctx, sys.EthernetInterfaces.ID)
		if err != nil {
			return err
		}
		for _, id := range nics {
			var nic struct {
				MACAddress string `json:"MACAddress"`
			}
			if _, err := c.getJSON(ctx, id, &nic); err != nil {
				return err
			}
			if mac := NormalizeMAC(nic.MACAddress); mac != "" && !slices.Contains(inv.MACs, mac) {
				inv.MACs = append(inv.MACs, mac)
			}
		}
		return nil
	})
	return inv, err
}

// NormalizeMAC lower-cases a MAC and separates it with colons; "" when it is not a MAC.
func NormalizeMAC(s string) string {
	h := strings.NewReplacer(":", "", "-", "", ".", "").Replace(strings.ToLower(strings.TrimSpace(s)))
	if len(h) != 12 || strings.Trim(h, "0123456789abcdef") != "" || h == "000000000000" {
		return ""
	}
	return h[0:2] + ":" + h[2:4] + ":" + h[4:6] + ":" + h[6:8] + ":" + h[8:10] + ":" + h[10:12]
}

type mediaDoc struct {
	ID         string   `json:"@odata.id"`
	MediaTypes []string `json:"MediaTypes"`
	Inserted   bool     `json:"Inserted"`
	Image      string   `json:"Image"`
	Actions    struct {
		Insert struct {
			Target string `json:"target"`
		} `json:"#VirtualMedia.InsertMedia"`
		Eject struct {
			Target string `json:"target"`
		} `json:"#VirtualMedia.EjectMedia"`
	} `json:"Actions"`
}

// cdMedia finds the CD/DVD virtual media: under the ComputerSystem first (iDRAC10, newer
// Lenovo XCC put it there), then under the system's managers (or every manager when the system
// names none).
func (c *Client) cdMedia(ctx context.Context) (mediaDoc, error) {
	sys, _, err := c.getSystem(ctx)
	if err != nil {
		return mediaDoc{}, err
	}
	if sys.VirtualMedia.ID != "" {
		md, ok, err := c.cdIn(ctx, sys.VirtualMedia.ID)
		if err != nil || ok {
			return md, err
		}
	}
	var managers []string
	for _, m := range sys.Links.ManagedBy {
		managers = append(managers, m.ID)
	}
	if len(managers) == 0 {
		if managers, err = c.members(ctx, "/redfish/v1/Managers"); err != nil {
			return mediaDoc{}, err
		}
	}
	for _, mgr := range managers {
		var doc struct {
			VirtualMedia odataRef `json:"VirtualMedia"`
		}
		if _, err := c.getJSON(ctx, mgr, &doc); err != nil {
			return mediaDoc{}, err
		}
		if doc.VirtualMedia.ID == "" {
			continue
		}
		md, ok, err := c.cdIn(ctx, doc.VirtualMedia.ID)
		if err != nil || ok {
			return md, err
		}
	}
	return mediaDoc{}, errors.New("the BMC has no CD/DVD virtual media (looked under the system and its managers)")
}

// cdIn finds the first CD/DVD member of a VirtualMedia collection.
func (c *Client) cdIn(ctx context.Context, collection string) (mediaDoc, bool, error) {
	ids, err := c.members(ctx, collection)
	if err != nil {
		return mediaDoc{}, false, err
	}
	for _, id := range ids {
		var md mediaDoc
		if _, err := c.getJSON(ctx, id, &md); err != nil {
			return mediaDoc{}, false, err
		}
		if md.ID == "" {
			md.ID = id
		}
		if slices.Contains(md.MediaTypes, "CD") || slices.Contains(md.MediaTypes, "DVD") {
			return md, true, nil
		}
	}
	return mediaDoc{}, false, nil
}

// InsertMedia attaches the ISO at imageURL to the virtual CD, ejecting another image first.
// Errors and logs show imageURL as bmc.ShownAddress does: its user information, query and
// fragment may hold a credential (a pre-signed URL's signature), hidden also where the BMC
// echoes them.
func (c *Client) InsertMedia(ctx context.Context, imageURL string) error {
	what := "inserting virtual media " + bmc.ShownAddress(imageURL)
	return c.retry(ctx, what, func(ctx context.Context) error {
		md, err := c.cdMedia(ctx)
		if err != nil {
			return err
		}
		if md.Inserted && md.Image == imageURL {
			return nil
		}
		if md.Inserted {
			if err := c.send(ctx, http.MethodPost, actionTarget(md.Actions.Eject.Target, md.ID, "VirtualMedia.EjectMedia"), map[string]any{}, ""); err != nil {
				return err
			}
		}
		return c.send(ctx, http.MethodPost, actionTarget(md.Actions.Insert.Target, md.ID, "VirtualMedia.InsertMedia"),
			map[string]any{"Image": imageURL, "Inserted": true, "WriteProtected": true}, "")
	}, hideURL(imageURL))
}

// EjectMedia empties the virtual CD; an empty one is left alone.
func (c *Client) EjectMedia(ctx context.Context) error {
	return c.retry(ctx, "ejecting virtual media", func(ctx context.Context) error {
		md, err := c.cdMedia(ctx)
		if err != nil || !md.Inserted {
			return err
		}
		return c.send(ctx, http.MethodPost, actionTarget(md.Actions.Eject.Target, md.ID, "VirtualMedia.EjectMedia"), map[string]any{}, "")
	})
}

func actionTarget(target, resource, action string) string {
	if target != "" {
		return target
	}
	return resource + "/Actions/" + action
}

// RotateCredential sets a new password on the account the driver logs in with, then logs in with
// it to prove it works; from then on the client uses it.
func (c *Client) RotateCredential(ctx context.Context, newPassword string) error {
	what := "rotating the password of " + c.ep.Username
	if newPassword == "" {
		return fmt.Errorf("%s on Redfish BMC %s: the new password is empty", what, c.base)
	}
	err := c.retry(ctx, what, func(ctx context.Context) error {
		var svc struct {
			Accounts odataRef `json:"Accounts"`
		}
		if _, err := c.getJSON(ctx, "/redfish/v1/AccountService", &svc); err != nil {
			return err
		}
		accounts, err := c.members(ctx, svc.Accounts.ID)
		if err != nil {
			return err
		}
		for _, id := range accounts {
			var acct struct {
				UserName string `json:"UserName"`
			}
			tag, err := c.getJSON(ctx, id, &acct)
			if err != nil {
				return err
			}
			if acct.UserName == c.ep.Username {
				return c.send(ctx, http.MethodPatch, id, map[string]string{"Password": newPassword}, tag)
			}
		}
		return fmt.Errorf("the BMC has no account named %s", c.ep.Username)
	}, hideSecret(newPassword))
	if err != nil {
		return err
	}
	var api *gofish.APIClient
	err = c.retry(ctx, what+": logging in with the new password", func(ctx context.Context) error {
		a, err := c.connect(ctx, newPassword)
		api = a
		return err
	}, hideSecret(newPassword))
	if err != nil {
		return err
	}
	c.mu.Lock()
	old := c.api
	c.api = api
	c.ep.Password = newPassword
	c.mu.Unlock()
	if old != nil {
		old.WithContext(ctx).Logout()
	}
	c.log.InfoContext(ctx, "redfish password rotated and verified", "user", c.ep.Username)
	return nil
}
