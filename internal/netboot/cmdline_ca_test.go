package netboot

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"bcd/internal/pki"
)

// TestBootEntryCABundleFitsTheCommandLine: a ramdisk entry as a site builds it during a
// rotation (two CAs, a gateway URL, a discovery token and console arguments) fits the kernel
// command line; one whose extra arguments leave no room for the bundle is refused when built,
// saying that bcd.ca takes the room and how much (never with the CA cut short).
func TestBootEntryCABundleFitsTheCommandLine(t *testing.T) {
	var bundle []byte
	for _, name := range []string{"bcd CA", "bcd CA 2026-06-01 12:00:00Z"} {
		ca, err := pki.CreateCA(name, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, ca.CertPEM()...)
	}
	token, _, err := pki.NewToken(pki.DiscoveryTokenPrefix)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(extra ...string) Entry {
		return Entry{Kind: KindRamdisk,
			Kernel:     Artifact{Name: "vmlinuz", URL: "https://images.example.com/bcd/vmlinuz", SHA256: strings.Repeat("a", 64)},
			Initrd:     Artifact{Name: "initrd.img", URL: "https://images.example.com/bcd/initrd.img", SHA256: strings.Repeat("b", 64)},
			GatewayURL: "https://bcd-gateway.dc1.example.internal:8443", Token: token,
			CA: base64.RawURLEncoding.EncodeToString(bundle), ExtraArgs: extra}
	}
	realistic := entry("console=tty0", "console=ttyS0,115200n8", "panic=10", "net.ifnames=0", "biosdevname=0")
	if err := realistic.Validate(); err != nil {
		t.Fatalf("a realistic ramdisk entry with a two-CA bundle: %v", err)
	}
	line, _ := realistic.cmdline("")
	t.Logf("a realistic entry during a rotation: %d of %d bytes, bcd.ca %d", len(line), maxCmdlineLen, len(realistic.CA))

	var long []string
	for i := range 6 {
		long = append(long, fmt.Sprintf("x%d=%s", i, strings.Repeat("v", 60)))
	}
	tooLong := entry(long...)
	err = tooLong.Validate()
	if err == nil {
		t.Fatal("an entry over the kernel command line's length was accepted")
	}
	for _, want := range []string{"kernel command line", "bcd.ca", fmt.Sprint(len(CmdlineCAKey) + 1 + len(tooLong.CA)), "2 CA certificates"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), tooLong.CA[:40]) {
		t.Errorf("error %q echoes the token or the CA", err)
	}
}
