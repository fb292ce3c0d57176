package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/netboot"
)

// The store-backed boot lease, reached through the gateway (BootLease), and what comes with
// holding it: the site's boot entries (the control plane keeps them in boot_entries and gives a
// new holder all of them) and power polling (PollSet, ReportPower).

// leaseLink is what the gateway lease needs of the agent's link.
type leaseLink interface {
	BootLease(ctx context.Context, req agentlink.LeaseRequest) (agentlink.LeaseGrant, error)
}

// gatewayLease implements Lease and leaseReleaser over the gateway. It applies the entries the
// control plane sends the holder, and remembers the epoch (fencing token) the agent holds.
type gatewayLease struct {
	link  leaseLink
	apply func(full bool, es []agentlink.BootEntry) error
	// rejected receives the rejected MACs each grant to the holder carries; nil: ignored.
	rejected func(macs []string)
	// reports: the holder's DHCP lease changes, sent with each renewal; nil: none.
	reports *dhcpReports
	// known receives, when the agent takes the lease, the site's DHCP leases the control plane
	// kept from earlier holders (before it serves: its DHCP starts with them); nil: ignored.
	known func(ls []gateway.DHCPLease)
	log   *slog.Logger

	mu          sync.Mutex
	epoch       uint64 // held epoch; 0 none
	rev         uint64 // entries revision applied
	unsupported bool
	changed     chan struct{} // closed and replaced when epoch changes
}

func newGatewayLease(l leaseLink, apply func(bool, []agentlink.BootEntry) error, log *slog.Logger) *gatewayLease {
	return &gatewayLease{link: l, apply: apply, log: log, changed: make(chan struct{})}
}

// Acquire implements Lease.
func (g *gatewayLease) Acquire(ctx context.Context, site, agent string, ttl time.Duration) (bool, error) {
	g.mu.Lock()
	if g.unsupported {
		g.mu.Unlock()
		return true, nil
	}
	req := agentlink.LeaseRequest{TTL: ttl, Epoch: g.epoch, KnownRevision: g.rev}
	g.mu.Unlock()
	if g.reports != nil && req.Epoch != 0 {
		req.DHCPLeases = g.reports.take(gateway.MaxDHCPLeases)
	}
	grant, err := g.link.BootLease(ctx, req)
	if errors.Is(err, agentlink.ErrUnsupported) {
		g.log.Warn("the control plane keeps no boot lease: this agent serves as the only one of its site", "site", site)
		g.mu.Lock()
		g.unsupported = true
		close(g.changed)
		g.changed = make(chan struct{})
		g.mu.Unlock()
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if !grant.Held {
		g.setEpoch(0, 0)
		return false, nil
	}
	if grant.Full || len(grant.Entries) > 0 {
		if err := g.apply(grant.Full, grant.Entries); err != nil {
			// Not applied: ask for everything again, and do not serve a table we lack.
			g.setEpoch(0, 0)
			return false, fmt.Errorf("applying the boot entries of site %s: %w", site, err)
		}
	}
	if g.rejected != nil {
		g.rejected(grant.Rejected)
	}
	switch {
	case grant.Full && g.known != nil:
		g.known(grant.DHCPLeases)
	case !grant.Full && g.reports != nil:
		g.reports.sent(req.DHCPLeases) // kept: the agent held at the epoch it named
	}
	g.setEpoch(grant.Epoch, grant.Revision)
	return true, nil
}

// Release implements leaseReleaser.
func (g *gatewayLease) Release(ctx context.Context, site, agent string) error {
	g.mu.Lock()
	skip := g.unsupported
	g.mu.Unlock()
	g.setEpoch(0, 0)
	if skip {
		return nil
	}
	_, err := g.link.BootLease(ctx, agentlink.LeaseRequest{Release: true})
	return err
}

func (g *gatewayLease) setEpoch(epoch, rev uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rev = rev
	if epoch != g.epoch {
		g.epoch = epoch
		close(g.changed)
		g.changed = make(chan struct{})
	}
}

// Epoch is the epoch held (0 none) and a channel closed when it changes.
func (g *gatewayLease) Epoch() (uint64, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch, g.changed
}

// Unsupported reports whether the control plane keeps no lease.
func (g *gatewayLease) Unsupported() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unsupported
}

