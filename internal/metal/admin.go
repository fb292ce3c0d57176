package metal

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"time"

	"bcd/internal/auth"
	"bcd/internal/catalog"
	"bcd/internal/hardware"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

func (s *Service) now() time.Time { return time.Now() }

func encodePageToken(afterID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("after:" + afterID))
}

var pageTokenRe = regexp.MustCompile(`^after:[0-9a-f-]{36}$`)

func decodePageToken(tok string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || !pageTokenRe.Match(b) {
		return "", invalid("page_token", "is not a token this server returned: pass next_page_token from the previous page unchanged")
	}
	return string(b[len("after:"):]), nil
}

// ---------------------------------------------------------------- tenants, sites, pools, profiles

// tenantFor resolves the tenant an administrative call acts in: the principal's own, or the
// named one for an all-tenant admin (default "default").
func (s *Service) tenantFor(ctx context.Context, p auth.Principal, ref string) (store.Tenant, error) {
	if ref == "" {
		if p.TenantID != "" {
			ref = p.TenantID
		} else {
			ref = "default"
		}
	}
	tn, err := s.st.Tenant(ctx, ref)
	if err != nil || !p.CanSeeTenant(tn.ID) {
		return store.Tenant{}, fmt.Errorf("tenant %q: %w", ref, store.ErrNotFound)
	}
	return tn, nil
}

func (s *Service) CreateTenant(ctx context.Context, p auth.Principal, name string) (store.Tenant, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.Tenant{}, err
	}
	if p.TenantID != "" {
		return store.Tenant{}, &ForbiddenError{Msg: "only an installation-wide admin token (one without a tenant) creates tenants"}
	}
	if err := ValidLookupName("name", name); err != nil {
		return store.Tenant{}, err
	}
	var tn store.Tenant
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if tn, err = tx.InsertTenant(ctx, name); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: tn.ID, Actor: p.Actor(), Kind: "tenant.create", Data: jsonObject(map[string]any{"name": name})})
	})
	return tn, err
}

func (s *Service) Tenants(ctx context.Context, p auth.Principal) ([]store.Tenant, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	all, err := s.st.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, tn := range all {
		if p.CanSeeTenant(tn.ID) {
			out = append(out, tn)
		}
	}
	return out, nil
}

func (s *Service) CreateSite(ctx context.Context, p auth.Principal, name, tenant string, labels map[string]string) (store.Site, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.Site{}, err
	}
	if err := ValidLookupName("name", name); err != nil {
		return store.Site{}, err
	}
	if err := ValidLabels("labels", labels); err != nil {
		return store.Site{}, err
	}
	tn, err := s.tenantFor(ctx, p, tenant)
	if err != nil {
		return store.Site{}, err
	}
	var site store.Site
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if site, err = tx.InsertSite(ctx, tn.ID, name, labels); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: tn.ID, Actor: p.Actor(), Kind: "site.create", Data: jsonObject(map[string]any{"name": name, "labels": labels})})
	})
	return site, err
}

func (s *Service) Sites(ctx context.Context, p auth.Principal, tenant string) ([]store.Site, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	tid := p.TenantID
	if tenant != "" {
		tn, err := s.tenantFor(ctx, p, tenant)
		if err != nil {
			return nil, err
		}
		tid = tn.ID
	}
	return s.st.Sites(ctx, tid)
}

func (s *Service) DeleteSite(ctx context.Context, p auth.Principal, ref string) error {
	if err := Require(p, auth.Administer); err != nil {
		return err
	}
	if ref == "" {
		return invalid("site", "is required: the name or id of the site to delete")
	}
	site, err := s.st.Site(ctx, ref)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return fmt.Errorf("site %q: %w", ref, store.ErrNotFound)
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.DeleteSite(ctx, site.ID); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: site.TenantID, Actor: p.Actor(), Kind: "site.delete", Data: jsonObject(map[string]any{"name": site.Name})})
	})
}

