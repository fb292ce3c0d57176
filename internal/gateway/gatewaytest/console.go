package gatewaytest

import (
	"context"
	"fmt"

	"bcd/internal/console"
	"bcd/internal/gateway"
)

// HubConsoles attaches agents' console streams to the sessions of h, as the engine does
// (without its check of the command's row: the test queue keeps none).
func HubConsoles(h *console.Hub) gateway.Consoles { return hubConsoles{h} }

type hubConsoles struct{ h *console.Hub }

func (c hubConsoles) AttachConsole(ctx context.Context, a gateway.AgentRef, id string) (gateway.ConsoleEnd, error) {
	end, err := c.h.Attach(ctx, id, a.AgentID)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", gateway.ErrNoConsole, err)
	}
	return end, nil
}
