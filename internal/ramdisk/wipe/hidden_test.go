package wipe

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"bcd/internal/ramdisk/inventory"
)

// ataIdentifyBlock builds IDENTIFY DEVICE data: words 82/83 valid (83 bits 15:14 = 01b), HPA,
// 48-bit and DCO bits as asked, word 119 valid with AMAC as asked, the accessible capacity in
// words 100–103 (48-bit) or 60–61.
func ataIdentifyBlock(hpa, lba48, dco, amac bool, accessible uint64) []byte {
	b := make([]byte, 512)
	put := func(w int, v uint16) { binary.LittleEndian.PutUint16(b[2*w:], v) }
	var w82, w83, w119 uint16 = 0, 1 << 14, 1 << 14
	if hpa {
		w82 |= 1 << 10
	}
	if lba48 {
		w83 |= 1 << 10
	}
	if dco {
		w83 |= 1 << 11
	}
	if amac {
		w119 |= 1 << 8
	}
	put(82, w82)
	put(83, w83)
	put(119, w119)
	if lba48 {
		put(100, uint16(accessible))
		put(101, uint16(accessible>>16))
		put(102, uint16(accessible>>32))
	} else {
		put(60, uint16(accessible))
		put(61, uint16(accessible>>16))
	}
	return b
}

func TestATAHidden(t *testing.T) {
	const disk = 976773168 // a 500 GB drive in 512-byte sectors
	for _, tc := range []struct {
		name       string
		id         []byte
		kernel     uint64
		nativeMax  uint64 // last LBA the drive answers
		wantCmd    uint8
		wantFound  bool
		wantDetail []string
	}{
		{"no HPA feature", ataIdentifyBlock(false, true, false, false, disk), disk, 0, 0, false, []string{"none", "no Host Protected Area"}},
		{"HPA feature, no area", ataIdentifyBlock(true, true, false, false, disk), disk, disk - 1, 0x27, false, []string{"none: READ NATIVE MAX ADDRESS EXT"}},
		{"HPA hides 1 GiB", ataIdentifyBlock(true, true, false, false, disk-2097152), disk - 2097152, disk - 1, 0x27, true,
			[]string{"host protected area", "has 976773168 sectors, the kernel shows 974676016", "last 2097152 sectors", "libata.ignore_hpa=1", "hdparm -N p976773168"}},
		{"AMAC preferred over HPA", ataIdentifyBlock(true, true, false, true, disk-8), disk - 8, disk - 1, 0x78, true, []string{"GET NATIVE MAX ADDRESS EXT", "last 8 sectors"}},
		{"28-bit drive", ataIdentifyBlock(true, false, false, false, 1000), 1000, 1999, 0xf8, true, []string{"READ NATIVE MAX ADDRESS says", "last 1000 sectors"}},
		{"native below the kernel's size", ataIdentifyBlock(true, true, false, false, disk), disk, disk - 11, 0x27, true, []string{"cannot be trusted"}},
		{"DCO unreadable is named, not failed", ataIdentifyBlock(true, true, true, false, disk), disk, disk - 1, 0x27, false, []string{"none", "device configuration overlay, which could not be read (aborted): not checked"}},
		{"words 82-84 invalid", func() []byte { b := ataIdentifyBlock(true, true, false, false, disk); b[2*83+1] = 0xc0; return b }(), disk, 0, 0, false, []string{"none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseATACapacity(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			cmd, _, _, name, ok := ataNativeMaxCommand(c)
			if cmd != tc.wantCmd {
				t.Fatalf("native max command %#x, want %#x", cmd, tc.wantCmd)
			}
			p := ataProbe{kernelSectors: tc.kernel, id: c, nativeMax: tc.nativeMax, dcoErr: "aborted"}
			if ok {
				p.nativeCmd = name
			}
			h := ataHidden(p)
			if !h.Checked || h.Found != tc.wantFound {
				t.Fatalf("%+v, want found=%v", h, tc.wantFound)
			}
			for _, w := range tc.wantDetail {
				if !strings.Contains(h.Detail, w) {
					t.Errorf("detail %q does not say %q", h.Detail, w)
				}
			}
		})
	}
	if _, err := parseATACapacity(make([]byte, 100)); err == nil {
		t.Error("a short IDENTIFY block was accepted")
	}
}

