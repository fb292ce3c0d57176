package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkImageStream streams a 64 MiB image from a loopback HTTP server to a file, hashing
// and (for zstd) decompressing on the way. The 2 GiB comparison with curl|tee sha256sum|dd is
// in the package README (doc.go).
func BenchmarkImageStream(b *testing.B) {
	img := diskImage(64<<20, 1)
	for _, c := range []Compression{CompressionNone, CompressionZstd} {
		b.Run(string(c), func(b *testing.B) {
			art := compress(b, c, img)
			srv := serve(b, art)
			path := filepath.Join(b.TempDir(), "disk")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				b.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			target := fileTarget{f, int64(len(img)) + 1<<20}
			spec := Spec{URL: srv.URL, Compression: c, SHA256: sha256Hex(art)}
			b.SetBytes(int64(len(img)))
			b.ReportMetric(float64(len(art))/float64(len(img)), "ratio")
			for b.Loop() {
				if _, err := Fetch(context.Background(), testLog(), spec, target, Options{}, nil); err != nil {
					b.Fatal(err)
				}
			}
			_ = bytes.MinRead
		})
	}
}
