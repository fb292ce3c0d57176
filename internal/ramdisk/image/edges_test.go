package image

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// An artifact that unpacks to nothing is no OS image, whatever its digest: the deploy fails
// instead of reporting a disk with no partition table as written.
func TestWriteRefusesEmptyImage(t *testing.T) {
	for _, c := range []Compression{CompressionNone, CompressionGzip, CompressionZstd} {
		t.Run(string(c), func(t *testing.T) {
			art := compress(t, c, nil)
			target := newMemTarget(4 * mib)
			res, err := Write(context.Background(), testLog(), bytes.NewReader(art), Spec{Compression: c, SHA256: sha256Hex(art)}, target, Options{}, nil)
			if err == nil || !strings.Contains(err.Error(), "empty") {
				t.Fatalf("err = %v, result %+v: want the empty image refused", err, res)
			}
		})
	}
}

// The disk's last MiB (the old backup GPT; md 1.0 and ZFS labels) goes with its first before
// any image byte lands: a disk that held a GPT does not keep a second copy of the old
// partition table beyond a smaller image, nor after a failed write.
func TestWriteZeroesOldBackupGPT(t *testing.T) {
	img := diskImage(3*mib+512, 4)
	tests := []struct {
		name   string
		digest string
		disk   int
		ok     bool
	}{
		{"written", sha256Hex(img), 8*mib + 4096, true},
		{"digest mismatch", sha256Hex(img[1:]), 8*mib + 4096, false},
		{"image up to the last MiB", sha256Hex(img), 4 * mib, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := newMemTarget(tt.disk)
			copy(target.b[tt.disk-512:], "EFI PART") // the old backup GPT header, in the last LBA
			_, err := Write(context.Background(), testLog(), bytes.NewReader(img), Spec{SHA256: tt.digest}, target, Options{}, nil)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v", err)
			}
			tail := target.b[max(len(img), tt.disk-mib):]
			if bytes.ContainsFunc(tail, func(r rune) bool { return r != 0 }) {
				t.Errorf("the disk's last MiB beyond the image still holds old data")
			}
			if tt.ok && !bytes.Equal(target.b[:len(img)], img) {
				t.Error("the disk does not hold the image")
			}
		})
	}
}

// A write that fails leaves neither of the image's partition tables behind: an image that
// reaches the disk's last MiB puts its backup GPT there (firmware and kernels that find the
// primary GPT gone go to the backup), so the failure zeroes the last MiB as it zeroes the first.
func TestWriteFailureZeroesBothEnds(t *testing.T) {
	const disk = 4 * mib
	img := diskImage(disk, 9)
	copy(img[disk-512:], "EFI PART") // the image's backup GPT header, in its last LBA
	tests := []struct {
		name string
		src  []byte
		spec Spec
	}{
		{"digest mismatch", img, Spec{SHA256: sha256Hex(img[1:])}},
		{"size mismatch", img, Spec{SHA256: sha256Hex(img), Size: disk - 4096}},
		{"digest mismatch, zstd", compress(t, CompressionZstd, img), Spec{Compression: CompressionZstd, SHA256: sha256Hex(img)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := newMemTarget(disk)
			if _, err := Write(context.Background(), testLog(), bytes.NewReader(tt.src), tt.spec, target, Options{}, nil); err == nil {
				t.Fatal("the write succeeded")
			}
			for _, r := range []struct {
				what string
				b    []byte
			}{{"first", target.b[:mib]}, {"last", target.b[disk-mib:]}} {
				if bytes.ContainsFunc(r.b, func(c rune) bool { return c != 0 }) {
					t.Errorf("the disk's %s MiB still holds the unverified image's bytes after the failure", r.what)
				}
			}
		})
	}
}
