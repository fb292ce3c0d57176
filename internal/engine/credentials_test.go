package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"bcd/internal/cache"
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
	e := &Engine{cfg: Config{Secrets: mapSecrets{"secret://u": "root", "secret://p": "pw", "secret://p2": "pw2"}},
		credentials: cache.New[string, string](maxCredentials), credentialsKey: []byte("k")}
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

// Credentials encrypted once to an agent are handed again to the same certificate for the same
// plaintext, and decrypt with its key; another plaintext or another agent's certificate gets a
// new encryption, which the first agent's key cannot open; a secret deleted since is refused
// even though its encryption is kept.
func TestCredentialsEncryptedOncePerAgentAndValue(t *testing.T) {
	ca, err := pki.CreateCA("test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	agent := func(id string) (Agent, any) {
		key, csr, err := pki.NewKeyAndCSR(id)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := ca.IssueSiteAgent(csr, "site-1", id, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return Agent{ID: id, Kind: "site", SiteID: "site-1", CertDER: cert}, key
	}
	a1, key1 := agent("a1")
	a2, key2 := agent("a2")
	secrets := mapSecrets{"secret://u": "root", "secret://p": "hunter2-first", "secret://p2": "hunter2-second"}
	e := &Engine{cfg: Config{Secrets: secrets}, credentials: cache.New[string, string](maxCredentials), credentialsKey: []byte("process key")}
	ctx := context.Background()
	first, second := store.BMCRef{UsernameRef: "secret://u", PasswordRef: "secret://p"}, store.BMCRef{UsernameRef: "secret://u", PasswordRef: "secret://p2"}
	get := func(a Agent, ref store.BMCRef) string {
		jwe, err := e.credentialsFor(ctx, a, ref)
		if err != nil {
			t.Fatal(err)
		}
		return jwe
	}
	opens := func(key any, jwe, want string) bool {
		plain, err := pki.DecryptAsAgent(key, jwe)
		return err == nil && strings.Contains(string(plain), want)
	}
	j1 := get(a1, first)
	if again := get(a1, first); again != j1 {
		t.Error("the same credentials to the same agent were encrypted again")
	}
	if !opens(key1, j1, "hunter2-first") {
		t.Error("a1 cannot open its credentials")
	}
	j2 := get(a1, second)
	if j2 == j1 || !opens(key1, j2, "hunter2-second") {
		t.Error("another password to a1 was not encrypted anew")
	}
	j3 := get(a2, first)
	if j3 == j1 || !opens(key2, j3, "hunter2-first") || opens(key1, j3, "hunter2-first") {
		t.Error("a2's credentials are not its own")
	}
	if e.credentials.Len() != 3 {
		t.Errorf("kept %d encryptions, want 3", e.credentials.Len())
	}
	delete(secrets, "secret://p")
	if _, err := e.credentialsFor(ctx, a1, first); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("credentials of a deleted secret: %v, want not found", err)
	}
}
