package netboot

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
)

// IgnitionUserPath serves the operator's Ignition config of a node (its deploy's user-data),
// which IgnitionPath merges (ignition.config.merge, verified by its SHA-512). Bound to the
// node's address and 404 until prepared, like the other guest endpoints; 404 too when the
// node's deploy gave no user-data.
const IgnitionUserPath = "/ignition-user.json"

// ErrUserDataUnavailable is a node whose deploy gave user-data the site agent does not hold
// (it restarted since: it keeps user-data in memory only, until the control plane pushes it
// again). The guest endpoints answer 503: serving bcd's default instead would boot the
// machine without the operator's configuration.
var ErrUserDataUnavailable = errors.New("this node's user-data is not held by the site agent now")

// UserDataLookup answers the operator user-data of a node: nil and no error when its deploy
// gave none.
type UserDataLookup interface {
	UserData(ctx context.Context, nodeID string) ([]byte, error)
}

// ignitionConfigMerges is Ignition's ignition.config (spec 3: merge and replace).
type ignitionConfigMerges struct {
	Merge []ignitionResource `json:"merge"`
}

type ignitionResource struct {
	Source       string `json:"source"`
	Verification struct {
		Hash string `json:"hash"`
	} `json:"verification"`
}

// ignitionUser reports whether user-data is an Ignition config (a JSON object: what the
// control plane accepts for an Ignition guest) rather than cloud-init's: only such is served
// at IgnitionUserPath and merged (Ignition fails the boot on a merge it cannot parse). Pure.
func ignitionUser(user []byte) bool {
	b := bytes.TrimLeft(user, " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}

// userResource is the merge of the operator's config at base+IgnitionUserPath. Pure.
func userResource(base string, user []byte) ignitionResource {
	sum := sha512.Sum512(user)
	r := ignitionResource{Source: base + IgnitionUserPath}
	r.Verification.Hash = "sha512-" + hex.EncodeToString(sum[:])
	return r
}

// nodeUserData is the user-data of the node published at r's address: (nil, true) when it has
// none. On false the answer is written: 404 (no published node), 503 (user-data set but not
// held, or unreadable: the guest retries).
func (h *Handler) nodeUserData(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	_, node, ok := h.publishedNode(r)
	if !ok {
		http.NotFound(w, r)
		return nil, false
	}
	if h.userData == nil {
		return nil, true
	}
	b, err := h.userData.UserData(r.Context(), node)
	if err != nil {
		// The error names the node, never the user-data.
		h.logQuiet(r.Context(), slog.LevelError, "user-data "+node, "the node's user-data cannot be served", "node", node, "err", err)
		http.Error(w, "this node's user-data is not available on this site agent now: try again (see the site agent's log)", http.StatusServiceUnavailable)
		return nil, false
	}
	return b, true
}
