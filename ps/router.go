package ps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/cespare/xxhash/v2"
	"github.com/elasticps/elasticps/embedding"
)

// DefaultSlots is the slot count of a job unless configured otherwise.
const DefaultSlots = 4096

// LoadBound is the most a server's slot count may exceed its weighted share of the slots.
const LoadBound = 1.1

// Node is a parameter server as the owner table sees it.
type Node struct {
	// ID names the server for its whole life; it decides the server's place in the hashing.
	ID string
	// Addr is the server's RPC address.
	Addr string
	// Weight is the server's relative capacity; 0 means 1.
	Weight float64
}

func (n Node) weight() float64 {
	if n.Weight <= 0 {
		return 1
	}
	return n.Weight
}

// OwnerTable maps every slot to the server that owns it. It is immutable once made; a change of
// membership makes a new table with a higher Version. Safe for concurrent use.
type OwnerTable struct {
	Version uint64
	Slots   int
	Nodes   []Node   // sorted by ID; read only
	owner   []uint16 // slot -> index in Nodes
}

// NewOwnerTable places slots 0..slots-1 on nodes by weighted rendezvous (highest random weight)
// hashing with bounded load: a slot goes to the server with the highest score
// -weight/ln(hash(server, slot)), except that no server holds more than LoadBound times its
// weighted share (rounded up to a whole slot). With prev, the previous owner keeps every slot it
// can: only the slots whose top choice is a new server, the slots of servers that left, and
// what the load bound forces, move. Adding one server to n therefore moves about slots/(n+1)
// slots, and removing one moves only its own.
func NewOwnerTable(version uint64, slots int, nodes []Node, prev *OwnerTable) (*OwnerTable, error) {
	var errs []error
	if slots < 1 || slots > 1<<20 {
		errs = append(errs, fmt.Errorf("slot count %d not in 1..2^20", slots))
	}
	if prev != nil && prev.Slots != slots {
		errs = append(errs, fmt.Errorf("slot count %d differs from the previous table's %d", slots, prev.Slots))
	}
	ns, err := sortedNodes(nodes)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
	}
	t := &OwnerTable{Version: version, Slots: slots, Nodes: ns, owner: make([]uint16, slots)}
	t.place(prev)
	return t, nil
}

