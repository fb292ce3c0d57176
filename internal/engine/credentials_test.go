package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"bcd/internal/command"
	"bcd/internal/pki"
	"bcd/internal/store"
)

type mapSecrets map[string]string

func (m mapSecrets) OpenSecret(_ context.Context, ref string) ([]byte, error) {
	v, ok := m[ref]
	if !ok {
		return nil, fmt.Errorf("secret %s: %w", ref, store.ErrNotFound)
	}
	return []byte(v), nil
}

// Every command kind that acts on the node's BMC reaches a real site agent (one with a
// certificate) with the BMC's credentials encrypted to it, and no other kind carries them: a
// kind left out of the table fails on the agent with "credentials are missing" (as bmc.bios
// and bmc.firmware did).
func TestCommandCredentialsByKind(t *testing.T) {
	ca, err := pki.CreateCA("test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, csr, err := pki.NewKeyAndCSR("a1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueSiteAgent(csr, "site-1", "a1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{cfg: Config{Secrets: mapSecrets{"secret://u": "root", "secret://p": "pw", "secret://p2": "pw2"}}}
	a := Agent{ID: "a1", Kind: "site", SiteID: "site-1", CertDER: cert}
	args := `{"bmc":{"driver":"ipmi","address":"10.0.0.1:623","usernameRef":"secret://u","passwordRef":"secret://p"},"newPasswordRef":"secret://p2"}`
	for _, k := range command.Kinds() {
		got, err := e.commandCredentials(context.Background(), a, store.Command{ID: "c1", Kind: k.Name, Args: args})
		if err != nil {
			t.Errorf("%s: %v", k.Name, err)
			continue
		}
		jwe, _ := got["credentials"].(string)
		switch {
		case k.BMCCredentials && jwe == "":
			t.Errorf("%s acts on the BMC and carries no credentials", k.Name)
		case !k.BMCCredentials && len(got) != 0:
			t.Errorf("%s carries %v", k.Name, got)
		}
	}
	for _, name := range []string{"bmc.bios", "bmc.firmware", "bmc.console"} {
		if k, _ := command.Lookup(name); !k.BMCCredentials {
			t.Errorf("%s: the kinds table says it carries no BMC credentials", name)
		}
	}
}
