"""ggml-alloc (ggml/src/ggml-alloc.c) on one graph: the best-fit arena, in-place reuse of a
dying parent's memory, frees after the last reader, and the chunk's high-water mark."""

from __future__ import annotations

from qmgui.core.ggml.graph import Graph
from qmgui.core.ggml.tensor import Tensor, nbytes

# ggml_op_can_inplace (ggml-alloc.c): ggml-alloc may give these ops their parent's memory;
# "unary" stands for every GGML_OP_UNARY (silu, gelu, sigmoid, tanh, exp, relu, neg...)
INPLACE_OPS = frozenset(
    {
        "fill",
        "scale",
        "add",
        "add_id",
        "add1",
        "sub",
        "mul",
        "div",
        "sqr",
        "sqrt",
        "log",
        "unary",
        "rope",
        "rms_norm",
        "clamp",
        "soft_max",
    }
)


CPU_ALIGNMENT = 32  # TENSOR_ALIGNMENT: the CPU buffer type's alignment (ggml-backend.cpp)


class Arena:
    """ggml_dyn_tallocr with one chunk: best-fit over free blocks, the last block grows."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = []  # [offset, size], sorted by offset
        self.max_size = 0

    def _pad(self, n: int) -> int:
        return -(-n // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self._pad(size)
        if not self.blocks:
            self.blocks = [[0, 1 << 62]]
        best = -1
        best_size = 1 << 63
        for i in range(len(self.blocks) - 1):  # "besides the last block"
            bsize = self.blocks[i][1]
            if size <= bsize <= best_size:
                best, best_size = i, bsize
        if best == -1:
            best = len(self.blocks) - 1
        block = self.blocks[best]
        addr = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, addr + size)
        return addr

    def free(self, offset: int, size: int) -> None:
        size = self._pad(size)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


def same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def allocate(arena: Arena, t: Tensor) -> None:
    """ggml_gallocr_allocate_node: in place over a dying parent if allowed, else best fit."""
    if t.external or t.allocated or t.view_src is not None:
        return
    t.allocated = True
    if t.op in INPLACE_OPS:
        for p in t.src:
            if not p.allocated or p.is_output or not same_layout(t, p):
                continue
            if p.n_children == 1 and p.n_views == 0:
                t.offset = p.offset
                p.allocated = False  # the child now owns the memory
                return
    t.offset = arena.alloc(nbytes(t))


def release(arena: Arena, parent: Tensor) -> None:
    """The parent-update step of ggml_gallocr_alloc_graph_impl after a node has run."""
    parent.n_children -= 1
    if parent.n_children != 0 or parent.n_views != 0:
        return
    if parent.view_src is not None:
        root = parent.view_src
        root.n_views -= 1
        if root.n_views == 0 and root.n_children == 0 and root.allocated:
            _free(arena, root)
    elif parent.allocated:
        _free(arena, parent)


def _free(arena: Arena, t: Tensor) -> None:
    if t.is_output:
        return  # graph outputs are never freed
    arena.free(t.offset, nbytes(t))
    t.allocated = False


def peak_bytes(g: Graph, alignment: int = CPU_ALIGNMENT) -> int:
    """ggml_gallocr_reserve_n on one graph: the chunk's high-water mark."""
    arena = Arena(alignment)
    for leaf in g.leafs:
        allocate(arena, leaf)
    for node in g.nodes:
        if node.view_src is not None:
            node.view_src.n_views += 1
        for s in node.src:
            s.n_children += 1
    for node in g.nodes:
        for s in node.src:  # allocate's own first test, inline: most sources are placed
            if not (s.external or s.allocated or s.view_src is not None):
                allocate(arena, s)
        if node.view_src is None:  # a view needs no memory of its own
            allocate(arena, node)
        for s in node.src:
            release(arena, s)
    return arena.max_size
