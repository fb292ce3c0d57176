package wipe

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
)

// hostCacheDev is a disk behind the host's page cache, as a block device read without O_DIRECT
// is: writes land in the cache (4 KiB pages) and reach the disk on Sync, except those to lost,
// which the disk acknowledges and does not store; reads are served from the cache until
// DropCache empties it.
type hostCacheDev struct {
	mu      sync.Mutex
	disk    []byte
	lost    Extent
	cache   map[int64][]byte // page → contents
	drops   int
	dropErr error
}

const page = 4096

func (d *hostCacheDev) Size() int64 { return int64(len(d.disk)) }

func (d *hostCacheDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off >= d.Size() {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), d.Size()-off))
	for i := 0; i < n; {
		pos := off + int64(i)
		pg := pos / page
		src, ok := d.cache[pg]
		if !ok {
			src = d.disk[pg*page : min(d.Size(), (pg+1)*page)]
		}
		i += copy(p[i:n], src[pos%page:])
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (d *hostCacheDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off%page != 0 || len(p)%page != 0 || off+int64(len(p)) > d.Size() {
		return 0, errors.New("hostCacheDev: unaligned write")
	}
	for i := 0; i < len(p); i += page {
		d.cache[(off+int64(i))/page] = slices.Clone(p[i : i+page])
	}
	return len(p), nil
}

func (d *hostCacheDev) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for pg, c := range d.cache {
		if off := pg * page; off < d.lost.Offset || off >= d.lost.Offset+d.lost.Length {
			copy(d.disk[off:], c)
		}
	}
	return nil
}

func (d *hostCacheDev) DropCache() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dropErr != nil {
		return d.dropErr
	}
	clear(d.cache)
	d.drops++
	return nil
}

// The read-back reads the disk, not the host's cache of what was written: a disk that did not
// store the zeros written to its last MiB (the backup GPT), or to its first, fails it.
func TestReadBackComesFromTheDisk(t *testing.T) {
	const size = 8 * mib
	for _, mode := range []Mode{ModeQuick, ModeFull} {
		for _, tc := range []struct {
			name string
			lost Extent
		}{
			{"disk stores everything", Extent{}},
			{"last MiB lost", Extent{size - mib, mib}},
			{"one page of the backup GPT lost", Extent{size - page, page}},
			{"first MiB lost", Extent{0, mib}},
		} {
			t.Run(string(mode)+"/"+tc.name, func(t *testing.T) {
				d := &hostCacheDev{disk: newMemDev(size, 21).data, lost: tc.lost, cache: map[int64][]byte{}}
				res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: mode, Seed: 3}, nil)
				if d.drops != 1 {
					t.Errorf("the cache was dropped %d times, want once (after the flush, before the read-back)", d.drops)
				}
				if tc.lost.Length == 0 {
					if err != nil || !res.Passed() {
						t.Fatalf("wipe: %v %+v", err, res.Verification)
					}
					return
				}
				v := res.Verification
				if err == nil || res.Passed() || v.Passed || v.FirstNonZero < tc.lost.Offset || v.FirstNonZero >= tc.lost.Offset+tc.lost.Length {
					t.Fatalf("a disk that lost the zeros at %v passed or failed elsewhere: err %v, verification %+v", tc.lost, err, v)
				}
			})
		}
	}
	t.Run("cache cannot be dropped", func(t *testing.T) {
		d := &hostCacheDev{disk: newMemDev(size, 22).data, cache: map[int64][]byte{}, dropErr: errors.New("EINVAL")}
		res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: ModeQuick}, nil)
		if err == nil || res.Passed() || !strings.Contains(res.Verification.Error, "it would read the cache, not the disk") {
			t.Fatalf("err %v, verification %+v", err, res.Verification)
		}
	})
}

// withGPTHeader puts a GPT header (sector size 512) at byte at of d: entries at entLBA, and
// alt as its AlternateLBA.
func withGPTHeader(d []byte, at int64, entLBA, alt uint64, count uint32) {
	h := gptHeader(512, entLBA, count)
	binary.LittleEndian.PutUint64(h[32:], alt)
	clear(d[at : at+512])
	copy(d[at:], h)
}

// Quick mode reads the backup GPT too: partitions only the backup lists (the primary damaged or
// gone: gdisk would restore them from it) get their signatures zeroed, and a stale backup the
// primary names away from the disk's end (a disk that grew keeps its old one where it used to
// end) is zeroed and read back.
func TestQuickBackupGPT(t *testing.T) {
	const size = 200 * mib
	const lbas = size / 512
	t.Run("primary gone", func(t *testing.T) {
		d := newMemDev(size, 12)
		clear(d.data[:mib])
		entries := int64(lbas - 33)
		withGPTHeader(d.data, size-512, uint64(entries), 1, 128)
		clear(d.data[entries*512 : size-512])
		copy(d.data[entries*512:], gptEntry(20*mib/512, 60*mib/512-1))
		copy(d.data[entries*512+128:], gptEntry(150*mib/512, 160*mib/512-1))
		res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: ModeQuick}, nil)
		if err != nil || !res.Passed() {
			t.Fatalf("wipe: %v %+v", err, res)
		}
		for _, e := range []Extent{{20 * mib, mib}, {59 * mib, mib}, {150 * mib, mib}, {159 * mib, mib}} {
			if !slices.Contains(res.Verification.Regions, e) || !isZero(d.data[e.Offset:e.Offset+e.Length]) {
				t.Errorf("region %v of a partition only the backup GPT lists: not zeroed and read back (regions %v)", e, res.Verification.Regions)
			}
		}
		if d.data[40*mib] == 0 {
			t.Error("quick mode zeroed the middle of a partition")
		}
	})
	t.Run("stale backup of a grown disk", func(t *testing.T) {
		d := newMemDev(size, 13)
		d.data[510], d.data[511] = 0x55, 0xaa
		clear(d.data[446:510])
		copy(d.data[446:], mbrEntry(0xee, 1, lbas-1))
		withGPTHeader(d.data, 512, 2, 100*mib/512-1, 128) // the disk ended at 100 MiB
		clear(d.data[1024 : 1024+128*128])
		copy(d.data[1024:], gptEntry(mib/512, 90*mib/512-1))
		withGPTHeader(d.data, 100*mib-512, 100*mib/512-33, 1, 128) // its backup, still there
		res, err := Wipe(context.Background(), testLog(), Identity{Name: "sda"}, d, Request{Mode: ModeQuick}, nil)
		if err != nil || !res.Passed() {
			t.Fatalf("wipe: %v %+v", err, res)
		}
		stale := Extent{99 * mib, mib}
		if !slices.Contains(res.Verification.Regions, stale) || !isZero(d.data[stale.Offset:stale.Offset+stale.Length]) {
			t.Errorf("the old backup GPT at %v was not zeroed and read back (regions %v)", stale, res.Verification.Regions)
		}
		if d.data[95*mib] == 0 {
			t.Error("quick mode zeroed beyond the old backup GPT")
		}
	})
	t.Run("alternate LBA outside the disk", func(t *testing.T) {
		d := newMemDev(4*mib, 14)
		withGPTHeader(d.data, 512, 2, 1<<40, 4)
		regions, err := quickRegions(d)
		if err != nil || !slices.Equal(regions, []Extent{{0, mib}, {3 * mib, mib}}) {
			t.Fatalf("regions %v, err %v", regions, err)
		}
	})
}
