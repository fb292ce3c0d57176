package netboot_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/dhcp"
	"bcd/internal/netboot"
	"bcd/internal/tftp"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

type noEntries struct{}

func (noEntries) Entry(context.Context, net.HardwareAddr) (netboot.Entry, bool) {
	return netboot.Entry{}, false
}

type nopDiscovery struct{}

func (nopDiscovery) RecordDiscovery(context.Context, netboot.Discovery) error { return nil }

type noArtifacts struct{}

func (noArtifacts) Has(string) bool { return false }
func (noArtifacts) ServeArtifact(w http.ResponseWriter, r *http.Request, _ string) {
	http.NotFound(w, r)
}

type leases struct{}

func (leases) LoadLeases(context.Context) ([]dhcp.Lease, error) { return nil, nil }
func (leases) SaveLeases(context.Context, []dhcp.Lease) error   { return nil }

// site is a site's boot services over one directory laid out like Debian's /usr/lib/ipxe.
type site struct {
	dir   string
	files map[string][]byte
	route *tftp.DirRoute
	http  *httptest.Server
}

func newSite(t *testing.T, withARM64 bool) *site {
	t.Helper()
	s := &site{dir: t.TempDir(), files: map[string][]byte{
		dhcp.BinaryBIOS:    []byte("undionly kpxe image"),
		dhcp.BinaryEFI:     []byte("ipxe efi image"),
		dhcp.BinarySNPOnly: []byte("snponly efi image"),
	}}
	if withARM64 {
		s.files[dhcp.BinaryARM64] = []byte("arm64 efi image")
	}
	for n, b := range s.files {
		if err := os.WriteFile(filepath.Join(s.dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	route, err := tftp.NewDirRoute(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { route.Close() })
	s.route = route
	// The HTTP handler needs its base URL before it exists: bind the listener first.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	baseURL := "http://" + ln.Addr().String()
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: baseURL, Entries: noEntries{}, Discovery: nopDiscovery{}, Artifacts: noArtifacts{}, BinaryDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	s.http = httptest.NewUnstartedServer(h)
	s.http.Listener.Close()
	s.http.Listener = ln
	s.http.Start()
	t.Cleanup(s.http.Close)
	return s
}

// fetch checks that what DHCP advertised is served: a URL by the HTTP handler, a bare name by
// the TFTP route chain. want is the expected body (nil: any iPXE script).
func (s *site) fetch(t *testing.T, file string, want []byte) {
	t.Helper()
	if strings.HasPrefix(file, "http://") {
		if !strings.HasPrefix(file, s.http.URL+"/") {
			t.Fatalf("advertised URL %q is not on the site %s", file, s.http.URL)
		}
		// iPXE expands these settings before fetching.
		u := strings.NewReplacer("${net0/mac}", "52:54:00:00:00:0a", "${uuid}", "4c4c4544-0042-3510-8057-b4c04f4b4d32", "${buildarch}", "x86_64").Replace(file)
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", u, resp.StatusCode, body)
		}
		if want == nil && !bytes.HasPrefix(body, []byte("#!ipxe\n")) || want != nil && !bytes.Equal(body, want) {
			t.Fatalf("GET %s: body %q", u, body)
		}
		return
	}
	var buf bytes.Buffer
	if err := tftp.Dispatch(context.Background(), []tftp.Route{s.route}, file, &buf); err != nil {
		t.Fatalf("TFTP %q: %v", file, err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("TFTP %q: body %q", file, buf.Bytes())
	}
}

// TestContractEveryAdvertisedBootFileIsServed walks every (architecture, user class, vendor
// class, policy) the DHCP side decides on and fetches the result from the TFTP routes or the
// HTTP handler.
func TestContractEveryAdvertisedBootFileIsServed(t *testing.T) {
	for _, arm := range []bool{false, true} {
		s := newSite(t, arm)
		n := 0
		for _, efi := range []string{dhcp.BinaryEFI, dhcp.BinarySNPOnly} {
			p := dhcp.Policy{EFIBinary: efi, HaveARM64: arm}
			for a := range iana.Arch(64) {
				for _, vc := range []string{"PXEClient:Arch:00000", "HTTPClient:Arch:00016"} {
					c, err := dhcp.BootFile([]iana.Arch{a}, nil, vc, p)
					if err != nil {
						continue
					}
					n++
					if _, ok := s.files[c.Binary]; !ok {
						t.Fatalf("DHCP chose %q, which the site does not have (arm64 present: %v)", c.Binary, arm)
					}
				}
			}
		}
		if n == 0 {
			t.Fatal("no boot choice enumerated")
		}
	}
}

// TestContractPackets runs real DISCOVER/REQUEST packets of every firmware class through the
// DHCP chains of both modes and fetches whatever they advertise.
func TestContractPackets(t *testing.T) {
	type class struct {
		name   string
		arch   iana.Arch
		vendor string
		ipxe   bool
	}
	classes := []class{
		{"bios", iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001", false},
		{"efi x64 (7)", iana.EFI_BC, "PXEClient:Arch:00007:UNDI:003016", false},
		{"efi x64 (9)", iana.EFI_X86_64, "PXEClient:Arch:00009:UNDI:003016", false},
		{"efi arm64", iana.EFI_ARM64, "PXEClient:Arch:00011:UNDI:003000", false},
		{"http x64", iana.EFI_X86_64_HTTP, "HTTPClient:Arch:00016:UNDI:003001", false},
		{"http arm64", iana.EFI_ARM64_HTTP, "HTTPClient:Arch:00019:UNDI:003001", false},
		{"ipxe efi", iana.EFI_BC, "PXEClient:Arch:00007:UNDI:003010", true},
		{"ipxe bios", iana.INTEL_X86PC, "PXEClient:Arch:00000:UNDI:002001", true},
	}
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0a}
	ctx := context.Background()
	for _, arm := range []bool{false, true} {
		s := newSite(t, arm)
		for _, mode := range []dhcp.Mode{dhcp.ModeProxy, dhcp.ModeFull} {
			for _, efi := range []string{dhcp.BinaryEFI, dhcp.BinarySNPOnly} {
				cfg := dhcp.Config{Mode: mode, Interface: "prov0", ServerIP: netip.MustParseAddr("10.0.0.1"), HTTPBaseURL: s.http.URL, Boot: dhcp.Policy{EFIBinary: efi, HaveARM64: arm}}
				if mode == dhcp.ModeFull {
					cfg.Pools = []dhcp.Pool{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.200")}}
					cfg.Leases = leases{}
				}
				srv, err := dhcp.New(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range classes {
					mods := []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptClientArch(c.arch)), dhcpv4.WithOption(dhcpv4.OptClassIdentifier(c.vendor))}
					if c.ipxe {
						mods = append(mods, dhcpv4.WithUserClass("iPXE", false))
					}
					d, err := dhcpv4.NewDiscovery(mac, mods...)
					if err != nil {
						t.Fatal(err)
					}
					offer := srv.Handle(ctx, dhcp.ListenerDHCP, d)
					file := ""
					if offer != nil {
						file = offer.BootFileName
						if file == "" {
							file = offer.BootFileNameOption()
						}
					}
					arm64Class := c.arch == iana.EFI_ARM64 || c.arch == iana.EFI_ARM64_HTTP
					if file == "" {
						if arm64Class && !arm && !c.ipxe {
							continue // nothing advertised: correct without the binary
						}
						t.Fatalf("%s/%s/%s arm64=%v: nothing advertised", mode, efi, c.name, arm)
					}
					var want []byte
					if !c.ipxe {
						name := file[strings.LastIndex(file, "/")+1:]
						want = s.files[name]
						if want == nil {
							t.Fatalf("%s/%s/%s: advertised %q, not among the site's files", mode, efi, c.name, file)
						}
						if name == dhcp.BinaryEFI || name == dhcp.BinarySNPOnly {
							if name != efi {
								t.Fatalf("%s: policy %s but advertised %s", c.name, efi, name)
							}
						}
					}
					s.fetch(t, file, want)
				}
			}
		}
	}
}
