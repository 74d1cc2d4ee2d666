package snapshot

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Conflict is a path that both sides of a merge changed, differently.
type Conflict struct {
	// Path is where the two changes meet: the deeper of their paths.
	Path string `json:"path"`
	// Ours and Theirs are the two changes: at Path, or one of them at a
	// directory above it that it deleted or replaced with a non-directory.
	Ours   Change `json:"ours"`
	Theirs Change `json:"theirs"`
}

// Merge is a three-way check before theirs' changes are applied to ours:
// changes is what theirs changed over base (Changes(base, theirs), read
// from theirs, all of them, so WriteTar(changes, theirs) applies them),
// and conflicts are the paths where ours changed something over base too,
// sorted by path:
//   - both changed a path, and the results differ (in type, permissions,
//     owner, link target or content; a deletion differs from anything but
//     a deletion);
//   - one side added or modified a path under a directory the other
//     deleted or replaced with a non-directory (theirs added /a/b/c while
//     ours deleted /a: a conflict at /a/b/c).
//
// The same change on both sides is not a conflict, nor are deletions of
// the same thing, nor changes that only meet in a directory both keep.
func Merge(ctx context.Context, base, ours, theirs Stack, o Options) (changes []Change, conflicts []Conflict, err error) {
	changes, err = Changes(ctx, base, theirs, o)
	if err != nil {
		return nil, nil, fmt.Errorf("theirs: %w", err)
	}
	mine, err := Changes(ctx, base, ours, o)
	if err != nil {
		return nil, nil, fmt.Errorf("ours: %w", err)
	}
	if len(changes) == 0 || len(mine) == 0 {
		return changes, nil, nil
	}
	m := &merger{ctx: ctx, ours: ours, theirs: theirs, mine: mine, at: make(map[string]int, len(mine))}
	defer m.close()
	for i, c := range mine {
		m.at[c.Path] = i
	}
	for i, c := range changes {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
		}
		if err := m.check(c); err != nil {
			return nil, nil, err
		}
	}
	slices.SortStableFunc(m.conflicts, func(a, b Conflict) int { return strings.Compare(a.Path, b.Path) })
	m.conflicts = slices.CompactFunc(m.conflicts, func(a, b Conflict) bool { return a.Path == b.Path })
	return changes, m.conflicts, nil
}

type merger struct {
	ctx          context.Context
	ours, theirs Stack
	ot, tt       *tree // opened when content must be compared
	mine         []Change
	at           map[string]int // index in mine by path
	conflicts    []Conflict
	bufs         [2][]byte
}

func (m *merger) close() {
	if m.ot != nil {
		m.ot.close()
	}
	if m.tt != nil {
		m.tt.close()
	}
}

// removesTree reports whether c takes away whatever was below its path.
func removesTree(c *Change) bool { return c.Kind == Deleted || c.Type != "dir" }

// check finds the conflicts of theirs' change c.
func (m *merger) check(c Change) error {
	if i, ok := m.at[c.Path]; ok {
		same, err := m.sameResult(&m.mine[i], &c)
		if err != nil {
			return err
		}
		if !same {
			m.conflicts = append(m.conflicts, Conflict{Path: c.Path, Ours: m.mine[i], Theirs: c})
		}
	}
	// Below a directory ours took away: gone on both sides is agreement.
	if c.Kind != Deleted {
		for q := path.Dir(c.Path); q != "/"; q = path.Dir(q) {
			if i, ok := m.at[q]; ok && removesTree(&m.mine[i]) {
				m.conflicts = append(m.conflicts, Conflict{Path: c.Path, Ours: m.mine[i], Theirs: c})
				break
			}
		}
	}
	// Below a directory theirs took away.
	if removesTree(&c) {
		prefix := c.Path + "/"
		j, _ := slices.BinarySearchFunc(m.mine, prefix, func(x Change, p string) int { return strings.Compare(x.Path, p) })
		for ; j < len(m.mine) && strings.HasPrefix(m.mine[j].Path, prefix); j++ {
			if m.mine[j].Kind != Deleted {
				m.conflicts = append(m.conflicts, Conflict{Path: m.mine[j].Path, Ours: m.mine[j], Theirs: c})
			}
		}
	}
	return nil
}

// sameResult reports whether ours' change a and theirs' change b at the
// same path leave the same thing there.
func (m *merger) sameResult(a, b *Change) (bool, error) {
	if a.Kind == Deleted || b.Kind == Deleted {
		return a.Kind == b.Kind, nil
	}
	if a.Type != b.Type || a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID || a.Link != b.Link || a.Size != b.Size {
		return false, nil
	}
	if a.Type != "file" {
		return true, nil
	}
	var err error
	if m.ot == nil {
		if m.ot, err = openStack(m.ours); err != nil {
			return false, err
		}
	}
	if m.tt == nil {
		if m.tt, err = openStack(m.theirs); err != nil {
			return false, err
		}
	}
	ea, va, err := m.ot.find(a.Path, a.newAt)
	defer va.close()
	if err != nil {
		return false, fmt.Errorf("ours %s: %w", show(a.Path), err)
	}
	eb, vb, err := m.tt.find(b.Path, b.newAt)
	defer vb.close()
	if err != nil {
		return false, fmt.Errorf("theirs %s: %w", show(b.Path), err)
	}
	if !ea.isReg() || !eb.isReg() {
		return false, fmt.Errorf("%s: %w", show(a.Path), errChanged)
	}
	same, err := sameContent(m.ctx, &ea, &eb, &m.bufs)
	if err != nil {
		return false, fmt.Errorf("%s: %w", show(a.Path), err)
	}
	return same, nil
}
