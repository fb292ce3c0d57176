package cache

import (
	"fmt"
	"sync"
	"testing"
)

// A full generation becomes the older one and the one before it is dropped: what was added or
// read last stays, and the total never passes Max.
func TestBoundedKeepsTheNewerGeneration(t *testing.T) {
	b := New[string, int](4)
	if _, ok := b.Get("a"); ok {
		t.Fatal("empty cache has a")
	}
	b.Put("a", 1)
	b.Put("b", 2)
	b.Put("b", 9) // replacing a kept key drops nothing
	if v, ok := b.Get("b"); !ok || v != 9 || b.Len() != 2 {
		t.Fatalf("b = %d %v, len %d", v, ok, b.Len())
	}
	b.Put("c", 3) // the newer generation (a, b) is full: it becomes the older
	for _, k := range []string{"a", "b", "c"} {
		if _, ok := b.Get(k); !ok {
			t.Fatalf("%s dropped when its generation became the older", k)
		}
	}
	// Reading them moved each found in the older generation to the newer: a, then b (full: c
	// and a became the older), then c (the newer holds b and c). e, f and g fill two
	// generations: a, b and c go.
	for i, k := range []string{"e", "f", "g"} {
		b.Put(k, 5+i)
		if b.Len() > 4 {
			t.Fatalf("len %d over 4", b.Len())
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, ok := b.Get(k); ok {
			t.Fatalf("%s kept two generations on", k)
		}
	}
	for _, k := range []string{"e", "f", "g"} {
		if _, ok := b.Get(k); !ok {
			t.Fatalf("%s, among the last added, dropped", k)
		}
	}
}

// Whatever the order of puts and gets, at most Max entries are kept and the last half of Max
// keys put are all found.
func TestBoundedKeepsWhatWasPutLast(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 8, 9} {
		b := New[int, int](limit)
		for i := range 200 {
			b.Put(i, i)
			if i%3 == 0 {
				b.Get(i / 2)
			}
			if n := b.Len(); n > limit {
				t.Fatalf("max %d: %d entries after put %d", limit, n, i)
			}
			for k := max(0, i-max(1, limit/2)+1); k <= i; k++ {
				if v, ok := b.Get(k); !ok || v != k {
					t.Fatalf("max %d: key %d, of the last %d put, missing after put %d", limit, k, max(1, limit/2), i)
				}
			}
		}
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
