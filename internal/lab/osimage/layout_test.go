package osimage

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"bcd/internal/ramdisk/kexec"
)

func TestMBRRoundTrip(t *testing.T) {
	code := bytes.Repeat([]byte{0x90}, 440)
	tests := []struct {
		name    string
		code    []byte
		p       Partition
		wantErr string
	}{
		{"ESP, active", code, Partition{Active: true, Type: TypeESP, StartLBA: 2048, Sectors: 65536}, ""},
		{"FAT32 LBA, inactive", code[:100], Partition{Type: TypeFAT32LBA, StartLBA: 63, Sectors: 1}, ""},
		{"boot code too long", make([]byte, 441), Partition{Type: TypeESP, StartLBA: 2048, Sectors: 1}, "at most 440"},
		{"no start", code, Partition{Type: TypeESP, Sectors: 1}, "needs a start"},
		{"no size", code, Partition{Type: TypeESP, StartLBA: 2048}, "needs a start"},
		{"empty type", code, Partition{StartLBA: 2048, Sectors: 1}, "data partition type"},
		{"extended", code, Partition{Type: 0x05, StartLBA: 2048, Sectors: 1}, "data partition type"},
		{"GPT protective", code, Partition{Type: 0xEE, StartLBA: 1, Sectors: 1}, "data partition type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := MBR(tt.code, tt.p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(s) != SectorSize || !bytes.Equal(s[:len(tt.code)], tt.code) {
				t.Fatalf("sector of %d bytes, boot code not at its start", len(s))
			}
			if !bytes.Equal(s[440:444], []byte{0x51, 0x00, 0xcd, 0xb0}) {
				t.Errorf("disk signature bytes % x", s[440:444])
			}
			got, err := ParseMBR(s)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, []Partition{tt.p}) {
				t.Errorf("parsed %+v, want %+v", got, tt.p)
			}
		})
	}
	if _, err := ParseMBR(make([]byte, SectorSize)); err == nil {
		t.Error("a zero sector parsed as an MBR")
	}
}

// The configuration both syslinux builds read is also what the ramdisk's kexec parses.
func TestSyslinuxConfigParsesForKexec(t *testing.T) {
	for _, extra := range []string{"", "  bcd.metadata=http://10.0.0.1:8080/metadata "} {
		entries, def, err := kexec.ParseExtlinux(SyslinuxConfig(extra))
		if err != nil {
			t.Fatal(err)
		}
		e := entries[def]
		want := BaseCmdline
		if extra != "" {
			want += " bcd.metadata=http://10.0.0.1:8080/metadata"
		}
		if e.Kernel != "/"+KernelPath || !reflect.DeepEqual(e.Initrds, []string{"/" + InitrdPath}) || e.Cmdline != want {
			t.Errorf("extra %q: entry %+v, want kernel /%s initrd /%s cmdline %q", extra, e, KernelPath, InitrdPath, want)
		}
	}
}

func TestPartitionMiB(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		payload int64
		want    int64
	}{
		{0, 32},
		{10 * mib, 32},
		{22 * mib, 32},       // 22 + 5.5 + 4 = 31.5 → 32
		{24 * mib, 34},       // 24 + 6 + 4
		{24*mib + 1, 35},     // rounds up
		{100 * mib, 129},     // 100 + 25 + 4
		{1000 * mib, 1254},   // 1000 + 250 + 4
		{4 * mib / 5, 32},    // small
		{30*mib - 7, 42},     // 30 + 7.5 + 4 - ε → 41.5 → 42
		{40*mib + mib/2, 55}, // 40.5 + 10.125 + 4 = 54.625 → 55
	}
	for _, tt := range tests {
		if got := PartitionMiB(tt.payload); got != tt.want {
			t.Errorf("PartitionMiB(%d) = %d, want %d", tt.payload, got, tt.want)
		}
	}
}