func (s *Service) validPolicy(ctx context.Context, pol store.PoolPolicy) error {
	if pol.HardwareProfile == "" {
		return invalid("policy.hardware_profile", "is required: the name of a hardware profile (built in: redfish, ipmi)")
	}
	if pol.AutoAcceptInband && !pol.AutoAccept {
		return invalid("policy.auto_accept_inband", "needs auto_accept: the pool enrolls only what it accepts")
	}
	if _, err := workflow.ParseFastTrackWindow(pol.FastTrackWindow, 0); err != nil {
		return invalid("policy.fast_track_window", "%s (empty: the server's default)", err)
	}
	if err := ValidFirmwareBaseline("policy.firmware_baseline", pol.FirmwareBaseline); err != nil {
		return err
	}
	if err := ValidBIOSSettings("policy.bios_settings", pol.BIOSSettings); err != nil {
		return err
	}
	if _, err := hardware.ParseAll(pol.HardwareRequirements); err != nil {
		return invalid("policy.hardware_requirements", "%s", err)
	}
	if err := s.validFirmwareImages(ctx, pol); err != nil {
		return err
	}
	profiles, err := s.st.HardwareProfiles(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, hp := range profiles {
		if hp.Name == pol.HardwareProfile {
			if len(pol.BIOSSettings) > 0 && hp.Drivers["power"] == "ipmi" {
				return invalid("policy.bios_settings", "hardware profile %s drives its BMCs with ipmi, which has no BIOS settings: use a profile whose power driver is redfish", hp.Name)
			}
			if len(pol.FirmwareImages) > 0 && hp.Drivers["power"] == "ipmi" {
				return invalid("policy.firmware_images", "hardware profile %s drives its BMCs with ipmi, which cannot install firmware: use a profile whose power driver is redfish", hp.Name)
			}
			return ValidLabels("policy.labels", pol.Labels)
		}
		names = append(names, hp.Name)
	}
	return invalid("policy.hardware_profile", "unknown hardware profile %q: defined are %v", truncate(pol.HardwareProfile), names)
}

// validFirmwareImages checks a policy's firmware images: each names a component of the
// firmware baseline (the version the image must bring, checked after it is installed) and a
// catalog image of format firmware whose signature verifies.
func (s *Service) validFirmwareImages(ctx context.Context, pol store.PoolPolicy) error {
	const field = "policy.firmware_images"
	if len(pol.FirmwareImages) > MaxFirmwareBaseline {
		return invalid(field, "%d components: at most %d are accepted", len(pol.FirmwareImages), MaxFirmwareBaseline)
	}
	for _, comp := range slices.Sorted(maps.Keys(pol.FirmwareImages)) {
		if _, ok := pol.FirmwareBaseline[comp]; !ok {
			return invalid(field, "component %q has no version in firmware_baseline: the baseline says which version the image must bring, and is checked after it is installed", truncate(comp))
		}
		name := pol.FirmwareImages[comp]
		if err := ValidName(field, name); err != nil {
			return err
		}
		img, err := s.st.VerifiedImage(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return invalid(field, "component %s: no catalog image named %q (bcd image list)", comp, truncate(name))
		}
		if err != nil {
			return invalid(field, "component %s: %s: a BMC installs only catalog images whose signature verifies", comp, err.Error())
		}
		if img.Format != catalog.FormatFirmware {
			return invalid(field, "component %s: image %s is a %s image: use one registered with --format firmware", comp, img.Name, img.Format)
		}
	}
	return nil
}

func (s *Service) CreatePool(ctx context.Context, p auth.Principal, name, siteRef string, pol store.PoolPolicy) (store.Pool, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.Pool{}, err
	}
	if err := ValidLookupName("name", name); err != nil {
		return store.Pool{}, err
	}
	if siteRef == "" {
		return store.Pool{}, invalid("site", "is required: the name or id of the site the pool's machines are on")
	}
	site, err := s.st.Site(ctx, siteRef)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return store.Pool{}, fmt.Errorf("site %q: %w", siteRef, store.ErrNotFound)
	}
	if err := s.validPolicy(ctx, pol); err != nil {
		return store.Pool{}, err
	}
	var pool store.Pool
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if pool, err = tx.InsertPool(ctx, store.Pool{TenantID: site.TenantID, SiteID: site.ID, Name: name, Policy: pol}); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: site.TenantID, Actor: p.Actor(), Kind: "pool.create", Data: jsonObject(map[string]any{"name": name, "site": site.Name, "policy": pol})})
	})
	return pool, err
}

