package configdrive

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// FAT16 layout constants.
const (
	fatMinClusters  = 4085  // fewer is FAT12 (Linux, mtools, the FAT spec)
	fatMaxClusters  = 65524 // more is FAT32
	fatMaxCluster   = 32 << 10
	fatReserved     = 1
	fatCount        = 2
	fatRootEntries  = 512
	dirEntrySize    = 32
	fatMedia        = 0xF8
	fatEOC          = 0xFFFF
	lfnChars        = 13
	attrVolumeLabel = 0x08
	attrDirectory   = 0x10
	attrArchive     = 0x20
	attrLFN         = 0x0F
	lfnLast         = 0x40
	// fatDate is 2020-01-01 in FAT's date format (years since 1980, month, day).
	fatDate = (2020-1980)<<9 | 1<<5 | 1
)

// fatGeometry is the shape of a FAT16 filesystem; sizes in sectors unless named otherwise.
type fatGeometry struct {
	sectorSize   int
	totalSectors int64
	secPerClus   int
	fatSectors   int64
	clusters     int64
}

func (g fatGeometry) rootSectors() int64 {
	return int64(fatRootEntries * dirEntrySize / g.sectorSize)
}

// dataStart is the sector of cluster 2.
func (g fatGeometry) dataStart() int64 {
	return fatReserved + fatCount*g.fatSectors + g.rootSectors()
}

func (g fatGeometry) clusterBytes() int { return g.secPerClus * g.sectorSize }

// fatLayout picks the smallest cluster that keeps the cluster count FAT16's.
func fatLayout(size int64, ss int) (fatGeometry, error) {
	total := size / int64(ss)
	if total > 0xFFFFFFFF {
		return fatGeometry{}, fmt.Errorf("FAT16 of %d bytes: at most %d sectors is accepted", size, int64(0xFFFFFFFF))
	}
	for spc := 1; spc*ss <= fatMaxCluster; spc *= 2 {
		g := fatGeometry{sectorSize: ss, totalSectors: total, secPerClus: spc}
		// A FAT sized for every sector as a cluster is a little larger than needed; that is allowed.
		g.fatSectors = ((total/int64(spc)+2)*2 + int64(ss) - 1) / int64(ss)
		g.clusters = (total - g.dataStart()) / int64(spc)
		if g.clusters > fatMaxClusters {
			continue
		}
		if g.clusters < fatMinClusters {
			return fatGeometry{}, fmt.Errorf("FAT16 of %d bytes with %d-byte sectors has %d clusters, FAT16 needs at least %d: a larger partition is needed (16 MiB with 4096-byte sectors)",
				size, ss, g.clusters, fatMinClusters)
		}
		return g, nil
	}
	return fatGeometry{}, fmt.Errorf("FAT16 of %d bytes: too large for %d clusters of at most 32 KiB", size, fatMaxClusters)
}

// fatNode is a file or directory of the filesystem being built: the tree of File names.
type fatNode struct {
	name     string // its own name, the last part of its path ("" for the root)
	dir      bool
	data     []byte
	children []*fatNode // in the order their files were given
	parent   *fatNode   // nil for the root
	first    int64      // its first cluster; 0 for the root and for an empty file
	clusters int64
}

// fatTree makes the directory tree of files, whose names are paths ("openstack/latest/x"):
// a directory comes before the files in it, each in the order its first file was given.
// checkFiles has refused names that collide.
func fatTree(files []File) *fatNode {
	root := &fatNode{dir: true}
	for _, f := range files {
		parts := strings.Split(f.Name, "/")
		at := root
		for _, dir := range parts[:len(parts)-1] {
			i := slices.IndexFunc(at.children, func(c *fatNode) bool { return c.dir && c.name == dir })
			if i < 0 {
				at.children = append(at.children, &fatNode{name: dir, dir: true, parent: at})
				i = len(at.children) - 1
			}
			at = at.children[i]
		}
		at.children = append(at.children, &fatNode{name: parts[len(parts)-1], data: f.Data, parent: at})
	}
	return root
}

// walk calls f on n and everything under it, a directory before what it holds.
func (n *fatNode) walk(f func(*fatNode)) {
	f(n)
	for _, c := range n.children {
		c.walk(f)
	}
}

// dirEntries is the number of 32-byte entries a directory's listing takes: its children's
// long-name entries and 8.3 aliases, and "." and ".." (none in the root, which holds the
// volume label instead).
func (n *fatNode) dirEntries() int64 {
	e := int64(2)
	for _, c := range n.children {
		e += int64((len(c.name)+lfnChars-1)/lfnChars) + 1
	}
	return e
}

