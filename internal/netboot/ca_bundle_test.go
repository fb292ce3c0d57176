package netboot

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"bcd/internal/pki"
)

// TestBootEntryCarriesCABundle: during a rotation of the agent CA, agents trust two CAs; the
// boot entry's bcd.ca takes both (the ramdisk's parser, agent.DecodeCA, accepts 3072
// characters).
func TestBootEntryCarriesCABundle(t *testing.T) {
	var bundle []byte
	for _, name := range []string{"bcd CA", "bcd CA 2026-06-01 12:00:00Z"} {
		ca, err := pki.CreateCA(name, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, ca.CertPEM()...)
	}
	e := Entry{CA: base64.RawURLEncoding.EncodeToString(bundle), Initrd: Artifact{Name: "initrd.img"}}
	line, err := e.cmdline("")
	if err != nil {
		t.Fatalf("a two-CA bundle (%d characters): %v", len(e.CA), err)
	}
	if !strings.Contains(line, CmdlineCAKey+"="+e.CA) {
		t.Fatalf("cmdline %q lacks the bundle", line)
	}
	raw, err := base64.RawURLEncoding.DecodeString(e.CA)
	if err != nil || len(pki.BundleFingerprints(raw)) != 2 {
		t.Fatalf("the entry carries %d CAs (%v)", len(pki.BundleFingerprints(raw)), err)
	}
}
