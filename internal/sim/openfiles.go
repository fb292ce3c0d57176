package sim

// OpenFiles is about how many files a simulation of n machines against a running server
// (--server) holds open in its process at its peak: per machine its agent's TLS connection (an
// agent's journal is open only while it writes, and a link that ended closes its connections),
// plus an eighth for a machine's next agent joining while its last one's connection closes;
// plus a base for the site agent and a margin. Measured at 1 000 machines: 1 056–1 073. (With
// the server in the process, --gateway, the agents' connections are in memory: memnet.)
func OpenFiles(n int) uint64 {
	m := uint64(max(n, 0))
	return 1024 + m + m/8
}
