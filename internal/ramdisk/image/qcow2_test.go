package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// makeQCOW2 builds a minimal valid qcow2 (version 2, 64 KiB clusters) of the virtual disk img,
// allocating only the clusters that hold non-zero data. Layout: header, L1, refcount table,
// refcount block, L2 tables, data clusters.
func makeQCOW2(t testing.TB, img []byte) []byte {
	t.Helper()
	return makeQCOW2Bits(t, img, 16)
}

// makeQCOW2Bits is makeQCOW2 with clusters of 1<<cb bytes (cb from 9 to 21, as qemu allows);
// the L1 table and the refcount block must each fit one cluster.
func makeQCOW2Bits(t testing.TB, img []byte, cb int) []byte {
	t.Helper()
	cs := 1 << cb
	vclusters := (len(img) + cs - 1) / cs
	l2Entries := cs / 8
	l2Tables := (vclusters + l2Entries - 1) / l2Entries
	l1Size := l2Tables
	// Host clusters: 0 header, 1 L1, 2 refcount table, 3 refcount block, 4.. L2 tables, then data.
	next := 4 + l2Tables
	out := make([]byte, next*cs)
	l2 := make([]uint64, l2Tables*l2Entries)
	for c := range vclusters {
		chunk := img[c*cs : min((c+1)*cs, len(img))]
		if bytes.Count(chunk, []byte{0}) == len(chunk) {
			continue
		}
		l2[c] = uint64(next*cs) | 1<<63
		data := make([]byte, cs)
		copy(data, chunk)
		out = append(out, data...)
		next++
	}
	be := binary.BigEndian
	h := out[:cs]
	copy(h, "QFI\xfb")
	be.PutUint32(h[4:], 2)           // version
	be.PutUint32(h[20:], uint32(cb)) // cluster bits
	be.PutUint64(h[24:], uint64(len(img)))
	be.PutUint32(h[32:], 0) // no encryption
	be.PutUint32(h[36:], uint32(l1Size))
	be.PutUint64(h[40:], uint64(cs))   // L1
	be.PutUint64(h[48:], uint64(2*cs)) // refcount table
	be.PutUint32(h[56:], 1)            // refcount table clusters
	for i := range l2Tables {
		be.PutUint64(out[cs+8*i:], uint64((4+i)*cs)|1<<63)
		for j := range l2Entries {
			be.PutUint64(out[(4+i)*cs+8*j:], l2[i*l2Entries+j])
		}
	}
	be.PutUint64(out[2*cs:], uint64(3*cs)) // refcount block
	for c := range next {                  // 16-bit refcounts of 1 for every host cluster
		be.PutUint16(out[3*cs+2*c:], 1)
	}
	return out
}

func qcowImage() []byte {
	img := make([]byte, 4<<20+4096) // not a multiple of the cluster size
	copy(img, diskImage(200<<10, 11))
	copy(img[2<<20:], diskImage(70<<10, 12))
	copy(img[len(img)-100:], bytes.Repeat([]byte{7}, 100))
	return img
}

func TestFetchQCOW2(t *testing.T) {
	img := qcowImage()
	q := makeQCOW2(t, img)
	for _, c := range []Compression{CompressionNone, CompressionGzip, CompressionZstd} {
		t.Run(string(c), func(t *testing.T) {
			art := compress(t, c, q)
			target := newTarget(t, 8<<20) // pre-filled with 0xff: zero clusters must be written
			// Progress: the staging first (the artifact unpacked, up to its bound), then the
			// writing, each growing, and nothing written before the staging is done.
			var staged, written int64
			res, err := Fetch(context.Background(), testLog(), Spec{
				URL: serve(t, art).URL, Format: FormatQCOW2, Compression: c, SHA256: sha256Hex(art), Size: int64(len(img)),
			}, target, Options{TempDir: t.TempDir()}, func(stage Stage, done, total int64, rate float64) {
				switch {
				case stage == Staging && written == 0 && done > staged && total >= int64(len(q)) && rate > 0:
					staged = done
				case stage == Writing && done > written && total == int64(len(img)):
					written = done
				default:
					t.Errorf("progress %s %d/%d at %f after staging %d, writing %d", stage, done, total, rate, staged, written)
				}
			})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if staged != int64(len(q)) || written != int64(len(img)) {
				t.Errorf("progress ended at staging %d (qcow2 of %d bytes), writing %d (image of %d)", staged, len(q), written, len(img))
			}
			got := target.bytes(t)
			if !bytes.Equal(got[:len(img)], img) {
				for i := range img {
					if got[i] != img[i] {
						t.Fatalf("target differs from the virtual disk at %d", i)
					}
				}
			}
			if res.BytesWritten != int64(len(img)) || res.BytesRead != int64(len(art)) {
				t.Errorf("result %+v", res)
			}
		})
	}
}

// Cross-check the generator with qemu-img (Debian qemu-utils) when it is installed.
func TestQCOW2FixtureMatchesQemuImg(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed (Debian package qemu-utils)")
	}
	dir := t.TempDir()
	img := qcowImage()
	raw, qc := filepath.Join(dir, "a.raw"), filepath.Join(dir, "a.qcow2")
	if err := os.WriteFile(qc, makeQCOW2(t, img), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), qemuImg, "check", qc).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img check: %v\n%s", err, out)
	}
	if out, err := exec.CommandContext(t.Context(), qemuImg, "convert", "-O", "raw", qc, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(raw)
	if !bytes.Equal(got, img) {
		t.Fatal("qemu-img reads the fixture differently")
	}
	// And a qemu-img-made qcow2 (compressed clusters) through our writer.
	if out, err := exec.CommandContext(t.Context(), qemuImg, "convert", "-c", "-O", "qcow2", raw, qc).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert -c: %v\n%s", err, out)
	}
	q, _ := os.ReadFile(qc)
	target := newTarget(t, 8<<20)
	if _, err := Write(context.Background(), testLog(), bytes.NewReader(q), Spec{Format: FormatQCOW2, SHA256: sha256Hex(q)}, target, Options{TempDir: dir}, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(target.bytes(t)[:len(img)], img) {
		t.Fatal("qemu-img's compressed qcow2 converted wrongly")
	}
}

func TestQCOW2Refused(t *testing.T) {
	img := qcowImage()
	q := makeQCOW2(t, img)
	notQcow := diskImage(mib, 3)
	tests := []struct {
		name string
		art  []byte
		spec Spec
	}{
		{"digest mismatch: not converted", q, Spec{Format: FormatQCOW2, SHA256: sha256Hex(img)}},
		{"not a qcow2", notQcow, Spec{Format: FormatQCOW2, SHA256: sha256Hex(notQcow)}},
		{"virtual size mismatch", q, Spec{Format: FormatQCOW2, SHA256: sha256Hex(q), Size: 1 << 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := newTarget(t, 8<<20)
			if _, err := Write(context.Background(), testLog(), bytes.NewReader(tt.art), tt.spec, target, Options{TempDir: t.TempDir()}, nil); err == nil {
				t.Fatal("want error")
			}
			got := target.bytes(t)
			if bytes.ContainsFunc(got[:mib], func(r rune) bool { return r != 0 }) {
				t.Error("first MiB not zeroed")
			}
			if got[2<<20] != 0xff {
				t.Error("an unverified or invalid qcow2 was converted onto the disk")
			}
		})
	}
}