// syncRecord is one node's entry as the control plane pushed it, built for this site.
type syncRecord struct {
	NodeID   string
	MACs     []string
	Entry    *netboot.Entry // nil: removed
	Instance string         // instance token (metadata)
	// UserData is the instance's operator user-data (decrypted), nil when none; when the push
	// named a digest but the value could not be opened, UserData is nil and UserDataSHA256
	// keeps the digest (the guest endpoints answer 503 rather than bcd's default).
	UserData       []byte
	UserDataSHA256 string
	userDataJWE    string // as pushed (applyPushed opens it)
}

// buildSync turns pushed entries into records with this agent's ramdisk and local-boot
// settings. Entries it cannot build (no ramdisk configured, bad MACs) are left out and named in
// the error, which does not stop the others. Pure.
func buildSync(es []agentlink.BootEntry, ramdisk RamdiskConfig, localDefault string) ([]syncRecord, error) {
	out := make([]syncRecord, 0, len(es))
	var errs []error
	for _, e := range es {
		if e.NodeID == "" {
			continue
		}
		r := syncRecord{NodeID: e.NodeID}
		if e.Kind == "removed" {
			r.MACs = canonicalMACsLoose(e.MACs)
			out = append(out, r)
			continue
		}
		macs, err := canonicalMACs(e.MACs)
		if err != nil {
			errs = append(errs, fmt.Errorf("entry of node %s: %w", e.NodeID, err))
			continue
		}
		r.MACs = macs
		var entry netboot.Entry
		switch e.Kind {
		case "ramdisk":
			entry, err = RamdiskEntry(ramdisk, e.Token)
		case "instance":
			entry, err = LocalEntry(e.Local, localDefault)
			r.Instance = e.Token
			r.UserDataSHA256, r.userDataJWE = strings.ToLower(e.UserDataSHA256), e.UserData
		case "sanboot":
			// A pinned ISO (bmc.media without virtual media): applyPushed caches it, and the
			// boot handler serves the entry only once the cache verified its sha256.
			entry = netboot.Entry{Kind: netboot.KindSanboot, ISO: netboot.Artifact{Name: e.ISOName, URL: e.ISOURL, SHA256: strings.ToLower(e.ISOSHA256)}}
			err = entry.Validate()
		default:
			err = fmt.Errorf("kind %q: known are ramdisk, instance, sanboot, removed", e.Kind)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("entry of node %s: %w", e.NodeID, err))
			continue
		}
		r.Entry = &entry
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

// canonicalMACsLoose canonicalises what parses and drops the rest (removal: a bad MAC cannot
// have an entry).
func canonicalMACsLoose(in []string) []string {
	var out []string
	for _, m := range in {
		if c, err := canonicalMACs([]string{m}); err == nil {
			out = append(out, c...)
		}
	}
	return out
}

// Sync applies records pushed by the control plane: full replaces the whole table (entries and
// instance tokens), otherwise each record replaces (or removes) its node's entries.
func (e *Entries) Sync(full bool, recs []syncRecord) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := cloneTable(e.t)
	if full {
		e.t = tableFile{Entries: map[string]bootRecord{}, Instances: map[string]instanceRecord{}}
	}
	for _, r := range recs {
		for m, br := range e.t.Entries {
			if br.NodeID == r.NodeID {
				delete(e.t.Entries, m)
			}
		}
		delete(e.t.Instances, r.NodeID)
		if r.Entry == nil {
			continue
		}
		for _, m := range r.MACs {
			e.t.Entries[m] = bootRecord{NodeID: r.NodeID, Entry: *r.Entry}
		}
		if r.Instance != "" {
			e.t.Instances[r.NodeID] = instanceRecord{Token: r.Instance, MACs: slices.Clone(r.MACs), UserDataSHA256: r.UserDataSHA256}
		}
	}
	if err := e.commitLocked(old, "applying the boot entries pushed by the control plane"); err != nil {
		return err
	}
	for _, r := range recs {
		e.setUserDataLocked(r.NodeID, r.UserData)
	}
	for node := range e.userData {
		if in, ok := e.t.Instances[node]; !ok || in.UserDataSHA256 == "" {
			delete(e.userData, node)
		}
	}
	return nil
}

