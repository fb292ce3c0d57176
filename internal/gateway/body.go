package gateway

import "io"

// streamBody is a Connect stream's request body, on which the stream's receiver waits for the
// agent's next message before it asks Connect for it.
//
// Connect takes a buffer from its pool before it reads a message and gives it back after, so a
// receiver blocked inside Receive holds one: for an agent that sends nothing for hours (an idle
// installed OS), that is the buffer of whatever it sent last, the 64 KiB of an inventory as
// well as the few bytes of a heartbeat, pinned for as long as the stream stays open. Waiting
// here first holds a few bytes instead.
//
// Only the stream's receiver reads it (wait, then Connect's reads); Close may come from any
// goroutine and only closes the body underneath.
type streamBody struct {
	io.ReadCloser
	buf     [5]byte // a message's first bytes (an envelope's prefix is 5), read by wait
	off, n  int     // buf[off:n] is not yet read by Connect
	pending error   // the error wait met, for Connect's next read
}

// wait blocks until the body has a byte to read, or its error; the bytes it read are read again
// by the next Reads.
func (b *streamBody) wait() {
	if b.off < b.n || b.pending != nil {
		return
	}
	b.off = 0
	b.n, b.pending = b.ReadCloser.Read(b.buf[:])
}

// Read implements io.Reader: the bytes wait read, then its error, then the body.
func (b *streamBody) Read(p []byte) (int, error) {
	if b.off < b.n {
		n := copy(p, b.buf[b.off:b.n])
		b.off += n
		return n, nil
	}
	if err := b.pending; err != nil {
		b.pending = nil
		return 0, err
	}
	return b.ReadCloser.Read(p)
}
