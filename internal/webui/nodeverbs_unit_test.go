package webui

import (
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/provision"
)

func TestVerbInput(t *testing.T) {
	spec := func(v string) verbSpec {
		s, ok := verbSpecOf(v)
		if !ok {
			t.Fatalf("no spec for %s", v)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		verb string
		form url.Values
		want metal.VerbInput
		err  string
	}{
		{"simple", "manage", url.Values{"version": {"7"}, "reason": {"  why  "}}, metal.VerbInput{Node: "n", Reason: "why", ExpectedVersion: 7}, ""},
		{"no version", "manage", url.Values{}, metal.VerbInput{}, "the form must carry the node version"},
		{"version zero", "manage", url.Values{"version": {"0"}}, metal.VerbInput{}, "the form must carry the node version"},
		{"version not a number", "manage", url.Values{"version": {"x"}}, metal.VerbInput{}, `version "x"`},
		{"retire unconfirmed", "retire", url.Values{"version": {"1"}}, metal.VerbInput{}, "retire needs confirmation"},
		{"abort unconfirmed", "abort", url.Values{"version": {"1"}, "confirm": {"true"}}, metal.VerbInput{}, "abort needs confirmation"},
		{"undeploy unconfirmed", "undeploy", url.Values{"version": {"1"}, "wipe": {"full"}}, metal.VerbInput{}, "undeploy needs confirmation"},
		{"undeploy", "undeploy", url.Values{"version": {"1"}, "wipe": {"full"}, "confirm": {"yes"}}, metal.VerbInput{Node: "n", ExpectedVersion: 1, Wipe: "full"}, ""},
		{"deploy", "deploy", url.Values{"version": {"2"}, "image": {"ubuntu"}, "profile": {"web"}, "confirm": {"yes"}}, metal.VerbInput{Node: "n", ExpectedVersion: 2, Image: "ubuntu", Profile: "web"}, ""},
		{"deploy with user-data", "deploy", url.Values{"version": {"2"}, "image": {"ubuntu"}, "confirm": {"yes"}, "user_data": {"#!/bin/sh\r\necho hi\r\n"}},
			metal.VerbInput{Node: "n", ExpectedVersion: 2, Image: "ubuntu", UserData: []byte("#!/bin/sh\necho hi\n")}, ""},
		{"deploy with blank user-data", "deploy", url.Values{"version": {"2"}, "image": {"ubuntu"}, "confirm": {"yes"}, "user_data": {" \r\n"}},
			metal.VerbInput{Node: "n", ExpectedVersion: 2, Image: "ubuntu"}, ""},
		{"power", "power", url.Values{"version": {"3"}, "action": {"cycle"}, "confirm": {"yes"}}, metal.VerbInput{Node: "n", ExpectedVersion: 3, PowerAction: "cycle"}, ""},
		{"maintenance on", "maintenance", url.Values{"version": {"4"}, "on": {"true"}, "reason": {"r"}}, metal.VerbInput{Node: "n", ExpectedVersion: 4, MaintenanceOn: true, Reason: "r"}, ""},
		{"maintenance off", "maintenance", url.Values{"version": {"4"}, "on": {"false"}}, metal.VerbInput{Node: "n", ExpectedVersion: 4}, ""},
		{"maintenance unsaid", "maintenance", url.Values{"version": {"4"}}, metal.VerbInput{}, "accepted are true (turn maintenance on) or false"},
		{"recover unconfirmed", "recover", url.Values{"version": {"5"}}, metal.VerbInput{}, "recover needs confirmation"},
		{"recover", "recover", url.Values{"version": {"5"}, "confirm": {"yes"}}, metal.VerbInput{Node: "n", ExpectedVersion: 5}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := verbInput(spec(tc.verb), "n", tc.form)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("%+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

// TestVerbTable: the page's verbs are the table's verbs a node can be asked for (not enroll or
// delete, which have their own calls), and exactly retire, undeploy, abort, deploy, power and
// recover (a failed deploy's is a release) need confirmation.
func TestVerbTable(t *testing.T) {
	var got, destructive []string
	for _, v := range nodeVerbs() {
		got = append(got, string(v.Verb))
		if v.Destructive {
			destructive = append(destructive, string(v.Verb))
		}
		if _, ok := provision.RuleOf(v.Verb); !ok {
			t.Errorf("%s is no verb of the provision table", v.Verb)
		}
	}
	var want []string
	for _, v := range provision.Verbs() {
		if v != provision.VerbEnroll && v != provision.VerbDelete {
			want = append(want, string(v))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	slices.Sort(destructive)
	if !slices.Equal(got, want) {
		t.Errorf("page verbs %v, want %v", got, want)
	}
	if want := []string{"abort", "deploy", "power", "recover", "retire", "undeploy"}; !slices.Equal(destructive, want) {
		t.Errorf("verbs needing confirmation %v, want %v", destructive, want)
	}
	if got := offeredVerbs([]string{"delete", "power", "manage", "bogus"}); len(got) != 2 || got[0].Verb != provision.VerbManage || got[1].Verb != provision.VerbPower {
		t.Errorf("offered %+v", got)
	}
}

func TestVerbMessage(t *testing.T) {
	for code, want := range map[string]string{
		"maintenance-on":  "Maintenance is on.",
		"maintenance-off": "Maintenance is off",
		"power-held":      "waits for approval",
		"power":           "The power command was queued.",
		"retire":          "Retire accepted",
		"deploy":          "requires approvals",
		"manage":          "Manage accepted",
		"<script>":        "",
		"":                "",
		"maintenance":     "",
	} {
		got := verbMessage(code)
		if want == "" && got != "" || !strings.Contains(got, want) {
			t.Errorf("%q: %q, want %q", code, got, want)
		}
	}
}

func TestDeployProfileNames(t *testing.T) {
	got := deployProfileNames(map[string]string{"web": "", "metal-release": "", "default": "", "db": "", "metal-custom": ""})
	// metal-release is an override of a built-in profile, not a deploy profile; metal-custom
	// names no built-in and is one.
	if want := []string{"default", "db", "metal-custom", "web"}; !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}