// place fills t.owner.
func (t *OwnerTable) place(prev *OwnerTable) {
	n := len(t.Nodes)
	keys := make([]uint64, n)
	var total float64
	for i, nd := range t.Nodes {
		keys[i] = xxhash.Sum64String(nd.ID)
		total += nd.weight()
	}
	capOf := make([]int, n)
	for i, nd := range t.Nodes {
		share := float64(t.Slots) * nd.weight() / total
		capOf[i] = max(int(math.Ceil(share)), int(math.Floor(LoadBound*share)))
	}
	// Where the previous table's servers are now, and which servers are new.
	prevIdx := make([]int, 0)
	isNew := make([]bool, n)
	if prev != nil {
		at := make(map[string]int, n)
		for i, nd := range t.Nodes {
			at[nd.ID] = i
		}
		prevIdx = make([]int, len(prev.Nodes))
		for j, nd := range prev.Nodes {
			i, ok := at[nd.ID]
			if !ok {
				i = -1
			}
			prevIdx[j] = i
		}
		was := make(map[string]bool, len(prev.Nodes))
		for _, nd := range prev.Nodes {
			was[nd.ID] = true
		}
		for i, nd := range t.Nodes {
			isNew[i] = !was[nd.ID]
		}
	}
	score := func(slot, i int) float64 {
		h := mix64(keys[i] ^ mix64(uint64(slot)+0x9e3779b97f4a7c15))
		u := (float64(h>>11) + 0.5) / (1 << 53) // (0, 1)
		return -t.Nodes[i].weight() / math.Log(u)
	}
	top := func(slot int, allowed func(i int) bool) int {
		best, bs := -1, 0.0
		for i := 0; i < n; i++ {
			if allowed != nil && !allowed(i) {
				continue
			}
			if s := score(slot, i); best < 0 || s > bs {
				best, bs = i, s
			}
		}
		return best
	}
	first := make([]int, t.Slots) // each slot's top choice
	load := make([]int, n)
	for s := 0; s < t.Slots; s++ {
		first[s] = top(s, nil)
		o := first[s]
		if prev != nil && !isNew[o] {
			if p := prevIdx[prev.owner[s]]; p >= 0 {
				o = p // the previous owner is still here and the slot's top choice is not new
			}
		}
		t.owner[s] = uint16(o)
		load[o]++
	}
	// Enforce the bound: move the excess of each overloaded server to the best-scoring server with
	// room. Move first the slots that are moving anyway (new to this server), then those it holds
	// only by stickiness, then those it scores lowest on.
	prevOwner := func(s int) int {
		if prev == nil {
			return -1
		}
		return prevIdx[prev.owner[s]]
	}
	for i := 0; i < n; i++ {
		excess := load[i] - capOf[i]
		if excess <= 0 {
			continue
		}
		type cand struct {
			slot         int
			moving, held bool
			score        float64
		}
		var cs []cand
		for s := 0; s < t.Slots; s++ {
			if int(t.owner[s]) == i {
				cs = append(cs, cand{s, prev != nil && prevOwner(s) != i, first[s] != i, score(s, i)})
			}
		}
		sort.Slice(cs, func(a, b int) bool {
			x, y := cs[a], cs[b]
			if x.moving != y.moving {
				return x.moving
			}
			if x.held != y.held {
				return x.held
			}
			if x.score != y.score {
				return x.score < y.score
			}
			return x.slot < y.slot
		})
		for _, c := range cs[:excess] {
			// Prefer handing the slot back to its previous owner when that one has room.
			dst := -1
			if p := prevOwner(c.slot); p >= 0 && p != i && load[p] < capOf[p] {
				dst = p
			} else {
				dst = top(c.slot, func(j int) bool { return j != i && load[j] < capOf[j] })
			}
			t.owner[c.slot] = uint16(dst)
			load[i]--
			load[dst]++
		}
	}
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// NameSlot returns the slot of a dense parameter: xxhash64 of its name, mod the slot count.
func (t *OwnerTable) NameSlot(name string) int { return nameSlot(name, t.Slots) }

func nameSlot(name string, slots int) int { return int(xxhash.Sum64String(name) % uint64(slots)) }

// Equal reports whether t and u have the same version, nodes and placement.
func (t *OwnerTable) Equal(u *OwnerTable) bool {
	if t.Version != u.Version || t.Slots != u.Slots || len(t.Nodes) != len(u.Nodes) {
		return false
	}
	for i := range t.Nodes {
		if t.Nodes[i] != u.Nodes[i] {
			return false
		}
	}
	for s := range t.owner {
		if t.owner[s] != u.owner[s] {
			return false
		}
	}
	return true
}

// OwnerIndex returns the index in Nodes of slot's owner.
func (t *OwnerTable) OwnerIndex(slot int) int { return int(t.owner[slot]) }

// Owner returns slot's owner.
func (t *OwnerTable) Owner(slot int) Node { return t.Nodes[t.owner[slot]] }

// IndexOf returns the index of the node with id in Nodes, or -1.
func (t *OwnerTable) IndexOf(id string) int {
	i := sort.Search(len(t.Nodes), func(i int) bool { return t.Nodes[i].ID >= id })
	if i < len(t.Nodes) && t.Nodes[i].ID == id {
		return i
	}
	return -1
}

// SlotsOf returns the slots owned by the node with id (empty if it owns none).
func (t *OwnerTable) SlotsOf(id string) *embedding.SlotSet {
	set := embedding.NewSlotSet(t.Slots)
	i := t.IndexOf(id)
	for s, o := range t.owner {
		if int(o) == i {
			set.Add(s)
		}
	}
	return set
}

// Loads returns how many slots each node owns, in the order of Nodes.
func (t *OwnerTable) Loads() []int {
	l := make([]int, len(t.Nodes))
	for _, o := range t.owner {
		l[o]++
	}
	return l
}

// MaxOverAvgLoad returns the largest slot count of a node over the average.
func (t *OwnerTable) MaxOverAvgLoad() float64 {
	m := 0
	for _, l := range t.Loads() {
		m = max(m, l)
	}
	return float64(m) * float64(len(t.Nodes)) / float64(t.Slots)
}

// Move is one slot changing owner between two tables.
type Move struct {
	Slot     int
	From, To string // node IDs
}

// Moves lists the slots whose owner differs in next.
func (t *OwnerTable) Moves(next *OwnerTable) []Move {
	var m []Move
	for s := 0; s < t.Slots && s < next.Slots; s++ {
		a, b := t.Owner(s).ID, next.Owner(s).ID
		if a != b {
			m = append(m, Move{Slot: s, From: a, To: b})
		}
	}
	return m
}

// WithMoves returns a table of the given version that places every slot as t does except the
// moved ones, which go to their Move.To, over nodes (every node that owns a slot must be among
// them; nodes may own none). A migration publishes such tables, one per group of slots moved,
// on its way from one placement to the next. Each move's From must be the slot's owner in t.
func (t *OwnerTable) WithMoves(version uint64, nodes []Node, moves []Move) (*OwnerTable, error) {
	var errs []error
	if version <= t.Version {
		errs = append(errs, fmt.Errorf("version %d is not above %d", version, t.Version))
	}
	ns, err := sortedNodes(nodes)
	if err != nil {
		errs = append(errs, err)
	}
	owners := make([]string, t.Slots)
	for s := range owners {
		owners[s] = t.Owner(s).ID
	}
	for _, m := range moves {
		if m.Slot < 0 || m.Slot >= t.Slots {
			errs = append(errs, fmt.Errorf("move of slot %d of %d", m.Slot, t.Slots))
			continue
		}
		if owners[m.Slot] != m.From {
			errs = append(errs, fmt.Errorf("slot %d is owned by %q, not %q", m.Slot, owners[m.Slot], m.From))
			continue
		}
		owners[m.Slot] = m.To
	}
	out := &OwnerTable{Version: version, Slots: t.Slots, Nodes: ns, owner: make([]uint16, t.Slots)}
	if err == nil {
		for s, id := range owners {
			i := out.IndexOf(id)
			if i < 0 {
				errs = append(errs, fmt.Errorf("slot %d's owner %q is not among the nodes", s, id))
				break
			}
			out.owner[s] = uint16(i)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
	}
	return out, nil
}

// SamePlacement reports whether t and u give every slot to the same node ID.
func (t *OwnerTable) SamePlacement(u *OwnerTable) bool {
	if t.Slots != u.Slots {
		return false
	}
	for s := 0; s < t.Slots; s++ {
		if t.Owner(s).ID != u.Owner(s).ID {
			return false
		}
	}
	return true
}

// sortedNodes validates nodes and returns them sorted by ID.
func sortedNodes(nodes []Node) ([]Node, error) {
	var errs []error
	if len(nodes) == 0 || len(nodes) > math.MaxUint16 {
		errs = append(errs, fmt.Errorf("%d nodes, need 1..65535", len(nodes)))
	}
	ns := append([]Node(nil), nodes...)
	sort.Slice(ns, func(i, j int) bool { return ns[i].ID < ns[j].ID })
	for i, n := range ns {
		if n.ID == "" {
			errs = append(errs, errors.New("a node has no ID"))
		}
		if i > 0 && ns[i-1].ID == n.ID {
			errs = append(errs, fmt.Errorf("node %q listed twice", n.ID))
		}
		if math.IsNaN(n.Weight) || math.IsInf(n.Weight, 0) || n.Weight < 0 {
			errs = append(errs, fmt.Errorf("node %q has weight %v", n.ID, n.Weight))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ns, nil
}

// Table encoding, little-endian: "EPSO" | version u64 | slots u32 | node count u16 |
// per node: id len u16, id, addr len u16, addr, weight f64 | owner u16 per slot | xxhash64 of
// everything before.
const ownerMagic = "EPSO"

// AppendOwnerTable appends t's encoding to dst.
func AppendOwnerTable(dst []byte, t *OwnerTable) []byte {
	start := len(dst)
	dst = append(dst, ownerMagic...)
	dst = binary.LittleEndian.AppendUint64(dst, t.Version)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(t.Slots))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(t.Nodes)))
	for _, n := range t.Nodes {
		dst = appendString(dst, n.ID)
		dst = appendString(dst, n.Addr)
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(n.Weight))
	}
	for _, o := range t.owner {
		dst = binary.LittleEndian.AppendUint16(dst, o)
	}
	return binary.LittleEndian.AppendUint64(dst, xxhash.Sum64(dst[start:]))
}

