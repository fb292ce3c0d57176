package wipe

// Hidden capacity: storage of a disk that the kernel shows no block device bytes for, which a
// wipe through the block device therefore cannot reach, and which a read-back of the block device
// cannot prove erased:
//
//   - an ATA disk's Host Protected Area (HPA, or the Accessible Max Address of ACS-3): the drive
//     reports a smaller size than its native capacity. libata shows the native size when it
//     unlocks the area (libata.ignore_hpa=1); the wipe reads the native max address itself
//     (READ NATIVE MAX ADDRESS [EXT] or GET NATIVE MAX ADDRESS EXT) and compares.
//   - an ATA Device Configuration Overlay (DCO) lowers the native max address itself. It can be
//     removed only with DEVICE CONFIGURATION RESTORE, which also resets the features the
//     overlay turned off and is refused once the firmware froze it: the ramdisk does not do it.
//     It reads the overlay (DEVICE CONFIGURATION IDENTIFY) where the drive lets it, and fails a
//     disk whose overlay hides sectors.
//   - NVMe namespaces that are allocated but attached to no controller the kernel sees (no
//     block device), active namespaces the kernel made no usable block device for (a size of
//     0: a format it does not support), and capacity allocated to no namespace (UNVMCAP).
//
// A disk with hidden capacity is erased as far as the kernel shows it, and its Result fails with
// what was found and what the operator does about it: the attestation never claims a wipe of a
// disk part of which it could not reach.

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"bcd/internal/ramdisk/inventory"
)

// HiddenCapacity is what the wipe found out about capacity the kernel does not show.
type HiddenCapacity struct {
	// Checked: a check ran and its outcome is in Detail. False when the disk has no
	// hidden-capacity mechanism the ramdisk can read (Detail says why).
	Checked bool `json:"checked"`
	// Found: capacity the wipe did not reach. The disk's Result fails.
	Found  bool   `json:"found"`
	Detail string `json:"detail"`
}

// HiddenCapacityProber is implemented by devices that can look past the size the kernel shows
// (a block device: an ATA disk's native max address). The wipe records the answer in the Result
// and fails a disk whose answer is Found, or whose check failed, after erasing what it can reach.
type HiddenCapacityProber interface {
	HiddenCapacity(ctx context.Context) (HiddenCapacity, error)
}

// probeHidden runs dev's hidden-capacity check into res. The error (a failed check, or hidden
// capacity found) fails the wipe once the erase is over.
func probeHidden(ctx context.Context, dev Device, res *Result) error {
	p, ok := dev.(HiddenCapacityProber)
	if !ok {
		res.HiddenCapacity = HiddenCapacity{Detail: "not checked: the device has no hidden-capacity check"}
		return nil
	}
	h, err := p.HiddenCapacity(ctx)
	if err != nil {
		res.HiddenCapacity = HiddenCapacity{Detail: "check failed: " + err.Error()}
		return fmt.Errorf("checking for capacity the kernel does not show (a wipe that may be partial is not attested): %w", err)
	}
	res.HiddenCapacity = h
	if h.Found {
		return fmt.Errorf("hidden capacity not wiped: %s", h.Detail)
	}
	return nil
}

// ---- ATA ---------------------------------------------------------------------------------

// ataCapacity is what IDENTIFY DEVICE says about the drive's size and the feature sets that
// can hide part of it (ACS-3 §7.12.7; word numbers below).
type ataCapacity struct {
	lba48      bool   // word 83 bit 10: 48-bit Address feature set supported
	hpa        bool   // word 82 bit 10: Host Protected Area feature set supported
	amac       bool   // word 119 bit 8: Accessible Max Address Configuration supported
	dco        bool   // word 83 bit 11: Device Configuration Overlay supported
	accessible uint64 // words 100–103 (48-bit) or 60–61: user-addressable logical sectors
}