// buildFAT returns the filesystem's head: boot sector, FATs, root directory, and the clusters
// of the directories and files, zero-padded to at least 1 MiB (or the whole filesystem if
// smaller). The output depends only on the arguments.
func buildFAT(g fatGeometry, label string, hidden uint32, files []File) ([]byte, error) {
	ss, cb := int64(g.sectorSize), int64(g.clusterBytes())
	root := fatTree(files)
	if e := root.dirEntries() - 1; e > fatRootEntries {
		return nil, fmt.Errorf("config drive: the file names need %d directory entries, the root directory holds %d: fewer or shorter names are needed",
			e, fatRootEntries)
	}
	// Cluster allocation: each directory, then each file, contiguous from cluster 2, a
	// directory before what it holds.
	next := int64(2)
	root.walk(func(n *fatNode) {
		switch {
		case n == root:
			return
		case n.dir:
			n.clusters = (n.dirEntries()*dirEntrySize + cb - 1) / cb
		default:
			n.clusters = (int64(len(n.data)) + cb - 1) / cb
		}
		if n.clusters > 0 {
			n.first = next
		}
		next += n.clusters
	})
	if next-2 > g.clusters {
		return nil, fmt.Errorf("config drive: the files need %d clusters, the filesystem has %d", next-2, g.clusters)
	}
	headLen := max(g.dataStart()*ss+(next-2)*cb, min(mib, g.totalSectors*ss))
	head := make([]byte, headLen)

	// Boot sector.
	b := head[:ss]
	copy(b, []byte{0xEB, 0x3C, 0x90})
	copy(b[3:11], "BCD     ")
	binary.LittleEndian.PutUint16(b[11:], uint16(ss))
	b[13] = byte(g.secPerClus)
	binary.LittleEndian.PutUint16(b[14:], fatReserved)
	b[16] = fatCount
	binary.LittleEndian.PutUint16(b[17:], fatRootEntries)
	if g.totalSectors < 0x10000 {
		binary.LittleEndian.PutUint16(b[19:], uint16(g.totalSectors))
	} else {
		binary.LittleEndian.PutUint32(b[32:], uint32(g.totalSectors))
	}
	b[21] = fatMedia
	binary.LittleEndian.PutUint16(b[22:], uint16(g.fatSectors))
	binary.LittleEndian.PutUint16(b[24:], 63)  // sectors per track (unused with LBA)
	binary.LittleEndian.PutUint16(b[26:], 255) // heads (unused with LBA)
	binary.LittleEndian.PutUint32(b[28:], hidden)
	b[36] = 0x80 // drive number
	b[38] = 0x29 // extended boot signature: serial, label and type follow
	binary.LittleEndian.PutUint32(b[39:], volumeSerial(label, files))
	copy(b[43:54], padName(label, 11))
	copy(b[54:62], "FAT16   ")
	copy(b[62:], []byte{0xCD, 0x18}) // not bootable: int 18h hands back to the firmware
	b[mbrSigOff], b[mbrSigOff+1] = 0x55, 0xAA

	// FATs: each directory's and file's clusters chained.
	fat := make([]byte, g.fatSectors*ss)
	binary.LittleEndian.PutUint16(fat[0:], 0xFF00|fatMedia)
	binary.LittleEndian.PutUint16(fat[2:], fatEOC) // clean shutdown, no I/O errors
	root.walk(func(n *fatNode) {
		for c := n.first; c < n.first+n.clusters; c++ {
			v := uint16(c + 1)
			if c == n.first+n.clusters-1 {
				v = fatEOC
			}
			binary.LittleEndian.PutUint16(fat[2*c:], v)
		}
	})
	for i := range int64(fatCount) {
		copy(head[(fatReserved+i*g.fatSectors)*ss:], fat)
	}

	// Directories: the root in its fixed region, the others in their clusters.
	var err error
	root.walk(func(n *fatNode) {
		if !n.dir || err != nil {
			return
		}
		var dir []byte
		if dir, err = n.listing(label); err != nil {
			return
		}
		at := (fatReserved + fatCount*g.fatSectors) * ss
		if n != root {
			at = g.dataStart()*ss + (n.first-2)*cb
		}
		copy(head[at:], dir)
	})
	if err != nil {
		return nil, err
	}

	// Files.
	root.walk(func(n *fatNode) {
		if !n.dir && n.first != 0 {
			copy(head[g.dataStart()*ss+(n.first-2)*cb:], n.data)
		}
	})
	return head, nil
}

// volumeSerial derives the volume serial number from what the filesystem holds, so that the
// same input gives the same bytes and different inputs (most likely) different serials.
func volumeSerial(label string, files []File) uint32 {
	h := sha256.New()
	h.Write([]byte(label))
	for _, f := range files {
		fmt.Fprintf(h, "\x00%s\x00%d\x00", f.Name, len(f.Data))
		h.Write(f.Data)
	}
	return binary.LittleEndian.Uint32(h.Sum(nil))
}