// DecodeOwnerTable decodes a table written by AppendOwnerTable and returns the bytes after it.
func DecodeOwnerTable(src []byte) (*OwnerTable, []byte, error) {
	d := decoder{b: src}
	if string(d.bytes(len(ownerMagic))) != ownerMagic {
		return nil, src, fmt.Errorf("%w: not an owner table", ErrCorrupt)
	}
	t := &OwnerTable{Version: d.u64(), Slots: int(d.u32())}
	nn := int(d.u16())
	if d.err != nil || t.Slots < 1 || t.Slots > 1<<20 || nn < 1 {
		return nil, src, fmt.Errorf("%w: owner table header", ErrCorrupt)
	}
	for i := 0; i < nn && d.err == nil; i++ {
		n := Node{ID: d.str(), Addr: d.str(), Weight: math.Float64frombits(d.u64())}
		if i > 0 && n.ID <= t.Nodes[i-1].ID {
			return nil, src, fmt.Errorf("%w: owner table nodes not sorted and unique", ErrCorrupt)
		}
		t.Nodes = append(t.Nodes, n)
	}
	if d.err != nil || len(d.b) < 2*t.Slots+8 {
		return nil, src, fmt.Errorf("%w: truncated owner table", ErrCorrupt)
	}
	t.owner = make([]uint16, t.Slots)
	for s := range t.owner {
		t.owner[s] = d.u16()
		if int(t.owner[s]) >= nn {
			return nil, src, fmt.Errorf("%w: slot %d owned by node %d of %d", ErrCorrupt, s, t.owner[s], nn)
		}
	}
	body := len(src) - len(d.b)
	if sum := d.u64(); d.err != nil || sum != xxhash.Sum64(src[:body]) {
		return nil, src, fmt.Errorf("%w: owner table checksum", ErrCorrupt)
	}
	return t, d.b, nil
}