// parseATACapacity reads an IDENTIFY DEVICE block (512 bytes, untrusted). Words 82–84 count only
// when word 83 bits 15:14 are 01b, word 119 only when its bits 15:14 are 01b.
func parseATACapacity(id []byte) (ataCapacity, error) {
	if len(id) < 512 {
		return ataCapacity{}, fmt.Errorf("IDENTIFY DEVICE data of %d bytes, want 512", len(id))
	}
	w := func(i int) uint16 { return binary.LittleEndian.Uint16(id[2*i:]) }
	var c ataCapacity
	if w(83)>>14 == 1 {
		c.hpa = w(82)&(1<<10) != 0
		c.lba48 = w(83)&(1<<10) != 0
		c.dco = w(83)&(1<<11) != 0
	}
	if w(119)>>14 == 1 {
		c.amac = w(119)&(1<<8) != 0
	}
	if c.lba48 {
		c.accessible = (uint64(w(100)) | uint64(w(101))<<16 | uint64(w(102))<<32) // 48 bits: word 103 is reserved
	} else {
		c.accessible = uint64(w(60)) | uint64(w(61))<<16
	}
	return c, nil
}

// ataNativeMaxCommand is the command that reads the native max address: GET NATIVE MAX ADDRESS
// EXT (78h, feature 0000h) where AMAC is supported (ACS-3 obsoletes the HPA commands there), else
// READ NATIVE MAX ADDRESS EXT (27h) or, without 48-bit addressing, READ NATIVE MAX ADDRESS (F8h).
// ok is false when the drive has neither feature set: nothing can be hidden that way.
func ataNativeMaxCommand(c ataCapacity) (cmd uint8, feature uint16, ext bool, name string, ok bool) {
	switch {
	case c.amac:
		return 0x78, 0x0000, true, "GET NATIVE MAX ADDRESS EXT", true
	case c.hpa && c.lba48:
		return 0x27, 0, true, "READ NATIVE MAX ADDRESS EXT", true
	case c.hpa:
		return 0xf8, 0, false, "READ NATIVE MAX ADDRESS", true
	}
	return 0, 0, false, "", false
}

// ataRegs are the ATA output registers a pass-through command returns (SAT-3 ATA Status Return
// sense data descriptor).
type ataRegs struct {
	ext    bool // EXTEND: the HOB (48-bit) fields are valid
	error  uint8
	count  uint16
	lba    uint64
	device uint8
	status uint8
}

// parseATAStatusReturn finds the ATA Status Return descriptor (type 09h, additional length 0Ch)
// in descriptor-format sense data (response code 72h/73h) and decodes it. The layout (SAT-3
// §12.2.2.6): byte 2 bit 0 EXTEND, 3 ERROR, 4/5 COUNT 15:8/7:0, 6/7 LBA 31:24/7:0, 8/9 LBA
// 39:32/15:8, 10/11 LBA 47:40/23:16, 12 DEVICE, 13 STATUS. With EXTEND clear (a 28-bit
// command) LBA 27:24 are DEVICE bits 3:0. Untrusted input: every index is bounds-checked.
func parseATAStatusReturn(sense []byte) (ataRegs, bool) {
	if len(sense) < 8 || sense[0]&0x7f != 0x72 && sense[0]&0x7f != 0x73 {
		return ataRegs{}, false
	}
	end := min(len(sense), 8+int(sense[7]))
	for off := 8; off+2 <= end; {
		typ, n := sense[off], int(sense[off+1])
		if off+2+n > end {
			break
		}
		if typ == 0x09 && n >= 0x0c {
			d := sense[off : off+14]
			r := ataRegs{ext: d[2]&1 != 0, error: d[3], device: d[12], status: d[13]}
			r.count = uint16(d[5])
			r.lba = uint64(d[7]) | uint64(d[9])<<8 | uint64(d[11])<<16
			if r.ext {
				r.count |= uint16(d[4]) << 8
				r.lba |= uint64(d[6])<<24 | uint64(d[8])<<32 | uint64(d[10])<<40
			} else {
				r.lba |= uint64(d[12]&0x0f) << 24
			}
			return r, true
		}
		off += 2 + n
	}
	return ataRegs{}, false
}

