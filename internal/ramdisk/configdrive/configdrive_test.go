package configdrive

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// snapshot copies a memDisk's pages, to check that a refusal wrote nothing.
func snapshot(m *memDisk) map[int64][]byte {
	s := make(map[int64][]byte, len(m.pages))
	for k, v := range m.pages {
		s[k] = bytes.Clone(v)
	}
	return s
}

func TestWritePlacement(t *testing.T) {
	cases := []struct {
		name      string
		ss        int
		setup     func(t *testing.T, d *memDisk)
		table     string
		partition int
		start     int64
	}{
		{"gpt 512 after the highest-ending partition, not in the gap", 512, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}, {40000, 50001}, {10000, 12000}}})
		}, "gpt", 4, 50002*512/mib*mib + mib},
		{"gpt 512 first free slot", 512, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}, {}, {4096, 8191}}})
			clearEntry(t, d, 512, 1)
		}, "gpt", 2, 4 * mib},
		{"gpt 4096", 4096, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 4096, imageSize: 64 * mib, parts: [][2]int64{{256, 2559}}})
		}, "gpt", 2, 10 * mib},
		{"gpt already at the disk's end", 512, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 512, imageSize: d.size, parts: [][2]int64{{2048, 4095}}})
		}, "gpt", 2, 2 * mib},
		{"mbr 512 after the highest-ending partition", 512, func(t *testing.T, d *memDisk) {
			writeMBR(t, d, []mbrEntry{{0x83, 20480, 2048}, {0x82, 2048, 2048}})
		}, "mbr", 3, 11 * mib},
		{"mbr 4096 aligned up", 4096, func(t *testing.T, d *memDisk) {
			writeMBR(t, d, []mbrEntry{{0x83, 256, 257}})
		}, "mbr", 2, 3 * mib},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newMemDisk(256 * mib)
			c.setup(t, d)
			res, err := Write(d, d.size, testFiles(), Options{SectorSize: c.ss})
			if err != nil {
				t.Fatal(err)
			}
			if res.Table != c.table || res.Partition != c.partition || res.Start != c.start || res.Size != DefaultSize || res.Reused {
				t.Fatalf("got %+v, want table %s partition %d start %d", res, c.table, c.partition, c.start)
			}
			if c.table == "gpt" {
				ents := checkGPT(t, d, d.size, c.ss)
				e := ents[(c.partition-1)*128:]
				if [16]byte(e[:16]) != basicDataType() || gptName(e[56:]) != "config-drive" {
					t.Fatalf("entry %d: %x", c.partition, e[:128])
				}
				if e[16+7]>>4 != 4 || e[16+8]&0xC0 != 0x80 {
					t.Fatalf("partition GUID %x is not a random (v4) GUID", e[16:32])
				}
				if l := le64(e[40:]); int64(l+1)*int64(c.ss) != res.Start+res.Size {
					t.Fatalf("last LBA %d", l)
				}
				pm := d.bytes(446, 16)
				if pm[4] != 0xEE || le32(pm[12:]) != uint32(d.size/int64(c.ss)-1) {
					t.Fatalf("protective MBR entry %x", pm)
				}
			} else {
				e := d.bytes(446+16*int64(c.partition-1), 16)
				want := []byte{0, 0xFE, 0xFF, 0xFF, 0x0E, 0xFE, 0xFF, 0xFF}
				if !bytes.Equal(e[:8], want) || int64(le32(e[8:]))*int64(c.ss) != res.Start || int64(le32(e[12:]))*int64(c.ss) != res.Size {
					t.Fatalf("MBR entry %x", e)
				}
			}
			got, found, err := Find(d, d.size, c.ss)
			if err != nil || !found {
				t.Fatalf("Find: %v %v", found, err)
			}
			if got.Table != res.Table || got.Partition != res.Partition || got.Start != res.Start || got.Size != res.Size || got.Label != "CIDATA" {
				t.Fatalf("Find: %+v, Write: %+v", got, res)
			}
			// The boot sector's hidden sectors is the partition's start LBA.
			if h := le32(d.bytes(res.Start+28, 4)); int64(h) != res.Start/int64(c.ss) {
				t.Fatalf("hidden sectors %d", h)
			}
		})
	}
}

