package engine

import (
	"fmt"
	"time"
)

// DefaultQueueTimeout is how long a step's command may wait for an agent to take it before the
// step fails (Config.QueueTimeout).
const DefaultQueueTimeout = 30 * time.Minute

// stepClock is what decides whether a step in progress ran out of time (microseconds).
type stepClock struct {
	Now                 int64
	StartedAt, Deadline int64 // the step's: its start, and its start plus its timeout
	Timeout             time.Duration
	QueueTimeout        time.Duration
	// Command: the step is waiting on a command. Taken: an agent acknowledged it, at TakenAt
	// (0: not recorded, as for a final report that came before the acknowledgement).
	Command bool
	Taken   bool
	TakenAt int64
}

// stepVerdict: Expired with its Reason, or the time to look again (Next).
type stepVerdict struct {
	Expired bool
	Reason  string
	Next    int64
}

// stepDue decides whether a step in progress ran out of time. A step's timeout is for its
// work: its command's time runs from when an agent took it, not from when it was queued, so a
// backlog at a busy site (thousands of nodes released at once) or a site agent's restart fails
// no step. A command no agent takes has QueueTimeout from the step's start (or the step's own
// timeout, if longer); until an agent takes it, the step is looked at again every Timeout, as
// an acknowledgement wakes nobody. Pure.
func stepDue(c stepClock) stepVerdict {
	timeout := c.Timeout.Microseconds()
	if c.Command && !c.Taken {
		limit := max(c.Deadline, c.StartedAt+c.QueueTimeout.Microseconds())
		switch {
		case c.Now >= limit:
			return stepVerdict{Expired: true, Reason: fmt.Sprintf("no agent took its command within %s", time.Duration(limit-c.StartedAt)*time.Microsecond)}
		case c.Now < c.Deadline:
			return stepVerdict{Next: c.Deadline}
		default:
			return stepVerdict{Next: min(limit, c.Now+timeout)}
		}
	}
	deadline := c.Deadline
	if c.Command && c.TakenAt > 0 {
		deadline = max(deadline, c.TakenAt+timeout)
	}
	if c.Now >= deadline {
		return stepVerdict{Expired: true, Reason: fmt.Sprintf("did not finish within %s", c.Timeout)}
	}
	return stepVerdict{Next: deadline}
}

// takenDeadline is the deadline an agent that takes a command at now is given: the command's
// whole time (its deadline less its creation) from now, never less than its deadline. Pure.
func takenDeadline(createdAt, deadline, now int64) int64 {
	if deadline <= createdAt {
		return deadline
	}
	return max(deadline, now+(deadline-createdAt))
}