// parseDCOIdentify reads DEVICE CONFIGURATION IDENTIFY data (B1h/C2h, 512 bytes, untrusted; ATA8-ACS
// §7.10.5): words 3–6 are the largest LBA the drive can be configured to (the factory's max
// address, which an overlay may lower). When bits 7:0 of word 255 are A5h, its bits 15:8 are a
// checksum: the 512 bytes sum to 0 modulo 256.
func parseDCOIdentify(b []byte) (maxLBA uint64, err error) {
	if len(b) < 512 {
		return 0, fmt.Errorf("DEVICE CONFIGURATION IDENTIFY data of %d bytes, want 512", len(b))
	}
	b = b[:512]
	if b[510] == 0xa5 {
		var sum byte
		for _, v := range b {
			sum += v
		}
		if sum != 0 {
			return 0, fmt.Errorf("DEVICE CONFIGURATION IDENTIFY data fails its checksum")
		}
	}
	if rev := binary.LittleEndian.Uint16(b[0:]); rev == 0 {
		return 0, fmt.Errorf("DEVICE CONFIGURATION IDENTIFY data has revision 0 (no overlay data)")
	}
	return binary.LittleEndian.Uint64(b[6:14]) & (1<<48 - 1), nil
}

// ataProbe is what the ramdisk read from an ATA drive about its size.
type ataProbe struct {
	kernelSectors uint64      // the size the kernel shows, in logical sectors
	id            ataCapacity // IDENTIFY DEVICE
	nativeCmd     string      // what read nativeMax; "" without the HPA and AMAC feature sets
	nativeMax     uint64      // the native max address (last LBA)
	dcoMax        uint64      // DEVICE CONFIGURATION IDENTIFY's max address, when dcoRead
	dcoRead       bool
	dcoErr        string // why a supported overlay could not be read (reported, not failed)
}

// ataHidden decides whether the drive hides sectors past the end the kernel shows: a host
// protected area (native max address above the kernel's size) or a device configuration overlay
// (the factory max address above the native one). Pure.
func ataHidden(p ataProbe) HiddenCapacity {
	native := p.kernelSectors
	what := fmt.Sprintf("none: the ATA drive has no Host Protected Area or Accessible Max Address feature set (%d sectors)", native)
	if p.nativeCmd != "" {
		native = p.nativeMax + 1
		what = fmt.Sprintf("none: %s = the %d sectors the kernel shows", p.nativeCmd, native)
		if native < p.kernelSectors {
			return HiddenCapacity{Checked: true, Found: true, Detail: fmt.Sprintf(
				"ATA drive answers %s with %d sectors, fewer than the %d the kernel shows: its capacity cannot be trusted", p.nativeCmd, native, p.kernelSectors)}
		}
	}
	var found []string
	if native > p.kernelSectors {
		found = append(found, fmt.Sprintf(
			"ATA host protected area: %s says the drive has %d sectors, the kernel shows %d (IDENTIFY: %d): the last %d sectors were not wiped. "+
				"Boot the ramdisk with libata.ignore_hpa=1 (its boot entry does) so that libata removes the area, or remove it with hdparm -N p%d; "+
				"if it stays, the firmware froze the max address (SET MAX FREEZE LOCK): boot without the firmware doing so and wipe again",
			p.nativeCmd, native, p.kernelSectors, p.id.accessible, native-p.kernelSectors, native))
	}
	dco := ""
	switch {
	case p.dcoRead && p.dcoMax+1 > native:
		found = append(found, fmt.Sprintf(
			"ATA device configuration overlay: the drive can hold %d sectors, the overlay limits it to %d: %d more sectors were not wiped. "+
				"Only DEVICE CONFIGURATION RESTORE removes it (hdparm --dco-restore: it also turns back on every feature the overlay turned off, "+
				"and the drive refuses it once the firmware froze the overlay); the ramdisk does not do that: restore it, power-cycle and wipe again",
			p.dcoMax+1, native, p.dcoMax+1-native))
	case p.dcoRead:
		dco = "; device configuration overlay: none (its max address is the native one)"
	case p.id.dco:
		dco = "; the drive supports a device configuration overlay, which could not be read (" + p.dcoErr + "): not checked"
	}
	if len(found) > 0 {
		return HiddenCapacity{Checked: true, Found: true, Detail: strings.Join(found, "; ")}
	}
	return HiddenCapacity{Checked: true, Detail: what + dco}
}

