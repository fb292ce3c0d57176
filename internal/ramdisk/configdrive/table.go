package configdrive

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"unicode/utf16"
)

// MBR layout.
const (
	mbrEntries     = 446 // offset of the 4 primary entries, 16 bytes each
	mbrSigOff      = 510
	mbrTypeGPT     = 0xEE
	mbrTypeFAT16   = 0x0E // FAT16, LBA addressed
	mbrMaxSectors  = 1 << 32
	gptHeaderMin   = 92
	gptEntrySize   = 128
	gptMaxEntries  = 4096 // sanity bound on what an image may claim (sgdisk makes 128)
	gptNameOff     = 56
	gptNameChars   = 36
	gptSignature   = "EFI PART"
	gptHdrCRCOff   = 16
	gptMyLBAOff    = 24
	gptAltLBAOff   = 32
	gptFirstUseOff = 40
	gptLastUseOff  = 48
	gptEntryLBAOff = 72
	gptNumEntOff   = 80
	gptEntSizeOff  = 84
	gptEntCRCOff   = 88
)

// basicDataType is the GPT type GUID EBD0A0A2-B9E5-4433-87C0-68B6B72699C7 (Microsoft basic
// data) in its on-disk byte order (first three fields little-endian).
func basicDataType() [16]byte {
	return [16]byte{0xA2, 0xA0, 0xD0, 0xEB, 0xE5, 0xB9, 0x33, 0x44, 0x87, 0xC0, 0x68, 0xB6, 0xB7, 0x26, 0x99, 0xC7}
}

// part is one partition of the table, LBAs inclusive.
type part struct {
	index       int // 0-based slot in the MBR or the GPT entry array
	first, last int64
	mbrType     byte
	gptType     [16]byte
	gptName     string
}

// table is the disk's partition table as read.
type table struct {
	kind    string // tableGPT or tableMBR
	ss      int
	sectors int64  // whole sectors on the disk
	lba0    []byte // sector 0
	parts   []part // used slots only

	// GPT only.
	hdr        []byte // primary header sector
	hdrSize    int
	altLBA     int64
	firstUse   int64
	lastUse    int64
	entriesLBA int64
	numEntries int
	entries    []byte // the primary entry array, whole sectors
}

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }
func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// readTable reads and checks the disk's MBR or GPT.
func readTable(d io.ReaderAt, diskSize int64, ss int) (*table, error) {
	sectors := diskSize / int64(ss)
	if sectors < 3 {
		return nil, fmt.Errorf("config drive: disk of %d bytes: too small to hold a partition table", diskSize)
	}
	lba0, err := readAt(d, 0, ss)
	if err != nil {
		return nil, fmt.Errorf("config drive: reading the MBR: %w", err)
	}
	if lba0[mbrSigOff] != 0x55 || lba0[mbrSigOff+1] != 0xAA {
		return nil, fmt.Errorf("config drive: the image has no partition table (no 0x55AA signature in sector 0): a config drive needs one")
	}
	t := &table{ss: ss, sectors: sectors, lba0: lba0}
	gpt := false
	for i := range 4 {
		e := lba0[mbrEntries+16*i:]
		if e[0] != 0x00 && e[0] != 0x80 {
			// As the kernel does: a boot sector of a filesystem (FAT, NTFS) also ends in 0x55AA.
			return nil, fmt.Errorf("config drive: the image has no partition table (sector 0 ends in 0x55AA, but MBR entry %d's boot flag is %#02x, not 0x00 or 0x80: a filesystem without a partition table?): a config drive needs one", i+1, e[0])
		}
		if e[4] == mbrTypeGPT {
			gpt = true
		}
	}
	if gpt {
		if err := t.readGPT(d); err != nil {
			return nil, err
		}
	} else if err := t.readMBR(); err != nil {
		return nil, err
	}
	if len(t.parts) == 0 {
		return nil, fmt.Errorf("config drive: the image has no partition table (its %s holds no partition): a config drive needs one", t.kindName())
	}
	return t, nil
}

func (t *table) kindName() string {
	if t.kind == tableGPT {
		return "GPT"
	}
	return "MBR"
}

