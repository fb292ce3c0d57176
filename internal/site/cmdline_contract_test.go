package site

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/agent"
)

// Contract: the kernel line a site agent's ramdisk entry produces is what the ramdisk's own
// parser accepts, CA included, and the ramdisk gets back exactly the gateway, token and CA.
func TestRamdiskEntryCmdlineContract(t *testing.T) {
	ca, err := pki.CreateCA("contract CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	token, _, _ := pki.NewToken(pki.DiscoveryTokenPrefix)
	cfg := RamdiskConfig{
		Kernel:     netboot.Artifact{Name: "vmlinuz", URL: "http://127.0.0.1:1/vmlinuz", SHA256: strings.Repeat("a", 64)},
		Initrd:     netboot.Artifact{Name: "initrd.img", URL: "http://127.0.0.1:1/initrd.img", SHA256: strings.Repeat("b", 64)},
		GatewayURL: "https://10.0.0.1:7443", CAPEM: ca.CertPEM(),
	}
	e, err := RamdiskEntry(cfg, token)
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("52:54:00:00:00:01")
	script, err := netboot.Script(&e, netboot.Request{MAC: mac, Arch: "x86_64", Platform: "pcbios"}, netboot.ScriptParams{BaseURL: "http://10.0.0.2:8080", RetryAfter: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var kernelLine string
	for _, l := range strings.Split(script, "\n") {
		if strings.HasPrefix(l, "kernel ") {
			kernelLine = l
		}
	}
	f := strings.Fields(kernelLine)
	if len(f) < 3 {
		t.Fatalf("no kernel line in:\n%s", script)
	}
	cmdline := strings.Join(f[2:], " ") // after "kernel URL"
	p, err := agent.ParseCmdline(cmdline)
	if err != nil {
		t.Fatalf("the ramdisk refuses the site's kernel line: %v\n%s", err, kernelLine)
	}
	if p.GatewayURL != cfg.GatewayURL || p.Token != token || !bytes.Equal(p.CAPEM, ca.CertPEM()) {
		t.Fatalf("ramdisk parsed gateway %q, token match %v, CA match %v", p.GatewayURL, p.Token == token, bytes.Equal(p.CAPEM, ca.CertPEM()))
	}
}