func (s *Service) UpdatePool(ctx context.Context, p auth.Principal, ref string, pol store.PoolPolicy) (store.Pool, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.Pool{}, err
	}
	if ref == "" {
		return store.Pool{}, invalid("pool", "is required: the name or id of the pool to update")
	}
	pool, err := s.st.Pool(ctx, ref)
	if err != nil || !p.CanSeeTenant(pool.TenantID) {
		return store.Pool{}, fmt.Errorf("pool %q: %w", ref, store.ErrNotFound)
	}
	if err := s.validPolicy(ctx, pol); err != nil {
		return store.Pool{}, err
	}
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.UpdatePoolPolicy(ctx, pool.ID, pol); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: pool.TenantID, Actor: p.Actor(), Kind: "pool.update", Data: jsonObject(map[string]any{"name": pool.Name, "from": pool.Policy, "to": pol})})
	})
	pool.Policy = pol
	return pool, err
}

func (s *Service) Pools(ctx context.Context, p auth.Principal, tenant, site string) ([]store.Pool, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	tid := p.TenantID
	if tenant != "" {
		tn, err := s.tenantFor(ctx, p, tenant)
		if err != nil {
			return nil, err
		}
		tid = tn.ID
	}
	sid := ""
	if site != "" {
		st, err := s.st.Site(ctx, site)
		if err != nil || !p.CanSeeTenant(st.TenantID) {
			return nil, fmt.Errorf("site %q: %w", truncate(site), store.ErrNotFound)
		}
		sid = st.ID
	}
	return s.st.Pools(ctx, tid, sid)
}

func (s *Service) DeletePool(ctx context.Context, p auth.Principal, ref string) error {
	if err := Require(p, auth.Administer); err != nil {
		return err
	}
	if ref == "" {
		return invalid("pool", "is required: the name or id of the pool to delete")
	}
	pool, err := s.st.Pool(ctx, ref)
	if err != nil || !p.CanSeeTenant(pool.TenantID) {
		return fmt.Errorf("pool %q: %w", ref, store.ErrNotFound)
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.DeletePool(ctx, pool.ID); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: pool.TenantID, Actor: p.Actor(), Kind: "pool.delete", Data: jsonObject(map[string]any{"name": pool.Name})})
	})
}

// Concerns a hardware profile binds, and the drivers known for each.
var concernDrivers = map[string][]string{
	"power":         {"redfish", "ipmi"},
	"management":    {"redfish", "ipmi"},
	"boot":          {"ipxe"},
	"deploy":        {"image-stream"},
	"inspect":       {"redfish", "ipmi", "ramdisk"},
	"virtual-media": {"redfish"},
	// console: IPMI Serial-over-LAN, also for a node managed by Redfish (at its BMC's host,
	// port 623: ConsoleBMC). A node managed by IPMI has it without the binding.
	"console": {"ipmi"},
}

// bmcConcerns are the concerns the node's BMC driver serves. A node has one BMC driver (its
// power driver, or the one its enrollment names): a profile naming another for one of these
// would be stored and never used, so it is refused.
var bmcConcerns = []string{"management", "inspect", "virtual-media"}

// oneBMCDriver refuses BMC concerns bound to another driver than power's ("ramdisk" inspection
// is in-band, not the BMC's, and goes with any).
func oneBMCDriver(drivers map[string]string) error {
	power := drivers["power"]
	for _, c := range bmcConcerns {
		d := drivers[c]
		if d == "" || d == power || (c == "inspect" && d == "ramdisk") {
			continue
		}
		if !slices.Contains(concernDrivers[c], power) {
			return invalid("drivers", "%s=%s with power=%s: a node has one BMC driver, serving power, management, inspect and virtual-media, and %s has no %s driver: use power=%s, or leave %s out",
				c, d, power, power, c, d, c)
		}
		return invalid("drivers", "%s=%s with power=%s: a node has one BMC driver, serving power, management, inspect and virtual-media; accepted for %s: %s (or leave it out)",
			c, d, power, c, power)
	}
	return nil
}

