package image

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"

	"github.com/ulikunitz/xz/lzma"
)

// MaxXZDict bounds the LZMA2 dictionary an xz image may declare: 64 MiB, the largest any xz
// preset uses (xz -9 and -9e; the default -6 uses 8 MiB). The dictionary is allocated whole from
// each block's header, read before the digest can be checked (an xz header may declare up to
// 4 GiB), and the ramdisk lives in RAM. An image compressed with a larger one
// (xz --lzma2=dict=128MiB) is refused with what to do.
const MaxXZDict = 64 << 20

// ErrXZDictTooLarge is returned (wrapped, with the declared size) for an xz block whose
// dictionary is over MaxXZDict.
const ErrXZDictTooLarge = Error("xz dictionary over the ramdisk's cap")

// xzReader decodes the .xz container (streams, block headers, checks, index, footers, stream
// padding) itself and hands only each block's LZMA2 data to github.com/ulikunitz/xz/lzma, with
// the dictionary the block declares once it is known to be at most MaxXZDict. xz.Reader cannot
// be bounded: its DictCap is a minimum, and it allocates whatever a block header declares.
// Checking the headers in front of xz.Reader is not enough either: its LZMA2 decoder may stop
// before the end of a chunk's declared payload and read the next header from inside it, where a
// framing parser in front would not look.
//
// Like xz.Reader it accepts one LZMA2 filter per block (no BCJ or delta filters) and the None,
// CRC32, CRC64 and SHA-256 checks, and verifies every check, the index and the footers. Memory
// does not grow with the number of blocks: the index is compared through a hash of its records.
// The source is read through a 64 KiB buffer (the LZMA2 decoder takes a byte at a time), up to
// its end: xz streams may follow one another, with stream padding between them.
type xzReader struct {
	r      *bufio.Reader
	stream int // streams begun, for errors
	block  int // blocks begun in this stream, for errors
	flags  [2]byte
	blk    *xzBlock // the block being decoded; nil between blocks
	// records of this stream's blocks, for the index: count and a hash of (unpadded size,
	// uncompressed size) pairs.
	records uint64
	recHash hash.Hash
	err     error
}

// newXZReader reads the first stream header (an input that is not xz fails here).
func newXZReader(r io.Reader) (*xzReader, error) {
	x := &xzReader{r: bufio.NewReaderSize(r, 64<<10)}
	if err := x.streamHeader(true); err != nil {
		return nil, err
	}
	return x, nil
}

// xzMagic opens every xz stream.
const xzMagic = "\xfd7zXZ\x00"

// unexpectedEOF turns a clean end of input inside an xz structure into io.ErrUnexpectedEOF:
// a truncated image is an error, never a short image.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (x *xzReader) Read(p []byte) (int, error) {
	for x.err == nil {
		if x.blk == nil {
			x.err = x.nextBlock()
			continue
		}
		n, err := x.blk.read(p)
		if err == io.EOF {
			err = x.endBlock()
		}
		if err != nil {
			x.err = err
		}
		if n > 0 || (err == nil && len(p) == 0) {
			return n, nil
		}
	}
	return 0, x.err
}

// streamHeader reads a stream header. Between streams (first false) the input may end there
// (io.EOF) or hold stream padding (groups of four zero bytes).
func (x *xzReader) streamHeader(first bool) error {
	var h [12]byte
	for {
		n, err := io.ReadFull(x.r, h[:4])
		if !first && n == 0 && err == io.EOF {
			return io.EOF
		}
		if err != nil {
			return fmt.Errorf("xz: reading a stream header: %w", unexpectedEOF(err))
		}
		if first || h != [12]byte{} {
			break
		}
	}
	if _, err := io.ReadFull(x.r, h[4:]); err != nil {
		return fmt.Errorf("xz: reading a stream header: %w", unexpectedEOF(err))
	}
	x.stream++
	switch {
	case string(h[:6]) != xzMagic:
		if first {
			return errors.New("xz: not an xz file (no xz magic)")
		}
		return fmt.Errorf("xz: stream %d: no xz magic after stream %d", x.stream, x.stream-1)
	case crc32.ChecksumIEEE(h[6:8]) != binary.LittleEndian.Uint32(h[8:]):
		return fmt.Errorf("xz: stream %d: stream header CRC32 mismatch", x.stream)
	case h[6] != 0 || h[7]&0xf0 != 0:
		return fmt.Errorf("xz: stream %d: unsupported stream flags %#02x%02x", x.stream, h[6], h[7])
	}
	if _, _, err := xzCheck(h[7]); err != nil {
		return fmt.Errorf("xz: stream %d: %w", x.stream, err)
	}
	x.flags = [2]byte{h[6], h[7]}
	x.block, x.records, x.recHash = 0, 0, sha256.New()
	return nil
}

