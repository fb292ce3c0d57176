package wipe

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"bcd/internal/ramdisk/inventory"
)

func testLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// memDev is an in-memory device with scriptable offload behaviour.
type memDev struct {
	mu         sync.Mutex
	data       []byte
	dropWrites bool
	caps       *Capabilities
	capsErr    error
	offload    map[Method]func(d *memDev) (string, error)
	offloaded  []Method
}

func newMemDev(size int, seed uint64) *memDev {
	d := &memDev{data: make([]byte, size)}
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range min(size, 64<<10) {
		d.data[i] = byte(r.Uint32()) | 1 // never zero
	}
	for n := 64 << 10; n < size; n *= 2 {
		copy(d.data[n:], d.data[:n])
	}
	return d
}

func (d *memDev) Size() int64 { return int64(len(d.data)) }
func (d *memDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off >= int64(len(d.data)) {
		return 0, io.EOF
	}
	n := copy(p, d.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
func (d *memDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off+int64(len(p)) > int64(len(d.data)) {
		return 0, errors.New("write beyond end")
	}
	if !d.dropWrites {
		copy(d.data[off:], p)
	}
	return len(p), nil
}

// offMemDev adds the Offloader interface.
type offMemDev struct{ *memDev }

func (d offMemDev) Capabilities(context.Context) (Capabilities, error) {
	if d.capsErr != nil {
		return Capabilities{}, d.capsErr
	}
	return *d.caps, nil
}
func (d offMemDev) Offload(_ context.Context, m Method) (string, error) {
	d.offloaded = append(d.offloaded, m)
	if f, ok := d.offload[m]; ok {
		return f(d.memDev)
	}
	return "", fmt.Errorf("%s: %w", m, ErrNotSupported)
}

func zeroAll(d *memDev) (string, error) {
	clear(d.data)
	return "", nil
}

func scramble(d *memDev) (string, error) { // crypto erase: new key, data reads as noise
	for i := range d.data {
		d.data[i] = byte(i*7) | 1
	}
	return "sanitize log: completed successfully", nil
}

func isZero(b []byte) bool { return firstNonZero(b) < 0 }

func TestWipeFullAndSecureOnPlainDevice(t *testing.T) {
	for _, mode := range []Mode{ModeFull, ModeSecure} {
		t.Run(string(mode), func(t *testing.T) {
			d := newMemDev(3*mib+4096, 1)
			var last, total int64
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "vdb", Serial: "S1", WWN: "naa.1"}, d, Request{Mode: mode, Seed: 42, Samples: 16},
				func(dev string, done, tot int64) { last, total = done, tot })
			if err != nil {
				t.Fatalf("Wipe: %v", err)
			}
			if !isZero(d.data) {
				t.Fatal("device not all zero")
			}
			if !res.Passed() || res.Method != MethodWriteZeros || res.BytesWritten != d.Size() || last != total || total != d.Size() {
				t.Errorf("result %+v (progress %d/%d)", res, last, total)
			}
			if res.Verification.Seed != 42 || len(res.Verification.Regions) != 18 || res.Verification.FirstNonZero != -1 {
				t.Errorf("verification %+v", res.Verification)
			}
			if res.Device != "vdb" || res.Serial != "S1" || res.WWN != "naa.1" || res.SizeBytes != d.Size() || res.Mode != mode {
				t.Errorf("identity not recorded: %+v", res)
			}
		})
	}
}

