package image

import (
	"context"
	"fmt"
	"hash"
	"sync"
	"time"
	"unsafe"
)

// alignedBuffer returns a zeroed n-byte buffer at a 4096-aligned address (for O_DIRECT targets).
func alignedBuffer(n int) []byte {
	const a = 4096
	b := make([]byte, n+a)
	skip := (a - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%a)) % a
	return b[skip : skip+n : skip+n]
}

// writer places image bytes on the target sequentially, holding back the first MiB.
type writer struct {
	ctx      context.Context
	target   Target
	total    int64
	start    time.Time
	progress Progress
	head     []byte // the image's first MiB, written last
	written  int64
}

func (w *writer) write(p []byte) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	off := w.written
	if off+int64(len(p)) > w.target.Size() {
		return fmt.Errorf("image is larger than the %d-byte target", w.target.Size())
	}
	if w.head == nil {
		w.head = alignedBuffer(headBytes)
	}
	rest := p
	if off < headBytes {
		n := copy(w.head[off:], p)
		rest = p[n:]
		off += int64(n)
	}
	if len(rest) > 0 {
		if _, err := w.target.WriteAt(rest, off); err != nil {
			return fmt.Errorf("writing %d bytes at %d: %w", len(rest), off, err)
		}
	}
	w.written += int64(len(p))
	if w.progress != nil {
		w.progress(Writing, w.written, w.total, float64(w.written)/max(time.Since(w.start).Seconds(), 1e-9))
	}
	return nil
}

// pipeline hands filled buffers to one writer goroutine so reading/decompressing and writing
// overlap; the buffers are recycled.
type pipeline struct {
	free chan []byte
	work chan []byte
	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	err  error
}

func newPipeline(ctx context.Context, w *writer, opts Options) *pipeline {
	p := &pipeline{free: make(chan []byte, opts.Buffers), work: make(chan []byte, opts.Buffers), done: make(chan struct{})}
	for range opts.Buffers {
		p.free <- alignedBuffer(opts.ChunkSize)
	}
	go func() {
		defer close(p.done)
		for buf := range p.work {
			if p.failed() == nil {
				if err := w.write(buf); err != nil {
					p.setErr(err)
					if opts.abort != nil {
						opts.abort(err) // the reader may be waiting for the source: end that
					}
				}
			}
			p.free <- buf[:cap(buf)]
		}
	}()
	return p
}

func (p *pipeline) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *pipeline) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

func (p *pipeline) get() []byte      { return <-p.free }
func (p *pipeline) release(b []byte) { p.free <- b[:cap(b)] }

// put queues a filled buffer; it returns the writer's error as soon as one happened.
func (p *pipeline) put(b []byte) error {
	if err := p.failed(); err != nil {
		p.release(b)
		return err
	}
	p.work <- b
	return nil
}

// finish waits for queued writes and returns the writer's error, or else err (the reading
// side's). The writer's comes first: once the target failed, what the reading side ran into
// (a source ended to stop the download, say) is a consequence.
func (p *pipeline) finish(err error) error {
	p.once.Do(func() { close(p.work) })
	<-p.done
	if werr := p.failed(); werr != nil {
		return werr
	}
	return err
}

// asyncHasher hashes in its own goroutine: Write copies into 1 MiB blocks handed over a channel.
type asyncHasher struct {
	h    hash.Hash
	cur  []byte
	free chan []byte
	work chan []byte
	done chan struct{}
	once sync.Once
	sum  []byte
}

func newAsyncHasher(h hash.Hash) *asyncHasher {
	const blocks, size = 4, 1 << 20
	a := &asyncHasher{h: h, free: make(chan []byte, blocks), work: make(chan []byte, blocks), done: make(chan struct{})}
	for range blocks {
		a.free <- make([]byte, 0, size)
	}
	go func() {
		defer close(a.done)
		for b := range a.work {
			a.h.Write(b)
			a.free <- b[:0]
		}
	}()
	return a
}

// Write never fails.
func (a *asyncHasher) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if a.cur == nil {
			a.cur = <-a.free
		}
		k := copy(a.cur[len(a.cur):cap(a.cur)], p)
		a.cur = a.cur[:len(a.cur)+k]
		p = p[k:]
		if len(a.cur) == cap(a.cur) {
			a.work <- a.cur
			a.cur = nil
		}
	}
	return n, nil
}

// Sum flushes, waits for the hasher and returns the digest. Later Writes are not allowed.
func (a *asyncHasher) Sum() []byte {
	a.once.Do(func() {
		if len(a.cur) > 0 {
			a.work <- a.cur
			a.cur = nil
		}
		close(a.work)
		<-a.done
		a.sum = a.h.Sum(nil)
	})
	return a.sum
}
