package engine

// What site agents report of their boot services: the scripts their boot binding withheld,
// and their DHCP mode and binding.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"bcd/internal/gateway"
	"bcd/internal/store"
)

// maxWithheldSeen bounds the withheld episodes a server remembers having recorded;
// maxBootServices the site agents whose boot services it remembers having written.
const (
	maxWithheldSeen = 65536
	maxBootServices = 4096
)

// RecordWithheld records a site.boot_withheld event for each episode of boot-script requests a
// site agent's boot binding withheld (a MAC's script asked for from an address its DHCP did
// not see that MAC take): once per agent, MAC, address and first request, however often the
// agent's status reports it again. The event names the MAC's node when it is one of the
// agent's site's (an agent's reports never reach another site's nodes); only callers that see
// every tenant see it.
func (e *Engine) RecordWithheld(ctx context.Context, a Agent, ws []gateway.WithheldBoot) error {
	var fresh []gateway.WithheldBoot
	var keys []string
	for _, w := range ws {
		k := a.ID + "|" + w.MAC + "|" + w.Remote.String() + "|" + strconv.FormatInt(w.First.UnixMilli(), 10)
		if _, seen := e.withheldSeen.Get(k); !seen {
			fresh, keys = append(fresh, w), append(keys, k)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		for _, w := range fresh {
			node, err := tx.SiteMACOwner(ctx, a.SiteID, w.MAC)
			if err != nil {
				return err
			}
			data, _ := json.Marshal(map[string]any{"site": a.SiteID, "agent": a.ID, "mac": w.MAC, "remote": w.Remote.String(),
				"count": w.Count, "firstUnixMs": w.First.UnixMilli(), "lastUnixMs": w.Last.UnixMilli()})
			if err := tx.AppendEvent(ctx, store.Event{NodeID: node, Actor: "site:" + a.ID, Kind: "site.boot_withheld", Data: string(data),
				Reason: fmt.Sprintf("boot script of %s withheld from %s: not the address the site's DHCP saw that MAC take", w.MAC, w.Remote)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("recording withheld boot scripts of agent %s: %w", a.ID, err)
	}
	for _, k := range keys {
		e.withheldSeen.Put(k, true)
	}
	return nil
}

// RecordBootServices keeps what site agent a reports of its boot services (its DHCP mode and
// boot binding, for bcd doctor), written only when it differs from what this server last
// wrote for the agent.
func (e *Engine) RecordBootServices(ctx context.Context, a Agent, dhcpMode, binding string) error {
	dhcpMode, binding = known(dhcpMode, "off", "proxy", "full", "observe"), known(binding, "lease", "none")
	return e.recordChanged(ctx, a.ID, dhcpMode+"|"+binding, func(tx *store.Tx) error { return tx.SetAgentBootServices(ctx, a.ID, dhcpMode, binding) })
}

// recordChanged runs write unless v is what this server last wrote under key (bootServices),
// and remembers v once written: agents repeat their status, which rarely changes.
func (e *Engine) recordChanged(ctx context.Context, key, v string, write func(*store.Tx) error) error {
	if last, ok := e.bootServices.Get(key); ok && last == v {
		return nil
	}
	if err := e.st.Write(ctx, write); err != nil {
		return err
	}
	e.bootServices.Put(key, v)
	return nil
}

// RecordArtifactCache keeps what site agent a reports of its artifact cache (facts: the
// counts, each a non-negative integer; a fact missing or malformed counts 0), writing only
// when it changed. An agent that reports no cache facts (an older agent) is left alone.
func (e *Engine) RecordArtifactCache(ctx context.Context, a Agent, facts map[string]string) error {
	if _, ok := facts["cacheBytes"]; !ok {
		return nil
	}
	n := func(k string) int64 {
		v, err := strconv.ParseInt(facts[k], 10, 64)
		if err != nil || v < 0 {
			return 0
		}
		return v
	}
	c := store.ArtifactCache{Artifacts: n("cacheArtifacts"), Bytes: n("cacheBytes"), Bound: n("cacheBoundBytes"),
		Evictions: n("cacheEvictions"), EvictedBytes: n("cacheEvictedBytes")}
	return e.recordChanged(ctx, "cache|"+a.ID, fmt.Sprint(c), func(tx *store.Tx) error { return tx.SetAgentArtifactCache(ctx, a.ID, c) })
}

// known is v when it is one of the accepted values, "" when empty, else "unknown" (what an agent
// reports is kept only in the words this server knows).
func known(v string, accepted ...string) string {
	if v == "" || slices.Contains(accepted, v) {
		return v
	}
	return "unknown"
}