func (t *table) readMBR() error {
	t.kind = tableMBR
	for i := range 4 {
		e := t.lba0[mbrEntries+16*i:]
		typ, first, n := e[4], int64(le32(e[8:])), int64(le32(e[12:]))
		if typ == 0 {
			continue
		}
		switch typ {
		case 0x05, 0x0F, 0x85:
			return fmt.Errorf("config drive: MBR partition %d is an extended partition (type %#02x): only images with primary partitions are accepted", i+1, typ)
		}
		if n == 0 {
			return fmt.Errorf("config drive: MBR partition %d (type %#02x) has no sectors: a used slot needs a size", i+1, typ)
		}
		if first+n > t.sectors {
			return fmt.Errorf("config drive: MBR partition %d ends at sector %d, beyond the disk's %d sectors (is the sector size %d right?)", i+1, first+n, t.sectors, t.ss)
		}
		t.parts = append(t.parts, part{index: i, first: first, last: first + n - 1, mbrType: typ})
	}
	return nil
}

func (t *table) readGPT(d io.ReaderAt) error {
	t.kind = tableGPT
	ss := int64(t.ss)
	hdr, err := readAt(d, ss, t.ss)
	if err != nil {
		return fmt.Errorf("config drive: reading the GPT header: %w", err)
	}
	if string(hdr[:8]) != gptSignature {
		hint := ""
		other := int64(sectorSize4K)
		if t.ss == sectorSize4K {
			other = 512
		}
		if b, err := readAt(d, other, 8); err == nil && string(b) == gptSignature {
			hint = fmt.Sprintf(" (there is one at byte %d: is the sector size %d?)", other, other)
		}
		return fmt.Errorf("config drive: protective MBR but no GPT header at LBA 1 (byte %d)%s", ss, hint)
	}
	size := int(le32(hdr[12:]))
	if size < gptHeaderMin || size > t.ss {
		return fmt.Errorf("config drive: GPT header size %d: %d to %d bytes is accepted", size, gptHeaderMin, t.ss)
	}
	want := le32(hdr[gptHdrCRCOff:])
	if got := headerCRC(hdr[:size]); got != want {
		return fmt.Errorf("config drive: primary GPT header CRC32 is %#08x, the header says %#08x: the image's GPT is damaged (not repaired from the backup)", got, want)
	}
	if my := le64(hdr[gptMyLBAOff:]); my != 1 {
		return fmt.Errorf("config drive: primary GPT header says it is at LBA %d, not 1", my)
	}
	t.hdr, t.hdrSize = hdr, size
	t.altLBA = int64(le64(hdr[gptAltLBAOff:]))
	t.firstUse = int64(le64(hdr[gptFirstUseOff:]))
	t.lastUse = int64(le64(hdr[gptLastUseOff:]))
	t.entriesLBA = int64(le64(hdr[gptEntryLBAOff:]))
	num, esize := le32(hdr[gptNumEntOff:]), le32(hdr[gptEntSizeOff:])
	if esize != gptEntrySize {
		return fmt.Errorf("config drive: GPT entry size %d: only %d is accepted", esize, gptEntrySize)
	}
	if num < 1 || num > gptMaxEntries {
		return fmt.Errorf("config drive: GPT with %d entries: 1 to %d is accepted", num, gptMaxEntries)
	}
	t.numEntries = int(num)
	es := t.entrySectors()
	switch {
	case t.altLBA < 2 || t.altLBA >= t.sectors:
		return fmt.Errorf("config drive: the GPT's backup header is at LBA %d, outside the disk's %d sectors (a disk smaller than the image, or the wrong sector size %d?)", t.altLBA, t.sectors, t.ss)
	case t.entriesLBA < 2 || t.entriesLBA >= t.sectors || t.entriesLBA+es > t.firstUse:
		return fmt.Errorf("config drive: GPT entry array at LBA %d (%d sectors) does not lie between the header and the first usable LBA %d", t.entriesLBA, es, t.firstUse)
	case t.firstUse > t.lastUse || t.lastUse >= t.altLBA-es:
		return fmt.Errorf("config drive: GPT usable LBAs %d..%d do not fit before the backup entries at LBA %d", t.firstUse, t.lastUse, t.altLBA-es)
	}
	ents, err := readAt(d, t.entriesLBA*ss, int(es)*t.ss)
	if err != nil {
		return fmt.Errorf("config drive: reading the GPT entry array: %w", err)
	}
	want = le32(hdr[gptEntCRCOff:])
	if got := crc32.ChecksumIEEE(ents[:t.numEntries*gptEntrySize]); got != want {
		return fmt.Errorf("config drive: GPT entry array CRC32 is %#08x, the header says %#08x: the image's GPT is damaged (not repaired from the backup)", got, want)
	}
	t.entries = ents
	for i := range t.numEntries {
		e := ents[i*gptEntrySize : (i+1)*gptEntrySize]
		var typ [16]byte
		copy(typ[:], e)
		if typ == ([16]byte{}) {
			continue
		}
		first, last := int64(le64(e[32:])), int64(le64(e[40:]))
		if first < t.firstUse || last < first || last > t.lastUse {
			return fmt.Errorf("config drive: GPT partition %d spans LBA %d..%d, outside the usable LBAs %d..%d", i+1, first, last, t.firstUse, t.lastUse)
		}
		t.parts = append(t.parts, part{index: i, first: first, last: last, gptType: typ, gptName: gptName(e[gptNameOff:])})
	}
	return nil
}

