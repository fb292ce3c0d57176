package cache

import (
	"fmt"
	"sync"
	"testing"
)

func TestBoundedEmptiesWhenFull(t *testing.T) {
	b := New[string, int](3)
	if _, ok := b.Get("a"); ok {
		t.Fatal("empty cache has a")
	}
	for i, k := range []string{"a", "b", "c"} {
		b.Put(k, i)
	}
	b.Put("b", 9) // replacing a kept key never empties
	if v, ok := b.Get("b"); !ok || v != 9 || b.Len() != 3 {
		t.Fatalf("b = %d %v, len %d", v, ok, b.Len())
	}
	b.Put("d", 4)
	if _, ok := b.Get("a"); ok || b.Len() != 1 {
		t.Fatalf("a full cache is emptied before it grows: len %d", b.Len())
	}
	if v, ok := b.Get("d"); !ok || v != 4 {
		t.Fatalf("d = %d %v", v, ok)
	}
}

func TestBoundedConcurrentUse(t *testing.T) {
	b := New[int, string](64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				b.Put(g*1000+i, fmt.Sprint(i))
				b.Get(i)
			}
		})
	}
	wg.Wait()
	if n := b.Len(); n < 1 || n > 64 {
		t.Fatalf("len %d outside 1..64", n)
	}
}

// A cache made to hold nothing (max 0, or a negative max from a miscomputed bound) keeps
// nothing: each Put used to empty the map and then keep the new entry anyway.
func TestBoundedWithoutRoomKeepsNothing(t *testing.T) {
	for _, max := range []int{0, -1} {
		b := New[string, int](max)
		b.Put("a", 1)
		b.Put("b", 2)
		if _, ok := b.Get("b"); ok || b.Len() != 0 {
			t.Errorf("max %d: len %d after two puts, want 0", max, b.Len())
		}
	}
}

func TestBoundedDelete(t *testing.T) {
	b := New[string, int](3)
	b.Put("a", 1)
	b.Put("b", 2)
	b.Delete("a")
	b.Delete("z") // absent: nothing happens
	if _, ok := b.Get("a"); ok || b.Len() != 1 {
		t.Fatalf("after deleting a: len %d, a kept %v", b.Len(), ok)
	}
	if v, ok := b.Get("b"); !ok || v != 2 {
		t.Fatalf("b = %d %v after deleting another key", v, ok)
	}
}

// A check that passed is not run again for the same inputs; one that failed is; inputs that
// only concatenate alike are others; a nil Verified runs every check.
func TestVerifiedRemembersWhatPassed(t *testing.T) {
	v := NewVerified(8)
	runs := 0
	pass := func() bool { runs++; return true }
	fail := func() bool { runs++; return false }
	for range 2 {
		if !v.Check(pass, []byte("key"), []byte("msg"), []byte("sig")) {
			t.Fatal("a passing check failed")
		}
	}
	if runs != 1 || v.Len() != 1 {
		t.Fatalf("passing check run %d times, %d remembered; want 1 and 1", runs, v.Len())
	}
	if !v.Check(pass, []byte("keym"), []byte("sg"), []byte("sig")) || runs != 2 {
		t.Fatalf("inputs that concatenate alike were taken for the same: %d runs", runs)
	}
	for range 2 {
		if v.Check(fail, []byte("other")) {
			t.Fatal("a failing check passed")
		}
	}
	if runs != 4 || v.Len() != 2 {
		t.Fatalf("failing check run %d times in all, %d remembered; want 4 and 2", runs, v.Len())
	}
	var none *Verified
	for range 2 {
		none.Check(pass, []byte("key"))
	}
	if runs != 6 {
		t.Fatalf("a nil Verified ran %d checks, want every one", runs-4)
	}
}
