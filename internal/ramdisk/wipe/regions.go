package wipe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"unsafe"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// LogicalBlockSizer is implemented by devices that know their logical block size (block
// devices); 0 means unknown.
type LogicalBlockSizer interface {
	LogicalBlockSize() int64
}

// mbrSectorSizes are the sector sizes an MBR's LBAs may count in: an MBR does not record its
// own, and a 4Kn disk counts in 4096-byte sectors. When the device's logical block size is not
// known, quick mode zeroes the regions of both readings (zeroing more is harmless to a wipe).
func mbrSectorSizes(dev Device) []int64 {
	if l, ok := dev.(LogicalBlockSizer); ok {
		if ss := l.LogicalBlockSize(); ss == 512 || ss == 4096 {
			return []int64{ss}
		}
	}
	return []int64{512, 4096}
}

// quickRegions reads the partition tables (before they are destroyed), following the chain of
// extended boot records of an MBR's extended partition, and returns what quick mode zeroes.
func quickRegions(dev Device) ([]Extent, error) {
	size := dev.Size()
	head := AlignedBuffer(int(min(size, mib)))
	if n, err := dev.ReadAt(head, 0); err != nil && !(errors.Is(err, io.EOF) && n == len(head)) {
		return nil, fmt.Errorf("reading the partition table: %w", err)
	}
	sectors := mbrSectorSizes(dev)
	parts := parsePartitions(head, sectors)
	logical, err := logicalPartitions(dev, head, sectors)
	if err != nil {
		return nil, err
	}
	backup, stale, err := backupGPT(dev, head)
	if err != nil {
		return nil, err
	}
	return mergeExtents(append(QuickRegions(size, slices.Concat(parts, logical, backup)), stale...)), nil
}

// backupGPT reads the GPT's other copy: the partitions of the backup table in the disk's last
// LBA (the primary may be damaged or gone, the partitions and their signatures still there, and
// gdisk restores the table from the backup), and, as a region to zero, the MiB that ends with
// the backup header the primary names when that is not at the disk's end (a disk that grew,
// a RAID volume or cloud disk extended, keeps its old backup where it used to end).
func backupGPT(dev Device, head []byte) (parts, stale []Extent, err error) {
	size := dev.Size()
	tailOff := max(0, size-mib) &^ (alignment - 1)
	tail := AlignedBuffer(int(size - tailOff))
	if n, err := dev.ReadAt(tail, tailOff); err != nil && !(errors.Is(err, io.EOF) && n == len(tail)) {
		return nil, nil, fmt.Errorf("reading the backup partition table: %w", err)
	}
	for _, ss := range []int64{512, 4096} {
		if p, _, ok := gptAt(tail, tailOff, size-ss, ss); ok {
			parts = p
			break
		}
	}
	for _, ss := range []int64{512, 4096} {
		_, alt, ok := gptAt(head, 0, ss, ss)
		if !ok {
			continue
		}
		if end := alt + ss; alt >= 2*ss && end <= size {
			start := max(0, end-mib) &^ (alignment - 1)
			stale = append(stale, Extent{start, min(size, alignUp(end)) - start})
		}
		break
	}
	return parts, stale, nil
}

// maxLogicalPartitions bounds the walk of an extended boot record chain (a loop or garbage
// never makes it run away).
const maxLogicalPartitions = 256

func isExtended(typ byte) bool { return typ == 0x05 || typ == 0x0f || typ == 0x85 }

// logicalPartitions walks the extended boot record (EBR) chain of every extended partition in
// the MBR in head, for each sector size: each EBR's first entry is a logical partition (its LBA
// relative to the EBR), its second the next EBR (relative to the extended partition's start).
// An EBR outside the device or without its signature ends the chain; a read error fails.
func logicalPartitions(dev Device, head []byte, sectors []int64) ([]Extent, error) {
	if len(head) < 512 || head[510] != 0x55 || head[511] != 0xaa {
		return nil, nil
	}
	size := dev.Size()
	buf := AlignedBuffer(4096)
	var parts []Extent
	for i := range 4 {
		e := head[446+16*i : 446+16*(i+1)]
		if !isExtended(e[4]) {
			continue
		}
		for _, ss := range sectors {
			ext := int64(binary.LittleEndian.Uint32(e[8:])) * ss
			seen := map[int64]bool{}
			for ebr := ext; ebr > 0 && ebr+ss <= size && !seen[ebr] && len(seen) < maxLogicalPartitions; {
				seen[ebr] = true
				b := buf[:ss]
				if n, err := dev.ReadAt(b, ebr); err != nil && !(errors.Is(err, io.EOF) && int64(n) == ss) {
					return nil, fmt.Errorf("reading the extended boot record at %d: %w", ebr, err)
				}
				if b[510] != 0x55 || b[511] != 0xaa {
					break
				}
				if l := b[446:462]; l[4] != 0 {
					lba, n := int64(binary.LittleEndian.Uint32(l[8:])), int64(binary.LittleEndian.Uint32(l[12:]))
					if n > 0 {
						parts = append(parts, Extent{ebr + lba*ss, n * ss})
					}
				}
				next := b[462:478]
				if !isExtended(next[4]) {
					break
				}
				ebr = ext + int64(binary.LittleEndian.Uint32(next[8:]))*ss
			}
		}
	}
	return parts, nil
}

