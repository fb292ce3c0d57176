package netboot

import (
	"net"
	"strings"
	"testing"
	"time"
)

const (
	shaK = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
	shaI = "2222222222222222222222222222222222222222222222222222222222222222"
	shaS = "3333333333333333333333333333333333333333333333333333333333333333"
	tok  = "tok_AbCdEfGhIjKlMnOp0123456789"
)

func ramdiskEntry() Entry {
	return Entry{
		Kind:       KindRamdisk,
		Kernel:     Artifact{Name: "vmlinuz", URL: "http://origin.example/k/vmlinuz", SHA256: shaK},
		Initrd:     Artifact{Name: "initrd.img", URL: "http://origin.example/k/initrd.img", SHA256: shaI},
		GatewayURL: "https://gw.example:8443/agent",
		Token:      tok,
		ExtraArgs:  []string{"console=ttyS0,115200n8", "quiet"},
	}
}

func testReq() Request {
	return Request{MAC: net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}, UUID: "4c4c4544-0042-3510-8057-b4c04f4b4d32", Arch: "x86_64"}
}

func testParams() ScriptParams {
	return ScriptParams{BaseURL: "http://10.0.0.1:8080", RetryAfter: 10 * time.Second}
}

func TestEntryValidate(t *testing.T) {
	mod := func(f func(*Entry)) Entry { e := ramdiskEntry(); f(&e); return e }
	iso := Artifact{Name: "boot.iso", URL: "http://origin.example/x.iso", SHA256: shaS}
	tests := []struct {
		name  string
		entry Entry
		ok    bool
	}{
		{"ramdisk", ramdiskEntry(), true},
		{"instance without token", mod(func(e *Entry) { e.Kind = KindInstance; e.Token = ""; e.GatewayURL = "" }), true},
		{"ramdisk without token", mod(func(e *Entry) { e.Token = "" }), false},
		{"ramdisk without gateway", mod(func(e *Entry) { e.GatewayURL = "" }), false},
		{"same names", mod(func(e *Entry) { e.Initrd.Name = "vmlinuz" }), false},
		{"bad sha", mod(func(e *Entry) { e.Kernel.SHA256 = strings.ToUpper(shaK) }), false},
		{"short sha", mod(func(e *Entry) { e.Kernel.SHA256 = shaK[:63] }), false},
		{"ftp url", mod(func(e *Entry) { e.Kernel.URL = "ftp://origin.example/k" }), false},
		{"file url", mod(func(e *Entry) { e.Kernel.URL = "file:///etc/passwd" }), false},
		{"userinfo url", mod(func(e *Entry) { e.Kernel.URL = "http://u:p@origin.example/k" }), false},
		{"name with slash", mod(func(e *Entry) { e.Initrd.Name = "a/b" }), false},
		{"name dotfile", mod(func(e *Entry) { e.Initrd.Name = ".x" }), false},
		{"name too long", mod(func(e *Entry) { e.Initrd.Name = strings.Repeat("a", 65) }), false},
		{"reserved extra initrd", mod(func(e *Entry) { e.ExtraArgs = []string{"initrd=evil"} }), false},
		{"reserved extra token", mod(func(e *Entry) { e.ExtraArgs = []string{"bcd.token=x"} }), false},
		{"reserved extra site URL", mod(func(e *Entry) { e.ExtraArgs = []string{"bcd_site=http://evil:80"} }), false},
		{"too many extras", mod(func(e *Entry) {
			e.ExtraArgs = make([]string, 33)
			for i := range e.ExtraArgs {
				e.ExtraArgs[i] = "a"
			}
		}), false},
		{"cmdline too long", mod(func(e *Entry) {
			e.ExtraArgs = make([]string, 32)
			for i := range e.ExtraArgs {
				e.ExtraArgs[i] = "k=" + strings.Repeat("v", 100)
			}
		}), false},
		{"ramdisk with iso", mod(func(e *Entry) { e.ISO = iso }), false},
		{"ramdisk with local", mod(func(e *Entry) { e.Local = LocalExit }), false},
		{"local exit", Entry{Kind: KindLocal, Local: LocalExit}, true},
		{"local sanboot", Entry{Kind: KindLocal, Local: LocalSanbootDrive}, true},
		{"local unknown", Entry{Kind: KindLocal, Local: "reboot"}, false},
		{"local empty", Entry{Kind: KindLocal}, false},
		{"local with token", Entry{Kind: KindLocal, Local: LocalExit, Token: tok}, false},
		{"sanboot", Entry{Kind: KindSanboot, ISO: iso}, true},
		{"sanboot no iso", Entry{Kind: KindSanboot}, false},
		{"sanboot with kernel", Entry{Kind: KindSanboot, ISO: iso, Kernel: iso}, false},
		{"unknown kind", Entry{Kind: "pxe"}, false},
		{"empty kind", Entry{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.entry.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && strings.Contains(err.Error(), tok) {
				t.Fatalf("error leaks the token: %v", err)
			}
		})
	}
}