// ---- NVMe --------------------------------------------------------------------------------

// NVMe Identify (admin opcode 06h) CNS values (NVM Express Base Specification 2.0, Figure 273).
const (
	nvmeCNSController      = 0x01 // Identify Controller data structure
	nvmeCNSActiveNSList    = 0x02 // active namespace ID list
	nvmeCNSAllocatedNSList = 0x10 // allocated namespace ID list (namespace management)
	nvmeIdentifySize       = 4096
	nvmeNSListEntries      = nvmeIdentifySize / 4
	// nvmeMaxNSListPages bounds the paging through a namespace ID list (1024 IDs a page).
	nvmeMaxNSListPages = 1024
)

// NVMeAdmin sends Identify to one NVMe controller: NVME_IOCTL_ADMIN_CMD on its character
// device /dev/nvmeN (in Linux: struct nvme_passthru_cmd of include/uapi/linux/nvme_ioctl.h,
// opcode 06h, nsid, CDW10 = CNS). buf is the 4096-byte data buffer the controller fills.
type NVMeAdmin interface {
	Identify(ctx context.Context, cns uint8, nsid uint32, buf []byte) error
}

// uint128 is a 16-byte little-endian NVMe capacity (TNVMCAP, UNVMCAP), in bytes.
type uint128 struct{ hi, lo uint64 }

func (u uint128) isZero() bool { return u.hi == 0 && u.lo == 0 }

func (u uint128) String() string {
	if u.hi == 0 {
		return strconv.FormatUint(u.lo, 10)
	}
	v := new(big.Int).Lsh(new(big.Int).SetUint64(u.hi), 64)
	return v.Or(v, new(big.Int).SetUint64(u.lo)).String()
}

// NVMeControllerID is what the wipe reads from Identify Controller. Offsets are those of struct
// nvme_id_ctrl in Linux's include/linux/nvme.h (and nvme-cli's libnvme types.h), the same as
// the NVMe Base Specification's Figure 275: OACS at bytes 257:256, TNVMCAP 295:280, UNVMCAP
// 311:296, NN 519:516, SUBNQN 1023:768.
type NVMeControllerID struct {
	NSManagement bool    // OACS bit 3: Namespace Management and Attachment commands supported
	TNVMCAP      uint128 // total NVM capacity, bytes
	UNVMCAP      uint128 // NVM capacity allocated to no namespace, bytes
	NN           uint32  // the largest namespace ID the controller supports
	SubNQN       string  // NVM subsystem NQN (NUL-padded; may be empty before NVMe 1.2.1)
}

// parseNVMeIDCtrl decodes Identify Controller data (untrusted: from a device). It must be the
// full 4096 bytes the command transfers.
func parseNVMeIDCtrl(b []byte) (NVMeControllerID, error) {
	if len(b) != nvmeIdentifySize {
		return NVMeControllerID{}, fmt.Errorf("identify controller data of %d bytes, want %d", len(b), nvmeIdentifySize)
	}
	le := binary.LittleEndian
	id := NVMeControllerID{
		NSManagement: le.Uint16(b[256:258])&(1<<3) != 0,
		TNVMCAP:      uint128{lo: le.Uint64(b[280:288]), hi: le.Uint64(b[288:296])},
		UNVMCAP:      uint128{lo: le.Uint64(b[296:304]), hi: le.Uint64(b[304:312])},
		NN:           le.Uint32(b[516:520]),
	}
	nqn := b[768:1024]
	if i := slices.Index(nqn, 0); i >= 0 {
		nqn = nqn[:i]
	}
	id.SubNQN = strings.TrimSpace(strings.ToValidUTF8(string(nqn), "?"))
	return id, nil
}

