package engine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"bcd/internal/command"
	"bcd/internal/pki"
	"bcd/internal/store"
)

// The site's boot lease (DESIGN §6), the boot entries a new holder is given, and power polling
// (DESIGN §10): what the gateway's BootLease, PollSet and ReportPower calls do.

// Bounds of the TTL an agent may ask for.
const (
	minLeaseTTL = time.Second
	maxLeaseTTL = 5 * time.Minute
	// pushedTokenTTL is the life of a token minted for a pushed entry (as at claim time).
	pushedTokenTTL = 2 * time.Hour
	// DefaultUnreachableAfter is how many consecutive failed power reads raise BMC_UNREACHABLE.
	DefaultUnreachableAfter = 3
	// pollSetRefresh is how often the holder asks for its poll set again.
	pollSetRefresh = 5 * time.Minute
	// maxReadingsPerReport bounds one ReportPower call.
	maxReadingsPerReport = 4096
)

// FaultBMCUnreachable is the condition power polling raises on a node whose BMC stopped answering.
const FaultBMCUnreachable = "BMC_UNREACHABLE"

// ErrNotHolder: the caller does not hold the site's boot lease at the epoch it names.
var ErrNotHolder = errors.New("the agent does not hold the site's boot lease at this epoch")

// holderKinds are the command kinds only the boot-lease holder claims (while a lease runs).
func holderKinds() []string {
	var out []string
	for _, k := range command.Kinds() {
		if k.BootLeaseHolder {
			out = append(out, k.Name)
		}
	}
	return out
}

// LeaseRequest is an agent's acquire, renewal or release.
type LeaseRequest struct {
	Release bool
	TTL     time.Duration
	// Epoch the agent holds (0: none); KnownRevision of the site's entries it applied.
	Epoch         uint64
	KnownRevision uint64
	// DHCPLeases: the holder's full-mode DHCP leases granted or ended (Expires 0) since its
	// last answered renewal; kept only when the agent holds the lease at Epoch.
	DHCPLeases []store.DHCPLease
}

// PushedEntry is a boot entry sent to the lease holder, with a freshly minted token.
type PushedEntry struct {
	NodeID, Kind string
	MACs         []string
	Token, Local string
	ISO          *store.BootISO // sanboot entries
	// UserData is an instance entry's operator user-data, a compact JWE to the holder, with
	// its hex SHA-256 ("" when the node's deploy gave none). With UserDataSHA256 and no
	// UserData, the value could not be opened: the holder answers 503 for it, not bcd's default.
	UserData, UserDataSHA256 string
}

// LeaseGrant answers a LeaseRequest.
type LeaseGrant struct {
	Held     bool
	Holder   string
	Epoch    uint64
	TTL      time.Duration
	Revision uint64 // the entries revision the agent has after applying Entries
	Full     bool   // Entries replace the agent's table
	Entries  []PushedEntry
	// Rejected: MACs of machines an operator rejected (acceptance flow), to the holder only:
	// their waiting discovery-mode ramdisks are told to power their hosts off.
	Rejected []string
	// DHCPLeases: with Full, the site's DHCP leases still running, which the new holder's DHCP
	// must not hand out again.
	DHCPLeases []store.DHCPLease
}

// clampTTL keeps a requested TTL within bounds; 0 takes the site agent's default. Pure.
func clampTTL(d time.Duration) time.Duration {
	switch {
	case d <= 0:
		return 10 * time.Second
	case d < minLeaseTTL:
		return minLeaseTTL
	case d > maxLeaseTTL:
		return maxLeaseTTL
	}
	return d
}

