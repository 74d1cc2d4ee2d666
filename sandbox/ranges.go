package sandbox

import (
	"sync"

	"github.com/berthsh/berth/errdefs"
)

// idRanges hands out ranges of host ids (runtime.IDMap.Range), one per
// sandbox, lowest free first, so that the ranges in use stay few and
// low. Range 0 is never handed out: it is the one sandboxes shared before
// ranges were per sandbox, and those keep it. The store's unique index on
// the range backs this up across daemon restarts.
type idRanges struct {
	mu   sync.Mutex
	max  uint32            // ranges 1..max-1 may be handed out
	used map[uint32]string // range -> sandbox id
	of   map[string]uint32 // sandbox id -> range
}

func newIDRanges(max uint32) *idRanges {
	return &idRanges{max: max, used: map[uint32]string{}, of: map[string]uint32{}}
}

// take gives sandbox id the lowest free range: resource_exhausted when
// every range is held.
func (r *idRanges) take(id string) (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for n := uint32(1); n < r.max; n++ {
		if _, held := r.used[n]; !held {
			r.used[n], r.of[id] = id, n
			return n, nil
		}
	}
	return 0, errdefs.New(errdefs.ResourceExhausted, "every one of the %d id ranges is held by a sandbox: delete one", r.max-1)
}

// held returns the range sandbox id holds (a spare's, taken in advance).
func (r *idRanges) held(id string) (uint32, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.of[id]
	return n, ok
}

// hold records that sandbox id holds range n (read from the store).
func (r *idRanges) hold(id string, n uint32) {
	if n == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.used[n], r.of[id] = id, n
}

// release frees sandbox id's range, if it holds one.
func (r *idRanges) release(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.of[id]; ok {
		delete(r.of, id)
		delete(r.used, n)
	}
}