// clearEntry empties GPT entry i in both arrays and fixes the CRCs.
func clearEntry(t *testing.T, d *memDisk, ss int, i int) {
	t.Helper()
	s := int64(ss)
	for _, lba := range []int64{1, 64*mib/s - 1} { // primary, backup at the image's end
		h := d.bytes(lba*s, s)
		el := int64(le64(h[72:]))
		e := d.bytes(el*s, 128*128)
		clear(e[i*128 : (i+1)*128])
		d.WriteAt(e, el*s)
		binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(e))
		binary.LittleEndian.PutUint32(h[16:], headerCRC(h[:92]))
		d.WriteAt(h, lba*s)
	}
}

func TestWriteMovesBackupGPT(t *testing.T) {
	d := newMemDisk(256 * mib)
	writeGPT(t, d, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}}})
	oldAlt := int64(64*mib - 512)
	if string(d.bytes(oldAlt, 8)) != "EFI PART" {
		t.Fatal("test setup: no backup header at the image's end")
	}
	if _, err := Write(d, d.size, testFiles(), Options{}); err != nil {
		t.Fatal(err)
	}
	checkGPT(t, d, d.size, 512)
	if b := d.bytes(oldAlt, 512); !bytes.Equal(b, make([]byte, 512)) {
		t.Fatal("the old backup GPT header at the image's end is still there")
	}
}

func TestWriteReuse(t *testing.T) {
	for _, c := range []struct {
		name  string
		ss    int
		setup func(t *testing.T, d *memDisk)
	}{
		{"gpt", 512, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}}})
		}},
		{"gpt 4096", 4096, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 4096, imageSize: 64 * mib, parts: [][2]int64{{256, 511}}})
		}},
		{"mbr", 512, func(t *testing.T, d *memDisk) {
			writeMBR(t, d, []mbrEntry{{0x83, 2048, 2048}})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newMemDisk(256 * mib)
			c.setup(t, d)
			files := testFiles()
			first, err := Write(d, d.size, files, Options{SectorSize: c.ss})
			if err != nil {
				t.Fatal(err)
			}
			table := d.bytes(0, 64*1024)
			backup := d.bytes(d.size-64*1024, 64*1024)
			files[0].Data = []byte("instance-id: second\n")
			second, err := Write(d, d.size, files, Options{SectorSize: c.ss, Size: 32 * mib})
			if err != nil {
				t.Fatal(err)
			}
			if !second.Reused || second.Partition != first.Partition || second.Start != first.Start || second.Size != first.Size {
				t.Fatalf("second %+v, first %+v", second, first)
			}
			if second.Files["meta-data"] == first.Files["meta-data"] {
				t.Fatal("the result's hashes did not change with the data")
			}
			if !bytes.Equal(table, d.bytes(0, 64*1024)) || !bytes.Equal(backup, d.bytes(d.size-64*1024, 64*1024)) {
				t.Fatal("the reuse changed the partition table")
			}
			g, err := fatLayout(first.Size, c.ss)
			if err != nil {
				t.Fatal(err)
			}
			head, err := buildFAT(g, "CIDATA", uint32(first.Start/int64(c.ss)), files)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d.bytes(first.Start, int64(len(head))), head) {
				t.Fatal("the partition does not hold the second filesystem")
			}
		})
	}
}