// dcoBlock builds DEVICE CONFIGURATION IDENTIFY data: revision 2, max LBA, checksummed.
func dcoBlock(maxLBA uint64) []byte {
	b := make([]byte, 512)
	binary.LittleEndian.PutUint16(b[0:], 2)
	binary.LittleEndian.PutUint64(b[6:], maxLBA)
	b[510] = 0xa5
	var sum byte
	for _, v := range b[:511] {
		sum += v
	}
	b[511] = -sum
	return b
}

// TestATADeviceConfigurationOverlay: an overlay that lowers the drive below its factory max
// address fails the disk, with or without a host protected area on top; one that does not is
// recorded as none; overlay data that fails its checksum is not trusted.
func TestATADeviceConfigurationOverlay(t *testing.T) {
	const disk = 976773168
	id, _ := parseATACapacity(ataIdentifyBlock(true, true, true, false, disk))
	for _, tc := range []struct {
		name    string
		kernel  uint64
		native  uint64 // sectors
		dcoMax  uint64 // last LBA
		found   bool
		details []string
	}{
		{"no overlay", disk, disk, disk - 1, false, []string{"device configuration overlay: none"}},
		{"overlay hides 1000 sectors", disk - 1000, disk - 1000, disk - 1, true, []string{"device configuration overlay", "can hold 976773168 sectors", "1000 more sectors", "DEVICE CONFIGURATION RESTORE"}},
		{"overlay and a host protected area", disk - 2000, disk - 1000, disk - 1, true, []string{"host protected area", "last 1000 sectors", "device configuration overlay", "1000 more sectors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDCOIdentify(dcoBlock(tc.dcoMax))
			if err != nil || got != tc.dcoMax {
				t.Fatalf("parsed %d %v", got, err)
			}
			h := ataHidden(ataProbe{kernelSectors: tc.kernel, id: id, nativeCmd: "READ NATIVE MAX ADDRESS EXT", nativeMax: tc.native - 1, dcoMax: got, dcoRead: true})
			if h.Found != tc.found {
				t.Fatalf("%+v", h)
			}
			for _, w := range tc.details {
				if !strings.Contains(h.Detail, w) {
					t.Errorf("detail %q does not say %q", h.Detail, w)
				}
			}
		})
	}
	bad := dcoBlock(5)
	bad[100]++
	for name, b := range map[string][]byte{"checksum": bad, "short": make([]byte, 10), "revision 0": make([]byte, 512)} {
		if _, err := parseDCOIdentify(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// statusReturn builds descriptor sense with an ATA Status Return descriptor for lba.
func statusReturn(lba uint64, ext bool, status uint8, before ...byte) []byte {
	d := []byte{0x09, 0x0c, 0, 0, 0, 0, byte(lba >> 24), byte(lba), byte(lba >> 32), byte(lba >> 8), byte(lba >> 40), byte(lba >> 16), 0x40, status}
	if ext {
		d[2] = 1
	} else {
		d[6], d[8], d[10] = 0, 0, 0
		d[12] |= byte(lba>>24) & 0x0f
	}
	descs := append(append([]byte{}, before...), d...)
	return append([]byte{0x72, 0x01, 0x00, 0x1d, 0, 0, 0, byte(len(descs))}, descs...)
}

func TestParseATAStatusReturn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sense   []byte
		ok      bool
		lba     uint64
		wantExt bool
	}{
		{"48-bit", statusReturn(0x123456789abc, true, 0x50), true, 0x123456789abc, true},
		{"28-bit takes LBA 27:24 from DEVICE", statusReturn(0x0abcdef1, false, 0x50), true, 0x0abcdef1, false},
		{"after another descriptor", statusReturn(976773167, true, 0x50, 0x00, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), true, 976773167, true},
		{"fixed format", []byte{0x70, 0, 0x01, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, false, 0, false},
		{"truncated descriptor", statusReturn(1, true, 0x50)[:15], false, 0, false},
		{"length past the buffer", append([]byte{0x72, 0, 0, 0, 0, 0, 0, 200}, 0x09, 0x0c), false, 0, false},
		{"empty", nil, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := parseATAStatusReturn(tc.sense)
			if ok != tc.ok || ok && (r.lba != tc.lba || r.ext != tc.wantExt || r.status != 0x50) {
				t.Fatalf("got %+v %v, want lba %#x ext %v ok %v", r, ok, tc.lba, tc.wantExt, tc.ok)
			}
		})
	}
	cdb := ataRegsPassThrough16(0x78, 0x0000, true)
	if cdb[0] != 0x85 || cdb[1] != 3<<1|1 || cdb[2] != 0x20 || cdb[14] != 0x78 || cdb[13] != 0x40 {
		t.Errorf("GET NATIVE MAX ADDRESS EXT CDB % x", cdb)
	}
}

func FuzzParseATA(f *testing.F) {
	f.Add(statusReturn(976773167, true, 0x50))
	f.Add(statusReturn(5, false, 0x51, 0x02, 0x00))
	f.Add(dcoBlock(976773167))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, err := parseDCOIdentify(b); err == nil && got >= 1<<48 {
			t.Fatalf("DCO max LBA %#x beyond 48 bits", got)
		}
		if _, err := parseATACapacity(b); err != nil && len(b) >= 512 {
			t.Fatalf("IDENTIFY of %d bytes refused: %v", len(b), err)
		}
		r, ok := parseATAStatusReturn(b)
		if ok && !r.ext && r.lba >= 1<<28 {
			t.Fatalf("a 28-bit answer decoded to LBA %#x", r.lba)
		}
	})
}