// parseNVMeNSList decodes one page of a namespace ID list (CNS 02h or 10h, untrusted): up to
// 1024 little-endian NSIDs greater than after, in increasing order, the unused entries zero.
// full reports that all 1024 entries are used (more may follow: ask again after the last).
func parseNVMeNSList(b []byte, after uint32) (ids []uint32, full bool, err error) {
	if len(b) != nvmeIdentifySize {
		return nil, false, fmt.Errorf("namespace list of %d bytes, want %d", len(b), nvmeIdentifySize)
	}
	prev := after
	for i := range nvmeNSListEntries {
		id := binary.LittleEndian.Uint32(b[4*i:])
		if id == 0 {
			for j := i + 1; j < nvmeNSListEntries; j++ {
				if binary.LittleEndian.Uint32(b[4*j:]) != 0 {
					return nil, false, fmt.Errorf("namespace list: entry %d is %d after the list ended at entry %d", j, binary.LittleEndian.Uint32(b[4*j:]), i)
				}
			}
			return ids, false, nil
		}
		if id <= prev || id == 0xffffffff {
			return nil, false, fmt.Errorf("namespace list: entry %d is namespace %d, not above %d (a list is increasing and above the ID asked for)", i, id, prev)
		}
		ids = append(ids, id)
		prev = id
	}
	return ids, true, nil
}

// nvmeNSList reads a whole namespace ID list, page after page.
func nvmeNSList(ctx context.Context, a NVMeAdmin, cns uint8, nn uint32) ([]uint32, error) {
	var all []uint32
	var after uint32
	buf := make([]byte, nvmeIdentifySize)
	for range nvmeMaxNSListPages {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		clear(buf)
		if err := a.Identify(ctx, cns, after, buf); err != nil {
			return nil, fmt.Errorf("identify CNS %02xh after namespace %d: %w", cns, after, err)
		}
		ids, full, err := parseNVMeNSList(buf, after)
		if err != nil {
			return nil, err
		}
		if nn > 0 && len(ids) > 0 && ids[len(ids)-1] > nn {
			return nil, fmt.Errorf("namespace list names namespace %d, above the %d the controller supports (NN)", ids[len(ids)-1], nn)
		}
		all = append(all, ids...)
		if !full {
			return all, nil
		}
		after = ids[len(ids)-1]
	}
	return nil, fmt.Errorf("namespace list longer than %d namespaces", nvmeMaxNSListPages*nvmeNSListEntries)
}

// NVMeController is one NVMe controller as the wipe reads it through its character device,
// whether or not the kernel shows a block device for any of its namespaces.
type NVMeController struct {
	Name      string // kernel name, nvme0
	Subsystem string // the subsystem NQN as sysfs shows it (subsysnqn); "" when unknown
	ID        NVMeControllerID
	Active    []uint32 // active (attached) namespace IDs, CNS 02h
	Allocated []uint32 // allocated namespace IDs, CNS 10h; nil without namespace management
}

