package image

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"time"

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
	n, err := io.Copy(&stagingWriter{w: f, limit: limit, start: time.Now(), progress: w.progress}, io.LimitReader(ctxReader{ctx, r}, limit+1))
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
	return convertQCOW2(io.NewSectionReader(f, 0, n), n, spec.Size, w, opts.ChunkSize)
}

// stagingWriter is the qcow2 staging file, reporting the bytes staged (Staging) as they land.
type stagingWriter struct {
	w        io.Writer
	limit, n int64
	start    time.Time
	progress Progress
}

func (s *stagingWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.n += int64(n)
	if s.progress != nil && n > 0 {
		s.progress(Staging, s.n, s.limit, float64(s.n)/max(time.Since(s.start).Seconds(), 1e-9))
	}
	return n, err
}

// qemu's own bounds on a qcow2 (block/qcow2.h): clusters of 512 bytes to 2 MiB, an L1 table of
// at most 32 MiB, and header versions 2 and 3.
const (
	qcow2MinClusterBits = 9
	qcow2MaxClusterBits = 21
	qcow2MaxL1Bytes     = 32 * mib
)

// qcow2 incompatible feature bits (version 3 headers).
const (
	qcow2Corrupt      = 1 << 1
	qcow2ExternalData = 1 << 2
	qcow2ExtendedL2   = 1 << 4
	qcow2KnownBits    = 1<<5 - 1
)

// checkQCOW2Header vets the header of the staged qcow2 of fileSize bytes before go-qcow2reader
// acts on it: that reader opens a backing file by its path (on the ramdisk: another disk, say)
// and would copy from it; it sizes its L1 and L2 tables from header fields unchecked (gigabytes,
// or a panic); it takes a virtual size that is 0 or past an int64 as an image of no bytes, and
// it reads images marked corrupt or of unknown versions. It returns the virtual size.
func checkQCOW2Header(ra io.ReaderAt, fileSize int64) (int64, error) {
	var h [104]byte
	n, err := ra.ReadAt(h[:], 0)
	if n < 72 {
		return 0, fmt.Errorf("not a qcow2: %d-byte header: %v", n, err)
	}
	be := binary.BigEndian
	if string(h[:4]) != "QFI\xfb" {
		return 0, errors.New("not a qcow2: no QFI\\xfb magic")
	}
	version := be.Uint32(h[4:])
	if version != 2 && version != 3 {
		return 0, fmt.Errorf("qcow2 version %d: only versions 2 and 3 are read", version)
	}
	if off := be.Uint64(h[8:]); off != 0 {
		return 0, errors.New("the qcow2 has a backing file: only self-contained images are written (qemu-img convert it first)")
	}
	if m := be.Uint32(h[32:]); m != 0 {
		return 0, fmt.Errorf("the qcow2 is encrypted (method %d): encrypted images are not written", m)
	}
	bits := be.Uint32(h[20:])
	if bits < qcow2MinClusterBits || bits > qcow2MaxClusterBits {
		return 0, fmt.Errorf("qcow2 cluster bits %d: qemu's range is %d to %d", bits, qcow2MinClusterBits, qcow2MaxClusterBits)
	}
	cluster := uint64(1) << bits
	size := be.Uint64(h[24:])
	if size == 0 || size > math.MaxInt64 {
		return 0, fmt.Errorf("qcow2 virtual size %d: not a disk", size)
	}
	l2Entries := cluster / 8
	if version == 3 {
		if n < 104 {
			return 0, errors.New("truncated qcow2 version 3 header")
		}
		features := be.Uint64(h[72:])
		switch {
		case features&qcow2Corrupt != 0:
			return 0, errors.New("the qcow2 is marked corrupt")
		case features&qcow2ExternalData != 0:
			return 0, errors.New("the qcow2 keeps its data in an external data file: only self-contained images are written")
		case features&^qcow2KnownBits != 0:
			return 0, fmt.Errorf("the qcow2 uses unknown incompatible feature bits %#x", features&^qcow2KnownBits)
		}
		if features&qcow2ExtendedL2 != 0 {
			l2Entries = cluster / 16
		}
		if hl := be.Uint32(h[100:]); hl < 104 || uint64(hl) > cluster || hl%8 != 0 {
			return 0, fmt.Errorf("qcow2 header length %d: want a multiple of 8 from 104 to the cluster size %d", hl, cluster)
		}
	}
	l1Size, l1Off := uint64(be.Uint32(h[36:])), be.Uint64(h[40:])
	need := (size + cluster*l2Entries - 1) / (cluster * l2Entries) // no overflow: size < 2^63, cluster*l2Entries <= 2^39
	switch {
	case l1Size < need:
		return 0, fmt.Errorf("qcow2 L1 table of %d entries does not cover the virtual size %d (%d needed)", l1Size, size, need)
	case l1Size*8 > qcow2MaxL1Bytes:
		return 0, fmt.Errorf("qcow2 L1 table of %d entries: qemu's limit is %d bytes", l1Size, qcow2MaxL1Bytes)
	case l1Off == 0 || l1Off%cluster != 0 || l1Off > uint64(fileSize) || l1Size*8 > uint64(fileSize)-l1Off:
		return 0, fmt.Errorf("qcow2 L1 table at %d (%d entries) is not cluster-aligned inside the %d-byte file", l1Off, l1Size, fileSize)
	}
	return int64(size), nil
}

