package image

import (
	"bcd/internal/ramdisk/looptest"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"bcd/internal/ramdisk/wipe"
)

// The ramdisk's real path: HTTP on loopback → zstd → O_DIRECT writes to a loop device; the
// backing file is then compared byte for byte.
func TestFetchToLoopDevice(t *testing.T) {
	looptest.RequireRoot(t)
	img := diskImage(13*mib+4096, 21)
	backing := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(backing, bytes.Repeat([]byte{0xab}, 16*mib), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := wipe.Open(looptest.Attach(t, backing, false), wipe.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	art := compress(t, CompressionZstd, img)
	_, err = Fetch(context.Background(), testLog(), Spec{URL: serve(t, art).URL, Compression: CompressionZstd, SHA256: sha256Hex(art), Size: int64(len(img))}, dev, Options{}, nil)
	if cerr := dev.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(backing)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:len(img)], img) || got[len(img)] != 0xab {
		t.Fatal("loop device contents differ from the image")
	}
}