func padName(s string, n int) []byte {
	b := []byte(strings.Repeat(" ", n))
	copy(b, s)
	return b
}

// listing builds directory n's entries: in the root the volume label first, elsewhere "."
// and ".." (the parent's first cluster, 0 for the root, as FAT has it); then each child's
// long-name entries followed by its 8.3 alias.
func (n *fatNode) listing(label string) ([]byte, error) {
	var dir []byte
	if n.parent == nil {
		lab := make([]byte, dirEntrySize)
		copy(lab, padName(label, 11))
		lab[11] = attrVolumeLabel
		putTimes(lab)
		dir = append(dir, lab...)
	} else {
		dir = append(dir, shortEntry([]byte(".          "), n)...)
		dir = append(dir, shortEntry([]byte("..         "), n.parent)...)
	}
	used := map[string]bool{}
	for _, c := range n.children {
		short, err := shortName(c.name, used)
		if err != nil {
			return nil, err
		}
		dir = append(dir, lfnEntries(c.name, lfnChecksum(short))...)
		dir = append(dir, shortEntry(short, c)...)
	}
	return dir, nil
}

// shortEntry is the 8.3 directory entry of n named short (11 bytes): a file's size and first
// cluster, or a directory's first cluster (0 for the root, as ".." names it).
func shortEntry(short []byte, n *fatNode) []byte {
	e := make([]byte, dirEntrySize)
	copy(e, short)
	e[11] = attrArchive
	if n.dir {
		e[11] = attrDirectory
	} else {
		binary.LittleEndian.PutUint32(e[28:], uint32(len(n.data)))
	}
	putTimes(e)
	binary.LittleEndian.PutUint16(e[26:], uint16(n.first))
	return e
}

// putTimes sets an entry's creation, access and write dates to fatDate, times to 00:00.
func putTimes(e []byte) {
	binary.LittleEndian.PutUint16(e[16:], fatDate) // created
	binary.LittleEndian.PutUint16(e[18:], fatDate) // accessed
	binary.LittleEndian.PutUint16(e[24:], fatDate) // written
}

// shortName makes the 11-byte 8.3 alias of a long name ("meta-data" → "META-D~1   "), unique
// among used, the way Windows and Linux do: the upper-cased name without dots, cut to leave
// room for "~N", and the first three characters after the last dot as the extension.
func shortName(name string, used map[string]bool) ([]byte, error) {
	base, ext := strings.ToUpper(name), ""
	if i := strings.LastIndexByte(base, '.'); i > 0 {
		base, ext = base[:i], base[i+1:]
	}
	base = strings.ReplaceAll(base, ".", "")
	ext = ext[:min(len(ext), 3)]
	for n := 1; n < 1000000; n++ {
		tail := "~" + strconv.Itoa(n)
		s := string(padName(base[:min(len(base), 8-len(tail))]+tail, 8)) + string(padName(ext, 3))
		if !used[s] {
			used[s] = true
			return []byte(s), nil
		}
	}
	return nil, errors.New("config drive: no free 8.3 alias for " + name)
}

// lfnChecksum is the VFAT checksum of an 8.3 name that ties long-name entries to it.
func lfnChecksum(short []byte) byte {
	var sum byte
	for _, c := range short[:11] {
		sum = (sum&1)<<7 + sum>>1 + c
	}
	return sum
}

// lfnEntries returns the long-name entries of name, last part first as they sit on disk.
func lfnEntries(name string, sum byte) []byte {
	n := (len(name) + lfnChars - 1) / lfnChars
	out := make([]byte, 0, n*dirEntrySize)
	// Character slots of one entry, as byte offsets.
	slots := []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30}
	for seq := n; seq >= 1; seq-- {
		e := make([]byte, dirEntrySize)
		e[0] = byte(seq)
		if seq == n {
			e[0] |= lfnLast
		}
		e[11] = attrLFN
		e[13] = sum
		for k, off := range slots {
			i := (seq-1)*lfnChars + k
			var c uint16
			switch {
			case i < len(name):
				c = uint16(name[i]) // names are ASCII
			case i == len(name):
				c = 0
			default:
				c = 0xFFFF
			}
			binary.LittleEndian.PutUint16(e[off:], c)
		}
		out = append(out, e...)
	}
	return out
}

// readFATLabel returns the volume label of the FAT boot sector at off, "" if there is none.
func readFATLabel(d io.ReaderAt, off int64, ss int) (string, error) {
	b, err := readAt(d, off, ss)
	if err != nil {
		return "", err
	}
	if b[mbrSigOff] != 0x55 || b[mbrSigOff+1] != 0xAA || b[38] != 0x29 || le16(b[11:]) != uint16(ss) {
		return "", nil
	}
	return strings.TrimRight(string(b[43:54]), " "), nil
}
