"""A minimal ggml tensor: type, shape, strides, op, sources and view source as ggml-alloc
sees them (ggml/src/ggml.c), and the byte sizes of ggml's types."""

from __future__ import annotations

from collections.abc import Sequence

# ggml type traits: bytes per block, elements per block (ggml/src/ggml.c type_traits)
TYPE_TRAITS: dict[str, tuple[int, int]] = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "i32": (4, 1),
    "i64": (8, 1),
    "i8": (1, 1),  # bytes: a copy of a weight in its file type (core.sched)
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
    "iq4_nl": (18, 32),
}


class Tensor:
    """One ggml tensor as ggml-alloc sees it: shape, strides, op, sources, view source."""

    __slots__ = (
        "allocated",
        "backend",
        "expert",
        "external",
        "is_output",
        "is_weight",
        "layer",
        "n_children",
        "n_views",
        "nb",
        "ne",
        "offset",
        "op",
        "src",
        "type",
        "view_src",
        "visited",
    )

    ne: tuple[int, ...]
    nb: tuple[int, ...]

    def __init__(  # noqa: PLR0917 - positional for speed (below)
        self,
        type_: str,
        ne: Sequence[int],
        op: str = "none",
        src: Sequence[Tensor] = (),
        view_src: Tensor | None = None,
        nb: Sequence[int] | None = None,
        external: bool = False,
    ) -> None:
        # positional parameters: the graph's constructors (ggml.graph) make every tensor, and
        # a call with keywords costs CPython 40% more (a dict for them)
        self.type = type_
        n = len(ne)
        if n == 4:
            if type(ne) is not tuple:
                ne = tuple(ne)
        elif n == 3:  # padded with ones, by index: a tuple built and sliced costs twice
            ne = (ne[0], ne[1], ne[2], 1)
        elif n == 2:
            ne = (ne[0], ne[1], 1, 1)
        else:
            ne = (*ne, 1, 1, 1, 1)[:4]
        self.ne = ne
        if nb is None:  # contiguous_nb, inline: every op's result is built here
            size, blck = TYPE_TRAITS[type_]
            nb1 = size * (ne[0] // blck)
            nb2 = nb1 * ne[1]
            self.nb = (size, nb1, nb2, nb2 * ne[2])
        else:
            self.nb = nb if type(nb) is tuple else tuple(nb)
        self.op = op
        self.src = src if type(src) is tuple else tuple(src)
        # ggml_new_tensor_impl: a view of a view points at the root tensor
        if view_src is not None and view_src.view_src is not None:
            view_src = view_src.view_src
        self.view_src: Tensor | None = view_src
        self.external = external  # weights, KV cache, recurrent state: not in this buffer
        # where an external tensor lives (core.sched places it): its layer (-1: the input
        # layer, n_layer: the output layer) and whether it is an expert tensor
        self.layer = -1
        self.expert = self.is_weight = self.is_output = False
        self.allocated = self.visited = False  # visited: reached by Graph.expand
        self.n_children = self.n_views = self.offset = 0
        self.backend = -1  # core.sched: the backend that runs it (-1: none decided)

    @property
    def nelements(self) -> int:
        n = 1
        for x in self.ne:
            n *= x
        return n

    def is_contiguous(self) -> bool:
        return self.nb == contiguous_nb(self.type, self.ne)


def contiguous_nb(type_: str, ne: Sequence[int]) -> tuple[int, int, int, int]:
    size, blck = TYPE_TRAITS[type_]
    nb0 = size
    nb1 = size * (ne[0] // blck)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def nbytes(t: Tensor) -> int:
    """ggml_nbytes: bytes spanned by the tensor's strides."""
    ne0, ne1, ne2, ne3 = t.ne
    if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
        return 0
    nb0, nb1, nb2, nb3 = t.nb
    size, blck = TYPE_TRAITS[t.type]
    rest = (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
    if blck == 1:
        return size + (ne0 - 1) * nb0 + rest
    return ne0 * nb0 // blck + rest


def row_size(type_: str, n: int) -> int:
    size, blck = TYPE_TRAITS[type_]
    return size * n // blck