// BootLease acquires, renews or releases a's site's boot lease. The holder receives the boot
// entries it lacks: every entry when it has just taken the lease (or names another epoch),
// otherwise those changed since its KnownRevision by commands that ran on other agents.
func (e *Engine) BootLease(ctx context.Context, a Agent, req LeaseRequest) (LeaseGrant, error) {
	if a.Kind != "site" || a.SiteID == "" {
		return LeaseGrant{}, fmt.Errorf("boot lease: %s is not a site agent", a.ID)
	}
	var g LeaseGrant
	var userData map[string]store.UserData
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		g, userData = LeaseGrant{}, nil
		if req.Release {
			return tx.ReleaseLease(ctx, a.SiteID, a.ID)
		}
		ttl := clampTTL(req.TTL)
		l, d, prev, err := tx.AcquireLease(ctx, a.SiteID, a.ID, ttl)
		if err != nil {
			return err
		}
		g.Holder, g.Epoch, g.TTL = l.Holder, l.Epoch, ttl
		if l.Holder != a.ID {
			return nil
		}
		if d == store.LeaseTake {
			reason := "boot lease taken"
			if prev != "" {
				reason = "boot lease taken over from " + prev + " (its lease lapsed)"
			}
			if err := tx.AppendEvent(ctx, store.Event{Actor: "site:" + a.ID, Kind: "site.lease", Reason: reason,
				Data: mustData(map[string]any{"site": a.SiteID, "holder": a.ID, "previous": prev, "epoch": l.Epoch})}); err != nil {
				return err
			}
		}
		g.Held, g.Revision = true, l.EntriesRev
		if g.Rejected, err = tx.RejectedMACs(ctx, a.SiteID); err != nil {
			return err
		}
		g.Full = req.Epoch != l.Epoch
		if !g.Full {
			// Only a holder that held all along reports: leases from before it lost the lease
			// may have been given again since by another holder.
			if err := tx.PutDHCPLeases(ctx, a.SiteID, req.DHCPLeases); err != nil {
				return err
			}
		} else if g.DHCPLeases, err = tx.DHCPLeases(ctx, a.SiteID); err != nil {
			return err
		}
		if !g.Full && req.KnownRevision >= l.EntriesRev {
			return nil
		}
		after := req.KnownRevision
		if g.Full {
			after = 0
		}
		rows, err := tx.BootEntries(ctx, a.SiteID, after)
		if err != nil {
			return err
		}
		rows = slices.DeleteFunc(rows, func(r store.BootEntry) bool {
			return !g.Full && r.AgentID == a.ID // it ran that command itself: it has the entry
		})
		if slices.ContainsFunc(rows, func(r store.BootEntry) bool { return r.Kind == store.BootEntryInstance }) {
			// One read per push that sends instance entries (a new holder's, or another agent's
			// work): never per renewal of a holder that ran the commands itself, nor per command.
			if userData, err = tx.SiteUserData(ctx, a.SiteID); err != nil {
				return err
			}
		}
		for _, r := range rows {
			p, err := e.pushEntry(ctx, tx, r)
			if err != nil {
				return err
			}
			g.Entries = append(g.Entries, p)
		}
		return nil
	})
	if err != nil {
		return LeaseGrant{}, fmt.Errorf("boot lease of site %s for agent %s: %w", a.SiteID, a.ID, err)
	}
	e.pushUserData(ctx, a, g.Entries, userData)
	if g.Held && g.Full {
		e.log.Info("boot lease taken: site entries pushed to the new holder", "site", a.SiteID, "agent", a.ID, "epoch", g.Epoch, "entries", len(g.Entries))
	}
	return g, nil
}

// pushEntry turns a stored entry into what the holder installs, minting the one-time token
// the entry carries (the store keeps only hashes; a token minted for the same command keeps
// the earlier one valid).
func (e *Engine) pushEntry(ctx context.Context, tx *store.Tx, r store.BootEntry) (PushedEntry, error) {
	p := PushedEntry{NodeID: r.NodeID, Kind: r.Kind, MACs: r.MACs, Local: r.Local, ISO: r.ISO}
	prefix, kind, ok := entryToken(r.Kind)
	if !ok {
		return p, nil
	}
	plain, hash, err := pki.NewToken(prefix)
	if err != nil {
		return PushedEntry{}, err
	}
	if err := tx.InsertJoinToken(ctx, store.JoinToken{Hash: hash, Kind: kind, SiteID: r.SiteID, NodeID: r.NodeID, CommandID: r.CommandID,
		Generation: r.Generation, ExpiresAt: tx.At() + pushedTokenTTL.Microseconds()}); err != nil {
		return PushedEntry{}, err
	}
	p.Token = plain
	return p, nil
}

// pushUserData adds to the pushed instance entries of nodes with user-data that user-data,
// encrypted to agent a (opened outside the single writer, as claims do). A value that cannot
// be opened is pushed as its digest alone: the holder then answers 503 for it rather than
// serve bcd's default user-data; the error is logged without the value.
func (e *Engine) pushUserData(ctx context.Context, a Agent, entries []PushedEntry, userData map[string]store.UserData) {
	for i := range entries {
		p := &entries[i]
		u, ok := userData[p.NodeID]
		if p.Kind != store.BootEntryInstance || !ok {
			continue
		}
		p.UserDataSHA256 = u.SHA256
		if e.cfg.Secrets == nil || len(a.CertDER) == 0 {
			continue // in-process agents (simulation)
		}
		jwe, err := e.userDataFor(ctx, a, u.Ref)
		if err != nil {
			e.log.Warn("boot lease: a node's user-data cannot be pushed to the holder: its guest endpoints answer 503 until it is prepared again",
				"node", p.NodeID, "agent", a.ID, "error", err)
			continue
		}
		p.UserData = jwe
	}
}

