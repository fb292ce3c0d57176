package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// memTarget is an in-memory disk pre-filled with 0xee that fails any write outside it.
type memTarget struct {
	mu  sync.Mutex
	b   []byte
	bad []string // writes outside the disk
}

func newMemTarget(size int) *memTarget {
	return &memTarget{b: bytes.Repeat([]byte{0xee}, size)}
}

func (m *memTarget) Size() int64 { return int64(len(m.b)) }

func (m *memTarget) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off > int64(len(m.b)) || int64(len(p)) > int64(len(m.b))-off {
		m.bad = append(m.bad, fmt.Sprintf("%d bytes at %d", len(p), off))
		return 0, fmt.Errorf("write of %d bytes at %d outside the %d-byte disk", len(p), off, len(m.b))
	}
	return copy(m.b[off:], p), nil
}

// qcow2Patch edits a qcow2 built by makeQCOW2Bits.
type qcow2Patch func(q []byte) []byte

var be = binary.BigEndian

func put32(off int, v uint32) qcow2Patch {
	return func(q []byte) []byte { be.PutUint32(q[off:], v); return q }
}

func put64(off int, v uint64) qcow2Patch {
	return func(q []byte) []byte { be.PutUint64(q[off:], v); return q }
}

// v3 makes the version 2 header a version 3 one with the given incompatible feature bits.
func v3(incompatible uint64) qcow2Patch {
	return func(q []byte) []byte {
		be.PutUint32(q[4:], 3)
		be.PutUint64(q[72:], incompatible)
		be.PutUint32(q[96:], 4)    // refcount order: 16-bit refcounts
		be.PutUint32(q[100:], 104) // header length
		return q
	}
}

// l2Entry is where makeQCOW2Bits(…, 16) put the L2 entry of virtual cluster c (one L2 table).
func l2Entry(c int) int { return 4<<16 + 8*c }

// A qcow2's tables point anywhere and its header sizes everything: a malformed or hostile one
// (its digest pinned all the same) is refused with an error: no panic, no allocation sized by a
// header field, no byte read from outside the staged file, no write outside the disk.
func TestQCOW2HostileHeaders(t *testing.T) {
	img := qcowImage()
	backing := filepath.Join(t.TempDir(), "backing.raw")
	if err := os.WriteFile(backing, bytes.Repeat([]byte("FROM-THE-RAMDISK"), 1<<18), 0o600); err != nil {
		t.Fatal(err)
	}
	withBacking := func(q []byte) []byte {
		copy(q[1024:], backing)
		be.PutUint64(q[8:], 1024)
		be.PutUint32(q[16:], uint32(len(backing)))
		return q
	}
	tests := []struct {
		name    string
		patches []qcow2Patch
		want    string // in the error
	}{
		{"backing file on the ramdisk", []qcow2Patch{withBacking}, "backing file"},
		{"encrypted (AES)", []qcow2Patch{put32(32, 1)}, "encrypt"},
		{"encrypted (LUKS)", []qcow2Patch{put32(32, 2)}, "encrypt"},
		{"cluster bits 63", []qcow2Patch{put32(20, 63)}, "cluster"},
		{"cluster bits 28: 256 MiB L2 tables", []qcow2Patch{put32(20, 28)}, "cluster"},
		{"cluster bits 8", []qcow2Patch{put32(20, 8)}, "cluster"},
		{"L1 of 64 Mi entries", []qcow2Patch{put32(36, 64<<20)}, "L1"},
		{"L1 of 2^29 entries (size*8 wraps in 32 bits)", []qcow2Patch{put32(36, 1<<29)}, "L1"},
		{"L1 past the end of the file", []qcow2Patch{put64(40, 1<<40)}, "L1"},
		{"L1 offset near 2^64", []qcow2Patch{put64(40, ^uint64(0)&^0xffff)}, "L1"},
		{"L1 offset 0", []qcow2Patch{put64(40, 0)}, "L1"},
		{"virtual size 2^63", []qcow2Patch{put64(24, 1<<63)}, "size"},
		{"virtual size 2^64-1", []qcow2Patch{put64(24, ^uint64(0))}, "size"},
		{"virtual size 0", []qcow2Patch{put64(24, 0)}, "size"},
		{"virtual size larger than the disk", []qcow2Patch{put64(24, 1<<40), put32(36, 2048)}, "does not fit"},
		{"version 1", []qcow2Patch{put32(4, 1)}, "version"},
		{"version 4", []qcow2Patch{put32(4, 4)}, "version"},
		{"marked corrupt", []qcow2Patch{v3(1 << 1)}, "corrupt"},
		{"external data file", []qcow2Patch{v3(1 << 2)}, "external data file"},
		{"unknown incompatible feature", []qcow2Patch{v3(1 << 40)}, "feature"},
		{"zstd clusters (no decompressor)", []qcow2Patch{v3(1 << 3), put32(100, 112), func(q []byte) []byte { q[104] = 1; return q }}, "compression"},
		{"header length past the cluster", []qcow2Patch{v3(0), put32(100, 1<<20)}, "header length"},
		{"L2 table past the end of the file", []qcow2Patch{put64(1<<16, 1<<40|1<<63)}, "L2"},
		{"data cluster past the end of the file", []qcow2Patch{put64(l2Entry(0), 1<<40|1<<63)}, "qcow2"},
		{"compressed cluster of garbage", []qcow2Patch{put64(l2Entry(0), 1<<62|5<<16)}, "qcow2"},
		{"compressed cluster past the end of the file", []qcow2Patch{put64(l2Entry(0), 1<<62|(1<<40))}, "qcow2"},
		{"truncated header", []qcow2Patch{func(q []byte) []byte { return q[:50] }}, "qcow2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := makeQCOW2(t, img)
			for _, p := range tt.patches {
				q = p(q)
			}
			target := newMemTarget(8 << 20)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Write(context.Background(), testLog(), bytes.NewReader(q), Spec{Format: FormatQCOW2, SHA256: sha256Hex(q)},
				target, Options{TempDir: t.TempDir(), ChunkSize: 2 * mib}, nil)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q in it", err, tt.want)
			}
			// Staging, hashing and converting a 4 MiB image take some 30 MiB; a table sized by
			// a header field would take hundreds.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 96*mib {
				t.Errorf("allocated %d MiB", alloc/mib)
			}
			if len(target.bad) > 0 {
				t.Errorf("wrote outside the disk: %v", target.bad)
			}
			if bytes.Contains(target.b, []byte("FROM-THE-RAMDISK")) {
				t.Error("bytes of a file on the ramdisk went to the disk")
			}
			if bytes.ContainsFunc(target.b[:mib], func(r rune) bool { return r != 0 }) {
				t.Error("first MiB not zeroed")
			}
		})
	}
}