// applyPushed installs pushed entries and starts caching the artifacts they boot (retried
// until cached, or until no entry boots them).
func (a *Agent) applyPushed(ctx context.Context, full bool, es []agentlink.BootEntry) error {
	recs, berr := buildSync(es, a.cfg.Ramdisk, a.cfg.LocalBoot)
	if berr != nil {
		a.log.Warn("some pushed boot entries cannot be served by this agent", "err", berr)
	}
	for i := range recs {
		r := &recs[i]
		if r.userDataJWE == "" && r.UserDataSHA256 == "" {
			continue
		}
		b, err := a.handler.openUserData(ctx, r.userDataJWE, r.UserDataSHA256)
		if err != nil || b == nil {
			// Its digest stays: the guest endpoints answer 503 for the node, not bcd's default.
			a.log.Warn("a pushed node's user-data cannot be opened: its guest endpoints answer 503 until it is prepared again", "node", r.NodeID, "err", err)
			continue
		}
		r.UserData = b
	}
	if err := a.entries.Sync(full, recs); err != nil {
		return err
	}
	a.poke()
	var arts []netboot.Artifact
	for _, r := range recs {
		if r.Entry != nil {
			for _, art := range r.Entry.Artifacts() {
				if !slices.ContainsFunc(arts, func(x netboot.Artifact) bool { return x.SHA256 == art.SHA256 }) {
					arts = append(arts, art)
				}
			}
		}
	}
	for _, art := range arts {
		// Until cached, or no entry boots it any more: the machines wait in iPXE meanwhile.
		a.keepFetching(ctx, art, "pushed boot entry", func() bool { return a.entries.Needs(art.SHA256) })
	}
	a.log.Info("boot entries pushed by the control plane applied", "full", full, "entries", len(recs))
	return nil
}

// ---------------------------------------------------------------- power polling

// pollLink is what polling needs of the agent's link.
type pollLink interface {
	PollSet(ctx context.Context, epoch uint64) ([]agentlink.PollTarget, time.Duration, error)
	ReportPower(ctx context.Context, epoch uint64, rs []agentlink.PowerReading) error
}

// pollSetLoop keeps the poller's targets and activity in step with the lease: while the agent
// holds it (at some epoch) the poller polls the control plane's poll set, fetched at each new
// epoch and again when the control plane says; otherwise the poller is paused.
func pollSetLoop(ctx context.Context, l pollLink, g *gatewayLease, p *poller, log *slog.Logger) {
	var fetched uint64
	var refresh <-chan time.Time
	var timer *time.Timer
	retry := time.Second
	for {
		epoch, changed := g.Epoch()
		if g.Unsupported() {
			// No lease, no poll set: the agent polls the nodes it ran BMC commands for.
			p.SetActive(true)
			<-ctx.Done()
			return
		}
		if epoch == 0 {
			p.SetActive(false)
			fetched = 0
		} else if epoch != fetched || refresh == nil {
			ts, every, err := l.PollSet(ctx, epoch)
			if timer != nil {
				timer.Stop()
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("fetching the poll set", "err", err)
				timer = time.NewTimer(retry)
				retry = min(2*retry, time.Minute)
			} else {
				set := make([]SetTarget, 0, len(ts))
				for _, t := range ts {
					if t.CredentialsJWE == "" {
						continue
					}
					set = append(set, SetTarget{NodeID: t.NodeID, JWE: t.CredentialsJWE, Ref: BMCRef{Driver: t.Driver, Address: t.Address,
						InsecureTLS: t.InsecureTLS, FingerprintSHA256: t.FingerprintSHA256}})
				}
				p.SetTargets(set)
				p.SetActive(true)
				fetched, retry = epoch, time.Second
				if every <= 0 {
					every = 5 * time.Minute
				}
				timer = time.NewTimer(every)
				log.Info("power polling", "epoch", epoch, "nodes", len(set))
			}
			refresh = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-changed:
		case <-refresh:
			refresh = nil
		}
	}
}