func TestWipeQuick(t *testing.T) {
	const size = 200 * mib
	d := newMemDev(size, 2)
	// A GPT with one partition at 2 MiB..100 MiB and an MBR with one at 150 MiB, 10 MiB long.
	copy(d.data[512:], gptHeader(512, 2, 4))
	copy(d.data[2*512:], gptEntry(2*mib/512, 100*mib/512-1))
	d.data[510], d.data[511] = 0x55, 0xaa
	copy(d.data[446:], mbrEntry(0x83, 150*mib/512, 10*mib/512))
	res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: ModeQuick}, nil)
	if err != nil {
		t.Fatalf("Wipe: %v", err)
	}
	want := []Extent{
		{0, mib}, {2 * mib, mib}, {64 * mib, 64 << 10}, {2*mib + 64*mib, 64 << 10}, {100*mib - mib, mib},
		{150 * mib, mib}, {160*mib - mib, mib}, {size - mib, mib},
	}
	if !reflect.DeepEqual(res.Verification.Regions, want) {
		t.Fatalf("regions = %v, want %v", res.Verification.Regions, want)
	}
	var wiped int64
	for _, e := range want {
		if !isZero(d.data[e.Offset : e.Offset+e.Length]) {
			t.Errorf("region %v not zero", e)
		}
		wiped += e.Length
	}
	// Everything else is untouched: quick does not write outside its regions.
	for _, off := range []int64{3 * mib, 50 * mib, 120 * mib, size - mib - 1} {
		if d.data[off] == 0 {
			t.Errorf("byte at %d was zeroed", off)
		}
	}
	if !res.Passed() || res.BytesWritten != wiped || res.Method != MethodQuickZero {
		t.Errorf("result %+v", res)
	}
}

func TestWipeFallsThroughOnlyOnNotSupported(t *testing.T) {
	caps := Capabilities{NVMe: true, NVMeSanitizeCrypto: true, NVMeFormatCrypto: true, SecDiscard: true, Discard: true, ZeroOut: true}
	tests := []struct {
		name       string
		caps       Capabilities
		offload    map[Method]func(*memDev) (string, error)
		wantMethod Method
		wantFill   Method
		wantTried  []Method
		wantErr    string
		wantStatus string
	}{
		{
			name: "sanitize unsupported, format scrambles, zero-out fills",
			caps: caps,
			offload: map[Method]func(*memDev) (string, error){
				MethodNVMeFormatCrypto: scramble, MethodZeroOut: zeroAll,
			},
			wantMethod: MethodNVMeFormatCrypto, wantFill: MethodZeroOut,
			wantTried:  []Method{MethodNVMeSanitizeCrypto, MethodNVMeFormatCrypto, MethodZeroOut},
			wantStatus: "sanitize log: completed successfully",
		},
		{
			name: "crypto erase that reads zero needs no fill",
			caps: func() Capabilities { c := caps; c.ReadsZeroAfterErase = true; return c }(),
			offload: map[Method]func(*memDev) (string, error){
				MethodNVMeSanitizeCrypto: zeroAll,
			},
			wantMethod: MethodNVMeSanitizeCrypto, wantTried: []Method{MethodNVMeSanitizeCrypto},
		},
		{
			name: "device claims zeros but is not: fill anyway",
			caps: func() Capabilities { c := caps; c.ReadsZeroAfterErase = true; return c }(),
			offload: map[Method]func(*memDev) (string, error){
				MethodNVMeSanitizeCrypto: scramble,
			},
			wantMethod: MethodNVMeSanitizeCrypto, wantFill: MethodWriteZeros,
			wantTried:  []Method{MethodNVMeSanitizeCrypto, MethodZeroOut, MethodWriteZeros},
			wantStatus: "sanitize log: completed successfully",
		},
		{
			name:       "nothing offloads: write zeros",
			caps:       caps,
			wantMethod: MethodWriteZeros,
			wantTried:  []Method{MethodNVMeSanitizeCrypto, MethodNVMeFormatCrypto, MethodSecDiscard, MethodZeroOut, MethodWriteZeros},
		},
		{
			name: "a real error stops the plan",
			caps: caps,
			offload: map[Method]func(*memDev) (string, error){
				MethodNVMeSanitizeCrypto: func(*memDev) (string, error) { return "", errors.New("I/O error") },
			},
			wantTried: []Method{MethodNVMeSanitizeCrypto},
			wantErr:   "I/O error",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMemDev(2*mib, 3)
			m.caps, m.offload = &tt.caps, tt.offload
			d := offMemDev{m}
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "nvme0n1"}, d, Request{Mode: ModeSecure, Seed: 7}, nil)
			var tried []Method
			for _, a := range res.Attempts {
				tried = append(tried, a.Method)
				if !a.OK && a.Error == "" {
					t.Errorf("failed attempt without a reason: %+v", a)
				}
			}
			if !slices.Equal(tried, tt.wantTried) {
				t.Errorf("tried %v, want %v", tried, tt.wantTried)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || res.Passed() || res.Error == "" {
					t.Fatalf("want error %q, got %v (result %+v)", tt.wantErr, err, res)
				}
				return
			}
			if err != nil || !res.Passed() || !isZero(m.data) {
				t.Fatalf("err %v, result %+v", err, res)
			}
			if res.Method != tt.wantMethod || res.ZeroFill != tt.wantFill || res.Verification.DeviceStatus != tt.wantStatus {
				t.Errorf("method %s fill %s status %q", res.Method, res.ZeroFill, res.Verification.DeviceStatus)
			}
		})
	}
}

