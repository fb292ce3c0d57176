package cli

import (
	"log/slog"

	"bcd/internal/gcbudget"
	"bcd/internal/site/sitecmd"
)

// defaultMemoryBudget is --memory-budget's default: the memory Go's collector lets the process
// reach before it collects, while its live heap is small (gcbudget). 10 000 simulated machines
// in one process peaked at 265–274 MiB resident with it (docs/benchmarks.md, session 44).
const defaultMemoryBudget = "192MiB"

// minMemoryBudget is the smallest budget accepted (other than 0, off).
const minMemoryBudget = 16 << 20

// startMemoryBudget gives the collector the budget of --memory-budget (gcbudget): "0" leaves
// Go's default collector (GOGC=100); GOGC or GOMEMLIMIT in the environment win over the flag.
// The caller stops it (a nil budget's Stop does nothing).
func startMemoryBudget(g *globals, flag string, log *slog.Logger) (*gcbudget.Budget, error) {
	n, err := sitecmd.ParseSize(flag)
	if err != nil {
		return nil, usagef("--memory-budget: %v", err)
	}
	if n == 0 {
		return nil, nil
	}
	if n < minMemoryBudget {
		return nil, usagef("--memory-budget %s: use 16MiB or more, or 0 for Go's default collector", flag)
	}
	fromEnv := g.env.Getenv("GOGC") != "" || g.env.Getenv("GOMEMLIMIT") != ""
	return gcbudget.Start(n, fromEnv, log), nil
}
