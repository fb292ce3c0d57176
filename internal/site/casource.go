package site

import (
	"bytes"
	"os"
	"sync"
	"time"
)

// caSource is the CA bundle the agent holds in its data dir (agentlink keeps it there, and
// replaces it when a rotation of the agent CA brings the next CA): what the ramdisks it boots
// and the installed OSes it serves metadata to are told to trust. The file is read again only
// when its size or modification time changed; fallback (the CA given for the first join) is
// used while there is none.
type caSource struct {
	path     string
	fallback []byte

	mu   sync.Mutex
	size int64
	mod  time.Time
	pem  []byte
}

func (c *caSource) current() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(c.path)
	if err != nil {
		if c.pem != nil {
			return bytes.Clone(c.pem) // kept: the file is being replaced, or went away
		}
		return bytes.Clone(c.fallback)
	}
	if c.pem == nil || fi.Size() != c.size || !fi.ModTime().Equal(c.mod) {
		b, err := os.ReadFile(c.path)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			if c.pem != nil {
				return bytes.Clone(c.pem)
			}
			return bytes.Clone(c.fallback)
		}
		c.pem, c.size, c.mod = b, fi.Size(), fi.ModTime()
	}
	return bytes.Clone(c.pem)
}