func TestWipeFailsClosed(t *testing.T) {
	t.Run("capabilities unreadable", func(t *testing.T) {
		m := newMemDev(mib, 4)
		m.capsErr = errors.New("identify timed out")
		res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, offMemDev{m}, Request{Mode: ModeQuick}, nil)
		if err == nil || res.Passed() || !strings.Contains(res.Error, "identify timed out") {
			t.Fatalf("err %v result %+v", err, res)
		}
		if isZero(m.data[:4096]) {
			t.Error("wrote to a device it could not classify")
		}
	})
	for _, mode := range []Mode{ModeQuick, ModeFull, ModeSecure} {
		t.Run("dropped writes "+string(mode), func(t *testing.T) {
			m := newMemDev(2*mib, 5)
			m.dropWrites = true
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "sdb"}, m, Request{Mode: mode, Seed: 1}, nil)
			if err == nil || res.Passed() || res.Verification.Passed || res.Verification.AllZero {
				t.Fatalf("a device that drops writes passed: err %v, %+v", err, res.Verification)
			}
			if res.Verification.FirstNonZero != 0 || !strings.Contains(res.Verification.Error, "non-zero byte at offset 0") {
				t.Errorf("verification %+v", res.Verification)
			}
		})
	}
	t.Run("bad mode", func(t *testing.T) {
		if _, err := Wipe(context.Background(), testLog(), Identity{}, newMemDev(mib, 6), Request{Mode: "fast"}, nil); err == nil {
			t.Fatal("want error")
		}
	})
	t.Run("zero size", func(t *testing.T) {
		if _, err := Wipe(context.Background(), testLog(), Identity{}, &memDev{}, Request{Mode: ModeFull}, nil); err == nil {
			t.Fatal("want error")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := Wipe(ctx, testLog(), Identity{}, newMemDev(mib, 7), Request{Mode: ModeFull}, nil)
		if !errors.Is(err, context.Canceled) || res.Passed() {
			t.Fatalf("err %v", err)
		}
	})
}

type fakeOpener map[string]*memDev

func (f fakeOpener) Open(_ context.Context, path string) (OpenedDevice, error) {
	d, ok := f[path]
	if !ok {
		return nil, fmt.Errorf("open %s: no such device", path)
	}
	return nopCloser{d}, nil
}

type nopCloser struct{ *memDev }

func (nopCloser) Close() error { return nil }

