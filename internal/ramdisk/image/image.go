// Package image writes OS images to disk for the ramdisk's deploy.image command.
//
// The artifact is streamed over HTTP from the site cache, its digest (SHA-256 or SHA-512 of the
// bytes as published, i.e. the compressed file) is computed while streaming in a goroutine of its
// own, it is decompressed (zstd, gzip, xz) and written with large aligned writes by a writer
// goroutine, so download+hash, decompression and disk writes overlap.
//
// The disk is never left bootable by a bad image: the target's first MiB (MBR/GPT and boot code)
// and its last (the backup GPT) are zeroed and synced before anything else is written, the
// image's own first MiB is held back in memory and written only after the digest matched. On a mismatch, a short or failed stream,
// or a size mismatch the first and last MiB are zeroed again and Write fails.
//
// qcow2 needs random access (its tables point anywhere in the file). The artifact is downloaded
// (and decompressed) into a file in Options.TempDir — the ramdisk's tmpfs — hashing as it
// arrives, at most the image's size (never more than the target's) and room for qcow2 tables;
// only after the digest matched is it converted to the target with go-qcow2reader.
// HTTP Range reads were rejected: they would convert bytes that have not been verified yet.
//
// Fetch fails a source that sends nothing for Options.IdleTimeout (2 minutes by default).
package image

import (
	"bcd/internal/catalog"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Format is the image format.
type Format string

// Formats.
const (
	FormatRaw   Format = "raw"
	FormatQCOW2 Format = "qcow2"
)

// Compression is the artifact's outer compression.
type Compression string

// Compressions.
const (
	CompressionNone Compression = "none"
	CompressionZstd Compression = "zstd"
	CompressionXZ   Compression = "xz"
	CompressionGzip Compression = "gzip"
)

// Spec describes the artifact.
type Spec struct {
	URL         string      // used by Fetch
	Format      Format      // "" means raw
	Compression Compression // "" means none
	SHA256      string      // hex digest of the artifact as published; exactly one of SHA256/SHA512
	SHA512      string
	Size        int64 // bytes the image occupies on disk once written; 0 = not known in advance
}

// Target is the disk (or, in tests, a file).
type Target interface {
	io.WriterAt
	Size() int64
}

// Progress reports what an image write is doing: done bytes of total (0 when unknown) at the
// stage's average rate.
type Progress func(stage Stage, done, total int64, bytesPerSecond float64)

// Stage is a part of an image write, for its progress.
type Stage string

const (
	// Staging: a qcow2 artifact is downloaded (and unpacked) into RAM, where its digest is
	// checked before any byte goes to the target. done counts the staged bytes; total is the
	// most the staging accepts.
	Staging Stage = "staging"
	// Writing: done bytes of the image written to the target, of total.
	Writing Stage = "writing"
)

// Options tune Write and Fetch.
type Options struct {
	Client    *http.Client // Fetch only; default http.DefaultClient
	TempDir   string       // qcow2 staging; default os.TempDir()
	ChunkSize int          // write size; default 8 MiB (a multiple of 1 MiB)
	Buffers   int          // write buffers in flight; default 3
	// IdleTimeout (Fetch only) fails the download when the source sends nothing for this long
	// while it is being waited for (response headers, or the next bytes of the body); default
	// DefaultIdleTimeout. Time spent writing to the disk does not count.
	IdleTimeout time.Duration

	// abort (set by Fetch) ends the download when writing to the target failed: the read that
	// waits for the source must not hold the command (up to IdleTimeout, on a stalled source)
	// nor have its error reported in place of the disk's.
	abort func(error)
}

// DefaultIdleTimeout is how long Fetch waits for a source that sends nothing.
const DefaultIdleTimeout = 2 * time.Minute

// ErrSourceStalled is returned when the image source sent nothing for the idle timeout.
const ErrSourceStalled = Error("image source stalled")

// Result describes a completed write.
type Result struct {
	Algorithm      string  `json:"algorithm"` // sha256 or sha512
	Digest         string  `json:"digest"`
	BytesRead      int64   `json:"bytesRead"`    // artifact bytes
	BytesWritten   int64   `json:"bytesWritten"` // image bytes on the target
	DurationMillis int64   `json:"durationMillis"`
	BytesPerSecond float64 `json:"bytesPerSecond"`
}

const (
	mib       = 1 << 20
	headBytes = mib // the held-back region
)

// Error is a constant error of this package.
type Error string

func (e Error) Error() string { return string(e) }

// ErrDigestMismatch is returned when the artifact's digest does not match the spec.
const ErrDigestMismatch = Error("image digest mismatch")

func (s Spec) normalize() (Spec, string, hash.Hash, []byte, error) {
	s.Format = Format(strings.ToLower(string(s.Format)))
	s.Compression = Compression(strings.ToLower(string(s.Compression)))
	if s.Format == "" {
		s.Format = FormatRaw
	}
	if s.Compression == "" {
		s.Compression = CompressionNone
	}
	switch s.Format {
	case FormatRaw, FormatQCOW2:
	default:
		return s, "", nil, nil, fmt.Errorf("unsupported image format %q", s.Format)
	}
	switch s.Compression {
	case CompressionNone, CompressionZstd, CompressionXZ, CompressionGzip:
	default:
		return s, "", nil, nil, fmt.Errorf("unsupported compression %q", s.Compression)
	}
	if s.Size < 0 {
		return s, "", nil, nil, fmt.Errorf("negative image size %d", s.Size)
	}
	var alg, want string
	var h hash.Hash
	switch {
	case s.SHA256 != "" && s.SHA512 != "":
		return s, "", nil, nil, errors.New("both sha256 and sha512 given: give exactly one")
	case s.SHA256 != "":
		alg, want, h = "sha256", s.SHA256, sha256.New()
	case s.SHA512 != "":
		alg, want, h = "sha512", s.SHA512, sha512.New()
	default:
		return s, "", nil, nil, errors.New("no digest given: images are only written with a sha256 or sha512")
	}
	sum, err := hex.DecodeString(strings.ToLower(want))
	if err != nil || len(sum) != h.Size() {
		return s, "", nil, nil, fmt.Errorf("%s digest %q is not %d hex bytes", alg, want, h.Size())
	}
	return s, alg, h, sum, nil
}

// Fetch downloads spec.URL and writes it to target (see Write). A source that sends nothing for
// Options.IdleTimeout fails with ErrSourceStalled instead of holding the command until its
// deadline.
func Fetch(ctx context.Context, log *slog.Logger, spec Spec, target Target, opts Options, progress Progress) (Result, error) {
	client := opts.Client
	if client == nil {
		client = http.DefaultClient
	}
	idle := cmp.Or(opts.IdleTimeout, DefaultIdleTimeout)
	shown := catalog.RedactURL(spec.URL) // a signed URL's token is not logged nor reported
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := newWatchdog(idle, func() {
		cancel(fmt.Errorf("%w: %s sent nothing for %s", ErrSourceStalled, shown, idle))
	})
	defer w.stop()
	stalled := func(err error) error {
		if cause := context.Cause(ctx); errors.Is(cause, ErrSourceStalled) {
			return cause
		}
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, spec.URL, nil)
	if err != nil {
		return Result{}, fmt.Errorf("building the request for %s: %w", shown, urlErrorCause(err))
	}
	w.arm()
	resp, err := client.Do(req)
	w.disarm()
	if err != nil {
		return Result{}, fmt.Errorf("fetching %s: %w", shown, stalled(urlErrorCause(err)))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{}, fmt.Errorf("fetching %s: HTTP %s", shown, resp.Status)
	}
	log.InfoContext(ctx, "image download started", "url", shown, "contentLength", resp.ContentLength, "idleTimeout", idle)
	opts.abort = cancel
	res, err := Write(ctx, log, &idleReader{r: resp.Body, w: w}, spec, target, opts, progress)
	if err != nil {
		if cause := stalled(nil); cause != nil && !errors.Is(err, ErrSourceStalled) {
			return res, fmt.Errorf("%w: %w", cause, err)
		}
		return res, err
	}
	return res, nil
}

// urlErrorCause is err without the *url.Error that repeats the full URL (its query, a
// redirect's): the caller names the URL, redacted.
func urlErrorCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// watchdog calls fire when it stays armed for longer than its timeout.
type watchdog struct {
	timeout time.Duration
	t       *time.Timer
}

func newWatchdog(timeout time.Duration, fire func()) *watchdog {
	t := time.AfterFunc(timeout, fire)
	t.Stop()
	return &watchdog{timeout: timeout, t: t}
}

func (w *watchdog) arm()    { w.t.Reset(w.timeout) }
func (w *watchdog) disarm() { w.t.Stop() }
func (w *watchdog) stop()   { w.t.Stop() }

// idleReader arms the watchdog for the time each Read of the source blocks: only waiting for
// the source counts, not the time the caller spends between reads (writing to the disk,
// converting a staged qcow2).
type idleReader struct {
	r io.Reader
	w *watchdog
}

func (i *idleReader) Read(p []byte) (int, error) {
	i.w.arm()
	n, err := i.r.Read(p)
	i.w.disarm()
	return n, err
}

// Write decompresses src onto target, checking the digest of src while streaming.
func Write(ctx context.Context, log *slog.Logger, src io.Reader, spec Spec, target Target, opts Options, progress Progress) (Result, error) {
	start := time.Now()
	spec, alg, h, want, err := spec.normalize()
	if err != nil {
		return Result{}, fmt.Errorf("checking the image spec: %w", err)
	}
	if spec.Size > target.Size() {
		return Result{}, fmt.Errorf("image of %d bytes does not fit the %d-byte target", spec.Size, target.Size())
	}
	opts.ChunkSize = max(mib, opts.ChunkSize&^(mib-1))
	if opts.ChunkSize == mib {
		opts.ChunkSize = 8 * mib
	}
	opts.Buffers = max(2, opts.Buffers)
	if opts.Buffers == 2 {
		opts.Buffers = 3
	}
	zeros := alignedBuffer(headBytes)
	if target.Size() < headBytes {
		return Result{}, fmt.Errorf("target of %d bytes is smaller than 1 MiB", target.Size())
	}
	// Unbootable first: the old partition table and boot code go before any image byte lands,
	// and so does its last MiB, where the old layout keeps its backup GPT (md 1.0 and ZFS labels
	// too): beyond an image smaller than the disk, it would outlive the deploy. Durable before
	// the unverified body lands: a power loss during the write must not leave the old boot code
	// in front of a half-written image.
	if err := zeroEnds(target, zeros); err != nil {
		return Result{}, err
	}
	res := Result{Algorithm: alg}
	w := &writer{ctx: ctx, target: target, total: spec.Size, start: start, progress: progress}
	counted := &countingReader{r: src}
	hashed := newAsyncHasher(h)

	switch spec.Format {
	case FormatQCOW2:
		err = writeQCOW2(ctx, log, io.TeeReader(counted, hashed), spec, hashed, want, w, opts)
	default:
		err = writeRaw(ctx, io.TeeReader(counted, hashed), spec, w, opts)
	}
	sum := hashed.Sum() // waits for the hasher; safe to call twice
	res.Digest, res.BytesRead, res.BytesWritten = hex.EncodeToString(sum), counted.n, w.written
	if err == nil && !equalBytes(sum, want) {
		err = fmt.Errorf("%w: %s of the artifact is %s, want %x", ErrDigestMismatch, alg, res.Digest, want)
	}
	if err == nil && w.written == 0 {
		err = errors.New("the image is empty")
	}
	if err == nil && spec.Size != 0 && w.written != spec.Size {
		err = fmt.Errorf("image wrote %d bytes, the spec says %d", w.written, spec.Size)
	}
	if err == nil {
		// Verified: now, and only now, the partition table and boot code.
		if _, err = target.WriteAt(w.head, 0); err != nil {
			err = fmt.Errorf("writing the image's first MiB: %w", err)
		}
	}
	if err == nil {
		err = syncTarget(target)
	}
	if err != nil {
		// Both ends again: the first MiB never got the image's, but the last may hold the
		// unverified image's backup GPT, which a firmware or kernel that finds no primary one
		// would go to.
		if zerr := zeroEnds(target, zeros); zerr != nil {
			err = errors.Join(err, fmt.Errorf("after the failure: %w", zerr))
		}
		log.ErrorContext(ctx, "image write failed; first and last MiB zeroed", "err", err, "bytesRead", res.BytesRead, "bytesWritten", res.BytesWritten)
		return res, fmt.Errorf("writing the image: %w", err)
	}
	d := time.Since(start)
	res.DurationMillis = d.Milliseconds()
	res.BytesPerSecond = float64(w.written) / max(d.Seconds(), 1e-9)
	log.InfoContext(ctx, "image written", "bytes", w.written, "digest", res.Digest, "duration", d)
	return res, nil
}

// zeroEnds zeroes the target's first MiB and its last (zeros is a MiB of them) and syncs.
func zeroEnds(target Target, zeros []byte) error {
	if _, err := target.WriteAt(zeros, 0); err != nil {
		return fmt.Errorf("zeroing the target's first MiB: %w", err)
	}
	if tail := max(headBytes, target.Size()-mib); tail < target.Size() {
		if _, err := target.WriteAt(zeros[:target.Size()-tail], tail); err != nil {
			return fmt.Errorf("zeroing the target's last MiB: %w", err)
		}
	}
	if err := syncTarget(target); err != nil {
		return fmt.Errorf("after zeroing the target's first and last MiB: %w", err)
	}
	return nil
}

func syncTarget(t Target) error {
	if s, ok := t.(interface{ Sync() error }); ok {
		if err := s.Sync(); err != nil {
			return fmt.Errorf("syncing the target: %w", err)
		}
	}
	return nil
}

func equalBytes(a, b []byte) bool {
	return len(a) == len(b) && string(a) == string(b)
}

// MaxZstdWindow bounds the window a zstd image may need, as the zstd tool's own default
// (--memory=128MB): the window is allocated from the frame's header, read before the digest can
// be checked, and the ramdisk lives in RAM. An image compressed with a larger window (zstd
// --long=28 and above) is refused with what to do.
const MaxZstdWindow = 128 << 20

// zstdReader says what to do when a frame needs a window over MaxZstdWindow.
type zstdReader struct{ d *zstd.Decoder }

func (z zstdReader) Read(p []byte) (int, error) {
	n, err := z.d.Read(p)
	if errors.Is(err, zstd.ErrWindowSizeExceeded) {
		err = fmt.Errorf("%w: the image needs a zstd window over %d MiB; compress it again without --long, or with --long=27 at most", err, MaxZstdWindow>>20)
	}
	return n, err
}

// decompressor wraps r per the compression.
func decompressor(r io.Reader, c Compression) (io.Reader, func(), error) {
	switch c {
	case CompressionZstd:
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(2), zstd.WithDecoderLowmem(false), zstd.WithDecoderMaxWindow(MaxZstdWindow))
		if err != nil {
			return nil, nil, fmt.Errorf("starting zstd: %w", err)
		}
		return zstdReader{d}, d.Close, nil
	case CompressionGzip:
		g, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the gzip header: %w", err)
		}
		return g, func() { _ = g.Close() }, nil
	case CompressionXZ:
		x, err := newXZReader(r) // not xz.NewReader: see xzReader
		if err != nil {
			return nil, nil, fmt.Errorf("reading the xz header: %w", err)
		}
		return x, func() {}, nil
	}
	return r, func() {}, nil
}

// writeRaw streams the (decompressed) image into the target through the writer goroutine.
func writeRaw(ctx context.Context, src io.Reader, spec Spec, w *writer, opts Options) error {
	r, done, err := decompressor(src, spec.Compression)
	if err != nil {
		return err
	}
	defer done()
	p := newPipeline(ctx, w, opts)
	for {
		buf := p.get()
		n, err := fill(r, buf)
		if n > 0 {
			if perr := p.put(buf[:n]); perr != nil {
				return p.finish(perr)
			}
		} else {
			p.release(buf)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return p.finish(fmt.Errorf("reading the image stream: %w", err))
		}
	}
	// Drain what the decompressor did not consume so the digest covers the whole artifact.
	if _, err := io.Copy(io.Discard, src); err != nil {
		return p.finish(fmt.Errorf("reading the rest of the artifact: %w", err))
	}
	return p.finish(nil)
}

// fill reads until buf is full or the stream ends (io.EOF, returned as is); truncation inside a
// compressed stream surfaces as the decompressor's own error, never as io.EOF.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