// linkReporter sends the poller's readings to the control plane in batches, under the epoch the
// agent holds; readings of a stale epoch are dropped (the new holder polls).
type linkReporter struct {
	link  pollLink
	lease *gatewayLease
	log   *slog.Logger

	mu      sync.Mutex
	pending map[string]agentlink.PowerReading // node → latest reading
	signal  chan struct{}
}

func newLinkReporter(l pollLink, g *gatewayLease, log *slog.Logger) *linkReporter {
	return &linkReporter{link: l, lease: g, log: log, pending: map[string]agentlink.PowerReading{}, signal: make(chan struct{}, 1)}
}

// maxPendingReadings bounds the readings kept while the control plane does not answer.
const maxPendingReadings = 100_000

// ReportPower implements PowerReporter: queues the reading for the next batch.
func (r *linkReporter) ReportPower(_ context.Context, pr PowerReading) error {
	rd := agentlink.PowerReading{NodeID: pr.NodeID, Power: string(pr.Power), Failures: pr.Failures, Observed: pr.At}
	if pr.Err != nil {
		rd.Error = pr.Err.Error()
	}
	r.mu.Lock()
	if _, ok := r.pending[pr.NodeID]; ok || len(r.pending) < maxPendingReadings {
		prev, had := r.pending[pr.NodeID]
		if had && prev.Power == "" && rd.Power != "" {
			// A success after a failure still in the batch: the failure count goes with it.
			rd.Failures = 0
		}
		r.pending[pr.NodeID] = rd
	}
	r.mu.Unlock()
	select {
	case r.signal <- struct{}{}:
	default:
	}
	return nil
}

// reportBatch bounds one ReportPower call.
const reportBatch = 1024

// Run sends batches until ctx ends, at most one call every `every`.
func (r *linkReporter) Run(ctx context.Context, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.signal:
		}
		for {
			epoch, _ := r.lease.Epoch()
			r.mu.Lock()
			batch := make([]agentlink.PowerReading, 0, min(len(r.pending), reportBatch))
			for id, rd := range r.pending {
				if len(batch) == reportBatch {
					break
				}
				batch = append(batch, rd)
				delete(r.pending, id)
			}
			more := len(r.pending) > 0
			r.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			if epoch == 0 {
				break // no longer the holder: dropped
			}
			err := r.link.ReportPower(ctx, epoch, batch)
			r.log.Debug("power readings reported", "readings", len(batch), "epoch", epoch, "err", err)
			switch {
			case err == nil, errors.Is(err, agentlink.ErrNotHolder), errors.Is(err, agentlink.ErrUnsupported):
			default:
				if ctx.Err() != nil {
					return
				}
				r.log.Warn("reporting power readings; will retry", "readings", len(batch), "err", err)
				r.requeue(batch)
				more = true
			}
			t := time.NewTimer(every)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if !more {
				break
			}
		}
	}
}

// requeue puts back readings that were not sent, unless a newer one arrived meanwhile.
func (r *linkReporter) requeue(batch []agentlink.PowerReading) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rd := range batch {
		if _, newer := r.pending[rd.NodeID]; !newer {
			r.pending[rd.NodeID] = rd
		}
	}
}
