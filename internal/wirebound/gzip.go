package wirebound

import (
	"compress/gzip"
	"io"

	"connectrpc.com/connect"
)

// Gzip is the compression the agent gateway and the API answer with: gzip at its fastest
// level, and only for messages of at least minBytes (a smaller one costs more to compress than
// to send). Connect's own gzip runs at the default level, whose compressor clears 640 KiB of
// tables for every message.
func Gzip(minBytes int) connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithCompressMinBytes(minBytes),
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &gzip.Reader{} },
			func() connect.Compressor {
				w, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed) // (a valid level: no error)
				return w
			}),
	)
}