func TestScriptGolden(t *testing.T) {
	ramdisk := ramdiskEntry()
	tests := []struct {
		name  string
		entry *Entry
		want  string
	}{
		{"ramdisk", &ramdisk, `#!ipxe
echo bcd: ramdisk boot of 52:54:00:12:34:56
kernel --name vmlinuz http://10.0.0.1:8080/artifacts/` + shaK + `/vmlinuz initrd=initrd.img bcd.gateway=https://gw.example:8443/agent bcd.token=` + tok + ` libata.ignore_hpa=1 bcd_site=http://10.0.0.1:8080 console=ttyS0,115200n8 quiet || goto failed
initrd --name initrd.img http://10.0.0.1:8080/artifacts/` + shaI + `/initrd.img || goto failed
boot || goto failed
:failed
echo bcd: boot failed, retrying in 10 s
sleep 10
chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64
`},
		{"local exit", &Entry{Kind: KindLocal, Local: LocalExit}, `#!ipxe
echo bcd: local boot of 52:54:00:12:34:56
exit
:failed
echo bcd: boot failed, retrying in 10 s
sleep 10
chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64
`},
		{"local sanboot", &Entry{Kind: KindLocal, Local: LocalSanbootDrive}, `#!ipxe
echo bcd: local boot of 52:54:00:12:34:56
sanboot --no-describe --drive 0x80 || goto failed
:failed
echo bcd: boot failed, retrying in 10 s
sleep 10
chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64
`},
		{"sanboot iso", &Entry{Kind: KindSanboot, ISO: Artifact{Name: "rescue.iso", URL: "http://o.example/r.iso", SHA256: shaS}}, `#!ipxe
echo bcd: sanboot boot of 52:54:00:12:34:56
sanboot --no-describe http://10.0.0.1:8080/artifacts/` + shaS + `/rescue.iso || goto failed
:failed
echo bcd: boot failed, retrying in 10 s
sleep 10
chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64
`},
		{"no entry", nil, `#!ipxe
echo bcd: no boot entry for this machine (52:54:00:12:34:56), retrying in 10 s
sleep 10
chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Script(tt.entry, testReq(), testParams())
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("script:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestScriptInitrdNameMatches: the kernel line names the initrd exactly as the initrd line does
// (LAB-NOTES gotcha 2), whatever the names are.
func TestScriptInitrdNameMatches(t *testing.T) {
	for _, name := range []string{"initrd.img", "initramfs-6.1.0-amd64", "a", "bcd_ramdisk.cpio.gz"} {
		e := ramdiskEntry()
		e.Initrd.Name = name
		s, err := Script(&e, testReq(), testParams())
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(s, "\n")
		if !strings.Contains(lines[2], " initrd="+name+" ") || !strings.HasPrefix(lines[3], "initrd --name "+name+" ") || !strings.Contains(lines[3], "/"+name+" ") {
			t.Fatalf("initrd name %q not consistent:\n%s", name, s)
		}
	}
}

// TestScriptInjection: values that could add iPXE commands, expand settings or split kernel
// arguments are refused, and the script is never produced.
func TestScriptInjection(t *testing.T) {
	evil := []string{"\n", "\r", ";", "||", "&&", "${", "$", " ", "\t", "\"", "'", "`", "\\", "#", "\x00", "é", "{", "}", "<", ">"}
	fields := []struct {
		name string
		set  func(e *Entry, v string)
	}{
		{"token", func(e *Entry, v string) { e.Token = tok + v + "x" }},
		{"gateway", func(e *Entry, v string) { e.GatewayURL = "https://gw.example/a" + v + "b" }},
		{"kernel url", func(e *Entry, v string) { e.Kernel.URL = "http://o.example/k" + v + "x" }},
		{"initrd name", func(e *Entry, v string) { e.Initrd.Name = "init" + v + "rd" }},
		{"extra arg value", func(e *Entry, v string) { e.ExtraArgs = []string{"console=tty" + v + "S0"} }},
		{"extra arg key", func(e *Entry, v string) { e.ExtraArgs = []string{"con" + v + "sole=1"} }},
	}
	for _, f := range fields {
		for _, v := range evil {
			e := ramdiskEntry()
			f.set(&e, v)
			if s, err := Script(&e, testReq(), testParams()); err == nil {
				t.Errorf("%s with %q accepted:\n%s", f.name, v, s)
			} else if strings.Contains(err.Error(), tok) {
				t.Errorf("%s with %q: error leaks token: %v", f.name, v, err)
			}
		}
	}
	for _, v := range evil {
		p := testParams()
		p.BaseURL = "http://10.0.0.1" + v + "x"
		if _, err := Script(nil, testReq(), p); err == nil {
			t.Errorf("base URL with %q accepted", v)
		}
	}
	// A hand-built request cannot smuggle anything either.
	r := testReq()
	r.Arch = "x86_64\nshell"
	if _, err := Script(nil, r, testParams()); err == nil {
		t.Error("request with bad arch accepted")
	}
	r = testReq()
	r.UUID = "4C4C4544-0042-3510-8057-B4C04F4B4D32"
	if _, err := Script(nil, r, testParams()); err == nil {
		t.Error("non-canonical uuid accepted")
	}
}

func TestParseQuery(t *testing.T) {
	tests := []struct {
		raw  string
		want *Request
	}{
		{"mac=52:54:00:12:34:56&uuid=4C4C4544-0042-3510-8057-B4C04F4B4D32&arch=x86_64", &Request{MAC: testReq().MAC, UUID: testReq().UUID, Arch: "x86_64"}},
		{"mac=52:54:00:12:34:56&uuid=&arch=arm64&platform=efi", &Request{MAC: testReq().MAC, Arch: "arm64", Platform: "efi"}},
		{"mac=52:54:00:12:34:56&buildarch=i386&platform=pcbios", &Request{MAC: testReq().MAC, Arch: "i386", Platform: "pcbios"}},
		{"mac=52:54:00:12:34:56&arch=x86_64&buildarch=x86_64", &Request{MAC: testReq().MAC, Arch: "x86_64"}},
		{"mac=52:54:00:12:34:56&arch=x86_64&buildarch=arm64", nil},
		{"mac=52:54:00:12:34:56", nil},
		{"arch=x86_64", nil},
		{"mac=52-54-00-12-34-56&arch=x86_64", nil},
		{"mac=5254.0012.3456&arch=x86_64", nil},
		{"mac=52:54:00:12:34:5g&arch=x86_64", nil},
		{"mac=52:54:00:12:34:56:78&arch=x86_64", nil},
		{"mac=52:54:00:12:34:56%0A&arch=x86_64", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64%0Ashell", nil},
		{"mac=52:54:00:12:34:56&arch=${buildarch}", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64&uuid=${uuid}", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64&uuid=4c4c4544004235108057b4c04f4b4d32", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64&platform=bios", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64&evil=1", nil},
		{"mac=52:54:00:12:34:56&mac=52:54:00:12:34:57&arch=x86_64", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64&%zz", nil},
		{"mac=52:54:00:12:34:56&arch=x86_64&platform=" + strings.Repeat("e", 65), nil},
		{strings.Repeat("a", 513), nil},
	}
	for _, tt := range tests {
		t.Run(tt.raw[:min(len(tt.raw), 60)], func(t *testing.T) {
			got, err := ParseQuery(tt.raw)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("accepted: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.MAC.String() != tt.want.MAC.String() || got.UUID != tt.want.UUID || got.Arch != tt.want.Arch || got.Platform != tt.want.Platform {
				t.Fatalf("got %+v, want %+v", got, *tt.want)
			}
		})
	}
}

func FuzzParseQuery(f *testing.F) {
	f.Add("mac=52:54:00:12:34:56&uuid=4C4C4544-0042-3510-8057-B4C04F4B4D32&arch=x86_64")
	f.Add("mac=52:54:00:12:34:56&buildarch=arm64&platform=efi")
	f.Add("mac=52:54:00:12:34:56&arch=x86_64%0Achain%20http://evil")
	f.Add("mac=${net0/mac}&uuid=${uuid}&arch=${buildarch}")
	f.Add("mac=aa:bb:cc:dd:ee:ff&arch=i386&uuid=&platform=pcbios")
	f.Add("%")
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := ParseQuery(raw)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("error message has a line break: %q", err)
			}
			return
		}
		if err := r.check(); err != nil {
			t.Fatalf("accepted request fails its own check: %v", err)
		}
		q := r.Query()
		for i := 0; i < len(q); i++ {
			if !urlSafe(q[i]) && q[i] != '&' {
				t.Fatalf("rendered query has unsafe byte %q: %q", q[i], q)
			}
		}
		back, err := ParseQuery(q)
		if err != nil || back.MAC.String() != r.MAC.String() || back.UUID != r.UUID || back.Arch != r.Arch || back.Platform != r.Platform {
			t.Fatalf("round trip of %q: %+v, %v", q, back, err)
		}
		s, err := Script(nil, r, testParams())
		if err != nil {
			t.Fatalf("wait script for accepted request: %v", err)
		}
		if n := strings.Count(s, "\n"); n != 4 {
			t.Fatalf("wait script has %d lines:\n%s", n, s)
		}
	})
}