// idCtrl builds Identify Controller data at the offsets of struct nvme_id_ctrl.
func idCtrl(nsMgmt bool, tnvmcap, unvmcap uint64, nn uint32, subnqn string) []byte {
	b := make([]byte, nvmeIdentifySize)
	if nsMgmt {
		binary.LittleEndian.PutUint16(b[256:], 1<<3|1<<1) // namespace management, format NVM
	}
	binary.LittleEndian.PutUint64(b[280:], tnvmcap)
	binary.LittleEndian.PutUint64(b[296:], unvmcap)
	binary.LittleEndian.PutUint32(b[516:], nn)
	copy(b[768:], subnqn)
	return b
}

func nsList(ids ...uint32) []byte {
	b := make([]byte, nvmeIdentifySize)
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	return b
}

func TestParseNVMeIDCtrl(t *testing.T) {
	b := idCtrl(true, 1<<40, 1<<30, 128, "nqn.2019-08.org.qemu:subsys0")
	b[304] = 1 // UNVMCAP bit 64
	id, err := parseNVMeIDCtrl(b)
	if err != nil {
		t.Fatal(err)
	}
	want := NVMeControllerID{NSManagement: true, TNVMCAP: uint128{lo: 1 << 40}, UNVMCAP: uint128{hi: 1, lo: 1 << 30}, NN: 128, SubNQN: "nqn.2019-08.org.qemu:subsys0"}
	if id != want {
		t.Fatalf("got %+v, want %+v", id, want)
	}
	if s := id.UNVMCAP.String(); s != "18446744074783293440" {
		t.Errorf("128-bit capacity printed as %s", s)
	}
	for _, n := range []int{0, 1023, 4095, 4097} {
		if _, err := parseNVMeIDCtrl(make([]byte, n)); err == nil {
			t.Errorf("identify data of %d bytes accepted", n)
		}
	}
}

func TestParseNVMeNSList(t *testing.T) {
	full := make([]uint32, nvmeNSListEntries)
	for i := range full {
		full[i] = uint32(i + 1)
	}
	for _, tc := range []struct {
		name     string
		b        []byte
		after    uint32
		want     []uint32
		wantFull bool
		wantErr  string
	}{
		{"empty", nsList(), 0, nil, false, ""},
		{"two", nsList(1, 3), 0, []uint32{1, 3}, false, ""},
		{"full page", nsList(full...), 0, full, true, ""},
		{"not increasing", nsList(3, 2), 0, nil, false, "not above"},
		{"not above the start", nsList(5, 6), 5, nil, false, "not above 5"},
		{"broadcast id", nsList(1, 0xffffffff), 0, nil, false, "not above"},
		{"entry after the end", nsList(1, 0, 4), 0, nil, false, "after the list ended"},
		{"short", make([]byte, 100), 0, nil, false, "want 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids, isFull, err := parseNVMeNSList(tc.b, tc.after)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(ids, tc.want) || isFull != tc.wantFull {
				t.Fatalf("got %v full=%v err %v", ids, isFull, err)
			}
		})
	}
}

func FuzzParseNVMeIdentify(f *testing.F) {
	f.Add(idCtrl(true, 1<<40, 0, 32, "nqn.x"), nsList(1, 2, 7)[:64], uint32(0))
	f.Add(make([]byte, 10), []byte{1, 0, 0, 0}, uint32(1))
	f.Fuzz(func(t *testing.T, ctrl, list []byte, after uint32) {
		_, _ = parseNVMeIDCtrl(ctrl)
		// A list page is 4096 bytes: pad what the fuzzer gives, so the decoder is exercised.
		page := make([]byte, nvmeIdentifySize)
		copy(page, list)
		for _, b := range [][]byte{list, page} {
			ids, full, err := parseNVMeNSList(b, after)
			if err != nil {
				continue
			}
			if len(ids) > nvmeNSListEntries || full && len(ids) != nvmeNSListEntries {
				t.Fatalf("%d ids, full=%v", len(ids), full)
			}
			prev := after
			for _, id := range ids {
				if id <= prev {
					t.Fatalf("ids %v not increasing above %d", ids, after)
				}
				prev = id
			}
		}
	})
}

// fakeNVMe answers Identify from canned data: ctrl for CNS 01h, and per CNS the namespace IDs
// (paged 1024 at a time above the NSID asked, as a controller does).
type fakeNVMe struct {
	ctrl  []byte
	lists map[uint8][]uint32
	err   map[uint8]error
	calls []string
}

func (f *fakeNVMe) Identify(_ context.Context, cns uint8, nsid uint32, buf []byte) error {
	f.calls = append(f.calls, string(rune('0'+cns)))
	if err := f.err[cns]; err != nil {
		return err
	}
	if cns == nvmeCNSController {
		copy(buf, f.ctrl)
		return nil
	}
	var page []uint32
	for _, id := range f.lists[cns] {
		if id > nsid && len(page) < nvmeNSListEntries {
			page = append(page, id)
		}
	}
	copy(buf, nsList(page...))
	return nil
}

func TestReadNVMeController(t *testing.T) {
	many := make([]uint32, 1500) // two pages
	for i := range many {
		many[i] = uint32(2*i + 1)
	}
	t.Run("namespace management, paged lists", func(t *testing.T) {
		f := &fakeNVMe{ctrl: idCtrl(true, 1<<40, 0, 4000, "nqn.a"), lists: map[uint8][]uint32{nvmeCNSActiveNSList: many[:3], nvmeCNSAllocatedNSList: many}}
		c, err := ReadNVMeController(context.Background(), "nvme0", "nqn.a", f)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.Active, many[:3]) || !reflect.DeepEqual(c.Allocated, many) {
			t.Fatalf("active %d allocated %d", len(c.Active), len(c.Allocated))
		}
	})
	t.Run("no namespace management: the allocated list is not asked", func(t *testing.T) {
		f := &fakeNVMe{ctrl: idCtrl(false, 0, 0, 1, ""), lists: map[uint8][]uint32{nvmeCNSActiveNSList: {1}}}
		c, err := ReadNVMeController(context.Background(), "nvme0", "", f)
		if err != nil || c.Allocated != nil || strings.Contains(strings.Join(f.calls, ""), string(rune('0'+nvmeCNSAllocatedNSList))) {
			t.Fatalf("%+v %v calls %v", c, err, f.calls)
		}
	})
	t.Run("namespace above NN", func(t *testing.T) {
		f := &fakeNVMe{ctrl: idCtrl(false, 0, 0, 4, ""), lists: map[uint8][]uint32{nvmeCNSActiveNSList: {1, 9}}}
		if _, err := ReadNVMeController(context.Background(), "nvme0", "", f); err == nil || !strings.Contains(err.Error(), "above the 4") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("allocated list refused", func(t *testing.T) {
		f := &fakeNVMe{ctrl: idCtrl(true, 0, 0, 4, ""), lists: map[uint8][]uint32{nvmeCNSActiveNSList: {1}}, err: map[uint8]error{nvmeCNSAllocatedNSList: ErrNotSupported}}
		if _, err := ReadNVMeController(context.Background(), "nvme0", "", f); err == nil || !strings.Contains(err.Error(), "allocated namespaces of nvme0") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestNVMeHidden(t *testing.T) {
	ctrl := func(name, subsys string, mgmt bool, unvmcap uint64, active, allocated []uint32) NVMeController {
		return NVMeController{Name: name, Subsystem: subsys, ID: NVMeControllerID{NSManagement: mgmt, TNVMCAP: uint128{lo: 1 << 40}, UNVMCAP: uint128{lo: unvmcap}}, Active: active, Allocated: allocated}
	}
	ns := func(disk, subsys string, id uint32) NVMeNamespace {
		return NVMeNamespace{Disk: disk, Subsystem: subsys, NSID: id}
	}
	for _, tc := range []struct {
		name   string
		inv    NVMeInventory
		want   []bool // Found per subsystem, in subsystem order
		detail []string
	}{
		{"one namespace, all wiped", NVMeInventory{[]NVMeController{ctrl("nvme0", "s0", true, 0, []uint32{1}, []uint32{1})}, []NVMeNamespace{ns("nvme0n1", "s0", 1)}},
			[]bool{false}, []string{"none", "active namespace(s) 1 each wiped"}},
		{"no namespace management", NVMeInventory{[]NVMeController{ctrl("nvme0", "s0", false, 5, []uint32{1}, nil)}, []NVMeNamespace{ns("nvme0n1", "s0", 1)}},
			[]bool{false}, []string{"namespace management not supported"}},
		{"detached namespaces", NVMeInventory{[]NVMeController{ctrl("nvme0", "s0", true, 0, []uint32{1}, []uint32{1, 2, 5})}, []NVMeNamespace{ns("nvme0n1", "s0", 1)}},
			[]bool{true}, []string{"namespace(s) 2, 5 are allocated but attached to no controller", "nvme attach-ns /dev/nvme0", "nvme delete-ns"}},
		{"attached to the other controller of the subsystem", NVMeInventory{[]NVMeController{
			ctrl("nvme0", "s0", true, 0, []uint32{1}, []uint32{1, 2}), ctrl("nvme1", "s0", true, 0, []uint32{2}, []uint32{1, 2})},
			[]NVMeNamespace{ns("nvme0n1", "s0", 1), ns("nvme0n2", "s0", 2)}}, []bool{false}, []string{"(nvme0, nvme1)"}},
		{"unallocated capacity", NVMeInventory{[]NVMeController{ctrl("nvme0", "s0", true, 1<<30, []uint32{1}, []uint32{1})}, []NVMeNamespace{ns("nvme0n1", "s0", 1)}},
			[]bool{true}, []string{"1073741824 bytes", "UNVMCAP", "allocated to no namespace"}},
		{"active namespace without a disk", NVMeInventory{[]NVMeController{ctrl("nvme0", "s0", false, 0, []uint32{1, 2}, nil)}, []NVMeNamespace{ns("nvme0n1", "s0", 1)}},
			[]bool{true}, []string{"namespace(s) 2 are attached but the kernel shows no usable block device"}},
		{"controller with no disk at all", NVMeInventory{[]NVMeController{
			ctrl("nvme0", "s0", true, 0, []uint32{1}, []uint32{1}), ctrl("nvme1", "s1", true, 0, nil, []uint32{1})},
			[]NVMeNamespace{ns("nvme0n1", "s0", 1)}}, []bool{false, true}, []string{"s1 (nvme1)", "namespace(s) 1 are allocated but attached to no controller"}},
		{"disk of an unread subsystem", NVMeInventory{nil, []NVMeNamespace{ns("nvme0n1", "s9", 1)}},
			[]bool{true}, []string{"no controller of the subsystem could be read"}},
		{"disk listed but not active", NVMeInventory{[]NVMeController{ctrl("nvme0", "s0", false, 0, []uint32{1}, nil)}, []NVMeNamespace{ns("nvme0n1", "s0", 1), ns("nvme0n2", "s0", 7)}},
			[]bool{true}, []string{"namespace(s) 7 have block devices but the controller does not list them"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NVMeHidden(tc.inv)
			if len(got) != len(tc.want) {
				t.Fatalf("%d findings, want %d: %+v", len(got), len(tc.want), got)
			}
			var all []string
			for i, f := range got {
				if f.Hidden.Found != tc.want[i] {
					t.Errorf("subsystem %s found=%v, want %v: %s", f.Subsystem, f.Hidden.Found, tc.want[i], f.Hidden.Detail)
				}
				all = append(all, f.Hidden.Detail)
			}
			for _, w := range tc.detail {
				if !strings.Contains(strings.Join(all, "\n"), w) {
					t.Errorf("details %q do not say %q", all, w)
				}
			}
		})
	}
}

// TestInspectNVMeSysfs: controllers come from class/nvme (whether or not they have a disk), each
// read through the admin interface; each NVMe disk's namespace ID and subsystem from its sysfs
// directory; a disk whose namespace ID cannot be read fails the inspection.
func TestInspectNVMeSysfs(t *testing.T) {
	sys := t.TempDir()
	write := func(p, v string) {
		t.Helper()
		p = filepath.Join(sys, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("class/nvme/nvme0/subsysnqn", "nqn.a")
	write("class/nvme/nvme1/subsysnqn", "nqn.b")
	write("block/nvme0n1/nsid", "1")
	write("block/nvme0n1/device/subsysnqn", "nqn.a")
	admins := map[string]*fakeNVMe{
		"nvme0": {ctrl: idCtrl(true, 1<<40, 0, 8, "nqn.a"), lists: map[uint8][]uint32{nvmeCNSActiveNSList: {1}, nvmeCNSAllocatedNSList: {1}}},
		"nvme1": {ctrl: idCtrl(true, 1<<40, 0, 8, "nqn.b"), lists: map[uint8][]uint32{nvmeCNSAllocatedNSList: {3}}},
	}
	var closed []string
	open := func(name string) (NVMeAdmin, func() error, error) {
		a, ok := admins[name]
		if !ok {
			return nil, nil, errors.New("no such controller")
		}
		return a, func() error { closed = append(closed, name); return nil }, nil
	}
	disks := []inventory.Disk{{Name: "nvme0n1"}, {Name: "sda"}}
	inv, err := inspectNVMe(context.Background(), sys, disks, open)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Controllers) != 2 || inv.Controllers[1].Subsystem != "nqn.b" || !reflect.DeepEqual(inv.Namespaces, []NVMeNamespace{{Disk: "nvme0n1", Subsystem: "nqn.a", NSID: 1}}) {
		t.Fatalf("%+v", inv)
	}
	if !reflect.DeepEqual(closed, []string{"nvme0", "nvme1"}) {
		t.Errorf("closed %v", closed)
	}
	f := NVMeHidden(inv)
	if len(f) != 2 || f[0].Hidden.Found || !f[1].Hidden.Found || !strings.Contains(f[1].Hidden.Detail, "namespace(s) 3") {
		t.Fatalf("findings %+v", f)
	}

	if _, err := inspectNVMe(context.Background(), sys, []inventory.Disk{{Name: "nvme0n2"}}, open); err == nil || !strings.Contains(err.Error(), "no namespace ID") {
		t.Errorf("a disk without nsid: err %v", err)
	}
	if inv, err := inspectNVMe(context.Background(), t.TempDir(), disks[1:], open); err != nil || len(inv.Controllers) != 0 {
		t.Errorf("no class/nvme (driver not loaded): %+v %v", inv, err)
	}
	admins["nvme1"].err = map[uint8]error{nvmeCNSController: errors.New("I/O error")}
	if _, err := inspectNVMe(context.Background(), sys, disks, open); err == nil || !strings.Contains(err.Error(), "identify controller nvme1") {
		t.Errorf("an unreadable controller: err %v", err)
	}
}

// inspectingOpener is fakeOpener with a canned NVMe inventory.
type inspectingOpener struct {
	fakeOpener
	inv NVMeInventory
	err error
}

func (o inspectingOpener) InspectNVMe(context.Context, []inventory.Disk) (NVMeInventory, error) {
	return o.inv, o.err
}

// TestWipeAllNVMeHidden: the disks of a subsystem that hides capacity are wiped and fail; a
// subsystem with no disk gets a failed Result of its own; a failed inspection fails every disk.
func TestWipeAllNVMeHidden(t *testing.T) {
	disks := []inventory.Disk{{Name: "nvme0n1", Path: "/dev/nvme0n1"}, {Name: "vda", Path: "/dev/vda"}}
	detached := NVMeController{Name: "nvme0", Subsystem: "s0", ID: NVMeControllerID{NSManagement: true}, Active: []uint32{1}, Allocated: []uint32{1, 2}}
	clean := NVMeController{Name: "nvme0", Subsystem: "s0", ID: NVMeControllerID{NSManagement: true}, Active: []uint32{1}, Allocated: []uint32{1}}
	noDisk := NVMeController{Name: "nvme1", Subsystem: "s1", ID: NVMeControllerID{NSManagement: true}, Allocated: []uint32{4}}
	ns := []NVMeNamespace{{Disk: "nvme0n1", Subsystem: "s0", NSID: 1}}
	for _, tc := range []struct {
		name        string
		inv         NVMeInventory
		err         error
		wantPassed  []bool
		wantErr     []string
		wantResults int
	}{
		{"clean", NVMeInventory{[]NVMeController{clean}, ns}, nil, []bool{true, true}, nil, 2},
		{"detached namespace", NVMeInventory{[]NVMeController{detached}, ns}, nil, []bool{false, true}, []string{"nvme0n1", "namespace(s) 2 are allocated"}, 2},
		{"controller without a disk", NVMeInventory{[]NVMeController{clean, noDisk}, ns}, nil, []bool{true, true, false}, []string{"NVMe nvme1", "namespace(s) 4"}, 3},
		{"inspection failed", NVMeInventory{}, errors.New("opening NVMe controller nvme3: permission denied"), []bool{false, false}, []string{"reading the NVMe controllers", "nvme3"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs := fakeOpener{"/dev/nvme0n1": newMemDev(2*mib, 1), "/dev/vda": newMemDev(2*mib, 2)}
			results, err := WipeAll(context.Background(), testLog(), disks, inspectingOpener{devs, tc.inv, tc.err}, Request{Mode: ModeFull, Seed: 3}, nil)
			if len(results) != tc.wantResults {
				t.Fatalf("%d results, want %d: %+v", len(results), tc.wantResults, results)
			}
			for i, want := range tc.wantPassed {
				if results[i].Passed() != want {
					t.Errorf("%s passed=%v, want %v (error %q)", results[i].Device, results[i].Passed(), want, results[i].Error)
				}
			}
			if (err == nil) != (len(tc.wantErr) == 0) {
				t.Fatalf("err %v", err)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err %q does not say %q", err, w)
				}
			}
			for p, d := range devs {
				if !isZero(d.data) {
					t.Errorf("%s was not wiped: hidden capacity must not stop the erase of what the kernel shows", p)
				}
			}
			if tc.err == nil && !results[0].HiddenCapacity.Checked {
				t.Errorf("the NVMe disk's result does not record the check: %+v", results[0].HiddenCapacity)
			}
		})
	}
}

// hiddenDev is a memDev with a hidden-capacity answer.
type hiddenDev struct {
	*memDev
	h   HiddenCapacity
	err error
}

func (d hiddenDev) HiddenCapacity(context.Context) (HiddenCapacity, error) { return d.h, d.err }

// TestWipeHiddenCapacity: a device's hidden capacity (or a check that failed) is recorded, the
// visible part is still erased and read back, and the wipe fails; none found passes.
func TestWipeHiddenCapacity(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       HiddenCapacity
		err     error
		pass    bool
		wantErr string
	}{
		{"none", HiddenCapacity{Checked: true, Detail: "none: READ NATIVE MAX ADDRESS EXT = the 4096 sectors the kernel shows"}, nil, true, ""},
		{"host protected area", HiddenCapacity{Checked: true, Found: true, Detail: "ATA host protected area: the last 8 sectors were not wiped"}, nil, false, "hidden capacity not wiped: ATA host protected area"},
		{"check failed", HiddenCapacity{}, errors.New("READ NATIVE MAX ADDRESS EXT: aborted"), false, "a wipe that may be partial is not attested"},
	} {
		for _, mode := range []Mode{ModeQuick, ModeFull, ModeSecure} {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				d := newMemDev(2*mib, 4)
				res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, hiddenDev{d, tc.h, tc.err}, Request{Mode: mode, Seed: 5}, nil)
				if res.Passed() != tc.pass || (err == nil) != tc.pass {
					t.Fatalf("passed=%v err %v", res.Passed(), err)
				}
				if !tc.pass && !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("err %q does not say %q", err, tc.wantErr)
				}
				if !res.Verification.Passed {
					t.Errorf("the visible part was not erased and read back: %+v", res.Verification)
				}
				if tc.err == nil && res.HiddenCapacity != tc.h {
					t.Errorf("recorded %+v, want %+v", res.HiddenCapacity, tc.h)
				}
				if tc.err != nil && !strings.Contains(res.HiddenCapacity.Detail, "check failed") {
					t.Errorf("recorded %+v", res.HiddenCapacity)
				}
				b, _ := res.CanonicalJSON()
				var back struct {
					HiddenCapacity HiddenCapacity `json:"hiddenCapacity"`
				}
				if err := json.Unmarshal(b, &back); err != nil || back.HiddenCapacity != res.HiddenCapacity {
					t.Errorf("hiddenCapacity not in the signed JSON: %s", b)
				}
			})
		}
	}
}
