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
	Members []odataRef `json:"Members"`
}

type bootDoc struct {
	Enabled        string   `json:"BootSourceOverrideEnabled"`
	Target         string   `json:"BootSourceOverrideTarget"`
	Mode           string   `json:"BootSourceOverrideMode"`
	AllowedTargets []string `json:"BootSourceOverrideTarget@Redfish.AllowableValues"`
}

type systemDoc struct {
	ID           string  `json:"@odata.id"`
	UUID         string  `json:"UUID"`
	SerialNumber string  `json:"SerialNumber"`
	Manufacturer string  `json:"Manufacturer"`
	Model        string  `json:"Model"`
	PowerState   string  `json:"PowerState"`
	Boot         bootDoc `json:"Boot"`
	Actions      struct {
		Reset struct {
			Target  string   `json:"target"`
			Allowed []string `json:"ResetType@Redfish.AllowableValues"`
		} `json:"#ComputerSystem.Reset"`
	} `json:"Actions"`
	Settings *struct {
		SettingsObject odataRef `json:"SettingsObject"`
	} `json:"@Redfish.Settings"`
	EthernetInterfaces odataRef `json:"EthernetInterfaces"`
	Links              struct {
		ManagedBy []odataRef `json:"ManagedBy"`
	} `json:"Links"`
}

// systemURI finds (once) the first ComputerSystem.
func (c *Client) systemURI(ctx context.Context) (string, error) {
	c.mu.Lock()
	uri := c.system
	c.mu.Unlock()
	if uri != "" {
		return uri, nil
	}
	var col collectionDoc
	if _, err := c.getJSON(ctx, "/redfish/v1/Systems", &col); err != nil {
		return "", err
	}
	if len(col.Members) == 0 {
		return "", errors.New("the BMC lists no ComputerSystem")
	}
	c.mu.Lock()
	c.system = col.Members[0].ID
	c.mu.Unlock()
	return col.Members[0].ID, nil
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

// SetPower carries out action with the reset types the system advertises.
func (c *Client) SetPower(ctx context.Context, action bmc.PowerAction) error {
	what := fmt.Sprintf("power %s", action)
	var sys systemDoc
	if err := c.retry(ctx, what+": reading the system", func(ctx context.Context) (err error) {
		sys, _, err = c.getSystem(ctx)
		return err
	}); err != nil {
		return err
	}
	plan, err := PlanPower(action, sys.Actions.Reset.Allowed, PowerFromRedfish(sys.PowerState) == bmc.PowerOn)
	if err != nil {
		return fmt.Errorf("%s on Redfish BMC %s: %w", what, c.base, err)
	}
	target := sys.Actions.Reset.Target
	if target == "" {
		target = sys.ID + "/Actions/ComputerSystem.Reset"
	}
	for _, step := range plan {
		if step == StepWaitOff {
			if err := c.waitOff(ctx, what); err != nil {
				return err
			}
			continue
		}
		err := c.retry(ctx, fmt.Sprintf("%s: ComputerSystem.Reset %s", what, step), func(ctx context.Context) error {
			return c.send(ctx, http.MethodPost, target, map[string]string{"ResetType": step}, "")
		})
		if err != nil {
			return err
		}
		c.log.InfoContext(ctx, "redfish reset sent", "action", action, "reset_type", step)
	}
	return nil
}

func (c *Client) waitOff(ctx context.Context, what string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.PowerOffWait)
	defer cancel()
	tick := time.NewTicker(c.opts.PollInterval)
	defer tick.Stop()
	for {
		p, err := c.GetPower(ctx)
		if err == nil && p == bmc.PowerOff {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s on Redfish BMC %s: waiting for the system to power off: %w", what, c.base, ctx.Err())
		case <-tick.C:
		}
	}
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
		var col collectionDoc
		if _, err := c.getJSON(ctx, sys.EthernetInterfaces.ID, &col); err != nil {
			return err
		}
		for _, m := range col.Members {
			var nic struct {
				MACAddress string `json:"MACAddress"`
			}
			if _, err := c.getJSON(ctx, m.ID, &nic); err != nil {
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

// cdMedia finds the CD/DVD virtual media of the system's manager.
func (c *Client) cdMedia(ctx context.Context) (mediaDoc, error) {
	sys, _, err := c.getSystem(ctx)
	if err != nil {
		return mediaDoc{}, err
	}
	var managers []string
	for _, m := range sys.Links.ManagedBy {
		managers = append(managers, m.ID)
	}
	if len(managers) == 0 {
		var col collectionDoc
		if _, err := c.getJSON(ctx, "/redfish/v1/Managers", &col); err != nil {
			return mediaDoc{}, err
		}
		for _, m := range col.Members {
			managers = append(managers, m.ID)
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
		var col collectionDoc
		if _, err := c.getJSON(ctx, doc.VirtualMedia.ID, &col); err != nil {
			return mediaDoc{}, err
		}
		for _, m := range col.Members {
			var md mediaDoc
			if _, err := c.getJSON(ctx, m.ID, &md); err != nil {
				return mediaDoc{}, err
			}
			if md.ID == "" {
				md.ID = m.ID
			}
			if slices.Contains(md.MediaTypes, "CD") || slices.Contains(md.MediaTypes, "DVD") {
				return md, nil
			}
		}
	}
	return mediaDoc{}, errors.New("the BMC has no CD/DVD virtual media")
}

// InsertMedia attaches the ISO at imageURL to the virtual CD, ejecting another image first.
func (c *Client) InsertMedia(ctx context.Context, imageURL string) error {
	what := "inserting virtual media " + redactURL(imageURL)
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
	})
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

// redactURL drops userinfo and query (they may hold tokens) from a URL for messages.
func redactURL(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if at := strings.IndexByte(u[i+3:], '@'); at >= 0 && !strings.Contains(u[i+3:i+3+at], "/") {
			u = u[:i+3] + u[i+3+at+1:]
		}
	}
	if q := strings.IndexByte(u, '?'); q >= 0 {
		u = u[:q]
	}
	return u
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
		var col collectionDoc
		if _, err := c.getJSON(ctx, svc.Accounts.ID, &col); err != nil {
			return err
		}
		for _, m := range col.Members {
			var acct struct {
				UserName string `json:"UserName"`
			}
			tag, err := c.getJSON(ctx, m.ID, &acct)
			if err != nil {
				return err
			}
			if acct.UserName == c.ep.Username {
				return c.send(ctx, http.MethodPatch, m.ID, map[string]string{"Password": newPassword}, tag)
			}
		}
		return fmt.Errorf("the BMC has no account named %s", c.ep.Username)
	})
	if err != nil {
		return err
	}
	var api *gofish.APIClient
	err = c.retry(ctx, what+": logging in with the new password", func(ctx context.Context) error {
		a, err := c.connect(ctx, newPassword)
		api = a
		return err
	})
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
