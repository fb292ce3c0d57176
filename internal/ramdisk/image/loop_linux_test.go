package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"bcd/internal/ramdisk/wipe"

	"golang.org/x/sys/unix"
)

// The ramdisk's real path: HTTP on loopback → zstd → O_DIRECT writes to a loop device; the
// backing file is then compared byte for byte.
func TestFetchToLoopDevice(t *testing.T) {
	requireRoot(t)
	img := diskImage(13*mib+4096, 21)
	backing := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(backing, bytes.Repeat([]byte{0xab}, 16*mib), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := wipe.Open(attachLoop(t, backing), wipe.OpenOptions{})
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

func requireRoot(t *testing.T, tools ...string) {
	t.Helper()
	msg := ""
	if os.Geteuid() != 0 {
		msg = "needs root"
	} else if _, err := os.Stat("/dev/loop-control"); err != nil {
		msg = "needs /dev/loop-control"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil && msg == "" {
			msg = "needs " + tool + ""
		}
	}
	if msg == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", msg)
	}
	t.Skip(msg)
}

// attachLoop attaches backing to a free loop device and returns its path (node created in a
// temp dir when /dev lacks it); detached at cleanup.
func attachLoop(t *testing.T, backing string) string {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	f, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatal(err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(path); err != nil {
			path = filepath.Join(t.TempDir(), fmt.Sprintf("loop%d", n))
			if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
				t.Fatal(err)
			}
		}
		l, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if err := unix.IoctlLoopConfigure(int(l.Fd()), &cfg); errors.Is(err, unix.EBUSY) {
			l.Close()
			continue
		} else if err != nil {
			l.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.IoctlSetInt(int(l.Fd()), unix.LOOP_CLR_FD, 0); l.Close() })
		return path
	}
	t.Fatal("no free loop device")
	return ""
}
