package wipe

import (
	"bcd/internal/ramdisk/looptest"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// randomFile writes size bytes of non-zero pseudo-random data to a new file.
func randomFile(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing.img")
	if err := os.WriteFile(path, newMemDev(size, 99).data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestWipeLoopDevice(t *testing.T) {
	looptest.RequireRoot(t)
	const size = 24 * mib
	for _, mode := range []Mode{ModeQuick, ModeFull, ModeSecure} {
		t.Run(string(mode), func(t *testing.T) {
			backing := randomFile(t, size)
			loop := looptest.Attach(t, backing, false)
			dev, err := Open(loop, OpenOptions{})
			if err != nil {
				t.Fatalf("Open %s: %v", loop, err)
			}
			if dev.Size() != size {
				t.Fatalf("loop size %d", dev.Size())
			}
			caps, err := dev.Capabilities(context.Background())
			if err != nil {
				t.Fatalf("Capabilities: %v", err)
			}
			t.Logf("loop capabilities %+v, direct I/O %v", caps, dev.Direct())
			res, err := Wipe(context.Background(), testLog(), Identity{Name: filepath.Base(loop)}, dev, Request{Mode: mode}, nil)
			if cerr := dev.Close(); cerr != nil {
				t.Fatal(cerr)
			}
			if err != nil || !res.Passed() {
				t.Fatalf("err %v result %+v", err, res)
			}
			t.Logf("method %s, attempts %+v", res.Method, res.Attempts)
			if mode == ModeSecure {
				// Loop devices have no secure discard: the attempt must be recorded as not
				// supported and the plan must have moved on.
				for _, a := range res.Attempts {
					if a.Method == MethodSecDiscard && (a.OK || !a.NotSupported) {
						t.Errorf("BLKSECDISCARD on a loop device: %+v", a)
					}
				}
			}
			// Independent check: read the backing file, not the device.
			got, err := os.ReadFile(backing)
			if err != nil {
				t.Fatal(err)
			}
			if mode == ModeQuick {
				if firstNonZero(got[:mib]) >= 0 || firstNonZero(got[size-mib:]) >= 0 || firstNonZero(got[5*mib:6*mib]) < 0 {
					t.Error("quick wipe: wrong regions in the backing file")
				}
				return
			}
			if i := firstNonZero(got); i >= 0 {
				t.Errorf("backing file has a non-zero byte at %d", i)
			}
		})
	}
}

// A mounted (claimed) device must not open: O_EXCL makes the claim visible.
func TestOpenLoopDeviceExclusive(t *testing.T) {
	looptest.RequireRoot(t)
	loop := looptest.Attach(t, randomFile(t, 4*mib), false)
	a, err := Open(loop, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if b, err := Open(loop, OpenOptions{}); err == nil {
		b.Close()
		t.Fatal("second exclusive open succeeded")
	}
}

func TestOffloadOnLoopDevice(t *testing.T) {
	looptest.RequireRoot(t)
	for _, m := range []Method{MethodZeroOut, MethodDiscard} {
		t.Run(string(m), func(t *testing.T) {
			backing := randomFile(t, 8*mib)
			dev, err := Open(looptest.Attach(t, backing, false), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			if _, err := dev.Offload(context.Background(), m); err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			buf := AlignedBuffer(8 * mib)
			if _, err := dev.ReadAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			if i := firstNonZero(buf); i >= 0 {
				t.Errorf("non-zero at %d after %s", i, m)
			}
		})
	}
	t.Run("nvme on a loop device is not supported", func(t *testing.T) {
		dev, err := Open(looptest.Attach(t, randomFile(t, mib), false), OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		if _, err := dev.Offload(context.Background(), MethodNVMeFormatCrypto); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("got %v, want ErrNotSupported", err)
		}
	})
}

func TestOpenRefusesOtherFiles(t *testing.T) {
	if _, err := Open("/dev/null", OpenOptions{}); err == nil {
		t.Error("opened a character device")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing"), OpenOptions{}); err == nil {
		t.Error("opened a missing file")
	}
	f, err := Open(randomFile(t, 4096), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if c, err := f.Capabilities(context.Background()); err != nil || c != (Capabilities{}) {
		t.Errorf("file capabilities %+v %v", c, err)
	}
	if _, err := f.Offload(context.Background(), MethodZeroOut); !errors.Is(err, ErrNotSupported) {
		t.Errorf("file offload: %v", err)
	}
}

func TestNVMeAndATAEncoding(t *testing.T) {
	ctrl, ns := make([]byte, 4096), make([]byte, 4096)
	binary.LittleEndian.PutUint32(ctrl[328:], 0b111)
	ctrl[524] = 0b100
	ns[33] = 0b001
	ns[26] = 0x21 // LBAF 1, high bits 01
	id := parseNVMeIdentify(ctrl, ns)
	if !id.sanitizeCrypto || !id.formatCrypto || !id.deallocReadsZero || id.lbaFormat != 0x11 {
		t.Errorf("identify %+v", id)
	}
	if got := parseNVMeIdentify(make([]byte, 10), nil); got != (nvmeIDInfo{}) {
		t.Errorf("short identify %+v", got)
	}
	if got := nvmeFormatCdw10(0x11); got != 0x1|2<<9|1<<12 {
		t.Errorf("format cdw10 %#x", got)
	}
	if nvmeSanitizeCdw10() != 4 {
		t.Error("sanitize action must be crypto erase (4)")
	}
	sanitize := []struct {
		log          []byte
		done, failed bool
	}{
		{[]byte{0, 0x80, 1, 0}, true, false},
		{[]byte{0, 0x80, 2, 0}, false, false},
		{[]byte{0, 0x80, 3, 0}, false, true},
		{[]byte{0, 0, 0, 0}, false, false},
		{[]byte{1}, false, true},
	}
	for _, s := range sanitize {
		if done, failed, _ := nvmeSanitizeStatus(s.log); done != s.done || failed != s.failed {
			t.Errorf("sanitize log %v: done %v failed %v", s.log, done, failed)
		}
	}
	if unsafeSizeofAdmin() != 72 || unsafeSizeofSG() != 88 {
		t.Errorf("ioctl struct sizes: nvme_admin_cmd %d (want 72), sg_io_hdr %d (want 88)", unsafeSizeofAdmin(), unsafeSizeofSG())
	}

	idb := make([]byte, 512)
	binary.LittleEndian.PutUint16(idb[128*2:], 1|1<<3|1<<5)
	binary.LittleEndian.PutUint16(idb[89*2:], 30)
	binary.LittleEndian.PutUint16(idb[90*2:], 0x8000|5)
	sec := parseATAIdentify(idb)
	if !sec.supported || !sec.frozen || !sec.enhanced || sec.enabled || sec.locked || sec.eraseMinutes != 60 || sec.enhancedMinutes != 10 {
		t.Errorf("ata identify %+v", sec)
	}
	cdb := ataPassThrough16(ataIdentify, ataProtoPIOIn)
	if cdb[0] != 0x85 || cdb[1] != 4<<1 || cdb[2] != 0x0e || cdb[6] != 1 || cdb[14] != 0xec {
		t.Errorf("identify CDB % x", cdb)
	}
	cdb = ataPassThrough16(ataSecurityErasePrep, ataProtoNonData)
	if cdb[1] != 3<<1 || cdb[6] != 0 || cdb[14] != 0xf3 {
		t.Errorf("erase prepare CDB % x", cdb)
	}
	pw := ataPasswordBlock("secret", true)
	if len(pw) != 512 || pw[0] != 2 || string(pw[2:8]) != "secret" || pw[8] != 0 {
		t.Errorf("password block % x", pw[:12])
	}
}