// ReadNVMeController reads Identify Controller and the namespace lists of controller name.
func ReadNVMeController(ctx context.Context, name, subsystem string, a NVMeAdmin) (NVMeController, error) {
	buf := make([]byte, nvmeIdentifySize)
	if err := a.Identify(ctx, nvmeCNSController, 0, buf); err != nil {
		return NVMeController{}, fmt.Errorf("identify controller %s: %w", name, err)
	}
	id, err := parseNVMeIDCtrl(buf)
	if err != nil {
		return NVMeController{}, fmt.Errorf("identify controller %s: %w", name, err)
	}
	c := NVMeController{Name: name, Subsystem: subsystem, ID: id}
	if c.Active, err = nvmeNSList(ctx, a, nvmeCNSActiveNSList, id.NN); err != nil {
		return NVMeController{}, fmt.Errorf("active namespaces of %s: %w", name, err)
	}
	if id.NSManagement {
		if c.Allocated, err = nvmeNSList(ctx, a, nvmeCNSAllocatedNSList, id.NN); err != nil {
			return NVMeController{}, fmt.Errorf("allocated namespaces of %s (it supports namespace management): %w", name, err)
		}
	}
	return c, nil
}

// NVMeNamespace is a disk that is an NVMe namespace: which subsystem, which namespace ID.
type NVMeNamespace struct {
	Disk      string // kernel name of the block device, nvme0n1
	Subsystem string // subsysnqn of its controller or multipath head
	NSID      uint32
}

// NVMeInventory is every NVMe controller of the machine and the disks that are namespaces.
type NVMeInventory struct {
	Controllers []NVMeController
	Namespaces  []NVMeNamespace
}

// NVMeFinding is the hidden-capacity verdict for one NVM subsystem (its controllers together:
// a namespace attached to any of them is reachable).
type NVMeFinding struct {
	Subsystem   string
	Controllers []string // names, sorted
	Disks       []string // the disks that are its namespaces, sorted
	Hidden      HiddenCapacity
}

