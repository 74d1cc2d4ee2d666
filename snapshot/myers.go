package snapshot

// diffBudget bounds the steps one line diff takes (a step is one diagonal
// of Myers' search looked at): about a second's work. Past it, what is
// left of the search becomes one replacement (every old line removed and
// every new one added): the diff is still right, only longer.
const diffBudget = 1 << 27

// lineDiff finds a shortest edit script from a to b and returns which
// lines of a it deletes and which of b it inserts. It is Myers' O(ND)
// algorithm in linear space (E. Myers, "An O(ND) Difference Algorithm and
// Its Variations", 1986, section 4b): find the middle snake of an
// optimal path, then solve the two halves. Lines that occur on one side
// only are set aside first, as no common subsequence can hold them; that
// makes the diff of two unrelated files cheap.
func lineDiff(a, b []string) (del, ins []bool) {
	del, ins = make([]bool, len(a)), make([]bool, len(b))
	ids := map[string]int{}
	intern := func(lines []string) []int {
		out := make([]int, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = len(ids)
				ids[l] = id
			}
			out[i] = id
		}
		return out
	}
	xa, xb := intern(a), intern(b)
	inA, inB := make([]bool, len(ids)), make([]bool, len(ids))
	for _, id := range xa {
		inA[id] = true
	}
	for _, id := range xb {
		inB[id] = true
	}
	// The lines both sides hold, and where they are.
	var d differ
	var ia, ib []int
	for i, id := range xa {
		if inB[id] {
			d.a, ia = append(d.a, id), append(ia, i)
		} else {
			del[i] = true
		}
	}
	for i, id := range xb {
		if inA[id] {
			d.b, ib = append(d.b, id), append(ib, i)
		} else {
			ins[i] = true
		}
	}
	d.del, d.ins = make([]bool, len(d.a)), make([]bool, len(d.b))
	size := len(d.a) + len(d.b) + 3
	d.vf, d.vr = make([]int, 2*size), make([]int, 2*size)
	d.budget = diffBudget
	d.compare(0, len(d.a), 0, len(d.b))
	for i, x := range d.del {
		del[ia[i]] = x
	}
	for i, x := range d.ins {
		ins[ib[i]] = x
	}
	return del, ins
}

type differ struct {
	a, b     []int
	del, ins []bool
	vf, vr   []int // furthest x on each diagonal, forward and back
	budget   int
}

// compare marks the edits from a[a0:a1] to b[b0:b1].
func (d *differ) compare(a0, a1, b0, b1 int) {
	for a0 < a1 && b0 < b1 && d.a[a0] == d.b[b0] {
		a0, b0 = a0+1, b0+1
	}
	for a0 < a1 && b0 < b1 && d.a[a1-1] == d.b[b1-1] {
		a1, b1 = a1-1, b1-1
	}
	x, y, u, v, ok := d.middleSnake(a0, a1, b0, b1)
	// A split that is outside the box or would not make the problem
	// smaller cannot come from a correct search; it is refused all the
	// same rather than trusted.
	ok = ok && a0 <= x && x <= u && u <= a1 && b0 <= y && y <= v && v <= b1 &&
		!(x == a1 && y == b1) && !(u == a0 && v == b0)
	if !ok {
		for i := a0; i < a1; i++ {
			d.del[i] = true
		}
		for i := b0; i < b1; i++ {
			d.ins[i] = true
		}
		return
	}
	d.compare(a0, x, b0, y)
	d.compare(u, a1, v, b1)
}

// middleSnake returns the middle snake (x, y)-(u, v) of a shortest edit
// path from (a0, b0) to (a1, b1), whose ends differ (the caller has
// stripped their common lines), or false when one side is empty or the
// budget is spent. Coordinates within the search are relative to (a0, b0);
// diagonal k holds the points with x - y = k.
func (d *differ) middleSnake(a0, a1, b0, b1 int) (x, y, u, v int, ok bool) {
	n, m := a1-a0, b1-b0
	if n == 0 || m == 0 {
		return 0, 0, 0, 0, false
	}
	a, b := d.a[a0:a1], d.b[b0:b1]
	delta := n - m
	odd := delta&1 != 0
	half := (n + m + 1) / 2
	off := half + 1 // index of diagonal 0 in vf; of diagonal delta in vr
	vf, vr := d.vf[:2*off+1], d.vr[:2*off+1]
	vf[off+1] = 0     // so that diagonal 0's first step starts at x 0
	vr[off+1] = n + 1 // and the backward one at x n
	for D := 0; D <= half; D++ {
		if d.budget -= 2*D + 2; d.budget < 0 {
			return 0, 0, 0, 0, false
		}
		// Forward: the furthest D-paths from (0, 0).
		for k := -D; k <= D; k += 2 {
			var px int
			if k == -D || (k != D && vf[off+k-1] < vf[off+k+1]) {
				px = vf[off+k+1] // down from diagonal k+1
			} else {
				px = vf[off+k-1] + 1 // right from diagonal k-1
			}
			py := px - k
			sx, sy := px, py
			for px < n && py < m && a[px] == b[py] {
				px, py = px+1, py+1
			}
			vf[off+k] = px
			// Odd delta: the backward (D-1)-paths lie on diagonals
			// delta-(D-1) .. delta+(D-1).
			if r := k - delta; odd && -(D-1) <= r && r <= D-1 && px >= vr[off+r] {
				return a0 + sx, b0 + sy, a0 + px, b0 + py, true
			}
		}
		// Backward: the furthest D-paths to (n, m), indexed by r = k -
		// delta.
		for r := -D; r <= D; r += 2 {
			var px int
			if r == -D || (r != D && vr[off+r+1]-1 < vr[off+r-1]) {
				px = vr[off+r+1] - 1 // left from diagonal r+1
			} else {
				px = vr[off+r-1] // up from diagonal r-1
			}
			k := r + delta
			py := px - k
			ex, ey := px, py
			for px > 0 && py > 0 && a[px-1] == b[py-1] {
				px, py = px-1, py-1
			}
			vr[off+r] = px
			if !odd && -D <= k && k <= D && px <= vf[off+k] {
				return a0 + px, b0 + py, a0 + ex, b0 + ey, true
			}
		}
	}
	return 0, 0, 0, 0, false
}
