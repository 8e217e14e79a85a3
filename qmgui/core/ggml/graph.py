"""ggml's tensor constructors (ggml.c semantics: the shapes, strides and views each op
makes) and ggml_build_forward_expand's node order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from qmgui.core.ggml.tensor import Tensor

_DEEP = 200  # Graph._visit recurses this deep at most (Python's limit is 1,000 frames)


class Graph:
    """Tensor constructors (ggml.c semantics) and ggml_build_forward_expand's node order."""

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.layer = -1  # the layer being built: stamped on weights and caches (core.sched)
        # nodes a walk made read other sources (core.sched: copies across backends), with
        # the sources they were built with, to restore (core.compute.KeptGraph)
        self.rewired: list[tuple[Tensor, tuple[Tensor, ...]]] = []

    # -- graph order ------------------------------------------------------------------------

    def expand(self, t: Tensor) -> Tensor:
        """ggml_visit_parents: depth-first over sources in order, each tensor once."""
        if t.visited:
            return t
        for s in t.src:
            if not s.visited:
                break
        else:  # every source placed already (an op expanded as it is made): no walk
            t.visited = True
            (self.leafs if t.op == "none" else self.nodes).append(t)
            return t
        self._visit(t, 0)
        return t

    def _visit(self, t: Tensor, depth: int) -> None:
        """ggml_visit_parents from `t` (not visited yet): its unvisited sources in order,
        then `t`. Recursive (a Python call costs less than the explicit stack's tuple and
        iterator per node) while the chain is shallow, by an explicit stack below _DEEP."""
        if depth > _DEEP:
            self._visit_stack(t)
            return
        t.visited = True
        for s in t.src:
            if not s.visited:
                if s.src:
                    self._visit(s, depth + 1)
                else:  # no sources: done at once
                    s.visited = True
                    if s.op == "none":
                        self.leafs.append(s)
                    else:
                        self.nodes.append(s)
        if t.op == "none":
            self.leafs.append(t)
        else:
            self.nodes.append(t)

    def _visit_stack(self, t: Tensor) -> None:
        """_visit with an explicit stack: any depth."""
        t.visited = True
        # list.append called on the lists (CPython specializes that call; a bound append
        # kept in a variable is a plain call)
        nodes, leafs = self.nodes, self.leafs
        stack: list[tuple[Tensor, Iterator[Tensor]]] = [(t, iter(t.src))]
        while stack:
            cur, srcs = stack[-1]
            for s in srcs:
                if not s.visited:
                    s.visited = True
                    if s.src:
                        stack.append((s, iter(s.src)))
                        break
                    if s.op == "none":  # no sources: done at once
                        leafs.append(s)
                    else:
                        nodes.append(s)
            else:
                stack.pop()
                if cur.op == "none":
                    leafs.append(cur)
                else:
                    nodes.append(cur)

    # -- leaves -----------------------------------------------------------------------------

    def weight(self, *ne: int) -> Tensor:
        t = Tensor("f16", ne, "none", (), None, None, True)
        t.layer = self.layer
        t.is_weight = True
        return t

    def expert_weight(self, *ne: int) -> Tensor:
        """An expert tensor (`--cpu-moe` / `--n-cpu-moe` keep these in host memory)."""
        t = self.weight(*ne)
        t.expert = True
        return t

    def cache(self, type_: str, *ne: int) -> Tensor:
        t = Tensor(type_, ne, "none", (), None, None, True)
        t.layer = self.layer
        return t

    @staticmethod
    def input(type_: str, *ne: int) -> Tensor:
        """An input leaf: allocated before the first node, freed after its last reader (one
        that nothing reads stays allocated for the whole graph)."""
        return Tensor(type_, ne)

    # -- views ------------------------------------------------------------------------------

    @staticmethod
    def view(a: Tensor, ne: Sequence[int], nb: Sequence[int] = ()) -> Tensor:
        """ggml_view_Nd: `nb` are strides 1..3; missing ones follow contiguously."""
        n = len(ne)
        if n == 4:
            ne4 = ne if type(ne) is tuple else tuple(ne)
        elif n == 3:  # padded by index, as Tensor pads
            ne4 = (ne[0], ne[1], ne[2], 1)
        elif n == 2:
            ne4 = (ne[0], ne[1], 1, 1)
        else:
            ne4 = (*ne, 1, 1, 1, 1)[:4]
        n = len(nb)
        nb0 = a.nb[0]
        nb1 = nb[0] if n > 0 else nb0 * ne4[0]
        nb2 = nb[1] if n > 1 else nb1 * ne4[1]
        nb3 = nb[2] if n > 2 else nb2 * ne4[2]
        return Tensor(a.type, ne4, "view", (a,), a, (nb0, nb1, nb2, nb3))

    @staticmethod
    def reshape(a: Tensor, *ne: int) -> Tensor:
        return Tensor(a.type, ne, "reshape", (a,), a)

    @staticmethod
    def permute(a: Tensor, *axes: int) -> Tensor:
        ne = [0, 0, 0, 0]
        nb = [0, 0, 0, 0]
        for i, ax in enumerate(axes):
            ne[ax] = a.ne[i]
            nb[ax] = a.nb[i]
        return Tensor(a.type, ne, "permute", (a,), a, nb)

    @staticmethod
    def transpose(a: Tensor) -> Tensor:
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        return Tensor(a.type, ne, "transpose", (a,), a, nb)

    @staticmethod
    def set_rows(dst: Tensor, rows: Tensor, idxs: Tensor) -> Tensor:
        """ggml_set_rows: a view of the destination (the KV cache), sources rows, idxs, dst."""
        return Tensor(dst.type, dst.ne, "set_rows", (rows, idxs, dst), dst, dst.nb)

    @staticmethod
    def cpy(a: Tensor, dst: Tensor) -> Tensor:
        return Tensor(dst.type, dst.ne, "cpy", (a, dst), dst, dst.nb)

    # -- computing ops ----------------------------------------------------------------------

    @staticmethod
    def op(
        name: str, a: Tensor, *src: Tensor, ne: Sequence[int] | None = None, type_: str = ""
    ) -> Tensor:
        """A new contiguous result: `a`'s shape and type unless told (ggml_dup_tensor)."""
        return Tensor(type_ or a.type, ne if ne is not None else a.ne, name, (a, *src))

    def cont(self, a: Tensor, *ne: int) -> Tensor:
        return self.op("cont", a, ne=ne or a.ne)

    @staticmethod
    def mul_mat(a: Tensor, b: Tensor) -> Tensor:
        return Tensor("f32", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), "mul_mat", (a, b))

    @staticmethod
    def mul_mat_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
        return Tensor("f32", (a.ne[1], ids.ne[0], b.ne[2], 1), "mul_mat_id", (a, b, ids))

    @staticmethod
    def get_rows(a: Tensor, b: Tensor) -> Tensor:
        type_ = "i32" if a.type == "i32" else "f32"
        return Tensor(type_, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), "get_rows", (a, b))

    @staticmethod
    def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
        ne = list(a.ne)
        ne[dim] += b.ne[dim]
        return Tensor(a.type, ne, "concat", (a, b))