func TestWipeAllRecordsEveryDisk(t *testing.T) {
	good := newMemDev(2*mib, 8)
	disks := []inventory.Disk{
		{Name: "vda", Path: "/dev/vda", Serial: "A", SizeBytes: 2 * mib},
		{Name: "vdb", Path: "/dev/vdb", Serial: "B", SizeBytes: 4 * mib},
	}
	results, err := WipeAll(context.Background(), testLog(), disks, fakeOpener{"/dev/vda": good}, Request{Mode: ModeFull, Seed: 9}, nil)
	if err == nil || !strings.Contains(err.Error(), "vdb") {
		t.Fatalf("err = %v, want failure naming vdb", err)
	}
	if len(results) != 2 || !results[0].Passed() || results[1].Passed() || results[1].Serial != "B" || results[1].SizeBytes != 4*mib {
		t.Fatalf("results %+v", results)
	}
	if !isZero(good.data) {
		t.Error("the openable disk was not wiped")
	}
}

func TestResultCanonicalJSON(t *testing.T) {
	d := newMemDev(2*mib, 9)
	res, err := Wipe(context.Background(), testLog(), Identity{Name: "vda", Serial: "S", WWN: "W"}, d, Request{Mode: ModeFull, Seed: 1 << 60}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := res.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(a, &back); err != nil {
		t.Fatal(err)
	}
	b, _ := back.CanonicalJSON()
	if !bytes.Equal(a, b) {
		t.Errorf("round trip changed the bytes:\n%s\n%s", a, b)
	}
	if !strings.Contains(string(a), `"seed":"1152921504606846976"`) {
		t.Errorf("seed not a JSON string (JS clients lose 64-bit precision): %s", a)
	}
	if !strings.HasPrefix(string(a), `{"device":"vda","serial":"S","wwn":"W","sizeBytes":2097152,"mode":"full",`) {
		t.Errorf("field order changed: %s", a)
	}
	empty, _ := Result{}.CanonicalJSON()
	if !strings.Contains(string(empty), `"attempts":[]`) || !strings.Contains(string(empty), `"regions":[]`) {
		t.Errorf("nil slices must encode as []: %s", empty)
	}
}

// Files are the unit-test stand-in for disks: wipe one, then check it with an independent read.
func TestWipeRegularFile(t *testing.T) {
	for _, mode := range []Mode{ModeQuick, ModeFull, ModeSecure} {
		t.Run(string(mode), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "disk.img")
			src := newMemDev(5*mib, 10)
			if err := os.WriteFile(path, src.data, 0o600); err != nil {
				t.Fatal(err)
			}
			dev, err := Open(path, OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "disk.img"}, dev, Request{Mode: mode}, nil)
			if cerr := dev.Close(); cerr != nil {
				t.Fatal(cerr)
			}
			if err != nil || !res.Passed() {
				t.Fatalf("err %v result %+v", err, res)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			switch mode {
			case ModeQuick:
				if !isZero(got[:mib]) || !isZero(got[len(got)-mib:]) || isZero(got[2*mib:3*mib]) {
					t.Error("quick wipe regions wrong")
				}
			default:
				if i := firstNonZero(got); i >= 0 {
					t.Errorf("non-zero byte at %d after %s wipe", i, mode)
				}
			}
		})
	}
}

