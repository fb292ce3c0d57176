package site

import (
	"context"
	"crypto"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
	"bcd/internal/pki"
)

const siteUserData = "#cloud-config\npassword: site-UD-Secret-41\n"

// agentKey is a site agent's key and the certificate the control plane encrypts to.
func agentKey(t *testing.T) (crypto.Signer, []byte) {
	t.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, csr, err := pki.NewKeyAndCSR("site")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueSiteAgent(csr, "s1", "a1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

// The site agent keeps a node's user-data in memory only: its table file holds the digest
// alone, so an agent that restarted answers "not held" (the guest endpoints' 503) for the node
// rather than bcd's default, until a push brings the value again; removal and a push without
// user-data drop it.
func TestEntriesKeepUserDataInMemoryOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := OpenEntries(dir, "https://gw:8443", nil)
	if err != nil {
		t.Fatal(err)
	}
	const mac = "52:54:00:aa:00:01"
	if err := e.SetInstance("n1", []string{mac}, "bcdi_instance-token-0123", []byte(siteUserData)); err != nil {
		t.Fatal(err)
	}
	if err := e.SetInstance("n2", []string{"52:54:00:aa:00:02"}, "bcdi_instance-token-4567", nil); err != nil {
		t.Fatal(err)
	}
	if b, err := e.UserData(ctx, "n1"); err != nil || string(b) != siteUserData {
		t.Fatalf("n1's user-data: %q %v", b, err)
	}
	if b, err := e.UserData(ctx, "n2"); err != nil || b != nil {
		t.Fatalf("n2 (none given): %q %v", b, err)
	}
	file, err := os.ReadFile(filepath.Join(dir, EntriesFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(file), "site-UD-Secret") || !strings.Contains(string(file), userDataDigest([]byte(siteUserData))) {
		t.Fatalf("the table file holds the user-data, or not its digest:\n%s", file)
	}

	restarted, err := OpenEntries(dir, "https://gw:8443", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.UserData(ctx, "n1"); !errors.Is(err, netboot.ErrUserDataUnavailable) {
		t.Fatalf("after a restart: %v, want ErrUserDataUnavailable", err)
	}
	// A full push brings it back (decrypted by applyPushed); a push with another digest's value
	// is not served as the node's.
	entry := netboot.Entry{Kind: netboot.KindLocal, Local: netboot.LocalExit}
	if err := restarted.Sync(true, []syncRecord{{NodeID: "n1", MACs: []string{mac}, Entry: &entry, Instance: "bcdi_instance-token-89ab",
		UserData: []byte(siteUserData), UserDataSHA256: userDataDigest([]byte(siteUserData))}}); err != nil {
		t.Fatal(err)
	}
	if b, err := restarted.UserData(ctx, "n1"); err != nil || string(b) != siteUserData {
		t.Fatalf("after the push: %q %v", b, err)
	}
	if err := restarted.Sync(false, []syncRecord{{NodeID: "n1", MACs: []string{mac}, Entry: &entry, Instance: "bcdi_instance-token-cdef",
		UserData: []byte("#cloud-config\n{}\n"), UserDataSHA256: userDataDigest([]byte(siteUserData))}}); err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.UserData(ctx, "n1"); !errors.Is(err, netboot.ErrUserDataUnavailable) {
		t.Fatalf("a value that is not the digest's: %v, want ErrUserDataUnavailable", err)
	}
	if err := restarted.Sync(false, []syncRecord{{NodeID: "n1", MACs: []string{mac}, Entry: &entry, Instance: "bcdi_instance-token-cdef"}}); err != nil {
		t.Fatal(err)
	}
	if b, err := restarted.UserData(ctx, "n1"); err != nil || b != nil {
		t.Fatalf("a push without user-data: %q %v, want none", b, err)
	}
	if err := e.Remove("n1", nil); err != nil {
		t.Fatal(err)
	}
	if b, err := e.UserData(ctx, "n1"); err != nil || b != nil || len(e.userData) != 0 {
		t.Fatalf("after removal: %q %v (%d held)", b, err, len(e.userData))
	}
}

// openUserData takes only what was encrypted to this agent and matches its digest; its errors
// never quote the value. buildSync keeps a pushed entry's encrypted user-data and digest.
func TestOpenUserData(t *testing.T) {
	ctx := context.Background()
	key, cert := agentKey(t)
	_, other := agentKey(t)
	h := &handler{key: func(context.Context) (crypto.Signer, error) { return key, nil }}
	jwe, err := pki.EncryptToAgent(cert, []byte(siteUserData))
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := pki.EncryptToAgent(other, []byte(siteUserData))
	if err != nil {
		t.Fatal(err)
	}
	digest := userDataDigest([]byte(siteUserData))
	cases := []struct {
		name, jwe, digest, want string // want: "" succeeds
	}{
		{"to this agent", jwe, digest, ""},
		{"to this agent, digest in upper case", jwe, strings.ToUpper(digest), ""},
		{"to another agent", foreign, digest, "decrypting the node's user-data"},
		{"another digest", jwe, strings.Repeat("0", 64), "its SHA-256 is not the one the command names"},
		{"digest without value", "", digest, "userDataSha256 without userData"},
		{"none", "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := h.openUserData(ctx, c.jwe, c.digest)
			switch {
			case c.want == "" && err != nil:
				t.Fatal(err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want %q", err, c.want)
			case err != nil && strings.Contains(err.Error(), "site-UD-Secret"):
				t.Fatalf("the error quotes the user-data: %v", err)
			case c.want == "" && c.jwe != "" && string(b) != siteUserData:
				t.Fatalf("opened %q", b)
			}
		})
	}
	recs, err := buildSync([]agentlink.BootEntry{{NodeID: "n1", Kind: "instance", MACs: []string{"52:54:00:aa:00:01"}, Token: "bcdi_x",
		UserData: jwe, UserDataSHA256: strings.ToUpper(digest)}}, RamdiskConfig{}, "exit")
	if err != nil || len(recs) != 1 || recs[0].userDataJWE != jwe || recs[0].UserDataSHA256 != digest || recs[0].UserData != nil {
		t.Fatalf("buildSync: %+v %v", recs, err)
	}
}
