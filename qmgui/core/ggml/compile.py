"""The ggml-alloc walk compiled once per graph structure, replayed per context.

In the graph builders (qmgui.core.graph, qmgui.core.models) a context (the cells per KV
stream, n_kv and n_kv_swa) changes no op, source or view of a graph, only the sizes of the
tensors that span the KV cache (the KQ mask, the cache views, the attention scores), and those
linearly. So each graph structure (everything but the cells: core.compute._reserve_bytes'
key) is built once with the cell counts as symbols, its ggml-alloc walk recorded as
allocations and frees of slots, and each slot's size read back as c + a*u + b*v bytes (u, v:
cells of the full and the sliding-window cache, in units of CELLS, which makes every size an
integer). A new context then costs one pass of the best-fit allocator over those events and
sizes.

The symbols are large powers of two, so an integer polynomial in them with small coefficients
shows each coefficient in its own digits: a size that is not affine (a product of cell counts)
is detected, and so is an in-place decision that some context could flip (a layout equal to
its parent's at one cell count only). Either makes the structure fall back to the plain build
for good. A compiled structure is also built at the real context that asked for it, and must be
the same graph there, every shape and stride evaluated (same_graph). test_compute checks it
against the plain build on every fixture model over many contexts.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qmgui.core.ggml.alloc import CPU_ALIGNMENT, INPLACE_OPS, same_layout
from qmgui.core.ggml.graph import Graph
from qmgui.core.ggml.tensor import Tensor, nbytes

CELLS = 256  # KV cells come in multiples of this (launch.CTX_PAD)


SYM_U = 1 << 64  # u in the symbolic build


SYM_V = 1 << 1024  # v in the symbolic build: above u**15, beyond any size's degree in u


COEF_MAX = 1 << 62  # coefficients are read back only below this


class NotAffine(Exception):
    """A structure whose walk a context could change: it is built and walked every time."""


@functools.lru_cache(maxsize=1 << 14)  # a graph's symbolic values repeat (one per KV view...)
def affine(x: int) -> tuple[int, int, int]:
    """(c, a, b) with x == c + a*SYM_U + b*SYM_V, each coefficient small; NotAffine if
    x is not of that form (a power of u above the first, or a product with v)."""
    c = x % SYM_U
    if c >= SYM_U // 2:
        c -= SYM_U
    rest = (x - c) // SYM_U
    a = rest % SYM_U
    if a >= SYM_U // 2:
        a -= SYM_U
    rest = x - c - a * SYM_U
    if rest % SYM_V:
        raise NotAffine
    b = rest // SYM_V
    if not -COEF_MAX < b < COEF_MAX:
        raise NotAffine
    return c, a, b


def same_layout_symbolic(t: Tensor, p: Tensor) -> bool:
    """same_layout for tensors of the symbolic build: whether it holds at every context.
    NotAffine if it holds at some contexts only (a shape component that another matches
    at one cell count)."""
    if t.type != p.type:
        return False
    if t.ne == p.ne and t.nb == p.nb:
        return True  # the same polynomials: equal at every context
    for x, y in zip((*t.ne, *t.nb), (*p.ne, *p.nb), strict=True):
        if x != y:
            _, a, b = affine(x - y)
            if a == 0 and b == 0:
                return False  # a constant apart: different at every context
    raise NotAffine


def claim(t: Tensor, same: Callable[[Tensor, Tensor], bool]) -> bool | None:
    """ggml_gallocr_allocate_node's first steps: None when `t` needs no memory of its own
    (external, allocated already, or a view), True when it took over a dying parent's memory
    in place (offset set), False when the caller must allocate it. The layout test `same`
    runs last: the symbolic one raises where a context could change its answer."""
    if t.external or t.allocated or t.view_src is not None:
        return None
    t.allocated = True
    return t.op in INPLACE_OPS and took_parent(t, same)


def freed_after_last_read(p: Tensor) -> Tensor | None:
    """release's end, once `p` has no reader and no view left: what is freed now, `p` or
    (for a view) its root once nothing reads or views that; None if nothing (not placed, or
    a graph output, which is never freed). The caller frees it (its arena, then
    `allocated = False`)."""
    root = p.view_src
    if root is None:
        return p if p.allocated and not p.is_output else None
    root.n_views -= 1
    if root.n_views or root.n_children or not root.allocated or root.is_output:
        return None
    return root


def took_parent(t: Tensor, same: Callable[[Tensor, Tensor], bool]) -> bool:
    """claim's in-place step for an op that may reuse a parent's memory: `t` takes over the
    first parent that dies here (its last reader, no view, not an output) with `t`'s layout
    (offset set, the parent no longer owns it)."""
    for p in t.src:
        if p.allocated and not p.is_output and p.n_children == 1 and p.n_views == 0 and same(t, p):
            t.offset = p.offset
            p.allocated = False
            return True
    return False


class EventWalk:
    """peak_bytes's walk without an arena: its allocations and frees in order, as slot
    numbers (slot for an allocation, ~slot for a free), and per slot the tensor allocated
    there (an in-place child takes over its parent's slot and frees it with its own size,
    which the same layout makes the same). `same` decides same_layout."""

    def __init__(self, g: Graph, same: Callable[[Tensor, Tensor], bool]) -> None:
        self.same = same
        self.events: list[int] = []
        self.owners: list[Tensor] = []
        for leaf in g.leafs:
            self.allocate(leaf)
        for node in g.nodes:
            if node.view_src is not None:
                node.view_src.n_views += 1
            for s in node.src:
                s.n_children += 1
        self._walk(g.nodes)

    def _walk(self, nodes: Sequence[Tensor]) -> None:
        """peak_bytes' node loop, its allocate and release inline (the tests they start
        with): a graph has thousands of nodes, most of whose sources are placed and keep
        readers."""
        events, owners, same = self.events, self.owners, self.same
        for node in nodes:
            srcs = node.src
            for s in srcs:
                if not (s.external or s.allocated or s.view_src is not None):
                    self.allocate(s)
            if not (node.external or node.allocated or node.view_src is not None):
                node.allocated = True  # allocate (claim), inline
                if not (node.op in INPLACE_OPS and took_parent(node, same)):
                    node.offset = len(owners)
                    owners.append(node)
                    events.append(node.offset)
            for p in srcs:
                p.n_children -= 1
                if p.n_children or p.n_views:
                    continue
                dead = freed_after_last_read(p)
                if dead is not None:
                    events.append(~dead.offset)
                    dead.allocated = False

    def allocate(self, t: Tensor) -> None:
        """allocate, with the layout test last (the tests are free of side effects)."""
        if claim(t, self.same) is not False:
            return
        t.offset = len(self.owners)
        self.owners.append(t)
        self.events.append(t.offset)


@dataclass(frozen=True)
class Program:
    """One graph structure's walk: events (slot: allocate, ~slot: free) and per-slot padded
    sizes, constant or (for `grows`: slot, c, a, b) c + a*u + b*v bytes before padding."""

    events: tuple[int, ...]
    sizes: tuple[int, ...]
    grows: tuple[tuple[int, int, int, int], ...]
    total: tuple[int, int, int]  # an upper bound of the padded sizes' sum, as c, a, b

    def bound(self, u: int, v: int) -> int:
        """Bytes the walk cannot exceed: no placement ends beyond all allocations together."""
        c, a, b = self.total
        return c + a * u + b * v

    def peak(self, u: int, v: int) -> int:
        sizes = list(self.sizes)
        for slot, c, a, b in self.grows:
            sizes[slot] = -(-(c + a * u + b * v) // CPU_ALIGNMENT) * CPU_ALIGNMENT
        return run_best_fit(self.events, sizes)


def peak_taped(g: Graph) -> int:
    """alloc.peak_bytes (the reference) by another road: the walk taped (EventWalk), then the
    best fit run over the tape (run_best_fit: two flat lists, a bisection per free) rather
    than an Arena placing as the walk goes."""
    walk = EventWalk(g, same_layout)
    sizes = [-(-nbytes(t) // CPU_ALIGNMENT) * CPU_ALIGNMENT for t in walk.owners]
    return run_best_fit(walk.events, sizes)


def run_best_fit(events: Sequence[int], sizes: Sequence[int]) -> int:
    """Arena over a compiled walk: its high-water mark. The same best fit and merging as
    Arena.alloc and Arena.free, on two parallel lists of free blocks."""
    offsets = [0] * len(sizes)
    starts = [0]  # free blocks as Arena keeps them; at first one, unbounded
    lens = [1 << 62]
    top = 0
    empty = False  # an empty block was kept (a freed empty tensor): frees scan from then on
    for e in events:
        if e >= 0:  # allocate: best fit among all but the last block, else the last
            size = sizes[e]
            best = len(starts) - 1
            if best:
                best_len = 1 << 63
                for i in range(best):
                    n = lens[i]
                    if size <= n <= best_len:
                        best, best_len = i, n
            addr = starts[best]
            offsets[e] = addr
            left = lens[best] - size
            if left:
                starts[best] = addr + size
                lens[best] = left
            else:
                del starts[best]
                del lens[best]
            if addr + size > top:  # noqa: PLR1730 - max() costs a call per allocation
                top = addr + size
            continue
        slot = ~e  # free: merge with the block that ends here or starts after, else insert
        offset = offsets[slot]
        size = sizes[slot]
        if not empty:  # blocks disjoint and sorted: the one before or the one at j
            j = bisect_left(starts, offset)
            if j and starts[j - 1] + lens[j - 1] == offset:  # the one before ends here: grow it
                lens[j - 1] += size
                if j < len(starts) and starts[j - 1] + lens[j - 1] == starts[j]:
                    lens[j - 1] += lens[j]
                    del starts[j]
                    del lens[j]
            elif j < len(starts) and starts[j] == offset + size:  # the next starts at the end
                starts[j] = offset
                lens[j] += size
            else:  # before the first block at or above it
                starts.insert(j, offset)
                lens.insert(j, size)
                empty = not size
            continue
        _free_scanning(starts, lens, offset, size)
    return top


def _free_scanning(starts: list[int], lens: list[int], offset: int, size: int) -> None:
    """Arena.free on run_best_fit's lists, block by block (empty blocks among them)."""
    end = offset + size
    for i, start in enumerate(starts):
        if start + lens[i] == offset:
            lens[i] += size
            if i + 1 < len(starts) and start + lens[i] == starts[i + 1]:
                lens[i] += lens[i + 1]
                del starts[i + 1]
                del lens[i + 1]
            return
        if end == start:
            starts[i] = offset
            lens[i] += size
            if i > 0 and starts[i - 1] + lens[i - 1] == offset:
                lens[i - 1] += lens[i]
                del starts[i]
                del lens[i]
            return
    i = 0  # before the first block at or above it (a freed empty tensor can follow the end)
    while i < len(starts) and starts[i] < offset:
        i += 1
    starts.insert(i, offset)
    lens.insert(i, size)


