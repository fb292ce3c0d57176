package workflow

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"bcd/internal/ramdisk/kexec"
)

// boot.kexec's guest (and guestSite) reach the part that sends boot.kexec, validated as data;
// a composite step's argument that no part takes is refused rather than dropped.
func TestBootKexecGuestArgs(t *testing.T) {
	deploy := func(kexecArgs map[string]string) Profile {
		return Profile{Name: "cloud", Steps: []Step{s("metal.ensureRamdisk"), s("deploy.image", "image", "$image"), s("boot.prepareInstance"), {Use: "boot.kexec", Args: kexecArgs}}}
	}
	for _, tc := range []struct {
		name string
		p    Profile
		want map[string]string // boot.kexecOnce's arguments
		err  string
	}{
		{"no guest", deploy(nil), map[string]string{}, ""},
		{"cloud-init", deploy(map[string]string{"guest": "cloud-init", "guestSite": "http://10.0.0.1:8080"}),
			map[string]string{"guest": "cloud-init", "guestSite": "http://10.0.0.1:8080"}, ""},
		{"ignition", deploy(map[string]string{"guest": "ignition"}), map[string]string{"guest": "ignition"}, ""},
		{"none", deploy(map[string]string{"guest": "none"}), map[string]string{"guest": "none"}, ""},
		{"unknown guest", deploy(map[string]string{"guest": "kickstart"}), nil, `argument guest "kickstart": accepted are none, cloud-init, ignition`},
		{"unknown argument", deploy(map[string]string{"gest": "cloud-init"}), nil, "step boot.kexec takes no argument gest: its parts take action, guest, guestSite"},
		{"a part's own argument is not replaced", Profile{Name: "x", Steps: []Step{s("metal.ensureRamdisk", "device", "disk")}}, nil,
			"step metal.ensureRamdisk takes no argument device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Resolve(tc.p, map[string]string{"image": "img"})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]string
			for _, st := range r.Steps {
				switch st.Use {
				case "boot.kexecOnce":
					got = st.Args
				case "power.cycle", "await.rejoin":
					if st.When == WhenNotRejoined && (st.Args["guest"] != "" || st.Args["guestSite"] != "") {
						t.Fatalf("%s got the guest arguments: %v", st.Use, st.Args)
					}
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("boot.kexecOnce args %v, want %v", got, tc.want)
			}
		})
	}
	// The built-in default profile boots the image's own command line.
	p, _ := Find("default", nil)
	r, err := Resolve(p, map[string]string{"image": "img"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range r.Steps {
		if st.Use == "boot.kexecOnce" && len(st.Args) != 0 {
			t.Fatalf("default profile's kexec has arguments %v", st.Args)
		}
	}
	// An operator profile in JSON takes them.
	if _, err := ParseProfile("cloud", []byte(`{"steps":[{"use":"metal.ensureRamdisk"},{"use":"deploy.image","args":{"image":"$image"}},{"use":"boot.prepareInstance"},{"use":"boot.kexec","args":{"guest":"cloud-init","guestSite":"http://10.0.0.1:8080"}}]}`)); err != nil {
		t.Fatal(err)
	}
}

// The values the workflow accepts are those the ramdisk knows.
func TestGuestValuesMatchTheRamdisk(t *testing.T) {
	var want []string
	for _, g := range kexec.Guests() {
		want = append(want, string(g))
	}
	got := slices.DeleteFunc(slices.Clone(argRules["boot.kexec"]["guest"]), func(v string) bool { return v == "" })
	if !slices.Equal(got, want) {
		t.Fatalf("workflow accepts %v, the ramdisk %v", got, want)
	}
}

// A config drive is placed where it can work: after boot.prepareInstance, among the steps,
// beside a guest that reads NoCloud; and it makes cloud-init what reads the user-data.
func TestConfigDriveInProfiles(t *testing.T) {
	prof := func(steps ...Step) Profile {
		return Profile{Name: "cloud", Steps: steps, Cleanup: []Step{s("boot.cleanUp")}}
	}
	ensure, image, prepare, drive := s("metal.ensureRamdisk"), s("deploy.image", "image", "$image"), s("boot.prepareInstance"), s("deploy.configDrive")
	kexec := func(guest string) Step { return s("boot.kexec", "guest", guest) }
	for _, tc := range []struct {
		name  string
		p     Profile
		guest string // UserDataGuest
		err   string
	}{
		{"no drive, no guest", prof(ensure, image, prepare, s("boot.kexec")), "", ""},
		{"no drive, cloud-init", prof(ensure, image, prepare, kexec("cloud-init")), "cloud-init", ""},
		{"no drive, ignition", prof(ensure, image, prepare, kexec("ignition")), "ignition", ""},
		{"drive, no guest", prof(ensure, image, prepare, drive, s("boot.kexec")), "cloud-init", ""},
		{"drive, guest none", prof(ensure, image, prepare, drive, kexec("none")), "cloud-init", ""},
		{"drive, cloud-init", prof(ensure, image, prepare, drive, kexec("cloud-init")), "cloud-init", ""},
		{"drive, site given", prof(ensure, image, prepare, s("deploy.configDrive", "guestSite", "http://10.0.0.1:8080"), s("boot.kexec")), "cloud-init", ""},
		{"drive, no kexec (the BMC boots the disk)", prof(ensure, image, prepare, drive, s("power.cycle")), "cloud-init", ""},
		{"drive, ignition", prof(ensure, image, prepare, drive, kexec("ignition")), "", "deploy.configDrive writes a cloud-init config drive (NoCloud or OpenStack), which boot.kexec's guest ignition does not read"},
		{"drive before prepareInstance", prof(ensure, image, drive, prepare, s("boot.kexec")), "", "put it after boot.prepareInstance"},
		{"drive without prepareInstance", prof(ensure, image, drive, s("boot.kexec")), "", "put it after boot.prepareInstance"},
		{"drive in cleanup", Profile{Name: "cloud", Steps: []Step{ensure, image, prepare}, Cleanup: []Step{drive}}, "", "deploy.configDrive is not a cleanup step"},
		{"drive with an unknown argument", prof(ensure, image, prepare, s("deploy.configDrive", "label", "x")), "", "argument label"},
		{"drive, OpenStack's format", prof(ensure, image, prepare, s("deploy.configDrive", "format", "openstack"), s("boot.kexec")), "cloud-init", ""},
		{"drive, NoCloud's format named", prof(ensure, image, prepare, s("deploy.configDrive", "format", "nocloud"), kexec("cloud-init")), "cloud-init", ""},
		{"drive, a format nothing writes", prof(ensure, image, prepare, s("deploy.configDrive", "format", "iso9660"), s("boot.kexec")), "", `"iso9660"`},
		{"drive, OpenStack's format, ignition", prof(ensure, image, prepare, s("deploy.configDrive", "format", "openstack"), kexec("ignition")), "", "which boot.kexec's guest ignition does not read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Resolve(tc.p, map[string]string{"image": "img"})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := UserDataGuest(r.Steps); g != tc.guest {
				t.Fatalf("UserDataGuest %q, want %q", g, tc.guest)
			}
			if slices.ContainsFunc(r.Steps, func(st Step) bool { return st.Use == ConfigDriveStep }) != slices.Contains(r.CommandKinds, "deploy.configDrive") {
				t.Fatalf("command kinds %v", r.CommandKinds)
			}
		})
	}
}