func (t *table) entrySectors() int64 {
	return (int64(t.numEntries)*gptEntrySize + int64(t.ss) - 1) / int64(t.ss)
}

func headerCRC(h []byte) uint32 {
	c := bytes.Clone(h)
	clear(c[gptHdrCRCOff : gptHdrCRCOff+4])
	return crc32.ChecksumIEEE(c)
}

func gptName(b []byte) string {
	u := make([]uint16, 0, gptNameChars)
	for i := 0; i < gptNameChars*2; i += 2 {
		c := le16(b[i:])
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u))
}

// findDrive returns the disk's config-drive partition, if it has one.
func (t *table) findDrive(d io.ReaderAt, label string) (part, bool, error) {
	for _, p := range t.parts {
		if t.kind == tableGPT {
			if p.gptType == basicDataType() && p.gptName == gptPartName {
				return p, true, nil
			}
			continue
		}
		if p.mbrType != mbrTypeFAT16 {
			continue
		}
		l, err := readFATLabel(d, p.first*int64(t.ss), t.ss)
		if err != nil {
			return part{}, false, fmt.Errorf("config drive: reading MBR partition %d's first sector: %w", p.index+1, err)
		}
		if l == label {
			return p, true, nil
		}
	}
	return part{}, false, nil
}

// plan places a new partition of size bytes after the last one, in the first free slot. It
// writes nothing.
func (t *table) plan(size int64) (part, error) {
	ss := int64(t.ss)
	n := size / ss
	var end int64 // first sector after the highest-ending partition
	for _, p := range t.parts {
		end = max(end, p.last+1)
	}
	align := int64(mib) / ss
	first := (end + align - 1) / align * align
	limit := t.sectors // first sector the partition may not use
	if t.kind == tableGPT {
		limit = t.newLastUsable() + 1
		first = max(first, (t.firstUse+align-1)/align*align)
	}
	if first+n > limit {
		free := max(0, limit-first) * ss
		return part{}, fmt.Errorf("config drive: not enough free space after the last partition: %d bytes free from byte %d (1 MiB aligned), %d bytes needed", free, first*ss, size)
	}
	if t.kind == tableMBR {
		if first+n > mbrMaxSectors {
			return part{}, fmt.Errorf("config drive: the partition would end at byte %d, beyond the %d sectors an MBR can address: a GPT image is needed", (first+n)*ss, int64(mbrMaxSectors))
		}
		slot := -1
		for i := 3; i >= 0; i-- {
			if t.lba0[mbrEntries+16*i+4] == 0 {
				slot = i
			}
		}
		if slot < 0 {
			return part{}, fmt.Errorf("config drive: all 4 MBR primary partitions are used: a config drive needs a free one")
		}
		return part{index: slot, first: first, last: first + n - 1, mbrType: mbrTypeFAT16}, nil
	}
	slot := -1
	for i := t.numEntries - 1; i >= 0; i-- {
		if [16]byte(t.entries[i*gptEntrySize:i*gptEntrySize+16]) == ([16]byte{}) {
			slot = i
		}
	}
	if slot < 0 {
		return part{}, fmt.Errorf("config drive: all %d GPT entries are used: a config drive needs a free one", t.numEntries)
	}
	return part{index: slot, first: first, last: first + n - 1, gptType: basicDataType(), gptName: gptPartName}, nil
}

// clearOldBackup zeroes the GPT's backup header at the image's end, which would otherwise stay
// a stale GPT header that some tools find. It goes before the filesystem (it may lie inside the
// new partition). Nothing to do for an MBR, or when the new backup GPT will cover it.
func (t *table) clearOldBackup(rec *recorder) error {
	if t.kind != tableGPT || t.altLBA >= t.sectors-1-t.entrySectors() {
		return nil
	}
	return rec.write("old backup GPT header (zeros)", t.altLBA*int64(t.ss), make([]byte, t.ss))
}

// commit writes the partition table with the new partition p.
func (t *table) commit(p part, rec *recorder) error {
	if t.kind == tableMBR {
		return t.commitMBR(p, rec)
	}
	return t.commitGPT(p, rec)
}