// TestWriteClearsOldFilesystem: what lay in the free space (an old filesystem) does not show
// through the metadata area or the partition's first and last MiB.
func TestWriteClearsOldFilesystem(t *testing.T) {
	for _, ss := range []int{512, 4096} {
		t.Run(fmt.Sprint(ss), func(t *testing.T) {
			d := newMemDisk(128 * mib)
			writeMBR(t, d, []mbrEntry{{0x83, uint32(mib / ss), uint32(mib / ss)}})
			d.WriteAt(bytes.Repeat([]byte{0xA5}, 126*mib), 2*mib)
			res, err := Write(d, d.size, testFiles(), Options{SectorSize: ss})
			if err != nil {
				t.Fatal(err)
			}
			g, _ := fatLayout(res.Size, ss)
			head, _ := buildFAT(g, "CIDATA", uint32(res.Start/int64(ss)), testFiles())
			if len(head) < mib {
				t.Fatalf("head of %d bytes", len(head))
			}
			if !bytes.Equal(d.bytes(res.Start, int64(len(head))), head) {
				t.Fatal("the partition's head is not what buildFAT makes")
			}
			if !bytes.Equal(d.bytes(res.Start+res.Size-mib, mib), make([]byte, mib)) {
				t.Fatal("the partition's last MiB is not zero")
			}
			if d.bytes(res.Start+res.Size/2, 1)[0] != 0xA5 {
				t.Fatal("the middle of the data area was written")
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	build := func(files []File) []byte {
		d := newMemDisk(64 * mib)
		writeMBR(t, d, []mbrEntry{{0x83, 2048, 2048}})
		res, err := Write(d, d.size, files, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return d.bytes(res.Start, res.Size)
	}
	a, b := build(testFiles()), build(testFiles())
	if !bytes.Equal(a, b) {
		t.Fatal("the same input gave different filesystems")
	}
	other := testFiles()
	other[0].Data = []byte("instance-id: other\n")
	c := build(other)
	if bytes.Equal(a[39:43], c[39:43]) {
		t.Fatal("different files, same volume serial")
	}
}

func TestFATLayout(t *testing.T) {
	for _, ss := range []int{512, 4096} {
		for _, size := range []int64{8 * mib, 16 * mib, 17 * mib, 32 * mib, 64 * mib, 256 * mib, 1024 * mib, 2047 * mib} {
			t.Run(fmt.Sprintf("%d/%dMiB", ss, size/mib), func(t *testing.T) {
				g, err := fatLayout(size, ss)
				if ss == 4096 && size < 16*mib {
					if err == nil || !strings.Contains(err.Error(), "at least 4085") {
						t.Fatalf("want a too-few-clusters error, got %v %+v", err, g)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if g.clusters < 4085 || g.clusters > 65524 {
					t.Fatalf("%d clusters: not FAT16", g.clusters)
				}
				if g.fatSectors*int64(ss)/2 < g.clusters+2 {
					t.Fatalf("FAT of %d sectors too small for %d clusters", g.fatSectors, g.clusters)
				}
				if g.dataStart()+g.clusters*int64(g.secPerClus) > g.totalSectors {
					t.Fatalf("clusters beyond the filesystem: %+v", g)
				}
				if g.clusterBytes() > 32<<10 {
					t.Fatalf("cluster of %d bytes", g.clusterBytes())
				}
			})
		}
	}
	if _, err := fatLayout(4096*mib, 512); err == nil {
		t.Fatal("4 GiB FAT16 accepted")
	}
}

func TestShortNames(t *testing.T) {
	cases := []struct {
		names []string
		want  []string
	}{
		{[]string{"meta-data", "user-data", "vendor-data", "network-config"}, []string{"META-D~1   ", "USER-D~1   ", "VENDOR~1   ", "NETWOR~1   "}},
		{[]string{"a.b.txt", "x.json", "a", "ab.c"}, []string{"AB~1    TXT", "X~1     JSO", "A~1        ", "AB~1    C  "}},
		{[]string{"meta-data1", "meta-data2", "meta-data3", "meta-data4", "meta-data5", "meta-data6", "meta-data7", "meta-data8", "meta-data9", "meta-data10"},
			[]string{"META-D~1   ", "META-D~2   ", "META-D~3   ", "META-D~4   ", "META-D~5   ", "META-D~6   ", "META-D~7   ", "META-D~8   ", "META-D~9   ", "META-~10   "}},
	}
	for _, c := range cases {
		used := map[string]bool{}
		for i, n := range c.names {
			s, err := shortName(n, used)
			if err != nil || string(s) != c.want[i] {
				t.Errorf("shortName(%q) = %q %v, want %q", n, s, err, c.want[i])
			}
		}
	}
}

func TestLFN(t *testing.T) {
	// Checksum: rotate right by one, add the byte (the FAT spec's ChkSum), written differently.
	short := []byte("META-D~1   ")
	var want byte
	for _, c := range short {
		want = (want>>1 | want<<7) + c
	}
	if got := lfnChecksum(short); got != want {
		t.Fatalf("checksum %#x, want %#x", got, want)
	}
	e := lfnEntries("network-config", want) // 14 characters: two entries
	if len(e) != 64 || e[0] != 0x42 || e[32] != 0x01 || e[11] != 0x0F || e[13] != want || e[32+13] != want {
		t.Fatalf("entries %x", e)
	}
	// Second part ("g"), then the terminator, then 0xFFFF padding.
	if le16(e[1:]) != 'g' || le16(e[3:]) != 0 || le16(e[5:]) != 0xFFFF || le16(e[30:]) != 0xFFFF {
		t.Fatalf("last entry %x", e[:32])
	}
	var name []byte
	for _, off := range []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30} {
		name = append(name, byte(le16(e[32+off:])))
	}
	if string(name) != "network-confi" {
		t.Fatalf("first entry holds %q", name)
	}
}

func TestRefusals(t *testing.T) {
	gpt := func(s gptSpec) func(t *testing.T, d *memDisk) {
		return func(t *testing.T, d *memDisk) { writeGPT(t, d, s) }
	}
	mbr := func(e ...mbrEntry) func(t *testing.T, d *memDisk) {
		return func(t *testing.T, d *memDisk) { writeMBR(t, d, e) }
	}
	one := gpt(gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}}})
	cases := []struct {
		name     string
		diskSize int64
		setup    func(t *testing.T, d *memDisk)
		files    []File
		o        Options
		want     string
	}{
		{"no table", 0, func(*testing.T, *memDisk) {}, nil, Options{}, "no partition table (no 0x55AA"},
		{"empty mbr", 0, mbr(), nil, Options{}, "its MBR holds no partition"},
		{"a filesystem, no table", 0, func(t *testing.T, d *memDisk) {
			g, _ := fatLayout(16*mib, 512)
			fs, _ := buildFAT(g, "OTHER", 0, testFiles())
			binary.LittleEndian.PutUint32(fs[446+16:], 0x12345678) // boot code that looks like entries
			d.WriteAt(fs, 0)
		}, nil, Options{}, "boot flag is 0x78, not 0x00 or 0x80"},
		{"empty gpt", 0, gpt(gptSpec{ss: 512, imageSize: 64 * mib}), nil, Options{}, "its GPT holds no partition"},
		{"full mbr", 0, mbr(mbrEntry{0x83, 2048, 2048}, mbrEntry{0x83, 4096, 2048}, mbrEntry{0x83, 6144, 2048}, mbrEntry{0x83, 8192, 2048}), nil, Options{}, "all 4 MBR primary partitions are used"},
		{"extended", 0, mbr(mbrEntry{0x83, 2048, 2048}, mbrEntry{0x05, 4096, 2048}), nil, Options{}, "extended partition (type 0x05)"},
		{"extended lba", 0, mbr(mbrEntry{0x0F, 4096, 2048}), nil, Options{}, "extended partition"},
		{"mbr partition beyond the disk", 0, mbr(mbrEntry{0x83, 2048, 1 << 30}), nil, Options{}, "beyond the disk"},
		{"mbr no free space", 0, mbr(mbrEntry{0x83, 2048, 256*mib/512 - 2048 - 8*2048}), nil, Options{}, "8388608 bytes free from byte 260046848 (1 MiB aligned), 16777216 bytes needed"},
		{"mbr beyond 2 TiB", 3 << 40, mbr(mbrEntry{0x83, 2048, 0xFFFFF000 - 2048}), nil, Options{}, "a GPT image is needed"},
		{"gpt no free space", 0, one, nil, Options{Size: 254 * mib}, "266321408 bytes free from byte 2097152 (1 MiB aligned), 266338304 bytes needed"},
		{"gpt full entries", 0, gpt(gptSpec{ss: 512, imageSize: 64 * mib, numEntries: 4, parts: [][2]int64{{34, 40}, {41, 50}, {51, 60}, {61, 70}}}), nil, Options{}, "all 4 GPT entries are used"},
		{"gpt bad header crc", 0, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}}})
			d.WriteAt([]byte{0xFF}, 512+48) // last usable LBA, CRC not updated
		}, nil, Options{}, "primary GPT header CRC32"},
		{"gpt bad entries crc", 0, func(t *testing.T, d *memDisk) {
			writeGPT(t, d, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}}})
			d.WriteAt([]byte{0xFF}, 1024+100)
		}, nil, Options{}, "GPT entry array CRC32"},
		{"gpt larger than the disk", -128 * mib, gpt(gptSpec{ss: 512, imageSize: 256 * mib, parts: [][2]int64{{2048, 4095}}}), nil, Options{}, "outside the disk's"},
		{"gpt 4096 read as 512", 0, gpt(gptSpec{ss: 4096, imageSize: 64 * mib, parts: [][2]int64{{256, 511}}}), nil, Options{SectorSize: 512}, "is the sector size 4096?"},
		{"gpt 512 read as 4096", 0, one, nil, Options{SectorSize: 4096}, "is the sector size 512?"},
		{"no files", 0, one, []File{}, Options{}, "no files"},
		{"name with space", 0, one, []File{{Name: "x y"}}, Options{}, `file "x y": names use letters, digits, '.', '_', '-'`},
		{"name with backslash", 0, one, []File{{Name: `a\b`}}, Options{}, "names use letters"},
		{"path with an empty part", 0, one, []File{{Name: "openstack//meta_data.json"}}, Options{}, `file "openstack//meta_data.json": part "": names are 1 to 64 characters long`},
		{"path from the root", 0, one, []File{{Name: "/meta-data"}}, Options{}, `part "": names are 1 to 64`},
		{"path ending in a slash", 0, one, []File{{Name: "openstack/"}}, Options{}, `part "": names are 1 to 64`},
		{"path up", 0, one, []File{{Name: "openstack/../meta-data"}}, Options{}, `part "..": names do not start or end with '.'`},
		{"path too deep", 0, one, []File{{Name: "a/b/c/d/e/f/g/h/i"}}, Options{}, "at most 8 parts separated by '/'"},
		{"file where a directory is", 0, one, []File{{Name: "openstack/latest/user_data"}, {Name: "openstack/latest"}}, Options{}, `file "openstack/latest": a directory of that name holds "openstack/latest/user_data"`},
		{"directory where a file is", 0, one, []File{{Name: "openstack"}, {Name: "OpenStack/latest/user_data"}}, Options{}, `"openstack" is a file, not a directory`},
		{"directory in two cases", 0, one, []File{{Name: "openstack/latest/a"}, {Name: "openstack/Latest/b"}}, Options{}, `directory "openstack/Latest" is "openstack/latest" in "openstack/latest/a" (FAT names ignore case)`},
		{"same path but case", 0, one, []File{{Name: "openstack/user_data"}, {Name: "openstack/USER_DATA"}}, Options{}, `same name as "openstack/user_data"`},
		{"name not ascii", 0, one, []File{{Name: "méta"}}, Options{}, "names use letters"},
		{"empty name", 0, one, []File{{Name: ""}}, Options{}, "1 to 64 characters"},
		{"long name", 0, one, []File{{Name: strings.Repeat("a", 65)}}, Options{}, "1 to 64 characters"},
		{"dot name", 0, one, []File{{Name: ".hidden"}}, Options{}, "do not start or end with '.'"},
		{"trailing dot", 0, one, []File{{Name: "a."}}, Options{}, "do not start or end with '.'"},
		{"same name but case", 0, one, []File{{Name: "meta-data"}, {Name: "META-DATA"}}, Options{}, `same name as "meta-data"`},
		{"too many directory entries", 0, one, manyFiles(90), Options{}, "the file names need 541 directory entries, the root directory holds 512"},
		{"too much data", 0, one, []File{{Name: "a", Data: make([]byte, mib/2)}, {Name: "b", Data: make([]byte, mib/2+1)}}, Options{}, "1048577 bytes: at most 1048576"},
		{"size too small", 0, one, nil, Options{Size: 7 * mib}, "at least 8 MiB"},
		{"size not MiB", 0, one, nil, Options{Size: 16*mib + 512}, "a multiple of 1 MiB"},
		{"sector size", 0, one, nil, Options{SectorSize: 1024}, "sector size 1024: 512 or 4096"},
		{"label too long", 0, one, nil, Options{Label: "ABCDEFGHIJKL"}, "at most 11 characters"},
		{"label space", 0, one, nil, Options{Label: "CI DATA"}, "labels use letters"},
		{"label as given, space", 0, one, nil, Options{Label: "config 2", LabelAsGiven: true}, "labels use letters"},
		{"4096 needs 16 MiB", 0, gpt(gptSpec{ss: 4096, imageSize: 64 * mib, parts: [][2]int64{{256, 511}}}), nil, Options{SectorSize: 4096, Size: 8 * mib}, "16 MiB with 4096-byte sectors"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			size := c.diskSize // < 0: the disk is that much smaller than the memDisk
			if size <= 0 {
				size += 256 * mib
			}
			d := newMemDisk(max(size, 256*mib))
			c.setup(t, d)
			files := c.files
			if files == nil {
				files = testFiles()
			}
			before := snapshot(d)
			_, err := Write(d, size, files, c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "config drive: ") {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if !maps.EqualFunc(before, d.pages, bytes.Equal) {
				t.Fatal("a refused Write changed the disk")
			}
		})
	}
}