func TestQuickRegions(t *testing.T) {
	tests := []struct {
		name  string
		size  int64
		parts []Extent
		want  []Extent
	}{
		{"tiny disk", 100 << 10, nil, []Extent{{0, 100 << 10}}},
		{"two MiB", 2 * mib, nil, []Extent{{0, 2 * mib}}},
		{"unaligned size", 10*mib + 512, nil, []Extent{{0, mib}, {9*mib + 0, mib + 512}}},
		{"btrfs mirror", 300 * mib, nil, []Extent{{0, mib}, {64 * mib, 64 << 10}, {299 * mib, mib}}},
		{"partition beyond end ignored", 10 * mib, []Extent{{20 * mib, mib}}, []Extent{{0, mib}, {9 * mib, mib}}},
		{"partition clipped", 10 * mib, []Extent{{4 * mib, 100 * mib}}, []Extent{{0, mib}, {4 * mib, mib}, {9 * mib, mib}}},
		{"small partition", 10 * mib, []Extent{{4 * mib, 4096}}, []Extent{{0, mib}, {3*mib + 4096, mib - 4096 + 4096}, {9 * mib, mib}}},
		// btrfs keeps its mirrors at 64 MiB and 256 GiB of the device it lives on: a partition's
		// are that far from the partition's start.
		{"btrfs mirrors of a partition", 400 * mib, []Extent{{mib, 300 * mib}},
			[]Extent{{0, 2 * mib}, {64 * mib, 64 << 10}, {65 * mib, 64 << 10}, {300 * mib, mib}, {399 * mib, mib}}},
		{"btrfs mirrors of a large partition", 600 << 30, []Extent{{mib, 400 << 30}, {400<<30 + mib, 1 << 30}},
			[]Extent{{0, 2 * mib}, {64 * mib, 64 << 10}, {65 * mib, 64 << 10}, {256 << 30, 64 << 10}, {256<<30 + mib, 64 << 10},
				{400 << 30, 2 * mib}, {400<<30 + 64*mib + mib, 64 << 10}, {401 << 30, mib}, {600<<30 - mib, mib}}},
		{"no mirror past a partition's end", 400 * mib, []Extent{{100 * mib, 64 * mib}},
			[]Extent{{0, mib}, {64 * mib, 64 << 10}, {100 * mib, mib}, {163 * mib, mib}, {399 * mib, mib}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := QuickRegions(tt.size, tt.parts)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			for _, e := range got {
				if e.Offset < 0 || e.Offset+e.Length > tt.size {
					t.Errorf("region %v outside the disk", e)
				}
			}
		})
	}
}

func gptHeader(ss int64, entLBA uint64, count uint32) []byte {
	h := make([]byte, 92)
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint64(h[72:], entLBA)
	binary.LittleEndian.PutUint32(h[80:], count)
	binary.LittleEndian.PutUint32(h[84:], 128)
	return h
}

func gptEntry(first, last uint64) []byte {
	e := make([]byte, 128)
	e[0] = 0xaf // non-zero type GUID
	binary.LittleEndian.PutUint64(e[32:], first)
	binary.LittleEndian.PutUint64(e[40:], last)
	return e
}

func mbrEntry(typ byte, lba, n uint32) []byte {
	e := make([]byte, 16)
	e[4] = typ
	binary.LittleEndian.PutUint32(e[8:], lba)
	binary.LittleEndian.PutUint32(e[12:], n)
	return e
}

