package api

import (
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/store"
)

// NodeService/Inventory answers a node's stored inventory and its facts; a node that never
// reported one, and a node of another tenant, are not_found.
func TestNodeInventoryOverHTTP(t *testing.T) {
	e := newEnv(t)
	for i, mac := range []string{"52:54:00:00:20:01", "52:54:00:00:20:02"} {
		if code, body := e.post(t, enrollPath, e.admin, enrollJSON("h"+string(rune('0'+i)), mac)); code != 200 {
			t.Fatalf("enroll: %d %s", code, body)
		}
	}
	// As inventory.refresh stores it: the identity first, then the ramdisk's inventory.
	const reported = `{"systemUuid":"u","macs":["52:54:00:00:20:01"],"cpu":{"model":"EPYC","sockets":2,"cores":64,"threads":128,"flags":["avx512f"]},` +
		`"memory":{"totalBytes":549755813888},"disks":[{"name":"nvme0n1","sizeBytes":3840000000000,"transport":"nvme"},{"name":"sdz","sizeBytes":1,"removable":true}],` +
		`"nics":[{"name":"eno1","mac":"52:54:00:00:20:01","speedMbps":25000,"carrier":true}],"pci":[{"address":"0000:41:00.0","gpu":true,"nvidia":true}],` +
		`"dmi":{"sysVendor":"Dell Inc.","productName":"XE8640"},"bootMode":"uefi"}`
	if err := e.st.Write(t.Context(), func(tx *store.Tx) error {
		n, err := tx.LockNode(t.Context(), "h0", "")
		if err != nil {
			return err
		}
		return tx.PutInventory(t.Context(), n.ID, json.RawMessage(reported))
	}); err != nil {
		t.Fatal(err)
	}
	const path = "/bcd.v1.NodeService/Inventory"
	code, body := e.post(t, path, e.admin, `{"node":"h0"}`)
	if code != 200 {
		t.Fatalf("h0's inventory: %d %s", code, body)
	}
	var got struct {
		Name, UpdatedAt, Inventory string
		Facts                      map[string]any
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	// (64-bit integers are strings in protobuf's JSON)
	for k, want := range map[string]any{"cpuModel": "EPYC", "cores": 64.0, "memoryBytes": "549755813888", "disks": 1.0, "largestDiskBytes": "3840000000000",
		"nvme": 1.0, "nvidiaGpus": 1.0, "fastestNicMbps": 25000.0, "bootMode": "uefi", "vendor": "Dell Inc."} {
		if got.Facts[k] != want {
			t.Errorf("facts.%s = %v, want %v (%s)", k, got.Facts[k], want, body)
		}
	}
	if got.Name != "h0" || got.UpdatedAt == "" || !strings.Contains(got.Inventory, `"productName":"XE8640"`) || !strings.Contains(got.Inventory, `"sizeBytes":3840000000000`) {
		t.Errorf("h0's inventory answer: %s", body)
	}
	for _, c := range []struct {
		token, body string
		code        int
		want        string
	}{
		{e.admin, `{"node":"h1"}`, 404, "no inventory yet"},
		{e.admin, `{"node":"nope"}`, 404, ""},
		{e.admin, `{}`, 400, "node: is required"},
	} {
		if code, body := e.post(t, path, c.token, c.body); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s, want %d with %q", c.body, code, body, c.code, c.want)
		}
	}
	// A listing with hardware: h0's facts, none for h1.
	code, body = e.post(t, "/bcd.v1.NodeService/List", e.admin, `{"hardware":true}`)
	var list struct {
		Nodes []struct {
			Name     string
			Hardware *struct {
				Cores       int
				MemoryBytes string
			}
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Nodes) != 2 {
		t.Fatalf("a listing with hardware: %d %s", code, body)
	}
	for _, n := range list.Nodes {
		if hw := n.Hardware; (n.Name == "h0") != (hw != nil) || hw != nil && (hw.Cores != 64 || hw.MemoryBytes != "549755813888") {
			t.Errorf("%s listed with hardware %+v", n.Name, hw)
		}
	}
	if _, body := e.post(t, "/bcd.v1.NodeService/List", e.admin, `{}`); strings.Contains(body, `"hardware"`) {
		t.Errorf("a listing without hardware has it: %s", body)
	}
	// The doctor names a machine at rest that its pool's requirements, raised since, exclude.
	if err := e.st.Write(t.Context(), func(tx *store.Tx) error {
		n, err := tx.LockNode(t.Context(), "h0", "")
		if err != nil {
			return err
		}
		n.State, n.TargetState, n.ChainVerb = "ready", "", ""
		return tx.UpdateNode(t.Context(), &n)
	}); err != nil {
		t.Fatal(err)
	}
	if code, body := e.post(t, "/bcd.v1.InventoryService/UpdatePool", e.admin, `{"pool":"default","policy":{"hardwareProfile":"redfish","hardwareRequirements":["memory>=1TiB"]}}`); code != 200 {
		t.Fatalf("pool requirements: %d %s", code, body)
	}
	// (protojson's spacing varies from build to build: the answer is read as JSON)
	code, body = e.post(t, "/bcd.v1.NodeService/Doctor", e.admin, `{}`)
	var doctor struct {
		HardwareShort []struct{ Name, State, Message string }
	}
	if code != 200 || json.Unmarshal([]byte(body), &doctor) != nil || len(doctor.HardwareShort) != 1 ||
		doctor.HardwareShort[0] != (struct{ Name, State, Message string }{"h0", "ready", "memory>=1TiB: it has 512GiB"}) {
		t.Errorf("doctor: %d %s", code, body)
	}
	// Another tenant's token finds no such node.
	if code, body := e.post(t, "/bcd.v1.InventoryService/CreateTenant", e.admin, `{"name":"acme"}`); code != 200 {
		t.Fatalf("tenant: %d %s", code, body)
	}
	viewer := e.tokenIn(t, "acme-viewer", "viewer", "acme")
	if code, body := e.post(t, path, viewer, `{"node":"h0"}`); code != 404 || strings.Contains(body, "XE8640") {
		t.Errorf("another tenant's viewer: %d %s, want not_found", code, body)
	}
}