// installationWide refuses a change to what every tenant shares (hardware profiles, deploy
// profiles, the image catalog and its signers) to any but an admin token without a tenant: a
// tenant's admin would otherwise decide what other tenants' machines run.
func installationWide(p auth.Principal, what string) error {
	if err := Require(p, auth.Administer); err != nil {
		return err
	}
	if p.TenantID != "" {
		return &ForbiddenError{Msg: what + " are installation-wide: only an admin token without a tenant changes them"}
	}
	return nil
}

func (s *Service) PutHardwareProfile(ctx context.Context, p auth.Principal, hp store.HardwareProfile) (store.HardwareProfile, error) {
	if err := installationWide(p, "hardware profiles"); err != nil {
		return store.HardwareProfile{}, err
	}
	if err := ValidName("name", hp.Name); err != nil {
		return store.HardwareProfile{}, err
	}
	if hp.Drivers["power"] == "" {
		return store.HardwareProfile{}, invalid("drivers", "a power driver is required (redfish or ipmi)")
	}
	for concern, driver := range hp.Drivers {
		known, ok := concernDrivers[concern]
		if !ok {
			return store.HardwareProfile{}, invalid("drivers", "unknown concern %q: accepted are power, management, boot, deploy, inspect, virtual-media, console", truncate(concern))
		}
		found := false
		for _, k := range known {
			found = found || k == driver
		}
		if !found {
			return store.HardwareProfile{}, invalid("drivers", "unknown %s driver %q: accepted are %v", concern, truncate(driver), known)
		}
	}
	if err := oneBMCDriver(hp.Drivers); err != nil {
		return store.HardwareProfile{}, err
	}
	switch hp.LocalBoot {
	case "":
		hp.LocalBoot = "exit"
	case "exit", "sanboot":
	default:
		return store.HardwareProfile{}, invalid("local_boot", "%q: accepted are exit and sanboot", truncate(hp.LocalBoot))
	}
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.PutHardwareProfile(ctx, hp); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: "hardwareprofile.put", Data: jsonObject(map[string]any{"name": hp.Name, "drivers": hp.Drivers, "localBoot": hp.LocalBoot})})
	})
	return hp, err
}

func (s *Service) HardwareProfiles(ctx context.Context, p auth.Principal) ([]store.HardwareProfile, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	return s.st.HardwareProfiles(ctx)
}

// ---------------------------------------------------------------- tokens

// CreateToken creates a token and returns its secret, shown once.
func (s *Service) CreateToken(ctx context.Context, p auth.Principal, name string, role auth.Role, tenant string) (string, store.Token, error) {
	if err := Require(p, auth.Administer); err != nil {
		return "", store.Token{}, err
	}
	if err := ValidLookupName("name", name); err != nil {
		return "", store.Token{}, err
	}
	if _, err := auth.ParseRole(string(role)); err != nil {
		return "", store.Token{}, invalid("role", "%s", err.Error())
	}
	tid := ""
	if tenant != "" || p.TenantID != "" {
		tn, err := s.tenantFor(ctx, p, tenant)
		if err != nil {
			return "", store.Token{}, err
		}
		tid = tn.ID
	}
	plain, hash, err := auth.NewToken()
	if err != nil {
		return "", store.Token{}, err
	}
	var tok store.Token
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if tok, err = tx.InsertToken(ctx, store.Token{Name: name, Hash: hash, Role: string(role), TenantID: tid, CreatedBy: p.Actor()}); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: tid, Actor: p.Actor(), Kind: "token.create", Data: jsonObject(map[string]any{"name": name, "role": role})})
	})
	if err != nil {
		return "", store.Token{}, err
	}
	return plain, tok, nil
}

func (s *Service) Tokens(ctx context.Context, p auth.Principal) ([]store.Token, error) {
	if err := Require(p, auth.Administer); err != nil {
		return nil, err
	}
	all, err := s.st.Tokens(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, t := range all {
		if p.TenantID == "" || t.TenantID == p.TenantID {
			out = append(out, t)
		}
	}
	return out, nil
}

func (s *Service) RevokeToken(ctx context.Context, p auth.Principal, ref string) (store.Token, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.Token{}, err
	}
	if ref == "" {
		return store.Token{}, invalid("token", "is required: the name or id of the token to revoke (bcd token list)")
	}
	var tok store.Token
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if tok, err = tx.RevokeToken(ctx, ref); err != nil {
			return err
		}
		if p.TenantID != "" && tok.TenantID != p.TenantID {
			return fmt.Errorf("active token %q: %w", ref, store.ErrNotFound)
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: tok.TenantID, Actor: p.Actor(), Kind: "token.revoke", Data: jsonObject(map[string]any{"name": tok.Name})})
	})
	return tok, err
}

