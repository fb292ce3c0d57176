package wipe

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkWipeFull zeroes a 64 MiB file through Open (O_DIRECT) and reads back the samples.
func BenchmarkWipeFull(b *testing.B) {
	path := filepath.Join(b.TempDir(), "disk")
	if err := os.WriteFile(path, newMemDev(64<<20, 1).data, 0o600); err != nil {
		b.Fatal(err)
	}
	benchWipe(b, path)
}

// BenchmarkWipeFullManual is the by-hand comparison with dd if=/dev/zero oflag=direct:
// BCD_BENCH_WIPE names an existing file or block device to zero.
func BenchmarkWipeFullManual(b *testing.B) {
	path := os.Getenv("BCD_BENCH_WIPE")
	if path == "" {
		b.Skip("set BCD_BENCH_WIPE to a file or device to zero")
	}
	benchWipe(b, path)
}

func benchWipe(b *testing.B, path string) {
	for b.Loop() {
		dev, err := Open(path, OpenOptions{})
		if err != nil {
			b.Fatal(err)
		}
		res, err := Wipe(context.Background(), testLog(), Identity{Name: filepath.Base(path)}, dev, Request{Mode: ModeFull}, nil)
		dev.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(res.SizeBytes)
		b.ReportMetric(float64(res.SizeBytes)/float64(max(res.DurationMillis, 1))/1e3, "MB/s")
	}
}