// convertQCOW2 writes the virtual disk of the staged, verified qcow2 ra (fileSize bytes) onto w,
// every byte of it: zero clusters are written as zeros, since the disk holds old data
// (qcow2reader's own convert assumes a zeroed target). specSize is the spec's size, 0 if none.
func convertQCOW2(ra io.ReaderAt, fileSize, specSize int64, w *writer, chunk int) error {
	size, err := checkQCOW2Header(ra, fileSize)
	if err != nil {
		return err
	}
	if specSize != 0 && size != specSize {
		return fmt.Errorf("qcow2 virtual size %d, the spec says %d", size, specSize)
	}
	if size > w.target.Size() {
		return fmt.Errorf("qcow2 virtual size %d does not fit the %d-byte target", size, w.target.Size())
	}
	img, err := qcow2reader.OpenWithType(ra, qcow2.Type)
	if err != nil {
		return fmt.Errorf("opening the qcow2: %w", err)
	}
	defer img.Close()
	if err := img.Readable(); err != nil {
		return fmt.Errorf("qcow2 not readable: %w", err)
	}
	if img.Size() != size {
		return fmt.Errorf("qcow2 reader sees a virtual size of %d, the header says %d", img.Size(), size)
	}
	w.total = size
	buf := alignedBuffer(chunk)
	// Plain reads, chunk after chunk: the reader's Extent misreports where an extent starting
	// inside a cluster ends, which would write zeros over data.
	for off := int64(0); off < size; {
		n := min(int64(len(buf)), size-off)
		p := buf[:n]
		if err := readQCOW2(img, p, off); err != nil {
			return err
		}
		if err := w.write(p); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// readQCOW2 fills p from the virtual disk at off. go-qcow2reader's ReadAt stops at a compressed
// cluster whose last bytes come with io.EOF from the decompressor, reporting that EOF: the read
// goes on after it. A read that makes no progress fails, so a cluster cut short by the end of
// the file or of its compressed stream is an error, never zeros.
func readQCOW2(img io.ReaderAt, p []byte, off int64) error {
	for done := 0; done < len(p); {
		m, err := img.ReadAt(p[done:], off+int64(done))
		done += m
		switch {
		case done == len(p), m > 0 && (err == nil || errors.Is(err, io.EOF)):
		case err == nil:
			return fmt.Errorf("reading the qcow2 at %d: no progress", off+int64(done))
		default:
			return fmt.Errorf("reading the qcow2 at %d: %w", off+int64(done), err)
		}
	}
	return nil
}

// qcow2StagingLimit is the most a qcow2 file for an image of specSize bytes (0: not known)
// written to a target of targetSize bytes may take: its virtual size, which is at most the
// image's size and never more than the target's, plus its tables (L2 and refcount tables take
// under 1/32 of the virtual size even with the smallest, 512-byte, clusters) and what takes
// whole clusters whatever the size: header, L1 table, refcount table and block, the first L2
// table, the last data cluster. qcow2StagingClusters of qemu's largest (2 MiB) cover those.
func qcow2StagingLimit(specSize, targetSize int64) (base, limit int64) {
	base = targetSize
	if specSize > 0 {
		base = min(specSize, targetSize)
	}
	return base, base + base/32 + qcow2StagingClusters<<qcow2MaxClusterBits
}

// qcow2StagingClusters is how many whole clusters a qcow2 may take beyond its data and tables.
const qcow2StagingClusters = 16

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
