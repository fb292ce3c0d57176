package sim

// OpenFiles is about how many files a simulation of n machines whose agents speak the agent
// protocol holds open in its process at its peak: per machine its agent's TLS connection (an
// agent's journal is open only while it writes, and a link that ended closes its connections),
// plus an eighth for a machine's next agent joining while its last one's connection closes,
// and the server's end of each when the server runs in this process too; plus a base for the
// store, the site agent and a margin. Measured at 1 000 machines: 1 056–1 073 against a running
// server, 2 096 with the server in this process.
func OpenFiles(n int, serverInProcess bool) uint64 {
	m := uint64(max(n, 0))
	per := m + m/8
	if serverInProcess {
		per *= 2
	}
	return 1024 + per
}