// Clusters larger than the gaps between chunk boundaries (2 MiB clusters, 3 MiB chunks): each
// byte of the virtual disk lands on the disk, a data cluster following a zero one included.
func TestQCOW2LargeClustersUnalignedChunks(t *testing.T) {
	img := make([]byte, 6*mib+4096)
	copy(img[4*mib:], diskImage(2*mib, 9)) // clusters 0 and 1 zero, 2 data, 3 a tail of zeros
	img[len(img)-1] = 1
	for _, chunk := range []int{3 * mib, 8 * mib} { // 3 MiB: chunks end mid-cluster
		t.Run(fmt.Sprint(chunk/mib, "MiB"), func(t *testing.T) {
			q := makeQCOW2Bits(t, img, 21)
			target := newMemTarget(8 * mib)
			if _, err := Write(context.Background(), testLog(), bytes.NewReader(q), Spec{Format: FormatQCOW2, SHA256: sha256Hex(q)},
				target, Options{TempDir: t.TempDir(), ChunkSize: chunk}, nil); err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(target.b[:len(img)], img); i >= 0 {
				t.Fatalf("the disk differs from the virtual disk at %d (%d MiB + %d)", i, i/mib, i%mib)
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// Compressed clusters (qemu-img convert -c: how cloud images are published) convert: the qcow2
// reader returns a compressed cluster's last bytes together with io.EOF, which must not end the
// read of a chunk holding more clusters.
func TestQCOW2CompressedClusters(t *testing.T) {
	img := qcowImage()
	for _, cb := range []int{12, 16} {
		t.Run(fmt.Sprint("cluster bits ", cb), func(t *testing.T) {
			q := compressClusters(t, makeQCOW2Bits(t, img, cb), img, cb)
			target := newMemTarget(8 * mib)
			if _, err := Write(context.Background(), testLog(), bytes.NewReader(q), Spec{Format: FormatQCOW2, SHA256: sha256Hex(q), Size: int64(len(img))},
				target, Options{TempDir: t.TempDir()}, nil); err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(target.b[:len(img)], img); i >= 0 {
				t.Fatalf("the disk differs from the virtual disk at %d", i)
			}
		})
	}
}
