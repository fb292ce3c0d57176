package image

import (
	"bytes"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// A zstd image whose frames need a window over MaxZstdWindow is refused, saying what to do,
// before the window is allocated; one within it decompresses.
func TestZstdWindowBounded(t *testing.T) {
	body := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(rng.IntN(16))
	}
	for _, tc := range []struct {
		name    string
		window  int
		wantErr string
	}{
		{"default window", 8 << 20, ""},
		{"the bound", MaxZstdWindow, ""},
		{"over the bound", 2 * MaxZstdWindow, "window over 128 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var comp bytes.Buffer
			w, err := zstd.NewWriter(&comp, zstd.WithWindowSize(tc.window))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(body); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			r, done, err := decompressor(bytes.NewReader(comp.Bytes()), CompressionZstd)
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			got, err := io.ReadAll(r)
			switch {
			case tc.wantErr == "" && (err != nil || !bytes.Equal(got, body)):
				t.Fatalf("decompressed %d bytes, %v; want the %d bytes", len(got), err, len(body))
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			}
		})
	}
}