// bootEntryArgs are the arguments of a boot.* command the entry is rebuilt from.
type bootEntryArgs struct {
	MACs  []string `json:"macs"`
	Local string   `json:"local"`
}

// entryToken is the one-time join token a boot entry of kind entryKind carries: the token's
// prefix and its kind as stored (store.JoinToken.Kind); ok false for an entry that carries
// none. Pure.
func entryToken(entryKind string) (prefix, kind string, ok bool) {
	switch entryKind {
	case store.BootEntryRamdisk:
		return pki.DiscoveryTokenPrefix, "node", true
	case store.BootEntryInstance:
		return pki.InstanceTokenPrefix, "os", true
	}
	return "", "", false
}

// bootEntryKind is the entry a succeeded boot command leaves, "" for other kinds. Pure.
func bootEntryKind(commandKind string) string {
	switch commandKind {
	case "boot.prepareRamdisk":
		return store.BootEntryRamdisk
	case "boot.prepareInstance":
		return store.BootEntryInstance
	case "boot.cleanUp":
		return store.BootEntryRemoved
	}
	return ""
}

// mediaArgs and mediaResult are what recordMediaEntry reads of a bmc.media command.
type mediaArgs struct {
	Action string   `json:"action"`
	Image  string   `json:"image"`
	URL    string   `json:"url"`
	SHA256 string   `json:"sha256"`
	MACs   []string `json:"macs"`
}

type mediaResult struct {
	Via string `json:"via"`
}

// MediaEntry is the boot entry a succeeded bmc.media leaves at the agent that ran it: a
// sanboot entry of the ISO (insert where the BMC has no virtual media), its removal (eject
// of such an entry), or none (virtual media: the BMC holds the ISO). Pure.
func MediaEntry(c store.Command) (store.BootEntry, bool, error) {
	if c.Kind != "bmc.media" || command.State(c.State) != command.Succeeded {
		return store.BootEntry{}, false, nil
	}
	var res mediaResult
	if c.Result != "" {
		if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
			return store.BootEntry{}, false, fmt.Errorf("bmc.media result is not JSON: %w", err)
		}
	}
	if res.Via != "sanboot" {
		return store.BootEntry{}, false, nil
	}
	var a mediaArgs
	if err := json.Unmarshal([]byte(c.Args), &a); err != nil {
		return store.BootEntry{}, false, fmt.Errorf("decoding arguments of command %s: %w", c.ID, err)
	}
	macs := make([]string, 0, len(a.MACs))
	for _, m := range a.MACs {
		macs = append(macs, strings.ToLower(m))
	}
	e := store.BootEntry{SiteID: c.SiteID, NodeID: c.NodeID, MACs: macs, Generation: c.Generation, CommandID: c.ID, AgentID: c.TargetAgent}
	switch a.Action {
	case "insert":
		// The site cache's name for it (site.mediaArtifact): the image name + ".iso".
		e.Kind, e.ISO = store.BootEntrySanboot, &store.BootISO{Name: a.Image + ".iso", URL: a.URL, SHA256: strings.ToLower(a.SHA256)}
	case "eject":
		e.Kind = store.BootEntryRemoved
	default:
		return store.BootEntry{}, false, fmt.Errorf("bmc.media %s: action %q", c.ID, a.Action)
	}
	return e, true, nil
}

// recordBootEntry keeps the entry a boot command installs (or removes) as the command is given
// to agent a (the holder), so that a later holder can be given it. It is written at claim, not
// at success: a holder that dies between installing an entry and reporting it leaves a machine
// in PXE that its successor must serve at once, not after the lost command's retry.
func (e *Engine) recordBootEntry(ctx context.Context, tx *store.Tx, a Agent, c store.Command) error {
	kind := bootEntryKind(c.Kind)
	if kind == "" || c.SiteID == "" {
		return nil
	}
	var args bootEntryArgs
	if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
		return fmt.Errorf("decoding arguments of command %s: %w", c.ID, err)
	}
	macs := make([]string, 0, len(args.MACs))
	for _, m := range args.MACs {
		macs = append(macs, strings.ToLower(m))
	}
	return tx.PutBootEntry(ctx, &store.BootEntry{SiteID: c.SiteID, NodeID: c.NodeID, Kind: kind, MACs: macs, Local: args.Local,
		Generation: c.Generation, CommandID: c.ID, AgentID: a.ID})
}

