package configdrive

import (
	"testing"
)

// FuzzFind feeds arbitrary first sectors (what an image wrote) to the partition table parser,
// through Find and Write, with both sector sizes: nothing may panic, and whatever Write accepts
// Find must then find.
func FuzzFind(f *testing.F) {
	const size = 64 * mib
	seed := func(build func(d *memDisk), n int64) {
		d := newMemDisk(size)
		build(d)
		f.Add(d.bytes(0, n))
	}
	seed(func(d *memDisk) {
		writeGPT(f, d, gptSpec{ss: 512, imageSize: 32 * mib, parts: [][2]int64{{2048, 4095}}})
	}, 34*512)
	seed(func(d *memDisk) {
		writeGPT(f, d, gptSpec{ss: 4096, imageSize: 32 * mib, numEntries: 4, parts: [][2]int64{{256, 511}}})
	}, 3*4096)
	seed(func(d *memDisk) { writeMBR(f, d, []mbrEntry{{0x83, 2048, 2048}, {0x0E, 8192, 16384}}) }, 512)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, head []byte) {
		if len(head) > 64<<10 {
			return
		}
		for _, ss := range []int{512, 4096} {
			d := newMemDisk(size)
			d.WriteAt(head, 0)
			Find(d, size, ss)
			res, err := Write(d, size, []File{{Name: "meta-data", Data: []byte("x")}}, Options{SectorSize: ss})
			if err != nil {
				continue
			}
			got, found, err := Find(d, size, ss)
			if err != nil || !found || got.Partition != res.Partition || got.Start != res.Start || got.Size != res.Size {
				t.Fatalf("sector size %d: Write made %+v, Find says %+v %v %v", ss, res, got, found, err)
			}
			if res.Start < 0 || res.Start+res.Size > size {
				t.Fatalf("partition outside the disk: %+v", res)
			}
		}
	})
}
