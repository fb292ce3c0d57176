package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/lima-vm/go-qcow2reader"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"
)

// writeQCOW2 stages the artifact in a temp file (decompressing it if needed), checks the digest
// of the bytes as published, and only then converts the qcow2 onto the target.
func writeQCOW2(ctx context.Context, log *slog.Logger, src io.Reader, spec Spec, hashed *asyncHasher, want []byte, w *writer, opts Options) error {
	f, err := os.CreateTemp(opts.TempDir, "bcd-image-*.qcow2")
	if err != nil {
		return fmt.Errorf("creating the qcow2 staging file: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	r, done, err := decompressor(src, spec.Compression)
	if err != nil {
		return err
	}
	// Bounded: the artifact is not verified yet, and the staging directory is RAM.
	base, limit := qcow2StagingLimit(spec.Size, w.target.Size())
	n, err := io.Copy(f, io.LimitReader(ctxReader{ctx, r}, limit+1))
	done()
	if err != nil {
		return fmt.Errorf("staging the qcow2 (%d bytes so far): %w", n, err)
	}
	if n > limit {
		return fmt.Errorf("staging the qcow2: the artifact unpacks to more than %d bytes (the image's %d and room for qcow2 tables): refusing to stage more of an unverified download", limit, base)
	}
	if _, err := io.Copy(io.Discard, src); err != nil {
		return fmt.Errorf("reading the rest of the artifact: %w", err)
	}
	if !equalBytes(hashed.Sum(), want) {
		return fmt.Errorf("%w: refusing to convert an unverified qcow2", ErrDigestMismatch)
	}
	log.InfoContext(ctx, "qcow2 staged and verified", "bytes", n)
	img, err := qcow2reader.OpenWithType(f, qcow2.Type)
	if err != nil {
		return fmt.Errorf("opening the qcow2: %w", err)
	}
	defer img.Close()
	if err := img.Readable(); err != nil {
		return fmt.Errorf("qcow2 not readable (backing files and encryption are not supported): %w", err)
	}
	size := img.Size()
	if spec.Size != 0 && size != spec.Size {
		return fmt.Errorf("qcow2 virtual size %d, the spec says %d", size, spec.Size)
	}
	if size > w.target.Size() {
		return fmt.Errorf("qcow2 virtual size %d does not fit the %d-byte target", size, w.target.Size())
	}
	w.total = size
	buf := alignedBuffer(opts.ChunkSize)
	for off := int64(0); off < size; {
		// Extents in the middle of a chunk-sized window are fine: the loop reads up to the chunk
		// or the extent's end, whichever comes first. Zero extents are written as zeros, since
		// the disk holds old data (qcow2reader's convert assumes a zeroed target).
		ext, err := img.Extent(off, min(int64(len(buf)), size-off))
		if err != nil {
			return fmt.Errorf("reading the qcow2 extent at %d: %w", off, err)
		}
		n := min(ext.Length, int64(len(buf)))
		if n <= 0 {
			return fmt.Errorf("qcow2 extent of length %d at %d", ext.Length, off)
		}
		chunk := buf[:n]
		if ext.Zero {
			clear(chunk)
		} else if m, err := img.ReadAt(chunk, off); err != nil && !(errors.Is(err, io.EOF) && int64(m) == n) {
			return fmt.Errorf("reading the qcow2 at %d: %w", off, err)
		}
		if err := w.write(chunk); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// qcow2StagingLimit is the most a qcow2 file for an image of specSize bytes (0: not known)
// written to a target of targetSize bytes may take: its virtual size, which is at most the
// image's size and never more than the target's, plus its tables (L2 and refcount tables take
// under 1/32 of the virtual size even with the smallest, 512-byte, clusters) and headers.
func qcow2StagingLimit(specSize, targetSize int64) (base, limit int64) {
	base = targetSize
	if specSize > 0 {
		base = min(specSize, targetSize)
	}
	return base, base + base/32 + 4*mib
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