// newLastUsable is the GPT's last usable LBA once the backup sits at the disk's end.
func (t *table) newLastUsable() int64 {
	return t.sectors - 1 - t.entrySectors() - 1
}

func (t *table) commitMBR(p part, rec *recorder) error {
	s := bytes.Clone(t.lba0)
	e := s[mbrEntries+16*p.index : mbrEntries+16*p.index+16]
	e[0] = 0x00 // not active
	copy(e[1:4], []byte{0xFE, 0xFF, 0xFF})
	e[4] = mbrTypeFAT16
	copy(e[5:8], []byte{0xFE, 0xFF, 0xFF})
	binary.LittleEndian.PutUint32(e[8:], uint32(p.first))
	binary.LittleEndian.PutUint32(e[12:], uint32(p.last-p.first+1))
	return rec.write("MBR", 0, s)
}

func (t *table) commitGPT(p part, rec *recorder) error {
	ss := int64(t.ss)
	ents := bytes.Clone(t.entries)
	e := ents[p.index*gptEntrySize : (p.index+1)*gptEntrySize]
	clear(e)
	typ := basicDataType()
	copy(e, typ[:])
	guid, err := t.newGUID()
	if err != nil {
		return err
	}
	copy(e[16:], guid[:])
	binary.LittleEndian.PutUint64(e[32:], uint64(p.first))
	binary.LittleEndian.PutUint64(e[40:], uint64(p.last))
	for i, c := range utf16.Encode([]rune(gptPartName)) {
		binary.LittleEndian.PutUint16(e[gptNameOff+2*i:], c)
	}
	entCRC := crc32.ChecksumIEEE(ents[:t.numEntries*gptEntrySize])

	backupLBA := t.sectors - 1
	backupEntries := backupLBA - t.entrySectors()
	header := func(my, alt, entries int64) []byte {
		h := bytes.Clone(t.hdr)
		binary.LittleEndian.PutUint64(h[gptMyLBAOff:], uint64(my))
		binary.LittleEndian.PutUint64(h[gptAltLBAOff:], uint64(alt))
		binary.LittleEndian.PutUint64(h[gptLastUseOff:], uint64(t.newLastUsable()))
		binary.LittleEndian.PutUint64(h[gptEntryLBAOff:], uint64(entries))
		binary.LittleEndian.PutUint32(h[gptEntCRCOff:], entCRC)
		binary.LittleEndian.PutUint32(h[gptHdrCRCOff:], headerCRC(h[:t.hdrSize]))
		return h
	}

	// Protective MBR: a plain one (a single 0xEE entry from LBA 1) grows to the disk; a hybrid
	// MBR's entries are left alone.
	pmbr := bytes.Clone(t.lba0)
	used, protective := 0, -1
	for i := range 4 {
		ent := pmbr[mbrEntries+16*i:]
		if ent[4] != 0 {
			used++
		}
		if ent[4] == mbrTypeGPT && le32(ent[8:]) == 1 {
			protective = i
		}
	}
	if used == 1 && protective >= 0 {
		binary.LittleEndian.PutUint32(pmbr[mbrEntries+16*protective+12:], uint32(min(t.sectors-1, 0xFFFFFFFF)))
	}

	// Backup first, the primary header last: until it is written the disk holds the old,
	// consistent primary GPT.
	for _, w := range []struct {
		name string
		lba  int64
		data []byte
	}{
		{"backup GPT entry array", backupEntries, ents},
		{"backup GPT header", backupLBA, header(backupLBA, 1, backupEntries)},
		{"protective MBR", 0, pmbr},
		{"primary GPT entry array", t.entriesLBA, ents},
		{"primary GPT header", 1, header(1, backupLBA, t.entriesLBA)},
	} {
		if err := rec.write(w.name, w.lba*ss, w.data); err != nil {
			return err
		}
	}
	return nil
}

// newGUID draws a random (version 4) unique partition GUID, in on-disk byte order, unlike the
// disk's and every other entry's.
func (t *table) newGUID() ([16]byte, error) {
	for {
		var g [16]byte
		if _, err := rand.Read(g[:]); err != nil {
			return g, fmt.Errorf("config drive: drawing a partition GUID: %w", err)
		}
		g[7] = g[7]&0x0F | 0x40 // version 4 (time_hi_and_version is stored little-endian)
		g[8] = g[8]&0x3F | 0x80 // RFC 4122 variant
		dup := [16]byte(t.hdr[56:72]) == g
		for i := range t.numEntries {
			if [16]byte(t.entries[i*gptEntrySize+16:i*gptEntrySize+32]) == g {
				dup = true
			}
		}
		if !dup {
			return g, nil
		}
	}
}
