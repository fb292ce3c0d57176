package engine

import (
	"strings"
	"testing"
	"time"
)

func TestStepDue(t *testing.T) {
	const minute = int64(time.Minute / time.Microsecond)
	start := 1000 * minute
	base := stepClock{StartedAt: start, Deadline: start + 3*minute, Timeout: 3 * time.Minute, QueueTimeout: 30 * time.Minute}
	at := func(c stepClock, now int64) stepClock { c.Now = now; return c }
	queued := base
	queued.Command = true
	taken := func(at int64) stepClock { c := base; c.Command, c.Taken, c.TakenAt = true, true, at; return c }
	awaiting := base // no command: an await step
	long := base     // a step whose timeout is longer than the queue's (a wipe)
	long.Deadline, long.Timeout, long.Command = start+24*60*minute, 24*time.Hour, true
	for _, tc := range []struct {
		name    string
		clock   stepClock
		expired bool
		reason  string // part of it
		next    int64
	}{
		{"await, before its deadline", at(awaiting, start+minute), false, "", start + 3*minute},
		{"await, at its deadline", at(awaiting, start+3*minute), true, "did not finish within 3m0s", 0},
		{"queued, before the step's deadline", at(queued, start+minute), false, "", start + 3*minute},
		{"queued past the step's deadline: looked at again a timeout later", at(queued, start+4*minute), false, "", start + 7*minute},
		{"queued, near the queue's limit", at(queued, start+29*minute), false, "", start + 30*minute},
		{"queued at the queue's limit", at(queued, start+30*minute), true, "no agent took its command within 30m0s", 0},
		{"queued, the step's timeout longer than the queue's", at(long, start+31*minute), false, "", start + 24*60*minute},
		{"queued past the longer step's deadline", at(long, start+24*60*minute), true, "no agent took its command within 24h0m0s", 0},
		{"taken at once, before its deadline", at(taken(start), start+2*minute), false, "", start + 3*minute},
		{"taken at once, at its deadline", at(taken(start), start+3*minute), true, "did not finish within 3m0s", 0},
		{"taken after 10 minutes in the queue: its time runs from then", at(taken(start+10*minute), start+12*minute), false, "", start + 13*minute},
		{"taken after 10 minutes, 3 minutes later", at(taken(start+10*minute), start+13*minute), true, "did not finish within 3m0s", 0},
		{"reported before its acknowledgement was recorded", at(taken(0), start+2*minute), false, "", start + 3*minute},
		{"reported before its acknowledgement, past the deadline", at(taken(0), start+3*minute), true, "did not finish", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := stepDue(tc.clock)
			if v.Expired != tc.expired || !strings.Contains(v.Reason, tc.reason) || (!tc.expired && v.Next != tc.next) {
				t.Fatalf("stepDue = %+v, want expired %v (%q), next %d", v, tc.expired, tc.reason, tc.next)
			}
			if !v.Expired && v.Next <= tc.clock.Now {
				t.Fatalf("look again at %d, not after now (%d)", v.Next, tc.clock.Now)
			}
		})
	}
}

func TestTakenDeadline(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		created, deadline, now, want int64
	}{
		{"taken at once", 100, 400, 100, 400},
		{"taken after a wait: the whole time from now", 100, 400, 1000, 1300},
		{"no time recorded", 100, 0, 1000, 0},
		{"deadline before creation (clock moved)", 100, 50, 1000, 50},
	} {
		if got := takenDeadline(tc.created, tc.deadline, tc.now); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // part of the error; "" for none
	}{
		{"defaults", Config{}, ""},
		{"short-lived certificates (tests)", Config{SiteCertTTL: 3 * time.Second, NodeCertTTL: time.Minute, OSCertTTL: time.Hour}, ""},
		{"two years", Config{OSCertTTL: 2 * 365 * 24 * time.Hour}, ""},
		{"over two years", Config{SiteCertTTL: 3 * 365 * 24 * time.Hour}, "site agent certificate lifetime 26280h0m0s: accepted is up to 17520h0m0s"},
		{"negative", Config{NodeCertTTL: -time.Hour}, "ramdisk certificate lifetime -1h0m0s"},
		{"negative queue timeout", Config{QueueTimeout: -time.Minute}, "queue timeout -1m0s: accepted is a positive duration"},
	} {
		err := tc.cfg.Check()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
