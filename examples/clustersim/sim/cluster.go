package sim

import "fmt"

// Resources is an amount of each resource a node has or a task asks for.
type Resources struct {
	CPU float64 // cores
	Mem float64 // GiB
	GPU float64
}

func (r Resources) add(o Resources) Resources {
	return Resources{r.CPU + o.CPU, r.Mem + o.Mem, r.GPU + o.GPU}
}

func (r Resources) sub(o Resources) Resources {
	return Resources{r.CPU - o.CPU, r.Mem - o.Mem, r.GPU - o.GPU}
}

func (r Resources) scale(f float64) Resources {
	return Resources{r.CPU * f, r.Mem * f, r.GPU * f}
}

// fitsIn reports whether r fits in free, with a little slack for float rounding.
func (r Resources) fitsIn(free Resources) bool {
	const eps = 1e-9
	return r.CPU <= free.CPU+eps && r.Mem <= free.Mem+eps && r.GPU <= free.GPU+eps
}

func (r Resources) String() string {
	return fmt.Sprintf("%.0f CPU %.0f GiB %.0f GPU", r.CPU, r.Mem, r.GPU)
}

// NodeSpec describes Count identical machines.
type NodeSpec struct {
	Count int
	Resources
}

// cluster tracks what every node has free. Tasks are placed first fit, node by node in
// order, the way a bin-packing scheduler without preferences does.
type cluster struct {
	capacity []Resources
	free     []Resources
	total    Resources
}

func newCluster(specs []NodeSpec) *cluster {
	c := &cluster{}
	for _, s := range specs {
		for range s.Count {
			c.capacity = append(c.capacity, s.Resources)
			c.free = append(c.free, s.Resources)
			c.total = c.total.add(s.Resources)
		}
	}
	return c
}

// placement is where a job's tasks run: the node of each task, and the task's size.
type placement struct {
	nodes []int
	sizes []Resources
}

// place puts every task on a node or none of them; ok reports which.
func (c *cluster) place(tasks []Resources) (placement, bool) {
	p := placement{nodes: make([]int, 0, len(tasks)), sizes: tasks}
	for _, t := range tasks {
		n := -1
		for i := range c.free {
			if t.fitsIn(c.free[i]) {
				n = i
				break
			}
		}
		if n < 0 {
			c.release(placement{nodes: p.nodes, sizes: tasks[:len(p.nodes)]})
			return placement{}, false
		}
		c.free[n] = c.free[n].sub(t)
		p.nodes = append(p.nodes, n)
	}
	return p, true
}

// restore takes the exact nodes of an earlier placement again (they were just released).
func (c *cluster) restore(p placement) {
	for i, n := range p.nodes {
		c.free[n] = c.free[n].sub(p.sizes[i])
	}
}

func (c *cluster) release(p placement) {
	for i, n := range p.nodes {
		c.free[n] = c.free[n].add(p.sizes[i])
	}
}

// fits reports whether tasks could be placed now, without placing them.
func (c *cluster) fits(tasks []Resources) bool {
	p, ok := c.place(tasks)
	if ok {
		c.release(p)
	}
	return ok
}

func (c *cluster) freeTotal() Resources {
	var r Resources
	for _, f := range c.free {
		r = r.add(f)
	}
	return r
}

// largest is the largest node's capacity.
func (c *cluster) largest() Resources {
	var r Resources
	for _, n := range c.capacity {
		if n.CPU+n.Mem+n.GPU > r.CPU+r.Mem+r.GPU {
			r = n
		}
	}
	return r
}
