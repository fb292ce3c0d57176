package sim

// OpenFiles is about how many files a simulation of n machines whose agents speak the agent
// protocol holds open in its process at its peak: per machine its agents' TLS connections and
// the installed OS's journal (measured: 2 043 for 1 000 machines against a running server), and
// the server's end of each connection when the server runs in this process too (3 060 for
// 1 000); plus a base for the store, the site agent and a margin.
func OpenFiles(n int, serverInProcess bool) uint64 {
	per := uint64(2)
	if serverInProcess {
		per = 3
	}
	return 1024 + per*uint64(max(n, 0))
}