func TestParsePartitions(t *testing.T) {
	mk := func(f func(b []byte)) []byte { b := make([]byte, mib); f(b); return b }
	tests := []struct {
		name string
		head []byte
		want []Extent
	}{
		{"empty", nil, nil},
		{"zeros", make([]byte, mib), nil},
		{"mbr", mk(func(b []byte) {
			b[510], b[511] = 0x55, 0xaa
			copy(b[446:], mbrEntry(0x83, 2048, 4096))
			copy(b[462:], mbrEntry(0, 9999, 1)) // empty type
		}), []Extent{{2048 * 512, 4096 * 512}, {2048 * 4096, 4096 * 4096}}}, // both sector sizes
		{"mbr extended", mk(func(b []byte) {
			b[510], b[511] = 0x55, 0xaa
			copy(b[446:], mbrEntry(0x05, 20480, 204800))
		}), []Extent{{10 * mib, 100 * mib}, {11 * mib, mib}, {80 * mib, 800 * mib}, {81 * mib, mib}}},
		{"protective mbr + gpt 512", mk(func(b []byte) {
			b[510], b[511] = 0x55, 0xaa
			copy(b[446:], mbrEntry(0xee, 1, 0xffffffff))
			copy(b[512:], gptHeader(512, 2, 128))
			copy(b[1024:], gptEntry(2048, 4095))
			copy(b[1024+128*3:], gptEntry(8192, 8192))
		}), []Extent{{2048 * 512, 2048 * 512}, {8192 * 512, 512}}},
		{"gpt 4k", mk(func(b []byte) {
			copy(b[4096:], gptHeader(4096, 2, 4))
			copy(b[8192:], gptEntry(256, 511))
		}), []Extent{{256 * 4096, 256 * 4096}}},
		{"gpt entries past the buffer", mk(func(b []byte) {
			copy(b[512:], gptHeader(512, 1<<40, 128))
		}), nil},
		{"gpt bad entry size", mk(func(b []byte) {
			h := gptHeader(512, 2, 4)
			binary.LittleEndian.PutUint32(h[84:], 16)
			copy(b[512:], h)
		}), nil},
		{"gpt last before first", mk(func(b []byte) {
			copy(b[512:], gptHeader(512, 2, 4))
			copy(b[1024:], gptEntry(100, 50))
		}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParsePartitions(tt.head); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func FuzzParsePartitions(f *testing.F) {
	f.Add(make([]byte, 2048))
	b := make([]byte, 4096)
	copy(b[512:], gptHeader(512, 2, 16))
	copy(b[1024:], gptEntry(34, 100))
	f.Add(b)
	f.Fuzz(func(t *testing.T, head []byte) {
		for _, p := range ParsePartitions(head) {
			if p.Offset < 0 || p.Length <= 0 {
				t.Fatalf("bad extent %v", p)
			}
			_ = QuickRegions(1<<30, []Extent{p})
		}
	})
}

func TestSampleRegionsSeeded(t *testing.T) {
	a := sampleRegions(1<<30, 5, 32, 64<<10)
	b := sampleRegions(1<<30, 5, 32, 64<<10)
	c := sampleRegions(1<<30, 6, 32, 64<<10)
	if !reflect.DeepEqual(a, b) || reflect.DeepEqual(a, c) || len(a) != 34 {
		t.Fatalf("samples not reproducible from the seed")
	}
	for _, e := range a {
		if e.Offset%(64<<10) != 0 || e.Offset+e.Length > 1<<30 {
			t.Errorf("bad sample %v", e)
		}
	}
	if got := sampleRegions(1000, 1, 4, 64<<10); !reflect.DeepEqual(got, []Extent{{0, 1000}}) {
		t.Errorf("tiny device: %v", got)
	}
}

func TestAlignedBuffer(t *testing.T) {
	for _, n := range []int{1, 512, 4096, 8 << 20} {
		b := AlignedBuffer(n)
		if len(b) != n || uintptrOf(b)%4096 != 0 {
			t.Errorf("AlignedBuffer(%d): len %d addr %% 4096 = %d", n, len(b), uintptrOf(b)%4096)
		}
	}
}

func TestFirstNonZero(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 100} {
		b := make([]byte, n)
		if firstNonZero(b) != -1 {
			t.Errorf("zeros of %d", n)
		}
		for i := range n {
			b[i] = 1
			if got := firstNonZero(b); got != i {
				t.Errorf("n=%d i=%d got %d", n, i, got)
			}
			b[i] = 0
		}
	}
}

// cacheDev models a disk with a volatile write cache: writes land in the cache, reads are
// served from the cache, and only Sync (fsync on a block device: write back the page cache and
// send FLUSH) makes them durable. A hard power-off loses the cache.
type cacheDev struct {
	mu             sync.Mutex
	media          []byte
	cache          map[int64]byte
	syncErr        error
	syncs          int
	readsAfterSync int // reads since the last successful Sync
}

func (d *cacheDev) Size() int64 { return int64(len(d.media)) }
func (d *cacheDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range p {
		if b, ok := d.cache[off+int64(i)]; ok {
			p[i] = b
		} else {
			p[i] = d.media[off+int64(i)]
		}
	}
	d.readsAfterSync++
	return len(p), nil
}
func (d *cacheDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, b := range p {
		d.cache[off+int64(i)] = b
	}
	return len(p), nil
}
func (d *cacheDev) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.syncErr != nil {
		return d.syncErr
	}
	for o, b := range d.cache {
		d.media[o] = b
	}
	clear(d.cache)
	d.syncs++
	d.readsAfterSync = 0
	return nil
}
func (d *cacheDev) powerLoss() { d.mu.Lock(); clear(d.cache); d.mu.Unlock() }

// The erase is flushed to the media before the read-back (a release hard-powers the machine off
// afterwards), and a failed flush fails the wipe.
func TestWipeFlushesWriteCache(t *testing.T) {
	for _, mode := range []Mode{ModeQuick, ModeFull, ModeSecure} {
		t.Run(string(mode), func(t *testing.T) {
			d := &cacheDev{media: newMemDev(4*mib, 3).data, cache: map[int64]byte{}}
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: mode, Seed: 1}, nil)
			if err != nil || !res.Passed() || !res.Flushed {
				t.Fatalf("wipe: %v, passed %t flushed %t", err, res.Passed(), res.Flushed)
			}
			if d.readsAfterSync == 0 {
				t.Error("the read-back ran before the flush: it read the cache, not the media")
			}
			d.powerLoss()
			if mode == ModeQuick {
				for _, e := range res.Verification.Regions {
					if i := firstNonZero(d.media[e.Offset : e.Offset+e.Length]); i >= 0 {
						t.Fatalf("after a power loss region %v has a non-zero byte at %d", e, e.Offset+int64(i))
					}
				}
				return
			}
			if i := firstNonZero(d.media); i >= 0 {
				t.Fatalf("after a power loss the media has a non-zero byte at %d (%d syncs)", i, d.syncs)
			}
		})
		t.Run(string(mode)+" flush fails", func(t *testing.T) {
			d := &cacheDev{media: newMemDev(4*mib, 3).data, cache: map[int64]byte{}, syncErr: errors.New("FLUSH CACHE: I/O error")}
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: mode, Seed: 1}, nil)
			if err == nil || res.Passed() || res.Flushed || !strings.Contains(err.Error(), "flushing the device's write cache") ||
				!strings.Contains(res.Error, "FLUSH CACHE: I/O error") {
				t.Fatalf("err %v, result passed %t flushed %t error %q", err, res.Passed(), res.Flushed, res.Error)
			}
		})
	}
}

