package configdrive

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"testing"
)

// memDisk is a sparse in-memory disk of 4 KiB pages.
type memDisk struct {
	size  int64
	pages map[int64][]byte
}

const memPage = 4096

func newMemDisk(size int64) *memDisk { return &memDisk{size: size, pages: map[int64][]byte{}} }

func (m *memDisk) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d", off)
	}
	n := 0
	for n < len(p) {
		o := off + int64(n)
		if o >= m.size {
			return n, io.EOF
		}
		pg, in := o/memPage, o%memPage
		k := min(int64(len(p)-n), memPage-in, m.size-o)
		if b, ok := m.pages[pg]; ok {
			copy(p[n:n+int(k)], b[in:])
		} else {
			clear(p[n : n+int(k)])
		}
		n += int(k)
	}
	return n, nil
}

func (m *memDisk) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > m.size {
		return 0, fmt.Errorf("write of %d bytes at %d beyond the disk's %d bytes", len(p), off, m.size)
	}
	n := 0
	for n < len(p) {
		o := off + int64(n)
		pg, in := o/memPage, o%memPage
		b, ok := m.pages[pg]
		if !ok {
			b = make([]byte, memPage)
			m.pages[pg] = b
		}
		n += copy(b[in:], p[n:])
	}
	return n, nil
}

func (m *memDisk) bytes(off, n int64) []byte {
	b := make([]byte, n)
	m.ReadAt(b, off)
	return b
}

// gptSpec describes a GPT built by hand for tests.
type gptSpec struct {
	ss         int
	imageSize  int64 // where the backup GPT goes
	numEntries int
	parts      [][2]int64 // first, last LBA
}

// linuxFS is the GPT type 0FC63DAF-8483-4772-8E79-3D69D8477DE4 in on-disk order.
func linuxFSType() [16]byte {
	return [16]byte{0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4}
}

// writeGPT writes a protective MBR and primary + backup GPT onto d.
func writeGPT(t testing.TB, d Disk, s gptSpec) {
	t.Helper()
	ss := int64(s.ss)
	sectors := s.imageSize / ss
	if s.numEntries == 0 {
		s.numEntries = 128
	}
	es := (int64(s.numEntries)*128 + ss - 1) / ss
	mbr := make([]byte, ss)
	e := mbr[446:]
	e[4] = 0xEE
	copy(e[1:4], []byte{0, 2, 0})
	copy(e[5:8], []byte{0xFF, 0xFF, 0xFF})
	binary.LittleEndian.PutUint32(e[8:], 1)
	binary.LittleEndian.PutUint32(e[12:], uint32(min(sectors-1, 0xFFFFFFFF)))
	mbr[510], mbr[511] = 0x55, 0xAA
	ents := make([]byte, es*ss)
	for i, p := range s.parts {
		x := ents[i*128:]
		typ := linuxFSType()
		copy(x, typ[:])
		x[16], x[17] = byte(i+1), 0x42
		binary.LittleEndian.PutUint64(x[32:], uint64(p[0]))
		binary.LittleEndian.PutUint64(x[40:], uint64(p[1]))
		copy(x[56:], []byte{'r', 0, 'o', 0, 'o', 0, 't', 0})
	}
	ecrc := crc32.ChecksumIEEE(ents[:s.numEntries*128])
	hdr := func(my, alt, entries int64) []byte {
		h := make([]byte, ss)
		copy(h, "EFI PART")
		binary.LittleEndian.PutUint32(h[8:], 0x00010000)
		binary.LittleEndian.PutUint32(h[12:], 92)
		binary.LittleEndian.PutUint64(h[24:], uint64(my))
		binary.LittleEndian.PutUint64(h[32:], uint64(alt))
		binary.LittleEndian.PutUint64(h[40:], uint64(2+es))
		binary.LittleEndian.PutUint64(h[48:], uint64(sectors-2-es))
		copy(h[56:], bytes.Repeat([]byte{0x5A}, 16))
		binary.LittleEndian.PutUint64(h[72:], uint64(entries))
		binary.LittleEndian.PutUint32(h[80:], uint32(s.numEntries))
		binary.LittleEndian.PutUint32(h[84:], 128)
		binary.LittleEndian.PutUint32(h[88:], ecrc)
		binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
		return h
	}
	for _, w := range []struct {
		off  int64
		data []byte
	}{
		{0, mbr},
		{ss, hdr(1, sectors-1, 2)},
		{2 * ss, ents},
		{(sectors - 1 - es) * ss, ents},
		{(sectors - 1) * ss, hdr(sectors-1, 1, sectors-1-es)},
	} {
		if _, err := d.WriteAt(w.data, w.off); err != nil {
			t.Fatal(err)
		}
	}
}

// mbrEntry is one primary partition for writeMBR.
type mbrEntry struct {
	typ         byte
	first, size uint32
}

func writeMBR(t testing.TB, d Disk, ents []mbrEntry) {
	t.Helper()
	s := make([]byte, 512)
	for i, e := range ents {
		x := s[446+16*i:]
		x[4] = e.typ
		binary.LittleEndian.PutUint32(x[8:], e.first)
		binary.LittleEndian.PutUint32(x[12:], e.size)
	}
	s[510], s[511] = 0x55, 0xAA
	if _, err := d.WriteAt(s, 0); err != nil {
		t.Fatal(err)
	}
}

// checkGPT parses both GPT headers at their final places and checks CRCs and cross-references;
// it returns the primary entries.
func checkGPT(t testing.TB, d Disk, diskSize int64, ss int) []byte {
	t.Helper()
	last := diskSize/int64(ss) - 1
	var ents [2][]byte
	for k, lba := range []int64{1, last} {
		h := make([]byte, ss)
		d.ReadAt(h, lba*int64(ss))
		if string(h[:8]) != "EFI PART" {
			t.Fatalf("GPT header at LBA %d: no signature", lba)
		}
		c := bytes.Clone(h[:92])
		clear(c[16:20])
		if crc32.ChecksumIEEE(c) != binary.LittleEndian.Uint32(h[16:]) {
			t.Fatalf("GPT header at LBA %d: bad CRC", lba)
		}
		my, alt := int64(binary.LittleEndian.Uint64(h[24:])), int64(binary.LittleEndian.Uint64(h[32:]))
		other := []int64{last, 1}[k]
		if my != lba || alt != other {
			t.Fatalf("GPT header at LBA %d: my %d alt %d, want %d %d", lba, my, alt, lba, other)
		}
		n := int(binary.LittleEndian.Uint32(h[80:]))
		el := int64(binary.LittleEndian.Uint64(h[72:]))
		e := make([]byte, n*128)
		d.ReadAt(e, el*int64(ss))
		if crc32.ChecksumIEEE(e) != binary.LittleEndian.Uint32(h[88:]) {
			t.Fatalf("GPT entries of header at LBA %d: bad CRC", lba)
		}
		es := (int64(n)*128 + int64(ss) - 1) / int64(ss)
		if k == 1 && el != last-es {
			t.Fatalf("backup entries at LBA %d, want %d", el, last-es)
		}
		if lu := int64(binary.LittleEndian.Uint64(h[48:])); lu != last-es-1 {
			t.Fatalf("header at LBA %d: last usable %d, want %d", lba, lu, last-es-1)
		}
		ents[k] = e
	}
	if !bytes.Equal(ents[0], ents[1]) {
		t.Fatal("primary and backup GPT entries differ")
	}
	return ents[0]
}

func testFiles() []File {
	user := []byte("#cloud-config\nhostname: node-1\n")
	for len(user) < 5000 { // several 512-byte clusters
		user = append(user, "# padding line to span clusters\n"...)
	}
	return []File{
		{Name: "meta-data", Data: []byte("instance-id: node-1\nlocal-hostname: node-1\n")},
		{Name: "user-data", Data: user},
		{Name: "vendor-data", Data: nil},
		{Name: "network-config", Data: []byte("version: 2\nethernets: {}\n")},
	}
}

// openStackFiles is an OpenStack config drive's layout: files two directories down, a name
// longer than 13 characters (two long-name entries), an empty file, and enough entries in
// openstack/latest that its listing spans more than one 512-byte cluster.
func openStackFiles() []File {
	files := []File{
		{Name: "openstack/latest/meta_data.json", Data: []byte(`{"uuid":"node-1"}`)},
		{Name: "openstack/latest/user_data", Data: testFiles()[1].Data},
		{Name: "openstack/latest/vendor_data.json", Data: []byte(`{"cloud-init":"#cloud-config\n{}\n"}`)},
		{Name: "openstack/latest/network_data.json", Data: nil},
		{Name: "openstack/content/0000", Data: []byte("a file in another directory\n")},
	}
	for i := range 12 {
		files = append(files, File{Name: fmt.Sprintf("openstack/latest/extra-file-%02d.txt", i), Data: []byte(fmt.Sprintf("extra %d\n", i))})
	}
	return files
}