// faultyDisk changes or refuses writes.
type faultyDisk struct {
	*memDisk
	flipAt  int64 // a write covering this offset stores its byte inverted
	failAll bool
}

func (f *faultyDisk) WriteAt(p []byte, off int64) (int, error) {
	if f.failAll {
		return 0, errors.New("I/O error")
	}
	n, err := f.memDisk.WriteAt(p, off)
	if f.flipAt >= off && f.flipAt < off+int64(len(p)) {
		b := f.memDisk.bytes(f.flipAt, 1)
		f.memDisk.WriteAt([]byte{^b[0]}, f.flipAt)
	}
	return n, err
}

func TestReadBack(t *testing.T) {
	cases := []struct {
		name string
		d    func(m *memDisk) Disk
		want string
	}{
		{"primary GPT header", func(m *memDisk) Disk { return &faultyDisk{memDisk: m, flipAt: 512 + 48} }, "read-back of the primary GPT header: byte 48 of it (disk byte 560)"},
		{"backup GPT entries", func(m *memDisk) Disk { return &faultyDisk{memDisk: m, flipAt: 256*mib - 33*512 + 130} }, "read-back of the backup GPT entry array: byte 130 of it"},
		{"filesystem", func(m *memDisk) Disk { return &faultyDisk{memDisk: m, flipAt: 2*mib + 600} }, "read-back of the filesystem head: byte 600 of it (disk byte 2097752)"},
		{"write error", func(m *memDisk) Disk { return &faultyDisk{memDisk: m, failAll: true} }, "writing the old backup GPT header (zeros) (512 bytes at byte 67108352): I/O error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMemDisk(256 * mib)
			writeGPT(t, m, gptSpec{ss: 512, imageSize: 64 * mib, parts: [][2]int64{{2048, 4095}}})
			_, err := Write(c.d(m), m.size, testFiles(), Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

func TestFindNone(t *testing.T) {
	d := newMemDisk(256 * mib)
	writeMBR(t, d, []mbrEntry{{0x0E, 2048, 32768}}) // FAT16 partition, but no CIDATA boot sector
	if _, found, err := Find(d, d.size, 512); err != nil || found {
		t.Fatalf("found %v, %v", found, err)
	}
	res, err := Write(d, d.size, testFiles(), Options{})
	if err != nil || res.Reused || res.Partition != 2 {
		t.Fatalf("%+v %v", res, err)
	}
}

// manyFiles returns n files with 64-character names (5 long-name entries and an alias each).
func manyFiles(n int) []File {
	files := make([]File, n)
	for i := range files {
		files[i] = File{Name: fmt.Sprintf("%02d-%s", i, strings.Repeat("x", 61)), Data: []byte{byte(i)}}
	}
	return files
}

// TestManyFiles: a root directory filled to its last entries (85 × 6 + the label = 511) is
// accepted, and mtools lists every file.
func TestManyFiles(t *testing.T) {
	d := newMemDisk(64 * mib)
	writeMBR(t, d, []mbrEntry{{0x83, 2048, 2048}})
	files := manyFiles(85)
	res, err := Write(d, d.size, files, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("mdir"); err != nil {
		t.Skip("mdir is not installed (apt: mtools)")
	}
	part := filepath.Join(t.TempDir(), "part.img")
	if err := os.WriteFile(part, d.bytes(res.Start, res.Size), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr("", []string{"MTOOLS_SKIP_CHECK=1"}, "mdir", "-i", part, "::")
	if err != nil {
		t.Fatalf("mdir: %v\n%s", err, out)
	}
	for _, f := range files {
		if !strings.Contains(out, " "+f.Name+"\n") {
			t.Fatalf("mdir: no %q:\n%s", f.Name, out)
		}
	}
}