// logicalDisk is a disk with an MBR holding one primary and an extended partition of
// logicals, with sectors of ss bytes: each EBR one MiB before its logical partition.
func logicalDisk(size, ss int64, logical []Extent) *memDev {
	d := newMemDev(int(size), 11)
	sec := func(off int64) uint32 { return uint32(off / ss) }
	mbr := func(at int64) []byte {
		b := d.data[at : at+512]
		b[510], b[511] = 0x55, 0xaa
		clear(b[446:510])
		return b
	}
	ext := logical[0].Offset - mib
	b := mbr(0)
	copy(b[446:], mbrEntry(0x83, sec(mib), sec(4*mib)))
	copy(b[462:], mbrEntry(0x0f, sec(ext), sec(size-ext)))
	for i, l := range logical {
		ebr := l.Offset - mib
		b := mbr(ebr)
		copy(b[446:], mbrEntry(0x83, sec(mib), sec(l.Length)))
		if i+1 < len(logical) {
			copy(b[462:], mbrEntry(0x05, sec(logical[i+1].Offset-mib-ext), sec(logical[i+1].Length+mib)))
		}
	}
	return d
}

// blockSized gives a memDev a logical block size, as a block device has.
type blockSized struct {
	*memDev
	lbs int64
}

func (b blockSized) LogicalBlockSize() int64 { return b.lbs }

