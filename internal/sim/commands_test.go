package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestNodeCommands: a node's commands as bcd node commands lists them after enrolment and a
// deploy: newest first, each with the agent that ran it, its times in order, its workflow's
// profile and step; one workflow's alone; refusals; another tenant sees none.
func TestNodeCommands(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 1)
		rest(t, h, ids)
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "sim-image"}); err != nil {
			t.Fatal(err)
		}
		if got := rest(t, h, ids); got[ids[0]].State != "deployed" {
			t.Fatalf("after deploy: %+v", got[ids[0]])
		}
		cmds, err := h.Metal.Commands(ctx, h.Admin, ids[0], "", 0)
		if err != nil {
			t.Fatal(err)
		}
		all, err := st.Commands(ctx, ids[0], 1000) // oldest first
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) != len(all) || len(cmds) < 10 {
			t.Fatalf("%d commands listed, the store holds %d: want all of them (at least 10)", len(cmds), len(all))
		}
		profiles := map[string]bool{}
		for i, c := range cmds {
			if c.ID != all[len(all)-1-i].ID {
				t.Fatalf("command %d is %s (%s), want %s: newest first", i, c.ID, c.Kind, all[len(all)-1-i].ID)
			}
			if c.State != "succeeded" || c.TargetAgent == "" || c.DeliveredAt < c.CreatedAt || c.FinishedAt < c.DeliveredAt || c.Attempts < 1 {
				t.Errorf("command %s (%s): state %s, agent %q, created %d, delivered %d, finished %d, attempts %d", c.ID, c.Kind, c.State, c.TargetAgent,
					c.CreatedAt, c.DeliveredAt, c.FinishedAt, c.Attempts)
			}
			if c.WorkflowID == "" || c.Profile == "" {
				t.Errorf("command %s (%s) without its workflow (%q) or profile (%q)", c.ID, c.Kind, c.WorkflowID, c.Profile)
			}
			profiles[c.Profile] = true
		}
		for _, p := range []string{"metal-enroll", "metal-inspect", "metal-commission", "default"} {
			if !profiles[p] {
				t.Errorf("no command of a %s workflow among %v", p, profiles)
			}
		}
		// The deploy's own: its image written by the node's ramdisk, then the kexec.
		deploy := cmds[0].WorkflowID
		one, err := h.Metal.Commands(ctx, h.Admin, ids[0], deploy, 0)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, c := range one {
			if c.WorkflowID != deploy {
				t.Errorf("--workflow %s listed %s of workflow %s", deploy, c.ID, c.WorkflowID)
			}
			kinds = append(kinds, c.Kind)
		}
		if !slices.Contains(kinds, "deploy.image") || !slices.Contains(kinds, "boot.kexec") {
			t.Errorf("the deploy's commands: %v, want deploy.image and boot.kexec among them", kinds)
		}
		if few, err := h.Metal.Commands(ctx, h.Admin, ids[0], "", 2); err != nil || len(few) != 2 || few[0].ID != cmds[0].ID {
			t.Errorf("the newest 2: %d, %v", len(few), err)
		}
		var invalid *metal.InvalidError
		for _, c := range []struct {
			node, workflow string
			limit          int
			want           string
		}{
			{"", "", 0, "node: is required"},
			{ids[0], "", 1001, "accepted are 1-1000"},
			{ids[0], "../etc", 0, "is not a workflow id"},
		} {
			if _, err := h.Metal.Commands(ctx, h.Admin, c.node, c.workflow, c.limit); !errors.As(err, &invalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("node %q workflow %q limit %d: %v, want invalid saying %q", c.node, c.workflow, c.limit, err, c.want)
			}
		}
		if _, err := h.Metal.Commands(ctx, h.Admin, "no-such-node", "", 0); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("an unknown node: %v, want not found", err)
		}
		other := auth.Principal{Name: "eve", Role: auth.Viewer, TenantID: "another"}
		if got, err := h.Metal.Commands(ctx, other, ids[0], "", 0); err == nil && len(got) > 0 {
			t.Errorf("another tenant listed %d of the node's commands", len(got))
		}
	})
}