// xzCheck is the hash for an xz check type and the size of its value.
func xzCheck(typ byte) (hash.Hash, int, error) {
	switch typ {
	case 0x00:
		return nil, 0, nil
	case 0x01:
		return crc32.NewIEEE(), 4, nil
	case 0x04:
		return crc64.New(crc64.MakeTable(crc64.ECMA)), 8, nil
	case 0x0a:
		return sha256.New(), 32, nil
	}
	return nil, 0, fmt.Errorf("unsupported check type %#x (None, CRC32, CRC64 and SHA-256 are)", typ)
}

// nextBlock reads up to the next block's data: its header, or the stream's index and footer
// and the next stream's header first. io.EOF at the end of the last stream.
func (x *xzReader) nextBlock() error {
	for {
		b, err := x.r.ReadByte()
		if err != nil {
			return fmt.Errorf("xz: stream %d: reading a block header or the index: %w", x.stream, unexpectedEOF(err))
		}
		if b != 0 {
			return x.blockHeader(b)
		}
		if err := x.index(); err != nil {
			return fmt.Errorf("xz: stream %d: %w", x.stream, err)
		}
		if err := x.streamHeader(false); err != nil {
			return err
		}
	}
}

// readVarint reads an xz multibyte integer (at most 9 bytes, 63 bits, no trailing zero byte).
func readVarint(r io.ByteReader) (uint64, int, error) {
	var v uint64
	for i := range 9 {
		b, err := r.ReadByte()
		if err != nil {
			return 0, i, unexpectedEOF(err)
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			if b == 0 && i > 0 {
				return 0, i + 1, errors.New("integer with a trailing zero byte")
			}
			return v, i + 1, nil
		}
	}
	return 0, 9, errors.New("integer over 63 bits")
}

// xzBlock is one block being decoded.
type xzBlock struct {
	lz           *lzma.Reader2
	in           countingReader // the block's compressed data, as the LZMA2 decoder takes it
	headerLen    int64
	out          int64 // uncompressed bytes so far
	check        hash.Hash
	checkLen     int
	compressed   int64 // declared in the header; -1 when not
	uncompressed int64
}

// blockHeader reads and checks the header whose size byte is size, and starts the block's LZMA2
// decoder: only now, with the dictionary known to be within MaxXZDict, is it allocated.
func (x *xzReader) blockHeader(size byte) error {
	x.block++
	fail := func(format string, a ...any) error {
		return fmt.Errorf("xz: stream %d, block %d: "+format, append([]any{x.stream, x.block}, a...)...)
	}
	h := make([]byte, (int(size)+1)*4)
	h[0] = size
	if _, err := io.ReadFull(x.r, h[1:]); err != nil {
		return fail("reading the block header: %w", unexpectedEOF(err))
	}
	body := h[:len(h)-4]
	if crc32.ChecksumIEEE(body) != binary.LittleEndian.Uint32(h[len(h)-4:]) {
		return fail("block header CRC32 mismatch")
	}
	flags := body[1]
	if flags&0x3c != 0 {
		return fail("unsupported block flags %#02x", flags)
	}
	hr := bytes.NewReader(body[2:])
	b := &xzBlock{headerLen: int64(len(h)), compressed: -1, uncompressed: -1}
	for _, f := range []struct {
		bit  byte
		v    *int64
		what string
	}{{0x40, &b.compressed, "compressed"}, {0x80, &b.uncompressed, "uncompressed"}} {
		if flags&f.bit == 0 {
			continue
		}
		v, _, err := readVarint(hr)
		if err != nil {
			return fail("block header %s size: %w", f.what, err)
		}
		if v == 0 && f.bit == 0x40 {
			return fail("block header declares 0 compressed bytes")
		}
		*f.v = int64(v)
	}
	if n := int(flags&3) + 1; n != 1 {
		return fail("%d filters: only LZMA2 alone is supported (no BCJ or delta filters; xz -d and xz -z again without them)", n)
	}
	id, _, err := readVarint(hr)
	if err != nil {
		return fail("filter id: %w", err)
	}
	props, _, err := readVarint(hr)
	if err != nil {
		return fail("filter properties size: %w", err)
	}
	if id != 0x21 || props != 1 {
		return fail("filter %#x with %d bytes of properties: only LZMA2 (0x21, 1 byte) is supported", id, props)
	}
	code, err := hr.ReadByte()
	if err != nil {
		return fail("LZMA2 properties: %w", unexpectedEOF(err))
	}
	dict, err := lzma.DecodeDictCap(code)
	if err != nil || code&0xc0 != 0 {
		return fail("invalid LZMA2 dictionary size code %#x", code)
	}
	if dict > MaxXZDict {
		return fmt.Errorf("%w: stream %d, block %d declares a %s LZMA2 dictionary, over the %d MiB cap (the dictionary is allocated whole, in RAM, before the digest can be checked); compress the image again with an xz preset (xz -9 at most) or --lzma2=dict=%dMiB or less",
			ErrXZDictTooLarge, x.stream, x.block, byteSize(dict), MaxXZDict>>20, MaxXZDict>>20)
	}
	for hr.Len() > 0 {
		if c, _ := hr.ReadByte(); c != 0 {
			return fail("non-zero block header padding")
		}
	}
	if b.check, b.checkLen, err = xzCheck(x.flags[1] & 0x0f); err != nil {
		return fail("%w", err)
	}
	b.in.r = x.r
	if b.compressed >= 0 {
		b.in.r = io.LimitReader(x.r, b.compressed)
	}
	if b.lz, err = (lzma.Reader2Config{DictCap: int(max(dict, lzma.MinDictCap))}).NewReader2(&b.in); err != nil {
		return fail("starting LZMA2: %w", err)
	}
	x.blk = b
	return nil
}

// byteSize is n as MiB when it is a whole number of them, else in bytes.
func byteSize(n int64) string {
	if n%mib == 0 {
		return fmt.Sprintf("%d MiB", n/mib)
	}
	return fmt.Sprintf("%d-byte (%d MiB)", n, (n+mib-1)/mib)
}

func (b *xzBlock) read(p []byte) (int, error) {
	n, err := b.lz.Read(p)
	b.out += int64(n)
	if b.check != nil {
		b.check.Write(p[:n])
	}
	if b.uncompressed >= 0 && b.out > b.uncompressed {
		return n, fmt.Errorf("xz: block holds more than the %d uncompressed bytes its header declares", b.uncompressed)
	}
	if err != nil && err != io.EOF {
		err = fmt.Errorf("xz: %w", unexpectedEOF(err))
	}
	return n, err
}

// endBlock checks the sizes, padding and check of the block whose LZMA2 data ended, and records
// it for the index.
func (x *xzReader) endBlock() error {
	b := x.blk
	x.blk = nil
	fail := func(format string, a ...any) error {
		return fmt.Errorf("xz: stream %d, block %d: "+format, append([]any{x.stream, x.block}, a...)...)
	}
	if b.compressed >= 0 && b.in.n != b.compressed {
		return fail("%d compressed bytes, the header declares %d", b.in.n, b.compressed)
	}
	if b.uncompressed >= 0 && b.out != b.uncompressed {
		return fail("%d uncompressed bytes, the header declares %d", b.out, b.uncompressed)
	}
	tail := make([]byte, (4-b.in.n%4)%4+int64(b.checkLen))
	if _, err := io.ReadFull(x.r, tail); err != nil {
		return fail("reading the block padding and check: %w", unexpectedEOF(err))
	}
	pad := len(tail) - b.checkLen
	if !allZero(tail[:pad]) {
		return fail("non-zero block padding")
	}
	if b.check != nil && !bytes.Equal(tail[pad:], checkValue(b.check)) {
		return fail("check mismatch: the decompressed data is corrupt")
	}
	var rec [16]byte
	binary.LittleEndian.PutUint64(rec[:], uint64(b.headerLen+b.in.n+int64(b.checkLen)))
	binary.LittleEndian.PutUint64(rec[8:], uint64(b.out))
	x.recHash.Write(rec[:])
	x.records++
	return nil
}

// checkValue is the check as xz stores it: CRC32 and CRC64 little-endian.
func checkValue(h hash.Hash) []byte {
	switch c := h.(type) {
	case hash.Hash32:
		return binary.LittleEndian.AppendUint32(nil, c.Sum32())
	case hash.Hash64:
		return binary.LittleEndian.AppendUint64(nil, c.Sum64())
	}
	return h.Sum(nil)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// crcByteReader reads bytes through a CRC32 and counts them.
type crcByteReader struct {
	r   *bufio.Reader
	crc hash.Hash32
	n   int64
}

func (c *crcByteReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.crc.Write([]byte{b})
		c.n++
	}
	return b, err
}

// index reads the index (its indicator byte read) and the stream footer, and checks them
// against the blocks decoded.
func (x *xzReader) index() error {
	r := &crcByteReader{r: x.r, crc: crc32.NewIEEE(), n: 1}
	r.crc.Write([]byte{0})
	count, _, err := readVarint(r)
	if err != nil {
		return fmt.Errorf("index: %w", err)
	}
	if count != x.records {
		return fmt.Errorf("index lists %d blocks, the stream has %d", count, x.records)
	}
	h := sha256.New()
	for range count {
		var rec [16]byte
		for i := range 2 {
			v, _, err := readVarint(r)
			if err != nil {
				return fmt.Errorf("index: %w", err)
			}
			binary.LittleEndian.PutUint64(rec[8*i:], v)
		}
		h.Write(rec[:])
	}
	if !bytes.Equal(h.Sum(nil), x.recHash.Sum(nil)) {
		return errors.New("index records do not match the blocks")
	}
	for r.n%4 != 0 {
		b, err := r.ReadByte()
		if err != nil {
			return fmt.Errorf("index padding: %w", unexpectedEOF(err))
		}
		if b != 0 {
			return errors.New("non-zero index padding")
		}
	}
	var tail [4 + 12]byte // the index CRC32, then the footer
	if _, err := io.ReadFull(x.r, tail[:]); err != nil {
		return fmt.Errorf("reading the index CRC32 and stream footer: %w", unexpectedEOF(err))
	}
	size := r.n + 4
	f := tail[4:]
	switch {
	case binary.LittleEndian.Uint32(tail[:4]) != r.crc.Sum32():
		return errors.New("index CRC32 mismatch")
	case crc32.ChecksumIEEE(f[4:10]) != binary.LittleEndian.Uint32(f[:4]):
		return errors.New("stream footer CRC32 mismatch")
	case (int64(binary.LittleEndian.Uint32(f[4:8]))+1)*4 != size:
		return errors.New("stream footer backward size does not match the index")
	case f[8] != x.flags[0] || f[9] != x.flags[1]:
		return errors.New("stream footer flags differ from the header's")
	case f[10] != 'Y' || f[11] != 'Z':
		return errors.New("no footer magic")
	}
	return nil
}