// Quick mode finds partitions where they are: MBR LBAs in the disk's own sector size (4Kn
// disks count in 4096-byte sectors) and the logical partitions of an extended partition, whose
// chain of extended boot records lies outside the first MiB.
func TestQuickRegionsFindPartitions(t *testing.T) {
	logical := []Extent{{20 * mib, 30 * mib}, {60 * mib, 10 * mib}, {100 * mib, 50 * mib}}
	tests := []struct {
		name string
		ss   int64
		dev  func(d *memDev) Device
	}{
		{"512-byte sectors, size unknown", 512, func(d *memDev) Device { return d }},
		{"4Kn, size unknown", 4096, func(d *memDev) Device { return d }},
		{"512-byte sectors", 512, func(d *memDev) Device { return blockSized{d, 512} }},
		{"4Kn", 4096, func(d *memDev) Device { return blockSized{d, 4096} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const size = 200 * mib
			m := logicalDisk(size, tt.ss, logical)
			res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, tt.dev(m), Request{Mode: ModeQuick}, nil)
			if err != nil || !res.Passed() {
				t.Fatalf("wipe: %v %+v", err, res)
			}
			for _, p := range append([]Extent{{mib, 4 * mib}}, logical...) {
				for _, off := range []int64{p.Offset, p.Offset + 1024, p.Offset + mib - 1, p.Offset + p.Length - mib, p.Offset + p.Length - 1} {
					if m.data[off] != 0 {
						t.Errorf("partition %v: byte at %d (a signature's place) not zeroed", p, off)
					}
				}
			}
			if m.data[40*mib] == 0 {
				t.Error("quick mode zeroed the middle of a partition")
			}
		})
	}
}

// A chain of extended boot records that loops ends; one that reads fails the wipe.
func TestLogicalPartitionsChainEnds(t *testing.T) {
	d := logicalDisk(64*mib, 512, []Extent{{20 * mib, 10 * mib}})
	ebr := d.data[19*mib : 19*mib+512]
	copy(ebr[462:], mbrEntry(0x05, 0, 1)) // the next EBR is the first one again
	parts, err := logicalPartitions(d, d.data[:mib], []int64{512})
	if err != nil || !reflect.DeepEqual(parts, []Extent{{20 * mib, 10 * mib}}) {
		t.Fatalf("parts %v err %v", parts, err)
	}
	bad := &readErrDev{memDev: d, at: 19 * mib}
	if _, err := quickRegions(bad); err == nil || !strings.Contains(err.Error(), "extended boot record") {
		t.Fatalf("err = %v", err)
	}
}

type readErrDev struct {
	*memDev
	at int64
}

func (d *readErrDev) ReadAt(p []byte, off int64) (int, error) {
	if off == d.at {
		return 0, errors.New("medium error")
	}
	return d.memDev.ReadAt(p, off)
}

// Whatever a disk holds, reading its partition tables (extended boot record chains included)
// ends, without error, with regions inside the disk.
func FuzzQuickRegionsDevice(f *testing.F) {
	f.Add(logicalDisk(4*mib, 512, []Extent{{2 * mib, mib}}).data[:3*mib], int64(4*mib))
	f.Add(make([]byte, 4096), int64(8192))
	f.Fuzz(func(t *testing.T, disk []byte, size int64) {
		if size < int64(len(disk)) || size <= 0 || size > 1<<34 {
			return
		}
		d := &sparseDev{data: disk, size: size}
		regions, err := quickRegions(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range regions {
			if e.Offset < 0 || e.Length <= 0 || e.Offset+e.Length > size {
				t.Fatalf("region %v outside a disk of %d bytes", e, size)
			}
		}
	})
}

// sparseDev reads data, then zeros up to size.
type sparseDev struct {
	data []byte
	size int64
}

func (d *sparseDev) Size() int64 { return d.size }
func (d *sparseDev) ReadAt(p []byte, off int64) (int, error) {
	if off >= d.size {
		return 0, io.EOF
	}
	clear(p)
	if off < int64(len(d.data)) {
		copy(p, d.data[off:])
	}
	if n := d.size - off; n < int64(len(p)) {
		return int(n), io.EOF
	}
	return len(p), nil
}
func (d *sparseDev) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }
