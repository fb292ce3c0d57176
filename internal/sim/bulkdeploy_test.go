package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A bulk deploy takes Count of the pool's ready nodes (first by name), all or none, under one
// batch that names the image and covers the deploy profile's commands; each node gets the
// profile, the pinned image and its own sealed copy of the user-data. Asking for more than the
// pool can deploy now changes nothing.
func TestBulkDeploy(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 5)
		ready := rest(t, h, ids)
		if err := h.Metal.PutDeployProfile(ctx, h.Admin, "drive", `{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},`+
			`{"use":"boot.prepareInstance"},{"use":"deploy.configDrive"},{"use":"boot.kexec"}],"cleanup":[{"use":"boot.cleanUp"}]}`); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
			t.Fatal(err)
		}
		names := make([]string, 0, len(ready))
		byName := map[string]string{}
		for id, n := range ready {
			names = append(names, n.Name)
			byName[n.Name] = id
		}
		slices.Sort(names)
		userData := []byte("#cloud-config\nhostname: fleet\n")
		sum := sha256.Sum256(userData)

		res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Count: 3, Image: "img", Profile: "drive", UserData: userData, Reason: "rack 7 for the web tier"})
		if err != nil {
			t.Fatal(err)
		}
		var first []string
		for i, n := range res.Nodes {
			if !n.Accepted || n.Name != names[i] || n.State != "deploying" {
				t.Fatalf("node %d of the answer: %+v (want %s accepted, deploying)", i, n, names[i])
			}
			first = append(first, n.Node)
		}
		if len(first) != 3 || !res.Held || res.Batch.Size != 3 || res.Batch.Image != "img" || !strings.HasPrefix(res.Batch.ImageDigest, "sha256:") {
			t.Fatalf("bulk answer: %d nodes, held %v, batch %+v", len(first), res.Held, res.Batch)
		}
		_, leaves, err := h.Metal.Batch(ctx, h.Admin, res.Batch.ID, 1000)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]int{}
		for _, l := range leaves {
			kinds[l.Kind]++
		}
		if kinds["deploy.image"] != 3 || kinds["deploy.configDrive"] != 3 || kinds["boot.kexec"] != 3 {
			t.Fatalf("the batch's scope does not cover the deploy profile on each node: %v", kinds)
		}
		heldAtFirstStep(t, st, first)
		if _, err := h.Metal.Approve(ctx, alice, res.Batch.ID, "web tier"); err != nil {
			t.Fatal(err)
		}
		got := rest(t, h, ids)
		refs := map[string]bool{}
		for _, id := range ids {
			n := got[id]
			if !slices.Contains(first, id) {
				if n.State != "ready" {
					t.Fatalf("%s was not taken but is %s", n.Name, n.State)
				}
				continue
			}
			if n.State != "deployed" || n.DeployProfile != "drive" || n.DeployImage != "img" || n.UserDataSHA256 != hex.EncodeToString(sum[:]) || n.UserDataRef == "" || refs[n.UserDataRef] {
				t.Fatalf("%s: %s profile %q image %q user-data %s %q (%s)", n.Name, n.State, n.DeployProfile, n.DeployImage, n.UserDataSHA256, n.UserDataRef, n.FaultMsg)
			}
			refs[n.UserDataRef] = true
		}

		// Two are left: asking for three takes none.
		_, err = h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Count: 3, Image: "img", Reason: "more"})
		var conflict *metal.ConflictError
		if !errors.As(err, &conflict) || !strings.Contains(err.Error(), "pool default has 2 nodes that can deploy now (ready, out of maintenance): 3 were asked for; nothing was deployed") {
			t.Fatalf("count above what the pool has: %v", err)
		}
		for _, id := range ids {
			if n, _ := st.Node(ctx, id, ""); !slices.Contains(first, id) && (n.State != "ready" || n.BatchID != "") {
				t.Fatalf("a refused bulk deploy moved %s: %s batch %q", n.Name, n.State, n.BatchID)
			}
		}
		// Refused before anything moves: what is wrong, and what is accepted.
		for _, tc := range []struct {
			in   metal.BulkInput
			want string
		}{
			{metal.BulkInput{Verb: "retire", Nodes: ids, Image: "img"}, "image: applies to deploy only"},
			{metal.BulkInput{Verb: "inspect", Selectors: []string{"a=b"}, Count: 2}, "count: applies to deploy only"},
			{metal.BulkInput{Verb: "deploy", Count: 2}, "image: is required"},
			{metal.BulkInput{Verb: "deploy", Count: 2, Image: "nope"}, `no catalog image named "nope"`},
			{metal.BulkInput{Verb: "deploy", Count: 2, Image: "img", Profile: "nope"}, `unknown deploy profile "nope"`},
			{metal.BulkInput{Verb: "deploy", Count: 1, Nodes: ids[:1], Image: "img"}, "count takes nodes from the pool by itself"},
			{metal.BulkInput{Verb: "deploy", Count: -1, Image: "img"}, "count: -1: from 1 to 10000"},
			{metal.BulkInput{Verb: "deploy", Image: "img"}, "give either node names or ids, or label selectors"},
			{metal.BulkInput{Verb: "deploy", Selectors: []string{"a=b"}, Image: "img", Spread: "rack"}, "spread: applies with count only"},
			{metal.BulkInput{Verb: "deploy", Count: 2, Image: "img", Spread: "Rack!"}, `spread: label key "Rack!" is not valid: use 1-63 characters`},
			// The built-in default profile boots an image that reads no user-data.
			{metal.BulkInput{Verb: "deploy", Count: 2, Image: "img", UserData: userData}, "the deploy profile's boot.kexec has no guest"},
		} {
			tc.in.Pool, tc.in.Reason = "default", "test"
			_, err := h.Metal.Bulk(ctx, h.Admin, tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want %q", tc.in, err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "hostname: fleet") {
				t.Errorf("the refusal quotes the user-data: %v", err)
			}
		}
		for _, id := range ids {
			if n, _ := st.Node(ctx, id, ""); !slices.Contains(first, id) && (n.State != "ready" || n.UserDataRef != "") {
				t.Fatalf("a refused bulk deploy changed %s: %s user-data %q", n.Name, n.State, n.UserDataRef)
			}
		}
		// Deployed nodes named again are refused one by one; the ready ones are taken.
		res, err = h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Nodes: ids, Image: "img", Reason: "the rest"})
		if err != nil {
			t.Fatal(err)
		}
		accepted := 0
		for _, n := range res.Nodes {
			if n.Accepted == slices.Contains(first, n.Node) {
				t.Fatalf("%+v", n)
			}
			if n.Accepted {
				accepted++
			}
		}
		if accepted != 2 {
			t.Fatalf("accepted %d, want the 2 ready nodes", accepted)
		}
		if _, err := h.Metal.Approve(ctx, alice, res.Batch.ID, ""); err != nil {
			t.Fatal(err)
		}
		for _, n := range rest(t, h, ids) {
			if n.State != "deployed" {
				t.Fatalf("%s: %s %s", n.Name, n.State, n.FaultMsg)
			}
		}
	})
}

// acceptedNames are the names of a bulk's nodes, in the answer's order; a refused one fails the
// test.
func acceptedNames(t *testing.T, res metal.BulkResult) []string {
	t.Helper()
	var names []string
	for _, n := range res.Nodes {
		if !n.Accepted {
			t.Fatalf("%+v refused", n)
		}
		names = append(names, n.Name)
	}
	return names
}

// A bulk deploy with Spread takes its Count in turn from each value of the label (the values
// in order, the nodes without it last, each value's nodes by name); its answer and its batch's
// creation event say how many it took of each.
func TestBulkDeploySpread(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h := startEmpty(t, st, 0)
		racks := []string{"r1", "r1", "r1", "r2", "r3", "r3", ""}
		var ids []string
		for i, rack := range racks {
			var labels map[string]string
			if rack != "" {
				labels = map[string]string{"rack": rack}
			}
			mac := fmt.Sprintf("02:5b:00:00:00:%02x", i)
			uuid := fmt.Sprintf("%08x-005b-4000-8000-%012x", i, i)
			n, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: fmt.Sprintf("m%d", i), Pool: "default", MACs: []string{mac}, ProductUUID: uuid, Labels: labels,
				BMC: metal.BMCInput{Address: "https://10.9.0.1", Username: "admin", Password: "sim-password"}})
			if err != nil {
				t.Fatal(err)
			}
			h.Sim.Add(&Machine{NodeID: n.ID, UUID: uuid, MACs: []string{mac}})
			ids = append(ids, n.ID)
		}
		h.nudge()
		rest(t, h, ids)
		res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Count: 5, Spread: "rack", Image: "img", Reason: "spread over racks"})
		if err != nil {
			t.Fatal(err)
		}
		got := acceptedNames(t, res)
		if want := []string{"m0", "m3", "m4", "m6", "m1"}; !slices.Equal(got, want) {
			t.Fatalf("took %v, want %v (r1, r2, r3, no rack, r1)", got, want)
		}
		if want := map[string]int{"r1": 2, "r2": 1, "r3": 1, "(none)": 1}; !maps.Equal(res.SpreadTaken, want) {
			t.Fatalf("the answer's counts by rack %v, want %v", res.SpreadTaken, want)
		}
		all, err := st.Events(ctx, store.EventFilter{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		evs := slices.DeleteFunc(all, func(e store.Event) bool { return e.Kind != "batch.create" })
		var created struct {
			Count  int
			Spread struct {
				Label string
				Taken map[string]int
			}
		}
		if len(evs) != 1 || json.Unmarshal([]byte(evs[0].Data), &created) != nil {
			t.Fatalf("batch.create events: %+v", evs)
		}
		if want := map[string]int{"r1": 2, "r2": 1, "r3": 1, "(none)": 1}; created.Count != 5 || created.Spread.Label != "rack" || !maps.Equal(created.Spread.Taken, want) {
			t.Fatalf("batch.create data %s, want count 5 and spread over rack %v", evs[0].Data, want)
		}
	})
}

// A bulk deploy with Require takes its Count from the nodes whose inventory, as their ramdisks
// reported it at inspection, meets every requirement; a node never inspected meets none, and a
// count the pool cannot meet says how many such nodes it left out. The node's inventory reads
// back as reported, with its facts.
func TestBulkDeployRequire(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h := startEmpty(t, st, 0)
		gpu := SimHardware()
		gpu.Memory.TotalBytes = 512 << 30
		gpu.PCI = []inventory.PCIDevice{{Address: "0000:41:00.0", Vendor: "10de", GPU: true, NVIDIA: true}, {Address: "0000:c1:00.0", Vendor: "10de", GPU: true, NVIDIA: true}}
		small := SimHardware()
		small.Memory.TotalBytes = 64 << 30
		// m0 and m2 have two NVIDIA GPUs and 512 GiB, m1 and m3 64 GiB and none; m1 is in row 9.
		hardware := []*inventory.Inventory{&gpu, &small, &gpu, &small}
		var ids []string
		for i, hw := range hardware {
			mac := fmt.Sprintf("02:5c:00:00:00:%02x", i)
			uuid := fmt.Sprintf("%08x-005c-4000-8000-%012x", i, i)
			var labels map[string]string
			if i == 1 {
				labels = map[string]string{"row": "9"}
			}
			n, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: fmt.Sprintf("m%d", i), Pool: "default", MACs: []string{mac}, ProductUUID: uuid, Labels: labels,
				BMC: metal.BMCInput{Address: "https://10.9.0.1", Username: "admin", Password: "sim-password"}})
			if err != nil {
				t.Fatal(err)
			}
			h.Sim.Add(&Machine{NodeID: n.ID, UUID: uuid, MACs: []string{mac}, Hardware: hw})
			ids = append(ids, n.ID)
		}
		h.nudge()
		rest(t, h, ids)

		inv, err := h.Metal.Inventory(ctx, h.Admin, "m0")
		if err != nil {
			t.Fatal(err)
		}
		if f := inv.Facts; f.MemoryBytes != 512<<30 || f.NVIDIAGPUs != 2 || f.Cores != 8 || f.Disks != 1 || f.NICs != 1 || f.FastestNICMbps != 25000 || f.BootMode != "uefi" ||
			inv.Inventory.DMI.ProductUUID != "00000000-005c-4000-8000-000000000000" || inv.UpdatedAt == 0 {
			t.Fatalf("m0's inventory: facts %+v, DMI %+v, updated at %d", f, inv.Inventory.DMI, inv.UpdatedAt)
		}

		// A listing with requirements, a node a page: the GPU machines, each page reading on
		// past the nodes that do not meet them.
		var listed []string
		for tok := ""; ; {
			page, next, err := h.Metal.List(ctx, h.Admin, metal.ListInput{Require: []string{"gpus.nvidia>=2"}, PageSize: 1, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range page {
				listed = append(listed, n.Name)
			}
			if tok = next; tok == "" || len(listed) > 4 {
				break
			}
		}
		if want := []string{"m0", "m2"}; !slices.Equal(listed, want) {
			t.Fatalf("the GPU machines, a page at a time: %v, want %v", listed, want)
		}
		if page, _, err := h.Metal.List(ctx, h.Admin, metal.ListInput{Require: []string{"memory<128GiB"}}); err != nil || len(page) != 2 || page[0].Name != "m1" || page[1].Name != "m3" {
			t.Fatalf("the small machines: %+v, %v", page, err)
		}
		var invalid *metal.InvalidError
		if _, _, err := h.Metal.List(ctx, h.Admin, metal.ListInput{Require: []string{"gpus>>1"}}); !errors.As(err, &invalid) || invalid.Field != "require" {
			t.Fatalf("a listing with a bad requirement: %v", err)
		}

		require := []string{"memory>=256GiB", "gpus.nvidia>=2"}
		res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Count: 2, Require: require, Image: "img", Reason: "the training cluster"})
		if err != nil {
			t.Fatal(err)
		}
		got := acceptedNames(t, res)
		if want := []string{"m0", "m2"}; !slices.Equal(got, want) {
			t.Fatalf("took %v, want %v (the two GPU machines)", got, want)
		}
		all, err := st.Events(ctx, store.EventFilter{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		evs := slices.DeleteFunc(all, func(e store.Event) bool { return e.Kind != "batch.create" })
		var created struct{ Require []string }
		if len(evs) != 1 || json.Unmarshal([]byte(evs[0].Data), &created) != nil ||
			!slices.Equal(created.Require, []string{"memory>=274877906944", "gpus.nvidia>=2"}) {
			t.Fatalf("batch.create events %+v: want the requirements recorded, sizes in bytes", evs)
		}

		// The pool's two small machines cannot make a count of 3.
		_, err = h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Count: 3, Require: []string{"memory<128GiB"}, Image: "img", Reason: "small ones"})
		var conflict *metal.ConflictError
		if !errors.As(err, &conflict) || !strings.Contains(err.Error(), "has 2 nodes that can deploy now matching memory<128GiB") {
			t.Fatalf("two small machines for a count of 3: %v", err)
		}
		// A node enrolled since, never inspected, meets no requirement: what selectors choose
		// leaves it out, and the small machine they choose moves.
		if _, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: "m9", Pool: "default", MACs: []string{"02:5c:00:00:00:99"}, Labels: map[string]string{"row": "9"},
			BMC: metal.BMCInput{Address: "https://10.9.0.99", Username: "admin", Password: "sim-password"}}); err != nil {
			t.Fatal(err)
		}
		res, err = h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "manage", Selectors: []string{"row=9"}, Require: []string{"gpus=0"}, Reason: "row 9 out"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Nodes) != 1 || res.Nodes[0].Name != "m1" || !res.Nodes[0].Accepted {
			t.Fatalf("row 9 without GPUs: %+v, want m1 alone, accepted", res.Nodes)
		}
		if _, err := h.Metal.Inventory(ctx, h.Admin, "m9"); !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "bcd node inspect") {
			t.Fatalf("the inventory of a node never inspected: %v", err)
		}
		for _, c := range []struct {
			in   metal.BulkInput
			want string
		}{
			{metal.BulkInput{Pool: "default", Verb: "deploy", Count: 1, Require: []string{"ram>=1GiB"}, Image: "img", Reason: "r"}, `unknown key "ram"`},
			{metal.BulkInput{Pool: "default", Verb: "retire", Nodes: []string{"m1"}, Require: []string{"gpus=0"}, Reason: "r"}, "not with node names"},
		} {
			if _, err := h.Metal.Bulk(ctx, h.Admin, c.in); !errors.As(err, &invalid) || invalid.Field != "require" || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: %v, want require invalid with %q", c.in, err, c.want)
			}
		}
	})
}