def compile_walk(sym: Graph) -> Program | None:
    """Compile one graph structure's walk from its symbolic build `sym` (the cells as SYM_U
    and SYM_V), a graph `same_graph` found to be the real one at a context; None where a
    context could change more than sizes."""
    try:
        walk = EventWalk(sym, same_layout_symbolic)
        sizes: list[int] = []
        grows: list[tuple[int, int, int, int]] = []
        total = [0, 0, 0]
        for slot, t in enumerate(walk.owners):
            c, a, b = affine(nbytes(t))
            if a < 0 or b < 0:
                raise NotAffine
            if a or b:
                grows.append((slot, c, a, b))
                sizes.append(0)
                total[0] += c + CPU_ALIGNMENT - 1
                total[1] += a
                total[2] += b
            else:
                padded = -(-c // CPU_ALIGNMENT) * CPU_ALIGNMENT
                sizes.append(padded)
                total[0] += padded
    except NotAffine:
        return None
    return Program(tuple(walk.events), tuple(sizes), tuple(grows), (total[0], total[1], total[2]))


def same_graph(sym: Graph, real: Graph, u: int, v: int) -> bool:
    """Whether `real` is `sym` at u, v: the same tensors in the same order with the same ops,
    types, flags, sources and views, every shape and stride of `sym` evaluating to `real`'s
    (shapes that grow: never below 1 at any context), and so the bytes of every tensor a
    walk allocates. Then a walk of `sym` (its in-place decisions taken for every context, or
    NotAffine) is the walk of `real` at u, v, and of the graph built at any other context
    at that context. NotAffine where a size is not affine in the cells."""
    if len(sym.leafs) != len(real.leafs) or len(sym.nodes) != len(real.nodes):
        return False
    xs, ys = sym.leafs + sym.nodes, real.leafs + real.nodes
    # each of sym's tensors to real's at the same place: a source or view matches when it is
    # its counterpart (a graph holds each tensor once)
    twin = {id(x): y for x, y in zip(xs, ys, strict=True)}
    get = twin.get
    for x, y in zip(xs, ys, strict=True):
        if (
            x.op != y.op
            or x.type != y.type
            or x.external != y.external
            or x.is_weight != y.is_weight
            or x.is_output != y.is_output
            or x.layer != y.layer
            or x.expert != y.expert
        ):
            return False
        x_src, y_src = x.src, y.src
        if len(x_src) != len(y_src):
            return False
        for a, b in zip(x_src, y_src, strict=True):
            if get(id(a)) is not b:
                return False
        xv, yv = x.view_src, y.view_src
        if (xv is None) != (yv is None) or (xv is not None and get(id(xv)) is not yv):
            return False
        if not ((x.ne == y.ne and x.nb == y.nb) or _sizes_evaluate(x, y, u, v)):
            return False
    return True


def _sizes_evaluate(x: Tensor, y: Tensor, u: int, v: int) -> bool:
    """Whether the symbolic shape, strides and (for a tensor a walk allocates) bytes of `x`
    are `y`'s at u, v."""
    if not (_evaluates(x.ne, y.ne, u, v, grows=True) and _evaluates(x.nb, y.nb, u, v, grows=False)):
        return False
    if x.view_src is not None or x.external:
        return True
    c, a, b = affine(nbytes(x))
    return c + a * u + b * v == nbytes(y)


def _evaluates(sym: Sequence[int], real: Sequence[int], u: int, v: int, *, grows: bool) -> bool:
    """Whether the symbolic values `sym` are `real` at u, v (growing ones: never below 1)."""
    for p, q in zip(sym, real, strict=True):
        if p == q:
            continue
        c, a, b = affine(p)
        if c + a * u + b * v != q:
            return False
        if grows and (a < 0 or b < 0 or c + a + b < 1):
            return False
    return True
