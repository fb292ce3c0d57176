package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"bcd/internal/gateway"
	"bcd/internal/store"
)

// maxWithheldSeen bounds the withheld episodes a server remembers having recorded.
const maxWithheldSeen = 65536

// RecordWithheld records a site.boot_withheld event for each episode of boot-script requests a
// site agent's boot binding withheld (a MAC's script asked for from an address its DHCP did
// not see that MAC take): once per agent, MAC, address and first request, however often the
// agent's status reports it again. The event names the MAC's node when it has one; only
// callers that see every tenant see it.
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
			node, err := tx.MACOwner(ctx, w.MAC)
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