// ---------------------------------------------------------------- power polling

// PollTarget is a node the holder polls, with its credentials encrypted to the holder.
type PollTarget struct {
	NodeID      string
	BMC         store.BMCRef
	Credentials string // JWE; "" when the engine has no secrets (simulation)
}

// PollSet lists the nodes of a's site for its poller; only the holder at epoch may ask.
func (e *Engine) PollSet(ctx context.Context, a Agent, epoch uint64) ([]PollTarget, time.Duration, error) {
	var targets []store.PollTarget
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		if err := holds(ctx, tx, a, epoch); err != nil {
			return err
		}
		var err error
		targets, err = tx.PollTargets(ctx, a.SiteID)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	out := make([]PollTarget, 0, len(targets))
	jwes := map[[2]string]string{} // nodes sharing credentials share one JWE
	for _, t := range targets {
		p := PollTarget{NodeID: t.NodeID, BMC: t.BMC}
		if e.cfg.Secrets != nil && len(a.CertDER) > 0 {
			key := [2]string{t.BMC.UsernameRef, t.BMC.PasswordRef}
			jwe, ok := jwes[key]
			if !ok {
				if jwe, err = e.credentialsFor(ctx, a, t.BMC); err != nil {
					e.log.Warn("power polling: node left out", "node", t.NodeID, "error", err)
					continue
				}
				jwes[key] = jwe
			}
			p.Credentials = jwe
		}
		out = append(out, p)
	}
	return out, pollSetRefresh, nil
}

// credentialsFor opens a BMC binding's credentials and encrypts them to agent a.
func (e *Engine) credentialsFor(ctx context.Context, a Agent, ref store.BMCRef) (string, error) {
	user, err := e.cfg.Secrets.OpenSecret(ctx, ref.UsernameRef)
	if err != nil {
		return "", fmt.Errorf("opening BMC username: %w", err)
	}
	pass, err := e.cfg.Secrets.OpenSecret(ctx, ref.PasswordRef)
	if err != nil {
		return "", fmt.Errorf("opening BMC password: %w", err)
	}
	plain, _ := json.Marshal(map[string]string{"username": string(user), "password": string(pass)})
	return e.encryptCredentials(a, plain)
}

// maxCredentials bounds the credentials kept encrypted to agents (one per machine and agent
// serving it; emptied when full, which only costs encrypting again).
const maxCredentials = 1 << 14

// encryptCredentials encrypts plain to agent a's certificate, or returns what it encrypted for
// the same certificate and plaintext before. The key of what is kept holds no secret: the
// certificate's digest and an HMAC of the plaintext under a key of this process.
func (e *Engine) encryptCredentials(a Agent, plain []byte) (string, error) {
	cert := sha256.Sum256(a.CertDER)
	mac := hmac.New(sha256.New, e.credentialsKey)
	mac.Write(plain)
	key := string(cert[:]) + string(mac.Sum(nil))
	if jwe, ok := e.credentials.Get(key); ok {
		return jwe, nil
	}
	jwe, err := pki.EncryptToAgent(a.CertDER, plain)
	if err != nil {
		return "", fmt.Errorf("encrypting BMC credentials to agent %s: %w", a.ID, err)
	}
	e.credentials.Put(key, jwe)
	return jwe, nil
}

// holds checks that a holds its site's lease at epoch.
func holds(ctx context.Context, tx *store.Tx, a Agent, epoch uint64) error {
	if a.Kind != "site" {
		return fmt.Errorf("%s is not a site agent: %w", a.ID, ErrNotHolder)
	}
	l, err := tx.LeaseOf(ctx, a.SiteID)
	if err != nil {
		return err
	}
	if !l.HeldBy(a.ID, tx.At()) || l.Epoch != epoch {
		return fmt.Errorf("agent %s, epoch %d (site %s: holder %q, epoch %d): %w", a.ID, epoch, a.SiteID, l.Holder, l.Epoch, ErrNotHolder)
	}
	return nil
}

// PowerReading is one read of a node's power by the holder's poller.
type PowerReading struct {
	NodeID   string
	Power    string // on, off, unknown; "" when the read failed
	Error    string
	Failures int
	Observed time.Time
}

// pollOutcome is what a reading does to a node. Pure (decidePoll).
type pollOutcome struct {
	next     store.PowerPoll
	setPower string // new power axis, "" unchanged
	raise    bool   // BMC_UNREACHABLE raised now
	clear    bool   // BMC_UNREACHABLE cleared now
}

