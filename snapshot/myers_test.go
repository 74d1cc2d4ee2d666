package snapshot

import (
	"math/rand/v2"
	"testing"
)

// lcsLen is the textbook dynamic program, the reference for lineDiff.
func lcsLen(a, b []string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			switch {
			case a[i] == b[j]:
				cur[j+1] = prev[j] + 1
			case prev[j+1] >= cur[j]:
				cur[j+1] = prev[j+1]
			default:
				cur[j+1] = cur[j]
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// checkDiff checks that the marks lineDiff returns turn a into b and are
// as few as can be.
func checkDiff(t *testing.T, a, b []string) {
	t.Helper()
	del, ins := lineDiff(a, b)
	var keptA, keptB []string
	edits := 0
	for i, l := range a {
		if del[i] {
			edits++
		} else {
			keptA = append(keptA, l)
		}
	}
	for j, l := range b {
		if ins[j] {
			edits++
		} else {
			keptB = append(keptB, l)
		}
	}
	if len(keptA) != len(keptB) {
		t.Fatalf("a %q b %q: kept %q and %q", a, b, keptA, keptB)
	}
	for i := range keptA {
		if keptA[i] != keptB[i] {
			t.Fatalf("a %q b %q: kept %q and %q", a, b, keptA, keptB)
		}
	}
	if want := len(a) + len(b) - 2*lcsLen(a, b); edits != want {
		t.Fatalf("a %q b %q: %d edits, the fewest is %d", a, b, edits, want)
	}
}

func TestLineDiffIsShortest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	letters := []string{"a\n", "b\n", "c\n", "d\n", "e\n"}
	gen := func(n, alphabet int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = letters[r.IntN(alphabet)]
		}
		return out
	}
	for range 100_000 {
		alphabet := 1 + r.IntN(len(letters))
		checkDiff(t, gen(r.IntN(14), alphabet), gen(r.IntN(14), alphabet))
	}
	// Long, lopsided and mostly alike.
	for range 300 {
		a := gen(200+r.IntN(300), 3)
		b := append([]string(nil), a...)
		for range r.IntN(20) {
			i := r.IntN(len(b))
			switch r.IntN(3) {
			case 0:
				b = append(b[:i], b[i+1:]...)
			case 1:
				b = append(b[:i], append([]string{letters[r.IntN(5)]}, b[i:]...)...)
			default:
				b[i] = letters[r.IntN(5)]
			}
		}
		checkDiff(t, a, b)
		checkDiff(t, a[:r.IntN(len(a))], b)
	}
}

func FuzzLineDiff(f *testing.F) {
	f.Add([]byte("abcabba"), []byte("cbabac"))
	f.Add([]byte(""), []byte("xyz"))
	f.Add([]byte("aaaa"), []byte("a"))
	f.Fuzz(func(t *testing.T, x, y []byte) {
		if len(x) > 64 || len(y) > 64 {
			return
		}
		split := func(s []byte) []string {
			out := make([]string, len(s))
			for i, c := range s {
				out[i] = string(c % 4) // a small alphabet: many matches
			}
			return out
		}
		checkDiff(t, split(x), split(y))
	})
}