// NVMeHidden decides, per NVM subsystem, whether capacity is out of the wipe's reach. Pure.
func NVMeHidden(inv NVMeInventory) []NVMeFinding {
	type group struct {
		ctrls             []NVMeController
		active, allocated map[uint32]bool
		nsMgmt            bool
		unalloc, total    uint128
		disksByNSID       map[uint32][]string
		disks             []string
	}
	groups := map[string]*group{}
	var keys []string
	key := func(subsys, ctrl string) string { return cmp.Or(subsys, "controller "+ctrl) }
	for _, c := range inv.Controllers {
		k := key(c.Subsystem, c.Name)
		g := groups[k]
		if g == nil {
			g = &group{active: map[uint32]bool{}, allocated: map[uint32]bool{}, disksByNSID: map[uint32][]string{}}
			groups[k] = g
			keys = append(keys, k)
		}
		g.ctrls = append(g.ctrls, c)
		for _, id := range c.Active {
			g.active[id] = true
		}
		if c.ID.NSManagement {
			g.nsMgmt = true
			for _, id := range c.Allocated {
				g.allocated[id] = true
			}
			g.unalloc = maxU128(g.unalloc, c.ID.UNVMCAP)
			g.total = maxU128(g.total, c.ID.TNVMCAP)
		}
	}
	for _, ns := range inv.Namespaces {
		// A namespace of a subsystem none of whose controllers was read cannot be judged: it
		// gets a group of its own, whose verdict says so.
		k := cmp.Or(ns.Subsystem, "disk "+ns.Disk)
		g := groups[k]
		if g == nil {
			g = &group{active: map[uint32]bool{}, allocated: map[uint32]bool{}, disksByNSID: map[uint32][]string{}}
			groups[k] = g
			keys = append(keys, k)
		}
		g.disksByNSID[ns.NSID] = append(g.disksByNSID[ns.NSID], ns.Disk)
		g.disks = append(g.disks, ns.Disk)
	}
	slices.Sort(keys)
	out := make([]NVMeFinding, 0, len(keys))
	for _, k := range keys {
		g := groups[k]
		f := NVMeFinding{Subsystem: k, Disks: slices.Sorted(slices.Values(g.disks))}
		for _, c := range g.ctrls {
			f.Controllers = append(f.Controllers, c.Name)
		}
		slices.Sort(f.Controllers)
		if len(g.ctrls) == 0 {
			f.Hidden = HiddenCapacity{Checked: false, Found: true, Detail: fmt.Sprintf(
				"NVMe namespace(s) %s of %s: no controller of the subsystem could be read, so namespaces and capacity the kernel does not show cannot be ruled out", strings.Join(f.Disks, ", "), k)}
			out = append(out, f)
			continue
		}
		var problems []string
		if ids := missing(g.allocated, g.active); len(ids) > 0 {
			problems = append(problems, fmt.Sprintf(
				"namespace(s) %s are allocated but attached to no controller the kernel sees, so they have no block device and were not wiped: attach them (nvme attach-ns /dev/%s -n <id> -c <controller id>) and wipe again, or delete them (nvme delete-ns /dev/%s -n <id>)",
				joinIDs(ids), f.Controllers[0], f.Controllers[0]))
		}
		wiped := map[uint32]bool{}
		for id := range g.disksByNSID {
			wiped[id] = true
		}
		if ids := missing(g.active, wiped); len(ids) > 0 {
			problems = append(problems, fmt.Sprintf(
				"namespace(s) %s are attached but the kernel shows no usable block device for them (none, or one of size 0: a format it does not support), so they were not wiped: reformat them to a supported LBA format or delete them, and wipe again",
				joinIDs(ids)))
		}
		if ids := missing(wiped, g.active); len(ids) > 0 {
			problems = append(problems, fmt.Sprintf(
				"namespace(s) %s have block devices but the controller does not list them as active: the disks cannot be matched to the controller", joinIDs(ids)))
		}
		if g.nsMgmt && !g.unalloc.isZero() {
			problems = append(problems, fmt.Sprintf(
				"%s bytes of NVM capacity (UNVMCAP, of TNVMCAP %s) are allocated to no namespace and were not wiped: create a namespace over them (nvme create-ns, attach-ns) and wipe again, or sanitize the subsystem (nvme sanitize)",
				g.unalloc, g.total))
		}
		if len(problems) > 0 {
			f.Hidden = HiddenCapacity{Checked: true, Found: true, Detail: fmt.Sprintf("NVMe %s (%s): %s", k, strings.Join(f.Controllers, ", "), strings.Join(problems, "; "))}
		} else {
			mgmt := "namespace management not supported"
			if g.nsMgmt {
				mgmt = fmt.Sprintf("no allocated namespace unattached, unallocated capacity 0 of %s bytes", g.total)
			}
			f.Hidden = HiddenCapacity{Checked: true, Detail: fmt.Sprintf("none: NVMe %s (%s): active namespace(s) %s each wiped as a disk; %s",
				k, strings.Join(f.Controllers, ", "), joinIDs(sortedKeys(g.active)), mgmt)}
		}
		out = append(out, f)
	}
	return out
}

func maxU128(a, b uint128) uint128 {
	if a.hi > b.hi || a.hi == b.hi && a.lo >= b.lo {
		return a
	}
	return b
}

// missing is the sorted IDs of a that are not in b.
func missing(a, b map[uint32]bool) []uint32 {
	var out []uint32
	for id := range a {
		if !b[id] {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func sortedKeys(m map[uint32]bool) []uint32 {
	return missing(m, nil)
}

func joinIDs(ids []uint32) string {
	if len(ids) == 0 {
		return "(none)"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(s, ", ")
}

// NVMeInspector is implemented by Openers that can read every NVMe controller of the machine,
// including those the kernel shows no block device for (LinuxOpener: /sys/class/nvme and the
// controllers' character devices), and say which of disks are NVMe namespaces. WipeAll asks it
// before wiping, and fails the disks of a subsystem that hides capacity (adding a failed Result
// for such a subsystem with no disk at all).
type NVMeInspector interface {
	InspectNVMe(ctx context.Context, disks []inventory.Disk) (NVMeInventory, error)
}
