package redfish

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// SystemsCollection is where a Redfish service lists its ComputerSystems.
const SystemsCollection = "/redfish/v1/Systems"

// systemIDRe is the ComputerSystem id an address may name: URL-unreserved characters only, so
// the path is the same raw and decoded, and ".." or an empty segment cannot be spelled.
var systemIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$`)

// SystemPathRule says, in error messages, what path a Redfish address may carry.
const SystemPathRule = "the only path accepted is " + SystemsCollection + "/ID, naming the ComputerSystem of a BMC that serves several " +
	"(https://HOST[:PORT]" + SystemsCollection + "/ID; ID of letters, digits, '.', '_', '~' and '-')"

// SystemPath reads the ComputerSystem a BMC address names: "" when the address has no path (or
// the service root /redfish/v1), so the driver chooses; else the path /redfish/v1/Systems/ID
// without a trailing slash. Any other path, user information, a query or a fragment is an error
// that does not quote the address (it may be a secret pasted into the wrong field). Pure.
func SystemPath(address string) (string, error) {
	a := strings.TrimSpace(address)
	if !strings.Contains(a, "://") {
		a = "https://" + a
	}
	if strings.Contains(a, "@") { // user information: the path quoted below could hold a piece of the password
		return "", fmt.Errorf("BMC address holds credentials ('@'): %s", SystemPathRule)
	}
	u, err := url.Parse(a)
	if err != nil {
		return "", fmt.Errorf("BMC address is not a URL: %s", SystemPathRule)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "", fmt.Errorf("BMC address has a query or fragment: %s", SystemPathRule)
	}
	p := strings.TrimSuffix(u.Path, "/")
	switch p {
	case "", "/redfish/v1":
		return "", nil
	}
	id, ok := strings.CutPrefix(p, SystemsCollection+"/")
	if !ok || !systemIDRe.MatchString(id) || u.RawPath != "" {
		return "", fmt.Errorf("BMC address path %q: %s", truncatePath(u.Path), SystemPathRule)
	}
	return p, nil
}

func truncatePath(p string) string {
	if len(p) > 80 {
		return p[:80] + "…"
	}
	return p
}

// namedSystem checks that the system the address names is one the BMC lists (members, the
// Systems collection) and returns the BMC's own spelling of it. Never a guess: a system the BMC
// does not list is an error naming those it does.
func namedSystem(named string, members []string) (string, error) {
	for _, m := range members {
		if sameURI(m, named) {
			return m, nil
		}
	}
	listed := "none"
	if len(members) > 0 {
		listed = strings.Join(members, ", ")
	}
	return "", fmt.Errorf("the BMC address names ComputerSystem %s, which this BMC does not list (it lists: %s): "+
		"correct the node's BMC address to one of those", named, listed)
}

// chooseSystem is the ComputerSystem the driver acts on among those the BMC lists: the one the
// address names, else the heuristics of pickSystem.
func (c *Client) chooseSystem(ctx context.Context, ids []string) (string, error) {
	if c.named != "" {
		return namedSystem(c.named, ids)
	}
	return c.pickSystem(ctx, ids)
}