// QuickRegions is what quick mode zeroes on a disk of size bytes holding parts: the first and
// last MiB (MBR, primary and backup GPT, end-of-disk RAID/ZFS labels), the first and last MiB of
// every partition (filesystem and LVM signatures, md 1.0 superblocks) and btrfs's superblock
// mirrors at 64 MiB and 256 GiB of the disk and of every partition. Regions are 4 KiB-aligned,
// clipped to the disk, sorted, merged.
func QuickRegions(size int64, parts []Extent) []Extent {
	var rs []Extent
	add := func(off, n int64) {
		start := max(0, off) &^ (alignment - 1)
		end := min(size, alignUp(off+n))
		if end > start {
			rs = append(rs, Extent{start, end - start})
		}
	}
	// btrfs superblock mirrors, from the start of the device btrfs lives on: the disk, or a
	// partition (where they sit that far from the partition's start).
	btrfsMirrors := func(start, end int64) {
		for _, off := range []int64{64 * mib, 256 << 30} {
			if start+off < end { // add clips a mirror the end cuts
				add(start+off, 64<<10)
			}
		}
	}
	add(0, mib)
	add(size-mib, mib)
	btrfsMirrors(0, size)
	for _, p := range parts {
		if p.Offset >= size || p.Length <= 0 {
			continue
		}
		end := min(size, p.Offset+p.Length)
		add(p.Offset, min(mib, end-p.Offset))
		add(end-mib, mib)
		btrfsMirrors(p.Offset, end)
	}
	return mergeExtents(rs)
}

func alignUp(v int64) int64 { return (v + alignment - 1) &^ (alignment - 1) }

func mergeExtents(rs []Extent) []Extent {
	slices.SortFunc(rs, func(a, b Extent) int {
		switch {
		case a.Offset < b.Offset:
			return -1
		case a.Offset > b.Offset:
			return 1
		}
		return 0
	})
	var out []Extent
	for _, r := range rs {
		if n := len(out); n > 0 && r.Offset <= out[n-1].Offset+out[n-1].Length {
			out[n-1].Length = max(out[n-1].Length, r.Offset+r.Length-out[n-1].Offset)
			continue
		}
		out = append(out, r)
	}
	return out
}

// ParsePartitions lists the partitions in an MBR and/or GPT found in head (the disk's first
// bytes, at least 1 MiB for large GPTs). Sector size 512 and 4096 are both tried for GPT, and
// both readings of the MBR's LBAs are listed (an MBR does not say which it counts in). Logical
// partitions lie outside head: quickRegions follows their chain on the device; here an extended
// partition adds its first MiB and the next (where partitioning tools put the first logical
// partition). Garbage yields no partitions, never an error: quick mode wipes the fixed regions
// regardless.
func ParsePartitions(head []byte) []Extent {
	return parsePartitions(head, []int64{512, 4096})
}

func parsePartitions(head []byte, mbrSectors []int64) []Extent {
	var parts []Extent
	if len(head) >= 512 && head[510] == 0x55 && head[511] == 0xaa {
		for _, ss := range mbrSectors {
			for i := range 4 {
				e := head[446+16*i : 446+16*(i+1)]
				typ := e[4]
				lba := int64(binary.LittleEndian.Uint32(e[8:]))
				n := int64(binary.LittleEndian.Uint32(e[12:]))
				if typ == 0 || typ == 0xee || n == 0 { // empty, or the GPT protective entry
					continue
				}
				parts = append(parts, Extent{lba * ss, n * ss})
				if isExtended(typ) {
					parts = append(parts, Extent{lba*ss + mib, mib})
				}
			}
		}
	}
	for _, ss := range []int64{512, 4096} {
		if p, _, ok := gptAt(head, 0, ss, ss); ok {
			parts = append(parts, p...)
			break
		}
	}
	return parts
}

// gptAt parses the GPT header at byte hdr of the disk (sector size ss) and its partition
// entries, from buf, which holds the disk's bytes from byte base: the partitions (those whose
// entries lie in buf), and where the header says the other copy of the header is (AlternateLBA,
// in bytes; -1 when implausible). ok is false when there is no usable header at hdr.
func gptAt(buf []byte, base, hdr, ss int64) (parts []Extent, alt int64, ok bool) {
	at := hdr - base
	if at < 0 || at+ss > int64(len(buf)) {
		return nil, -1, false
	}
	h := buf[at : at+ss]
	if !bytes.Equal(h[:8], []byte("EFI PART")) {
		return nil, -1, false
	}
	entLBA := binary.LittleEndian.Uint64(h[72:])
	count := int64(binary.LittleEndian.Uint32(h[80:]))
	esz := int64(binary.LittleEndian.Uint32(h[84:]))
	if esz < 128 || count > 4096 {
		return nil, -1, false
	}
	for i := range count {
		if entLBA > 1<<50 {
			break
		}
		off := int64(entLBA)*ss + i*esz - base
		if off < 0 || off+esz > int64(len(buf)) {
			break
		}
		e := buf[off : off+esz]
		if bytes.Equal(e[:16], make([]byte, 16)) { // unused entry
			continue
		}
		first := int64(binary.LittleEndian.Uint64(e[32:]))
		last := int64(binary.LittleEndian.Uint64(e[40:]))
		if last < first || first < 0 || last > 1<<50 {
			continue
		}
		parts = append(parts, Extent{first * ss, (last - first + 1) * ss})
	}
	alt = -1
	if a := binary.LittleEndian.Uint64(h[32:]); a <= 1<<50 {
		alt = int64(a) * ss
	}
	return parts, alt, true
}
