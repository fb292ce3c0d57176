package image

import (
	"bytes"
	"compress/flate"
	"context"
	"runtime"
	"testing"
)

// compressClusters rewrites the data clusters of a qcow2 made by makeQCOW2Bits(t, img, cb) as
// compressed clusters (raw deflate, as qemu-img convert -c writes them) appended to the file.
func compressClusters(t testing.TB, q, img []byte, cb int) []byte {
	t.Helper()
	cs := 1 << cb
	l2Entries := cs / 8
	x := 62 - (cb - 8) // bits of the host offset in a compressed cluster descriptor
	for c := range (len(img) + cs - 1) / cs {
		at := (4+c/l2Entries)*cs + 8*(c%l2Entries)
		if be.Uint64(q[at:]) == 0 {
			continue
		}
		var buf bytes.Buffer
		fw, err := flate.NewWriter(&buf, flate.BestSpeed)
		if err != nil {
			t.Fatal(err)
		}
		cluster := make([]byte, cs)
		copy(cluster, img[c*cs:min((c+1)*cs, len(img))])
		if _, err := fw.Write(cluster); err != nil {
			t.Fatal(err)
		}
		if err := fw.Close(); err != nil {
			t.Fatal(err)
		}
		off := uint64(len(q))
		sectors := (off+uint64(buf.Len())-1)>>9 - off>>9 // as qemu counts them
		be.PutUint64(q[at:], 1<<62|sectors<<x|off)
		q = append(q, buf.Bytes()...)
	}
	return q
}

// fuzzImage is a small virtual disk with data, zeros and a tail that ends mid-cluster.
func fuzzImage(size int) []byte {
	img := make([]byte, size)
	copy(img, diskImage(size/3, 5))
	copy(img[size/2:], diskImage(size/5, 6))
	img[size-1] = 9
	return img
}

// The qcow2 reader over arbitrary bytes (the conversion that runs once the digest matched):
// never a panic, a write outside the disk, an allocation sized by a header field, or success
// with nothing written. Seeds: valid images with small clusters (the fuzzer is slow on inputs
// past some tens of KiB; 64 KiB clusters are in TestQCOW2HostileHeaders), version 3 headers,
// compressed clusters.
func FuzzQCOW2(f *testing.F) {
	seeds := []struct {
		cb, size   int
		v3, deflat bool
	}{
		{9, 16 << 10, false, false},
		{9, 12 << 10, true, true},
		{10, 20 << 10, false, true},
		{12, 24 << 10, false, false},
		{12, 24 << 10, true, true},
	}
	for _, s := range seeds {
		img := fuzzImage(s.size)
		q := makeQCOW2Bits(f, img, s.cb)
		if s.deflat {
			q = compressClusters(f, q, img, s.cb)
		}
		if s.v3 {
			q = v3(0)(q)
		}
		// The seeds are valid: they convert to their virtual disk.
		target := newMemTarget(2 * mib)
		w := &writer{ctx: context.Background(), target: target}
		if err := convertQCOW2(bytes.NewReader(q), int64(len(q)), int64(len(img)), w, mib); err != nil {
			f.Fatalf("seed %+v: %v", s, err)
		}
		got := append(append([]byte(nil), w.head...), target.b[mib:]...)[:len(img)] // the head is held back
		if i := firstDiff(got, img); i >= 0 {
			f.Fatalf("seed %+v converts wrongly at %d", s, i)
		}
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q []byte) {
		// A small disk and 64 KiB chunks: cheap runs, and chunks that end inside clusters.
		target := newMemTarget(256 << 10)
		w := &writer{ctx: context.Background(), target: target}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := convertQCOW2(bytes.NewReader(q), int64(len(q)), 0, w, 64<<10)
		runtime.ReadMemStats(&after)
		if len(target.bad) > 0 {
			t.Fatalf("wrote outside the disk: %v", target.bad)
		}
		if err == nil && w.written == 0 {
			t.Fatal("converted to nothing without an error")
		}
		// The disk, the head and chunk buffers, a few L2 tables of up to 2 MiB.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64*mib+4*uint64(len(q)) {
			t.Fatalf("allocated %d MiB for a %d-byte qcow2", alloc/mib, len(q))
		}
	})
}