// Authenticate resolves a bearer token to its principal.
func (s *Service) Authenticate(ctx context.Context, plain string) (auth.Principal, error) {
	tok, err := s.st.TokenByHash(ctx, auth.HashToken(plain))
	if err != nil {
		return auth.Principal{}, err
	}
	return auth.Principal{TokenID: tok.ID, Name: tok.Name, Role: auth.Role(tok.Role), TenantID: tok.TenantID}, nil
}

// PutDeployProfile stores an operator-defined deploy profile after checking it resolves.
func (s *Service) PutDeployProfile(ctx context.Context, p auth.Principal, name, definition string) error {
	if err := installationWide(p, "deploy profiles"); err != nil {
		return err
	}
	if err := ValidName("name", name); err != nil {
		return err
	}
	if len(definition) > 64<<10 {
		return invalid("definition", "is larger than 64 KiB")
	}
	if _, err := workflow.ParseProfile(name, []byte(definition)); err != nil {
		return invalid("definition", "%s", err.Error())
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.PutProfile(ctx, name, definition); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: "profile.put", Data: jsonObject(map[string]any{"name": name})})
	})
}

// DeleteDeployProfile deletes a profile stored through the API: an operator-defined deploy
// profile (a profile of that name in the server's profiles file is used again), or the
// override of a built-in metal-* profile (which then runs as built). Refused while a node
// deploying, or failed while deploying, names it; workflows already started keep the steps
// they started with.
func (s *Service) DeleteDeployProfile(ctx context.Context, p auth.Principal, name string) error {
	if err := installationWide(p, "deploy profiles"); err != nil {
		return err
	}
	if name == "" {
		return invalid("name", "is required: the name of a profile stored through the API (bcd profile list)")
	}
	if err := ValidName("name", name); err != nil {
		return err
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.DeleteProfile(ctx, name); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: "profile.delete", Data: jsonObject(map[string]any{"name": name})})
	})
}

// DeployProfiles lists the built-in deploy profile and the operator-defined ones.
func (s *Service) DeployProfiles(ctx context.Context, p auth.Principal) (map[string]string, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	return s.st.Profiles(ctx)
}

// ---------------------------------------------------------------- image catalog

// AddSigner registers an Ed25519 public key that may sign catalog images.
func (s *Service) AddSigner(ctx context.Context, p auth.Principal, name string, pub []byte) error {
	if err := installationWide(p, "image signers"); err != nil {
		return err
	}
	if err := ValidName("name", name); err != nil {
		return err
	}
	if len(pub) != ed25519.PublicKeySize {
		return invalid("public_key", "is %d bytes: an Ed25519 public key is %d", len(pub), ed25519.PublicKeySize)
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.PutSigner(ctx, name, pub); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: "signer.add", Data: jsonObject(map[string]any{"name": name})})
	})
}

// RevokeSigner revokes a signer: its images can no longer be deployed.
func (s *Service) RevokeSigner(ctx context.Context, p auth.Principal, name string) error {
	if err := installationWide(p, "image signers"); err != nil {
		return err
	}
	if name == "" {
		return invalid("name", "is required: the name of the registered signer to revoke")
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.RevokeSigner(ctx, name); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: "signer.revoke", Data: jsonObject(map[string]any{"name": name})})
	})
}

// AddImage adds (or replaces) a catalog image. It may be unsigned in the catalog; deploy refuses
// it until a registered signer's signature covers it.
func (s *Service) AddImage(ctx context.Context, p auth.Principal, img catalog.Image) error {
	if err := installationWide(p, "catalog images"); err != nil {
		return err
	}
	if err := ValidName("name", img.Name); err != nil {
		return err
	}
	if err := catalog.Check(img); err != nil {
		return invalid("image", "%s", err.Error())
	}
	return s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.PutImage(ctx, img); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: "image.put", Data: jsonObject(map[string]any{"name": img.Name, "url": catalog.RedactURL(img.URL), "sha256": img.SHA256, "signer": img.Signer})})
	})
}

