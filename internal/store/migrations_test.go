package store

import (
	"io/fs"
	"slices"
	"strings"
	"testing"
)

// Both engines' migration directories hold the same migrations, each a goose SQL file.
func TestMigrationsMatchAcrossEngines(t *testing.T) {
	names := map[string][]string{}
	for _, dir := range []string{"migrations/sqlite", "migrations/postgres"} {
		entries, err := fs.ReadDir(migrations, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, _ := fs.ReadFile(migrations, dir+"/"+e.Name())
			if !strings.HasPrefix(string(b), "-- +goose Up") || !strings.Contains(string(b), "-- +goose Down") {
				t.Errorf("%s/%s is not a goose migration (%d bytes)", dir, e.Name(), len(b))
			}
			names[dir] = append(names[dir], e.Name())
		}
	}
	if !slices.Equal(names["migrations/sqlite"], names["migrations/postgres"]) {
		t.Errorf("migrations differ between engines:\n sqlite   %v\n postgres %v", names["migrations/sqlite"], names["migrations/postgres"])
	}
}