// decidePoll applies a reading to a node's polling record and power axis: a successful read sets
// the power (when it changed), resets the failures and clears BMC_UNREACHABLE; a failed one
// counts, and raises BMC_UNREACHABLE once after threshold consecutive failures. Pure.
func decidePoll(prev store.PowerPoll, nodePower string, r PowerReading, threshold int, at int64) pollOutcome {
	o := pollOutcome{next: prev}
	if r.Power != "" {
		o.next.Failures, o.next.LastError, o.next.LastOKAt = 0, "", at
		if r.Power != nodePower {
			o.setPower = r.Power
		}
		if prev.UnreachableSince != 0 {
			o.next.UnreachableSince, o.clear = 0, true
		}
		return o
	}
	o.next.Failures = max(r.Failures, prev.Failures+1)
	o.next.LastError = r.Error
	if o.next.Failures >= threshold && prev.UnreachableSince == 0 {
		o.next.UnreachableSince, o.raise = at, true
	}
	return o
}

// validPower reports whether a reading's power value is one the power axis takes. Pure.
func validPower(p string) bool { return p == "on" || p == "off" || p == "unknown" }

// ReportPower applies the holder's readings: the power axis (with an event when it changes) and
// the BMC_UNREACHABLE condition (an event when raised and when cleared). Readings about nodes
// of other sites, or with a power value outside on/off/unknown, are ignored.
func (e *Engine) ReportPower(ctx context.Context, a Agent, epoch uint64, rs []PowerReading) error {
	if len(rs) > maxReadingsPerReport {
		rs = rs[:maxReadingsPerReport]
	}
	threshold := e.cfg.UnreachableAfter
	if threshold <= 0 {
		threshold = DefaultUnreachableAfter
	}
	return e.st.Write(ctx, func(tx *store.Tx) error {
		if err := holds(ctx, tx, a, epoch); err != nil {
			return err
		}
		for _, r := range rs {
			if r.Power != "" && !validPower(r.Power) {
				continue
			}
			n, err := tx.LockNode(ctx, r.NodeID, "")
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if n.SiteID != a.SiteID {
				continue
			}
			prev, err := tx.LockPowerPoll(ctx, n.ID)
			if err != nil {
				return err
			}
			errText := r.Error
			if len(errText) > 512 {
				errText = errText[:512]
			}
			r.Error = errText
			o := decidePoll(prev, n.Power, r, threshold, tx.At())
			if err := tx.PutPowerPoll(ctx, o.next); err != nil {
				return err
			}
			ev := store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: "site:" + a.ID, FromState: n.State, ToState: n.State}
			if o.setPower != "" {
				if err := tx.SetPolledPower(ctx, n.ID, o.setPower); err != nil {
					return err
				}
				ev.Kind, ev.Reason = "node.power", fmt.Sprintf("power poll: %s → %s", n.Power, o.setPower)
				ev.Data = mustData(map[string]any{"from": n.Power, "to": o.setPower})
				if err := tx.AppendEvent(ctx, ev); err != nil {
					return err
				}
			}
			switch {
			case o.raise:
				ev.Kind, ev.Reason = "node.condition", fmt.Sprintf("%s raised: %d consecutive power reads failed: %s", FaultBMCUnreachable, o.next.Failures, errText)
				ev.Data = mustData(map[string]any{"condition": FaultBMCUnreachable, "status": "raised", "failures": o.next.Failures})
			case o.clear:
				ev.Kind, ev.Reason = "node.condition", FaultBMCUnreachable+" cleared: the BMC answers again"
				ev.Data = mustData(map[string]any{"condition": FaultBMCUnreachable, "status": "cleared"})
			default:
				continue
			}
			// The condition shows on the node (API conditions) as well as in its events.
			if o.setPower != "" {
				n.Power = o.setPower
				n.Version++ // SetPolledPower above bumped it
			}
			if n.Conditions == nil {
				n.Conditions = map[string]string{}
			}
			if o.raise {
				n.Conditions[FaultBMCUnreachable] = "True"
			} else {
				delete(n.Conditions, FaultBMCUnreachable)
			}
			if err := tx.UpdateNode(ctx, &n); err != nil {
				return err
			}
			if err := tx.AppendEvent(ctx, ev); err != nil {
				return err
			}
		}
		return nil
	})
}

func mustData(v any) string {
	if m, ok := v.(map[string]any); ok {
		return eventJSON(m)
	}
	b, _ := json.Marshal(v)
	return string(b)
}