// Images lists the catalog with each image's verdict ("" when deployable).
func (s *Service) Images(ctx context.Context, p auth.Principal) ([]catalog.Image, []string, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, nil, err
	}
	imgs, err := s.st.Images(ctx)
	if err != nil {
		return nil, nil, err
	}
	signers, err := s.st.Signers(ctx)
	if err != nil {
		return nil, nil, err
	}
	verdicts := make([]string, len(imgs))
	for i, img := range imgs {
		if err := catalog.Verify(img, signers); err != nil {
			verdicts[i] = err.Error()
		}
	}
	return imgs, verdicts, nil
}

// CreateSiteJoinToken mints, with mint (the agent gateway's), a one-time bootstrap token for a
// site agent of siteRef living ttl, and records who asked (event site.joinToken.create, in the
// site's tenant, without the token): the agent that joins with it is handed the site's BMC
// credentials. Admin; a tenant's token only for its own sites. The token is returned only once
// recorded: one minted but not recorded is never shown, so nobody can use it.
func (s *Service) CreateSiteJoinToken(ctx context.Context, p auth.Principal, siteRef string, ttl time.Duration,
	mint func(ctx context.Context, siteID string, ttl time.Duration) (string, error)) (string, time.Time, error) {
	if err := Require(p, auth.Administer); err != nil {
		return "", time.Time{}, err
	}
	if siteRef == "" {
		return "", time.Time{}, invalid("site", "is required: the name or id of the site the agent serves")
	}
	site, err := s.st.Site(ctx, siteRef)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return "", time.Time{}, fmt.Errorf("site %q: %w", truncate(siteRef), store.ErrNotFound)
	}
	tok, err := mint(ctx, site.ID, ttl)
	if err != nil {
		return "", time.Time{}, err
	}
	expires := s.now().Add(ttl).UTC()
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		return tx.AppendEvent(ctx, store.Event{TenantID: site.TenantID, Actor: p.Actor(), Kind: "site.joinToken.create",
			Data: jsonObject(map[string]any{"site": site.Name, "expiresAt": expires.Format(time.RFC3339)})})
	})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("recording the join token of site %s (not shown: it cannot be used): %w", site.Name, err)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "site join token created", slog.String("site", site.Name), slog.String("actor", p.Actor()))
	return tok, expires, nil
}

// RevokeSiteAgent refuses site agent agentID's certificate from now on (a decommissioned host,
// a leaked key): its connects, calls and renewals, and its open stream at the gateway's next
// check. Its commands are then released or lost as for any agent gone. Admin; a tenant's
// token may revoke only the agents of its own sites. It returns the agent and its site.
func (s *Service) RevokeSiteAgent(ctx context.Context, p auth.Principal, agentID, reason string) (store.Agent, store.Site, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.Agent{}, store.Site{}, err
	}
	if agentID == "" {
		return store.Agent{}, store.Site{}, invalid("agent", "is required: the site agent's id (bcd doctor lists them)")
	}
	if err := ValidReason(reason); err != nil {
		return store.Agent{}, store.Site{}, err
	}
	var a store.Agent
	var site store.Site
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		var rerr, err error
		a, rerr = tx.RevokeSiteAgent(ctx, agentID)
		if a.SiteID == "" && rerr != nil {
			return rerr // no such agent
		}
		// Another tenant's agent is not found, revoked already or not: whether it exists is
		// not this caller's to learn (the transaction, and its revocation, is rolled back).
		site, err = tx.Site(ctx, a.SiteID)
		if err != nil || !p.CanSeeTenant(site.TenantID) {
			return fmt.Errorf("site agent %q: %w", truncate(agentID), store.ErrNotFound)
		}
		if rerr != nil {
			return rerr
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: site.TenantID, Actor: p.Actor(), Kind: "site.agent.revoke", Reason: reason,
			Data: jsonObject(map[string]any{"agent": a.ID, "site": site.Name})})
	})
	if err != nil {
		return store.Agent{}, store.Site{}, err
	}
	return a, site, nil
}
