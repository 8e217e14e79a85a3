"""The compute buffer llama-server reserves on the CPU backend, predicted before loading.

llama.cpp reserves its compute buffer once, for the worst-case graph (`sched_reserve`,
src/llama-context.cpp): a prompt ubatch of `min(n_ctx, n_ubatch)` tokens (one output row per
slot, or per token in an embedding context) over the whole KV cache, then a one-token-per-slot
graph, and keeps the larger. The size is not a sum of tensors: ggml-alloc
(ggml/src/ggml-alloc.c) walks the graph in order, frees each tensor after its last reader,
runs element-wise ops in their parent's memory and puts every other tensor in the best-fitting
free block, so the buffer is the high-water mark of that walk, holes included. Best fit even
makes it non-monotonic: on the test engine a larger context or ubatch sometimes costs less.

No closed formula follows best-fit placement, so this module replays it. Per architecture
family it lays out the graph llama.cpp builds (the same ops in the same order with the same
shapes and views, from src/models/<arch>.cpp and src/llama-graph.cpp), then runs a port of
ggml-alloc's allocator over it. The context only resizes tensors that span the KV cache, so
each graph's walk is compiled once per structure and replayed per context over affine sizes
(see "the walk compiled once per graph structure"). The terms that come out on top are

    inputs: the KQ mask (n_kv x n_ubatch, f32; f16 with flash attention), token, position
            and KV-index inputs, an unused n_embd x n_ubatch f32 embedding input (from
            MIXED_BATCH_BUILD on also the mixed-batch branch's inputs and its never-freed
            n_embd x n_ubatch f32 copy: compute_buffer_bytes' `mixed_batch`)
  + the largest live set of one layer:
        attention without flash attention: the scores n_kv x n_ubatch x n_head x 4 bytes
            (soft-max runs in place), next to Q, the layer input and the residual
        FFN: gate and up, n_ff x n_ubatch x 4 bytes each, and their GLU product
            (MoE: n_expert_used x n_ff_exp rows per token)
        recurrent layers: the conv input, the scan/delta-net output plus new state
  + the output head: logits n_vocab x n_outputs x 4 bytes (kept, being a graph output)
  + the holes best fit leaves on the way.

Each builder names the llama.cpp source it mirrors; its node order, sizes and use counts were
compared with the engine's own graph dump (GGML_SCHED_DEBUG=2) of the build the tests
install, and its totals match every measured `sched_reserve: CPU compute buffer size` line in
tests/core/fixtures/compute/ to the printed 0.01 MiB. Architectures without a layout of their
own get the dense layout (driven by which optional tensors the GGUF has) times
GENERIC_MARGIN, unless they have recurrent, latent-attention or encoder layers, which the
dense layout cannot stand for, or are known to outgrow it (_NO_LAYOUT): those raise
SizingError, and the plan charges an upper bound instead (core.bounds.compute_bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from qmgui.core.errors import SizingError
from qmgui.core.launch import Resolved
from qmgui.core.meta import ModelClass, ModelMeta, Pooling

__all__ = ["GENERIC_MARGIN", "compute_buffer_bytes", "output_buffer_bytes"]


# --- constants ----------------------------------------------------------------------------------


# ggml type traits: bytes per block, elements per block (ggml/src/ggml.c type_traits)
_TYPE_TRAITS: dict[str, tuple[int, int]] = {
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

# ggml_op_can_inplace (ggml-alloc.c): ggml-alloc may give these ops their parent's memory;
# "unary" stands for every GGML_OP_UNARY (silu, gelu, sigmoid, tanh, exp, relu, neg...)
_INPLACE_OPS = frozenset(
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

# The first llama.cpp build known to build the mixed token/embedding input branch in
# build_inp_embd (src/llama-graph.cpp: inp_mixed_tokens, inp_mixed_slots, inp_mixed_embd and
# set_rows(dup(inp_mixed_embd), get_rows(tok_embd, inp_mixed_tokens), inp_mixed_slots)) and
# to scale Gemma 3's token rows there (inp_scale_rows). b10435 has neither and b11434 has
# both; the build in between that brought them is not pinned, so this is the measured
# boundary: builds from 10436 to 11433 are predicted as b11434.
MIXED_BATCH_BUILD = 11434
# llm_arch_supports_mixed_batch (src/llama-arch.cpp): the architectures without the branch
_NO_MIXED_BATCH = frozenset(
    {"cogvlm", "deepseek4", "graniteswitch", "eagle3", "dflash", "gemma4-assistant"}
)


# --- a minimal ggml: shapes, strides, views and graph order -------------------------------------


class _T:
    """One ggml tensor as ggml-alloc sees it: shape, strides, op, sources, view source."""

    __slots__ = (
        "allocated",
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

    def __init__(
        self,
        type_: str,
        ne: Sequence[int],
        *,
        op: str = "none",
        src: Sequence[_T] = (),
        view_src: _T | None = None,
        nb: Sequence[int] | None = None,
        external: bool = False,
    ) -> None:
        self.type = type_
        ne4 = self.ne = (*ne, 1, 1, 1, 1)[:4]
        if nb is None:  # _contiguous_nb, inline: every op's result is built here
            size, blck = _TYPE_TRAITS[type_]
            nb1 = size * (ne4[0] // blck)
            nb2 = nb1 * ne4[1]
            self.nb = (size, nb1, nb2, nb2 * ne4[2])
        else:
            self.nb = tuple(nb)
        self.op = op
        self.src = tuple(src)
        # ggml_new_tensor_impl: a view of a view points at the root tensor
        root = view_src
        if view_src is not None and view_src.view_src is not None:
            root = view_src.view_src
        self.view_src: _T | None = root
        self.external = external  # weights, KV cache, recurrent state: not in this buffer
        # where an external tensor lives (core.sched places it): its layer (-1: the input
        # layer, n_layer: the output layer) and whether it is an expert tensor
        self.layer = -1
        self.expert = False
        self.is_weight = False
        self.is_output = False
        self.n_children = 0
        self.n_views = 0
        self.allocated = False
        self.offset = 0
        self.visited = False  # reached by _Graph.expand

    @property
    def nelements(self) -> int:
        n = 1
        for x in self.ne:
            n *= x
        return n

    def is_contiguous(self) -> bool:
        return self.nb == _contiguous_nb(self.type, self.ne)


def _contiguous_nb(type_: str, ne: Sequence[int]) -> tuple[int, int, int, int]:
    size, blck = _TYPE_TRAITS[type_]
    nb0 = size
    nb1 = size * (ne[0] // blck)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def _nbytes(t: _T) -> int:
    """ggml_nbytes: bytes spanned by the tensor's strides."""
    if any(x <= 0 for x in t.ne):
        return 0
    size, blck = _TYPE_TRAITS[t.type]
    if blck == 1:
        n = size
        for i in range(4):
            n += (t.ne[i] - 1) * t.nb[i]
        return n
    n = t.ne[0] * t.nb[0] // blck
    for i in range(1, 4):
        n += (t.ne[i] - 1) * t.nb[i]
    return n


def _row_size(type_: str, n: int) -> int:
    size, blck = _TYPE_TRAITS[type_]
    return size * n // blck


class _Graph:
    """Tensor constructors (ggml.c semantics) and ggml_build_forward_expand's node order."""

    def __init__(self) -> None:
        self.nodes: list[_T] = []
        self.leafs: list[_T] = []
        self.layer = -1  # the layer being built: stamped on weights and caches (core.sched)

    # -- graph order ------------------------------------------------------------------------

    def expand(self, t: _T) -> _T:
        """ggml_visit_parents: depth-first over sources in order, each tensor once."""
        if t.visited:
            return t
        t.visited = True
        nodes, leafs = self.nodes, self.leafs
        stack: list[tuple[_T, Iterator[_T]]] = [(t, iter(t.src))]
        while stack:
            cur, srcs = stack[-1]
            for s in srcs:
                if not s.visited:
                    s.visited = True
                    stack.append((s, iter(s.src)))
                    break
            else:
                stack.pop()
                (leafs if cur.op == "none" else nodes).append(cur)
        return t

    # -- leaves -----------------------------------------------------------------------------

    def weight(self, *ne: int) -> _T:
        t = _T("f16", ne, external=True)
        t.layer = self.layer
        t.is_weight = True
        return t

    def expert_weight(self, *ne: int) -> _T:
        """An expert tensor (`--cpu-moe` / `--n-cpu-moe` keep these in host memory)."""
        t = self.weight(*ne)
        t.expert = True
        return t

    def cache(self, type_: str, *ne: int) -> _T:
        t = _T(type_, ne, external=True)
        t.layer = self.layer
        return t

    @staticmethod
    def input(type_: str, *ne: int) -> _T:
        """An input leaf: allocated before the first node, freed after its last reader (one
        that nothing reads stays allocated for the whole graph)."""
        return _T(type_, ne)

    # -- views ------------------------------------------------------------------------------

    @staticmethod
    def view(a: _T, ne: Sequence[int], nb: Sequence[int] = ()) -> _T:
        """ggml_view_Nd: `nb` are strides 1..3; missing ones follow contiguously."""
        ne4 = (*ne, 1, 1, 1, 1)[:4]
        full = [a.nb[0], 0, 0, 0]
        for i in range(1, 4):
            full[i] = nb[i - 1] if i - 1 < len(nb) else full[i - 1] * ne4[i - 1]
        return _T(a.type, ne4, op="view", src=(a,), view_src=a, nb=full)

    @staticmethod
    def reshape(a: _T, *ne: int) -> _T:
        return _T(a.type, ne, op="reshape", src=(a,), view_src=a)

    @staticmethod
    def permute(a: _T, *axes: int) -> _T:
        ne = [0, 0, 0, 0]
        nb = [0, 0, 0, 0]
        for i, ax in enumerate(axes):
            ne[ax] = a.ne[i]
            nb[ax] = a.nb[i]
        return _T(a.type, ne, op="permute", src=(a,), view_src=a, nb=nb)

    @staticmethod
    def transpose(a: _T) -> _T:
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        return _T(a.type, ne, op="transpose", src=(a,), view_src=a, nb=nb)

    @staticmethod
    def set_rows(dst: _T, rows: _T, idxs: _T) -> _T:
        """ggml_set_rows: a view of the destination (the KV cache), sources rows, idxs, dst."""
        return _T(dst.type, dst.ne, op="set_rows", src=(rows, idxs, dst), view_src=dst, nb=dst.nb)

    @staticmethod
    def cpy(a: _T, dst: _T) -> _T:
        return _T(dst.type, dst.ne, op="cpy", src=(a, dst), view_src=dst, nb=dst.nb)

    # -- computing ops ----------------------------------------------------------------------

    @staticmethod
    def op(name: str, a: _T, *src: _T, ne: Sequence[int] | None = None, type_: str = "") -> _T:
        """A new contiguous result: `a`'s shape and type unless told (ggml_dup_tensor)."""
        return _T(type_ or a.type, ne if ne is not None else a.ne, op=name, src=(a, *src))

    def cont(self, a: _T, *ne: int) -> _T:
        return self.op("cont", a, ne=ne or a.ne)

    @staticmethod
    def mul_mat(a: _T, b: _T) -> _T:
        return _T("f32", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), op="mul_mat", src=(a, b))

    @staticmethod
    def mul_mat_id(a: _T, b: _T, ids: _T) -> _T:
        return _T("f32", (a.ne[1], ids.ne[0], b.ne[2], 1), op="mul_mat_id", src=(a, b, ids))

    @staticmethod
    def get_rows(a: _T, b: _T) -> _T:
        type_ = "i32" if a.type == "i32" else "f32"
        return _T(type_, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), op="get_rows", src=(a, b))

    @staticmethod
    def concat(a: _T, b: _T, dim: int) -> _T:
        ne = list(a.ne)
        ne[dim] += b.ne[dim]
        return _T(a.type, ne, op="concat", src=(a, b))


# --- ggml-alloc (ggml/src/ggml-alloc.c) ---------------------------------------------------------


class _Arena:
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


def _same_layout(a: _T, b: _T) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def _allocate(arena: _Arena, t: _T) -> None:
    """ggml_gallocr_allocate_node: in place over a dying parent if allowed, else best fit."""
    if t.external or t.allocated or t.view_src is not None:
        return
    t.allocated = True
    if t.op in _INPLACE_OPS:
        for p in t.src:
            if not p.allocated or p.is_output or not _same_layout(t, p):
                continue
            if p.n_children == 1 and p.n_views == 0:
                t.offset = p.offset
                p.allocated = False  # the child now owns the memory
                return
    t.offset = arena.alloc(_nbytes(t))


def _release(arena: _Arena, parent: _T) -> None:
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


def _free(arena: _Arena, t: _T) -> None:
    if t.is_output:
        return  # graph outputs are never freed
    arena.free(t.offset, _nbytes(t))
    t.allocated = False


def _peak_bytes(g: _Graph, alignment: int = CPU_ALIGNMENT) -> int:
    """ggml_gallocr_reserve_n on one graph: the chunk's high-water mark."""
    arena = _Arena(alignment)
    for leaf in g.leafs:
        _allocate(arena, leaf)
    for node in g.nodes:
        if node.view_src is not None:
            node.view_src.n_views += 1
        for s in node.src:
            s.n_children += 1
    for node in g.nodes:
        for s in node.src:
            _allocate(arena, s)
        _allocate(arena, node)
        for s in node.src:
            _release(arena, s)
    return arena.max_size


# --- what the graph depends on ------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """One reserve pass: tokens in the ubatch, sequences, rows that reach the output head."""

    n_tokens: int
    n_seqs: int
    n_outputs: int


@dataclass(frozen=True)
class _Dims:
    """Model hyper-parameters and launch values the graph is built from."""

    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int
    head_v: int
    n_ff: tuple[int, ...]
    names: frozenset[str]  # tensor names: optional tensors decide optional ops
    shapes: dict[str, tuple[int, ...]]
    # launch
    n_kv: int  # cells per KV stream
    n_kv_swa: int
    n_stream: int
    unified: bool
    flash_attn: bool
    type_k: str
    type_v: str
    rot_k: int  # Hadamard rotation block of a quantized K cache (0: none)
    rot_v: int
    n_expert: int
    n_expert_used: int
    leading_dense: int
    recurrent_layers: tuple[bool, ...]
    ssm: tuple[int, int, int, int, int]  # d_conv, d_inner, d_state, n_group, dt_rank (zeros: none)
    shortconv: int  # LFM2 short-convolution cache length (0: none)
    n_ctx_train: int
    pooling: str
    rwkv_head: int
    mla_kv_lora: int  # DeepSeek MLA compressed KV width (0: no MLA)
    mla_rope: int
    mla_head_k: int  # per-head Q/K width before absorption (nope + rope)
    mla_head_v: int
    swa_layers: tuple[bool, ...]
    layers: tuple[int, ...] = ()  # the layers replayed (see _replay_layers)

    @property
    def iswa(self) -> bool:
        """The model has sliding-window layers and so a two-part KV cache."""
        return any(self.swa_layers)

    def is_swa(self, il: int) -> bool:
        return il < len(self.swa_layers) and self.swa_layers[il]

    @property
    def n_embd_v_gqa_max(self) -> int:
        return max((self.head_v * h for h in self.n_head_kv), default=0)

    def has(self, name: str) -> bool:
        return name in self.names

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)


_QUANTIZED = frozenset({"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})


def _rot(cache_type: str, head: int, *, grow: bool) -> int:
    """llama_kv_cache: a quantized cache whose heads are multiples of 64 rotates them with a
    Hadamard matrix of 64 (K: doubled while it divides the head)."""
    if cache_type not in _QUANTIZED or head <= 0 or head % 64:
        return 0
    n = 64
    while grow and head % (2 * n) == 0:
        n *= 2
    return n


def _swa_cells(meta: ModelMeta, r: Resolved) -> int:
    """Cells per stream of the sliding-window KV cache (llama_kv_cache_iswa)."""
    if not meta.sliding_window or r.swa_full:
        return r.n_ctx_seq
    per_stream = meta.sliding_window * (r.n_seq if r.kv_unified else 1) + r.n_ubatch
    return min(r.n_ctx_seq, -(-per_stream // 256) * 256)


def _dims(meta: ModelMeta, r: Resolved, embeddings: bool) -> _Dims:
    n_layer = meta.n_layer
    n_head = meta.n_head or (0,) * n_layer
    head0 = next((h for h in n_head if h), 1)
    head_k = meta.head_dim_k or meta.n_embd // head0
    head_v = meta.head_dim_v or meta.n_embd // head0
    swa_cells = _swa_cells(meta, r)
    # build_inp_mem_hybrid_iswa (src/llama-graph.cpp) builds no Hadamard inputs: a
    # recurrent hybrid with sliding-window attention (LFM2 with SWA) never rotates
    rotates = not (meta.sliding_window and any(meta.recurrent_layers))
    return _Dims(
        arch=meta.architecture,
        n_layer=n_layer,
        n_embd=meta.n_embd,
        n_vocab=meta.vocab_size or 0,
        n_head=tuple(n_head),
        n_head_kv=tuple(meta.n_head_kv or n_head),
        head_k=head_k,
        head_v=head_v,
        n_ff=tuple(meta.n_ff or (0,) * n_layer),
        names=frozenset(t.name for t in meta.tensors),
        shapes={t.name: t.shape for t in meta.tensors},
        n_kv=r.n_ctx_seq,
        n_kv_swa=swa_cells,
        n_stream=r.n_stream,
        unified=r.kv_unified,
        # llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
        flash_attn=r.flash_attn and meta.architecture != "grok",
        type_k=r.cache_type_k,
        type_v=r.cache_type_v,
        rot_k=_rot(r.cache_type_k, head_k, grow=True) if rotates else 0,
        rot_v=_rot(r.cache_type_v, head_v, grow=False) if rotates else 0,
        n_expert=meta.n_expert,
        n_expert_used=meta.n_expert_used,
        swa_layers=tuple(meta.swa_layers) if meta.sliding_window else (),
        leading_dense=meta.leading_dense_layers,
        recurrent_layers=tuple(meta.recurrent_layers),
        ssm=(
            (
                meta.ssm.conv_kernel,
                meta.ssm.inner_size,
                meta.ssm.state_size,
                meta.ssm.group_count,
                meta.ssm.time_step_rank or 1,
            )
            if meta.ssm
            else (0, 0, 0, 0, 0)
        ),
        shortconv=meta.shortconv_l_cache or 0,
        n_ctx_train=meta.context_length or 0,
        pooling=meta.pooling.value if embeddings else Pooling.NONE.value,
        rwkv_head=meta.rwkv.head_size if meta.rwkv else 0,
        mla_kv_lora=meta.mla.kv_lora_rank if meta.mla else 0,
        mla_rope=(meta.mla.rope_dim or 0) if meta.mla else 0,
        mla_head_k=(meta.mla.key_length_mla or 0) if meta.mla else 0,
        mla_head_v=(meta.mla.value_length_mla or 0) if meta.mla else 0,
        layers=_replay_layers(meta),
    )


def _layer_signature(
    meta: ModelMeta, il: int, blocks: dict[int, list[tuple[str, tuple[int, ...]]]]
) -> tuple[object, ...]:
    """What makes one layer's part of the graph differ from another's."""

    def at(xs: Sequence[object], default: object = None) -> object:
        return xs[il] if il < len(xs) else default

    return (
        at(meta.n_head),
        at(meta.n_head_kv),
        at(meta.n_ff),
        at(meta.swa_layers, False),
        at(meta.recurrent_layers, False),
        il < meta.leading_dense_layers,
        tuple(sorted(blocks.get(il, []))),
    )


def _replay_layers(meta: ModelMeta) -> tuple[int, ...]:
    """The layers whose graph the allocator replays: an irregular head of the stack, two
    periods (at least three layers) of its repeating part, and the last layer (which keeps
    only the output rows).

    ggml-alloc's state after a layer depends only on the layers before it, so once the
    repeating part has settled (best-fit placement can alternate between two layouts, hence
    more than one period) the high-water mark stops growing: replaying 94 layers gives the
    bytes replaying ~4 does. Two layers were not enough (qwen3next, period 1); two periods of
    at least three layers matched the full replay on all 5,099 measured launches, as did three
    and four periods. tests/core/test_compute.py checks the shortcut against the full replay.
    Cached per model: a fit search asks dozens of times.
    """
    hit = _REPLAY_CACHE.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    layers = _replay_layers_uncached(meta)
    if len(_REPLAY_CACHE) >= _CACHE_KEPT:
        _REPLAY_CACHE.clear()
    _REPLAY_CACHE[id(meta)] = (meta, layers)
    return layers


_CACHE_KEPT = 32  # models whose derived values are kept (the UI plans a handful at a time)
_REPLAY_CACHE: dict[int, tuple[ModelMeta, tuple[int, ...]]] = {}
_BYTES_CACHE: dict[tuple[object, ...], tuple[ModelMeta, int]] = {}


def _replay_layers_uncached(meta: ModelMeta) -> tuple[int, ...]:
    n = meta.n_layer
    if n <= 3:
        return tuple(range(n))
    blocks: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for t in meta.tensors:
        if t.name.startswith("blk."):
            idx, _, rest = t.name[4:].partition(".")
            if idx.isascii() and idx.isdigit() and len(idx) <= 9:
                blocks.setdefault(int(idx), []).append((rest, t.shape))
    ids: dict[tuple[object, ...], int] = {}
    sig = [ids.setdefault(_layer_signature(meta, il, blocks), len(ids)) for il in range(n - 1)]
    best: tuple[int, int] | None = None  # (kept layers, start)
    for start in range(len(sig)):
        if best is not None and start >= best[0]:
            break
        for period in range(1, (len(sig) - start) // 2 + 1):
            if all(sig[i] == sig[i - period] for i in range(start + period, len(sig))):
                kept = start + max(2 * period, 3)
                if best is None or kept < best[0]:
                    best = (kept, start)
                break
    if best is None or best[0] >= n - 1:
        return tuple(range(n))
    return (*range(best[0]), n - 1)


# --- graph pieces shared by the families (src/llama-graph.cpp) ----------------------------------


class _Builder:
    """llm_graph_context: inputs, norms, attention and FFN blocks, output head."""

    def __init__(self, d: _Dims, s: _Shape) -> None:
        self.d = d
        self.s = s
        self.g = _Graph()
        self.n_tokens = s.n_tokens
        self._pos: _T | None = None
        self._out_ids: _T | None = None
        self._attn_inputs: dict[str, _AttnInputs] = {}
        self.no_cache_mask: _T | None = None
        self._s_copy: tuple[_T, _T] | None = None
        # build_inp_embd as of MIXED_BATCH_BUILD (set by _mixed_batch's wrapper of a family)
        self.mixed_batch = False
        self.t_embd: _T | None = None  # the output head's input (res->t_embd)

    def each_layer(self) -> Iterator[int]:
        """The replayed layers in order; weights and caches built meanwhile are stamped with
        their layer, those built after the last one with the output layer's index."""
        for il in self.d.layers:
            self.g.layer = il
            yield il
        self.g.layer = self.d.n_layer

    # -- inputs -----------------------------------------------------------------------------

    def inp_embd(self, *, scale: bool = False, tok_scale: bool = False) -> _T:
        """build_inp_embd: token rows, plus the unused vector-embedding input (a leaf that is
        allocated and never freed); Granite scales the rows here.

        From MIXED_BATCH_BUILD on (`self.mixed_batch`, architectures that allow mixed
        token/embedding batches) a third select branch is built and allocated, though unused:
        its own token, slot (i64) and embedding inputs, the token rows (get_rows), a copy of
        the embedding input (dup) and set_rows into that copy. The set_rows result is a view
        of the copy that nothing reads, so ggml-alloc never frees the copy: n_embd x n_tokens
        f32 stays allocated for the whole graph, next to the three inputs. `tok_scale`: the
        token rows are scaled in here (Gemma 3 from that build on, sqrt(n_embd)): an
        [1, n_tokens] f32 input and a mul, in place; older builds scale in the model."""
        g, d = self.g, self.d
        tokens = g.input("i32", self.n_tokens)
        tok_embd = g.weight(d.n_embd, d.n_vocab)
        embd = g.get_rows(tok_embd, tokens)
        g.expand(embd)
        g.expand(g.input("f32", d.n_embd, self.n_tokens))
        mixed = self.mixed_batch and d.arch not in _NO_MIXED_BATCH
        if mixed:
            rows = g.get_rows(tok_embd, g.input("i32", self.n_tokens))
            slots = g.input("i64", self.n_tokens)
            copy = g.op("dup", g.input("f32", d.n_embd, self.n_tokens))
            g.expand(g.set_rows(copy, rows, slots))
        if scale:
            embd = g.expand(g.op("scale", embd))
        if tok_scale:
            if self.mixed_batch:
                embd = g.expand(g.op("mul", embd, g.input("f32", 1, self.n_tokens)))
            else:
                embd = g.op("scale", embd)
        return embd

    def inp_pos(self) -> _T:
        if self._pos is None:
            self._pos = self.g.input("i32", self.n_tokens)
        return self._pos

    def out_ids(self) -> _T:
        if self._out_ids is None:
            self._out_ids = self.g.input("i32", self.s.n_outputs)
        return self._out_ids

    # -- small blocks -----------------------------------------------------------------------

    def norm(self, x: _T, weight: bool = True, *, kind: str = "rms_norm", bias: bool = False) -> _T:
        """build_norm: rms_norm (or layer norm), times the weight, plus the bias."""
        g = self.g
        cur = g.op(kind, x)
        if weight:
            cur = g.op("mul", cur, g.weight(x.ne[0]))
        if bias:
            cur = g.op("add", cur, g.weight(x.ne[0]))
        return cur

    def linear(self, x: _T, n_out: int, bias: bool = False) -> _T:
        g = self.g
        cur = g.mul_mat(g.weight(x.ne[0], n_out), x)
        if bias:
            cur = g.op("add", cur, g.weight(n_out))
        return cur

    def rope(self, x: _T) -> _T:
        return self.g.op("rope", x, self.inp_pos())

    def last_rows(self, il: int, *xs: _T) -> list[_T]:
        """The last layer keeps only the rows that reach the output head (inp_out_ids)."""
        if il != self.d.n_layer - 1:
            return list(xs)
        return [self.g.get_rows(x, self.out_ids()) for x in xs]

    def ffn(self, x: _T, n_ff: int, *, act: str = "swiglu", gate: bool = True) -> _T:
        """build_ffn with a parallel gate: gate and up matmuls, fused GLU, down matmul."""
        g = self.g
        up = self.linear(x, n_ff)
        cur = g.op(act, self.linear(x, n_ff), up) if gate else g.op("unary", up)
        return self.linear(cur, x.ne[0])

    def output_head(
        self,
        cur: _T,
        *,
        keep_hidden: bool = False,
        logit_scale: bool = False,
        norm_is_output: bool = False,
        softcap: bool = False,
        kind: str = "rms_norm",
    ) -> _T:
        """result_norm and result_output are graph outputs: never freed, never reused.
        `keep_hidden`: the last layer's output is itself a graph output (t_h_nextn) and the
        output rows are selected only here; `norm_is_output`: the same, after the norm."""
        g = self.g
        if keep_hidden:
            cur.is_output = True
            cur = g.get_rows(cur, self.out_ids())
        cur = self.norm(cur, kind=kind, bias=kind == "norm")
        if norm_is_output:
            cur.is_output = True
            cur = g.get_rows(cur, self.out_ids())
        cur.is_output = True
        self.t_embd = cur
        logits = g.mul_mat(g.weight(self.d.n_embd, self.d.n_vocab), cur)
        if self.d.has("output.bias"):  # result_output_no_bias + output_b (in place)
            logits = g.op("add", logits, g.weight(self.d.n_vocab))
        if logit_scale:
            logits = g.op("scale", logits)
        if softcap:  # final logit soft-capping: scale, tanh, scale
            logits = g.op("scale", g.op("unary", g.op("scale", logits)))
        logits.is_output = True
        g.expand(logits)
        return logits

    # -- attention (build_attn / build_attn_mha) --------------------------------------------

    def kv_inputs(self, swa: bool) -> _AttnInputs:
        """build_attn_inp_kv(_iswa): KV write indices, the KQ mask, Hadamard rotations; one
        set per KV cache, shared by its layers."""
        key = "swa" if swa else "full"
        have = self._attn_inputs.get(key)
        if have is not None:
            return have
        d, g, n = self.d, self.g, self.n_tokens
        n_kv = d.n_kv_swa if swa else d.n_kv
        k_idxs = g.input("i64", n)
        # a transposed V (no flash attention) is written one element per row
        v_idxs = g.input("i64", n if d.flash_attn else n * d.n_embd_v_gqa_max)
        n_mask_streams = 1 if d.unified else self.s.n_seqs
        mask = g.input(
            "f16" if d.flash_attn else "f32", n_kv, n // n_mask_streams, 1, n_mask_streams
        )
        rot_k = g.input("f32", d.rot_k, d.rot_k) if d.rot_k else None
        rot_v = g.input("f32", d.rot_v, d.rot_v) if d.rot_v else None
        made = _AttnInputs(n_kv, k_idxs, v_idxs, mask, rot_k, rot_v)
        self._attn_inputs[key] = made
        return made

    def is_recurrent(self, il: int) -> bool:
        r = self.d.recurrent_layers
        return il < len(r) and r[il]

    def rs(self, state_size: int, get_rows: _RowsFn | None = None) -> _T:
        """build_rs: read this ubatch's recurrent states from the layer's state cache. The
        first slot is zeroed in place, the sequences' rows gathered (or handed to a scan op
        that reads them itself), the other slots copied back; all but the gather are views."""
        g = self.g
        n_seqs = self.s.n_seqs
        n_rs = max(1, n_seqs)  # recurrent memory holds one state per slot (n_rs_seq = 0)
        if self._s_copy is None:  # build_rs_inp: one index input and its two views
            s_copy = g.input("i32", n_rs)
            self._s_copy = (g.view(s_copy, (n_seqs,)), g.view(s_copy, (n_rs - n_seqs,)))
        main, extra = self._s_copy
        if self.mixed_batch:
            return self._rs_gathered(state_size, get_rows)
        cache = g.cache("f32", state_size, n_rs)
        states = g.reshape(cache, state_size, n_rs)
        zero = g.view(states, (state_size,))
        g.expand(_T(zero.type, zero.ne, op="scale", src=(zero,), view_src=zero, nb=zero.nb))
        out = get_rows(states, main) if get_rows else g.get_rows(states, main)
        g.expand(out)
        rest = g.get_rows(states, extra)
        g.expand(g.cpy(rest, g.view(cache, (state_size, n_rs - n_seqs))))
        return out

    def _rs_gathered(self, state_size: int, get_rows: _RowsFn | None) -> _T:
        """build_rs as of MIXED_BATCH_BUILD (b11434 src/llama-graph.cpp build_rs): one
        gather of every state (rs_s_copy, n_rs rows) whose first n_seqs rows are the
        ubatch's states (a view) and whose rest is copied back; a custom getter (the scan
        ops) reads the ubatch's states itself and the gather takes the n_rs - 1 others
        (s_copy_tail), allocated after the scan and freed by the copy."""
        g = self.g
        n_seqs = self.s.n_seqs
        n_rs = max(1, n_seqs)
        assert self._s_copy is not None
        main = self._s_copy[0]
        s_copy = main.view_src
        assert s_copy is not None
        cache = g.cache("f32", state_size, n_rs)
        states = g.reshape(cache, state_size, n_rs)
        zero = g.view(states, (state_size,))
        g.expand(_T(zero.type, zero.ne, op="scale", src=(zero,), view_src=zero, nb=zero.nb))
        idx = g.view(s_copy, (n_rs - 1,)) if get_rows else s_copy
        gathered = g.get_rows(states, idx)
        if get_rows:
            out = get_rows(states, main)
        else:
            out = g.view(gathered, (state_size, n_seqs), (gathered.nb[1],))
        g.expand(out)
        rest = g.view(gathered, (state_size, n_rs - n_seqs), (gathered.nb[1],))
        g.expand(g.cpy(rest, g.view(cache, (state_size, n_rs - n_seqs))))
        return out

    def hadamard(self, x: _T, rot: _T) -> _T:
        """llama_mul_mat_hadamard: rotate rows in blocks of rot.ne[0] (quantized KV cache)."""
        g = self.g
        n = rot.ne[0]
        rows = x.nelements // n
        cur = g.cont(x, n, rows) if not x.is_contiguous() else g.reshape(x, n, rows)
        return g.reshape(g.mul_mat(rot, cur), *x.ne)

    def attn_kv(
        self,
        il: int,
        q: _T,
        k: _T,
        v: _T,
        *,
        sinks: bool = False,
        softcap: bool = False,
        wo_bias: bool = False,
        wo: bool = True,
    ) -> _T:
        """build_attn with a KV cache: rotate, store K and V, attend over the whole cache
        (the sliding-window cache for SWA layers), project with wo."""
        g, d = self.g, self.d
        swa = d.is_swa(il)
        inp = self.kv_inputs(swa)
        if inp.rot_k is not None:
            q = self.hadamard(q, inp.rot_k)
            k = self.hadamard(k, inp.rot_k)
        if inp.rot_v is not None:
            v = self.hadamard(v, inp.rot_v)
        # the iSWA variant expands q, k, v; the plain one q, v, k (rope fusion into the cache)
        for t in (q, k, v) if d.iswa else (q, v, k):
            g.expand(t)
        kc, vc = self._cache_tensors(il, inp.n_kv)
        g.expand(self.store_k(kc, k, inp.k_idxs))
        g.expand(self._store_v(vc, v, inp.v_idxs))
        kview, vview = self.cache_views(il, kc, vc, inp.n_kv)
        cur = self.attn_mha(q, kview, vview, inp.mask, sinks=sinks, softcap=softcap)
        if inp.rot_v is not None:
            cur = self.hadamard(cur, inp.rot_v)
        return self.linear(cur, d.n_embd, bias=wo_bias) if wo else cur

    def _cache_tensors(self, il: int, n_kv: int) -> tuple[_T, _T]:
        d = self.d
        n_k = d.head_k * d.n_head_kv[il]
        n_v = d.head_v * d.n_head_kv[il] if d.flash_attn else d.n_embd_v_gqa_max
        kc = self.g.cache(d.type_k, n_k, n_kv, d.n_stream)
        vc = self.g.cache(d.type_v, n_v, n_kv, d.n_stream)
        return kc, vc

    def store_k(self, kc: _T, k: _T, idxs: _T) -> _T:
        """llama_kv_cache::cpy_k: rows of K into the cache (a view, allocates nothing)."""
        g = self.g
        n_gqa = k.ne[0] * k.ne[1]
        rows = g.view(k, (n_gqa, k.ne[2]), (k.nb[2],))
        dst = g.reshape(kc, kc.ne[0], kc.ne[1] * kc.ne[2]) if kc.ne[2] > 1 else kc
        return g.set_rows(dst, rows, idxs)

    def _store_v(self, vc: _T, v: _T, idxs: _T) -> _T:
        """llama_kv_cache::cpy_v: rows, or single elements when V is stored transposed."""
        g = self.g
        n_gqa = v.ne[0] * v.ne[1]
        if self.d.flash_attn:
            rows = g.view(v, (n_gqa, v.ne[2]), (v.nb[2],))
            dst = g.reshape(vc, vc.ne[0], vc.ne[1] * vc.ne[2]) if vc.ne[2] > 1 else vc
            return g.set_rows(dst, rows, idxs)
        cur = g.reshape(v, n_gqa, v.ne[2]) if v.is_contiguous() else g.cont(v, n_gqa, v.ne[2])
        if n_gqa < vc.ne[0]:
            cur = g.op("pad", cur, ne=(vc.ne[0], cur.ne[1]))
        dst = g.reshape(vc, 1, vc.nelements)
        return g.set_rows(dst, g.reshape(cur, 1, cur.nelements), idxs)

    def cache_views(self, il: int, kc: _T, vc: _T, n_kv: int) -> tuple[_T, _T]:
        """get_k / get_v: [head, n_head_kv, n_kv, n_stream] (V transposed without FA)."""
        d, g = self.d, self.g
        hkv = d.n_head_kv[il]
        ns = d.n_stream
        kv_size = kc.ne[1]
        tk = kc.type
        k = g.view(
            kc,
            (d.head_k, hkv, n_kv, ns),
            (_row_size(tk, d.head_k), _row_size(tk, kc.ne[0]), _row_size(tk, kc.ne[0] * kv_size)),
        )
        tv = vc.type
        if d.flash_attn:
            v = g.view(
                vc,
                (d.head_v, hkv, n_kv, ns),
                (
                    _row_size(tv, d.head_v),
                    _row_size(tv, vc.ne[0]),
                    _row_size(tv, vc.ne[0] * kv_size),
                ),
            )
        else:
            v = g.view(
                vc,
                (n_kv, hkv, d.head_v, ns),
                (
                    _row_size(tv, kv_size * d.head_v),
                    _row_size(tv, kv_size),
                    _row_size(tv, kv_size * vc.ne[0]),
                ),
            )
        return k, v

    def attn_mha(
        self,
        q: _T,
        k: _T,
        v: _T,
        mask: _T,
        *,
        sinks: bool = False,
        softcap: bool = False,
        v_mla: _T | None = None,
    ) -> _T:
        """build_attn_mha: flash attention, or KQ -> soft-max (in place) -> KQV."""
        g = self.g
        v_trans = v.nb[1] > v.nb[2]
        ns = k.ne[3]
        q = g.view(
            q, (q.ne[0], q.ne[1], q.ne[2] // ns, ns), (q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // ns))
        )
        q = g.permute(q, 0, 2, 1, 3)
        k = g.permute(k, 0, 2, 1, 3)
        v = g.permute(v, 0, 2, 1, 3)
        if self.d.flash_attn:
            if k.type == "f32":
                k = g.op("cpy", k, type_="f16")
            if v.type == "f32":
                v = g.op("cpy", v, type_="f16")
            extra = (g.weight(q.ne[2]),) if sinks else ()
            cur = _T(
                "f32",
                (v.ne[0], q.ne[2], q.ne[1], q.ne[3]),
                op="flash_attn_ext",
                src=(q, k, v, mask, *extra),
            )
            if v_mla is not None:
                cur = g.permute(cur, 0, 2, 1, 3)
                cur = g.mul_mat(v_mla, cur)
                cur = g.permute(cur, 0, 2, 1, 3)
                cur = g.cont(cur)
            cur = g.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = g.mul_mat(k, q)
            if softcap:
                kq = g.op("unary", g.op("scale", kq))
                kq = g.op("scale", kq)
            extra = (g.weight(q.ne[2]),) if sinks else ()
            kq = g.op("soft_max", kq, mask, *extra)
            if not v_trans:
                v = g.cont(g.transpose(v))
            kqv = g.mul_mat(v, kq)
            if v_mla is not None:
                kqv = g.mul_mat(v_mla, kqv)
            cur = g.permute(kqv, 0, 2, 1, 3)
            cur = g.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        g.expand(cur)
        return cur


_RowsFn = Callable[[_T, _T], _T]


@dataclass(frozen=True)
class _AttnInputs:
    n_kv: int
    k_idxs: _T
    v_idxs: _T
    mask: _T
    rot_k: _T | None
    rot_v: _T | None


class _Moe:
    """How one architecture routes tokens to experts (build_moe_ffn's arguments)."""

    def __init__(
        self,
        *,
        gating: str = "softmax",
        norm_w: bool = True,
        scale: bool = False,
        probs_bias: bool = False,
        biases: bool = False,
        act: str = "swiglu",
        weight_before: bool = False,
    ) -> None:
        self.gating = gating  # softmax | sigmoid | softmax_weight
        self.norm_w = norm_w
        self.scale = scale
        self.probs_bias = probs_bias  # DeepSeek-V3 exp_probs_b selection bias
        self.biases = biases  # gpt-oss: router and expert biases
        self.act = act
        # Llama 4: the routing weights scale each token's copies before the experts
        # (weight_before_ffn: the input repeated n_expert_used times, then multiplied)
        self.weight_before = weight_before


def _moe_ffn(b: _Builder, x: _T, il: int, m: _Moe) -> _T:
    """build_moe_ffn: router, top-k, weights, expert matmuls over n_expert_used rows per
    token, weighted, then the experts' rows summed."""
    g, d = b.g, b.d
    n_tok = x.ne[1]
    n_used = d.n_expert_used
    up_shape = d.shape(f"blk.{il}.ffn_up_exps.weight") or (d.n_embd, d.n_ff[il], d.n_expert)
    n_ff_exp = up_shape[1]
    logits = b.linear(x, d.n_expert, bias=m.biases)
    probs = logits
    if m.gating == "softmax":
        probs = g.op("soft_max", logits)
    elif m.gating == "sigmoid":
        probs = g.op("unary", logits)
    sel = g.op("add", probs, g.weight(d.n_expert)) if m.probs_bias else probs
    order = g.op("argsort", sel, type_="i32")
    topk = g.view(order, (n_used, n_tok), (order.nb[1],))
    weights = g.get_rows(g.reshape(probs, 1, d.n_expert, n_tok), topk)
    if m.gating == "softmax_weight":
        weights = g.op("soft_max", g.reshape(weights, n_used, n_tok))
        weights = g.reshape(weights, 1, n_used, n_tok)
    if m.norm_w:
        w2 = g.reshape(weights, n_used, n_tok)
        total = g.op("clamp", g.op("sum_rows", w2, ne=(1, n_tok)))
        weights = g.reshape(g.op("div", w2, total), 1, n_used, n_tok)
    if m.scale:
        weights = g.op("scale", weights)
    g.expand(weights)
    cur = g.reshape(x, x.ne[0], 1, n_tok)
    if m.weight_before:  # each token's copies scaled by its weights
        cur = g.op("mul", g.op("repeat", cur, ne=(x.ne[0], n_used, n_tok)), weights)
    up = g.mul_mat_id(g.expert_weight(x.ne[0], n_ff_exp, d.n_expert), cur, topk)
    gate = g.mul_mat_id(g.expert_weight(x.ne[0], n_ff_exp, d.n_expert), cur, topk)
    if m.biases:
        up = g.op("add_id", up, g.expert_weight(n_ff_exp, d.n_expert), topk)
        gate = g.op("add_id", gate, g.expert_weight(n_ff_exp, d.n_expert), topk)
    act = g.op(m.act, gate, up)
    experts = g.mul_mat_id(g.expert_weight(n_ff_exp, x.ne[0], d.n_expert), act, topk)
    if m.biases:
        experts = g.op("add_id", experts, g.expert_weight(x.ne[0], d.n_expert), topk)
    experts = experts if m.weight_before else g.op("mul", experts, weights)
    g.expand(experts)
    views = [g.view(experts, (x.ne[0], n_tok), (experts.nb[2],)) for _ in range(n_used)]
    for v in views:
        g.expand(v)
    out = views[0]
    for v in views[1:]:
        out = g.expand(g.op("add", out, v))
    if n_used == 1:
        out = g.cont(out)
    return out


def _qkv(b: _Builder, il: int, x: _T) -> tuple[_T, _T, _T]:
    """build_qkv (separate Q/K/V matmuls, optional biases) then the optional Q/K norms."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq, hkv = d.n_head[il], d.n_head_kv[il]
    pre = f"blk.{il}."
    if d.has(pre + "attn_qkv.weight"):  # fused projection, split by views
        n_q, n_k = d.head_k * hq, d.head_k * hkv
        qkv = b.linear(x, n_q + n_k + d.head_v * hkv, bias=d.has(pre + "attn_qkv.bias"))
        q = g.view(qkv, (d.head_k, hq, n_tok), (d.head_k * 4, qkv.nb[1]))
        k = g.view(qkv, (d.head_k, hkv, n_tok), (d.head_k * 4, qkv.nb[1]))
        v = g.view(qkv, (d.head_v, hkv, n_tok), (d.head_v * 4, qkv.nb[1]))
    else:
        q = b.linear(x, d.head_k * hq, bias=d.has(pre + "attn_q.bias"))
        k = b.linear(x, d.head_k * hkv, bias=d.has(pre + "attn_k.bias"))
        v = b.linear(x, d.head_v * hkv, bias=d.has(pre + "attn_v.bias"))
        q = g.reshape(q, d.head_k, hq, n_tok)
        k = g.reshape(k, d.head_k, hkv, n_tok)
        v = g.reshape(v, d.head_v, hkv, n_tok)
    if d.has(pre + "attn_q_norm.weight"):
        q = b.norm(q)
    if d.has(pre + "attn_k_norm.weight"):
        k = b.norm(k)
    return q, k, v


def _ffn_no_gate(b: _Builder, il: int, x: _T) -> _T:
    """build_ffn without a gate tensor: up (+bias), activation, down (+bias). An up
    projection twice n_ff wide carries the gate in its first half (phi3.cpp, glm4.cpp,
    chatglm.cpp: `{n_embd, 2 * n_ff}`, LLM_FFN_SWIGLU): the fused GLU (ggml_swiglu of one
    tensor) splits it and halves the width."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_ff = d.n_ff[il]
    shape = d.shape(pre + "ffn_up.weight")
    n_up = shape[1] if shape is not None and len(shape) > 1 else n_ff
    up = b.linear(x, n_up, bias=d.has(pre + "ffn_up.bias"))
    fused = n_up == 2 * n_ff
    act = g.op("swiglu", up, ne=(n_ff, *up.ne[1:])) if fused else g.op("unary", up)
    return b.linear(act, x.ne[0], bias=d.has(pre + "ffn_down.bias"))


def _pre_norm(b: _Builder, x: _T, name: str) -> _T:
    """RMS norm, or a layer norm with bias where the GGUF carries one."""
    if b.d.has(name + ".bias"):
        return b.norm(x, kind="norm", bias=True)
    return b.norm(x)


def _attn_no_cache(b: _Builder, il: int, q: _T, k: _T, v: _T) -> _T:
    """build_attn without a KV cache (encoders): attend over the ubatch itself, with a
    [n_tokens, n_tokens] mask; flash attention first casts K and V to f16."""
    d, g = b.d, b.g
    n_tok = q.ne[2]
    if b.no_cache_mask is None:
        b.no_cache_mask = g.input("f16" if d.flash_attn else "f32", n_tok, n_tok)
    for t in (q, k, v):
        g.expand(t)
    cur = b.attn_mha(q, k, v, b.no_cache_mask)
    return b.linear(cur, d.n_embd, bias=d.has(f"blk.{il}.attn_output.bias"))


def _pooling(b: _Builder, embd: _T) -> None:
    """build_pooling: t_embd stays an output; mean pooling multiplies by an [n_tokens,
    n_seqs] input, CLS/last pooling picks rows."""
    g = b.g
    embd.is_output = True
    g.expand(embd)
    n_tok = embd.ne[1]
    if b.d.pooling == "mean":
        pooled = g.mul_mat(g.cont(g.transpose(embd)), g.input("f32", n_tok, b.s.n_seqs))
    elif b.d.pooling in ("cls", "last", "rank"):
        pooled = g.get_rows(embd, g.input("i32", b.s.n_seqs))
    else:
        return
    if b.d.pooling == "rank":  # classification head (unmeasured: no reranker fixture)
        if b.d.has("cls.weight"):
            pooled = b.linear(pooled, b.d.n_embd, bias=b.d.has("cls.bias"))
            pooled = g.op("unary", pooled)
        if b.d.has("cls.output.weight"):
            n_out = (b.d.shape("cls.output.weight") or (0, 1))[1]
            pooled = b.linear(pooled, n_out, bias=b.d.has("cls.output.bias"))
    pooled.is_output = True
    g.expand(pooled)


# --- attention families (src/models/*.cpp) ------------------------------------------------------


# src/models/*.cpp without ggml_rope_ext: ALiBi (bloom, jais, mpt, refact) or learned
# positions (gpt2, starcoder); Q and K go to the cache as views of the projections
_NO_ROPE = frozenset({"bloom", "gpt2", "jais", "mpt", "refact", "starcoder"})


# The output gate measured against b11434's dumps (spark2-5.cpp, afmoe.cpp). muse-glimmer
# has one too but predicts best without it (its layout differs elsewhere: an embedding
# norm, layers without RoPE), so other architectures are laid out without the gate.
_GATED_ATTN = frozenset({"spark2_5", "afmoe"})


def _graph_llama(b: _Builder) -> None:
    """src/models/llama.cpp, qwen2.cpp, qwen3.cpp, qwen3moe.cpp: pre-norm attention with
    RoPE, residual, pre-norm FFN (dense SwiGLU or softmax-routed experts), residual.

    Also the layout for architectures without a builder of their own, so optional tensors
    switch optional ops: biased layer norms, a fused QKV projection, an FFN without gate,
    learned positions, an embedding norm, absent pre-norms and present post-norms (olmo2.cpp,
    exaone4.cpp), an attention output gate, shared experts."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    if d.has("position_embd.weight"):  # gpt2.cpp, starcoder.cpp: learned positions
        pos = g.get_rows(g.weight(d.n_embd, d.n_ctx_train), b.inp_pos())
        inp = g.op("add", inp, pos)
    if d.has("token_embd_norm.weight"):  # bloom.cpp: a layer norm on the embeddings
        inp = b.norm(inp, kind="norm", bias=d.has("token_embd_norm.bias"))
    # llama4.cpp: sigmoid routing, weights before the experts
    llama4 = _Moe(gating="sigmoid", norm_w=False, weight_before=True)
    moe = llama4 if d.arch == "llama4" else _Moe()
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = inp
        # post-norms and no attention norm tensor: post-norms only (olmo2.cpp, exaone4.cpp;
        # olmo.cpp has no norm tensors but weightless pre-norms); with an attention norm, a
        # post-attention norm is the FFN's pre-norm (openai-moe.cpp names it so)
        post = not d.has(pre + "attn_norm.weight") and (
            d.has(pre + "post_attention_norm.weight") or d.has(pre + "post_ffw_norm.weight")
        )
        cur = inp if post else _pre_norm(b, inp, pre + "attn_norm")
        cur = _llama_attn(b, il, cur)
        # a post-attention norm beside an FFN norm is a post-norm too (muse-glimmer.cpp)
        if d.has(pre + "post_attention_norm.weight") and (post or d.has(pre + "ffn_norm.weight")):
            cur = b.norm(cur)
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = ffn_inp if post else _pre_norm(b, ffn_inp, pre + "ffn_norm")
        cur = _llama_ffn(b, il, cur, moe)
        if d.has(pre + "post_ffw_norm.weight"):
            cur = b.norm(cur)
        inp = g.op("add", cur, ffn_inp)
    kind = "norm" if d.has("output_norm.bias") else "rms_norm"
    b.output_head(inp, kind=kind)
    assert b.t_embd is not None
    _pooling(b, b.t_embd)


def _llama_attn(b: _Builder, il: int, x: _T) -> _T:
    """The generic layout's attention: Q/K/V, RoPE unless the family has none, the cache,
    the optional per-head sigmoid output gate, wo."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    q, k, v = _qkv(b, il, x)
    if _ropes(d, il):
        q, k = b.rope(q), b.rope(k)
    wo_bias = d.has(pre + "attn_output.bias")
    gate_shape = d.shape(pre + "attn_gate.weight")
    if d.arch not in _GATED_ATTN or gate_shape is None or len(gate_shape) < 2:
        return b.attn_kv(il, q, k, v, wo_bias=wo_bias)
    # a sigmoid output gate computed from the attention's input (spark2-5.cpp, afmoe.cpp),
    # which so lives across the attention
    cur = b.attn_kv(il, q, k, v, wo=False)
    cur = g.op("mul", cur, g.op("unary", b.linear(x, gate_shape[1])))
    return b.linear(cur, d.n_embd, bias=wo_bias)


def _llama_ffn(b: _Builder, il: int, x: _T, moe: _Moe) -> _T:
    """The generic layout's FFN: experts (plus a shared expert, or Grok's dense FFN beside
    them), a gated FFN as wide as its up projection, or an ungated one."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    up = d.shape(pre + "ffn_up.weight")
    if d.arch == "refact":  # refact.cpp: build_ffn whatever expert tensors the file has
        if up is None:  # no weights at all: build_ffn leaves the activation alone
            return g.op("unary", x)
    elif d.has(pre + "ffn_gate_inp.weight"):
        cur = _moe_ffn(b, x, il, moe)
        shexp = d.shape(pre + "ffn_up_shexp.weight")
        if shexp is not None:  # a shared expert beside the routed ones
            return g.op("add", cur, b.ffn(x, shexp[1]))
        if d.arch == "grok" and up is not None:
            # grok.cpp: a dense GELU FFN beside the experts, the sum scaled
            return g.op("scale", g.op("add", b.ffn(x, d.n_ff[il], act="geglu"), cur))
        return cur
    if d.has(pre + "ffn_gate.weight") or up is None:
        # the up projection's width where the file has one: qwen.cpp's is n_ff / 2
        return b.ffn(x, up[1] if up is not None and len(up) > 1 else d.n_ff[il])
    return _ffn_no_gate(b, il, x)


def _ropes(d: _Dims, il: int) -> bool:
    """Whether layer `il` ropes Q and K. Cohere 2, Maple and muse-glimmer rope their
    sliding-window layers only; Cohere 2 MoE also its leading dense layers (cohere2moe.cpp
    force_rope); SmallThinker with sliding windows skips every 4th layer from 0
    (smallthinker.cpp n_no_rope_layer_step); baichuan.cpp ropes only the 7B (32 layers)."""
    if d.arch in _NO_ROPE or (d.arch == "baichuan" and d.n_layer != 32):
        return False
    if d.arch in ("cohere2", "maple", "muse-glimmer"):
        return d.is_swa(il)
    if d.arch == "cohere2moe":
        return d.is_swa(il) or il < d.leading_dense
    if d.arch == "smallthinker" and d.iswa:
        return il % 4 != 0
    return True


def _graph_parallel(b: _Builder) -> None:
    """src/models/phi2.cpp, command-r.cpp, cohere2.cpp: one layer norm feeds attention and
    the FFN in parallel, so the norm's output lives across the attention; the layer output
    is attention + FFN + input. Phi-2 scales Q after RoPE, has an ungated GELU FFN and a
    biased output head; Cohere 2 ropes only its sliding-window layers."""
    d, g = b.d, b.g
    # cohere2moe.cpp selects the output rows after the output norm (t_h_nextn)
    late_rows = d.arch == "cohere2moe"
    inp = b.inp_embd()
    for il in b.each_layer():
        pre = f"blk.{il}."
        normed = b.norm(inp, kind="norm", bias=d.has(pre + "attn_norm.bias"))
        q, k, v = _qkv(b, il, normed)
        if _ropes(d, il):
            q, k = b.rope(q), b.rope(k)
        if d.arch == "phi2":
            q = g.op("scale", q)
        cur = b.attn_kv(il, q, k, v, wo_bias=d.has(pre + "attn_output.bias"))
        if not late_rows:
            cur, inp, normed = b.last_rows(il, cur, inp, normed)
        if d.has(pre + "ffn_gate_inp.weight"):
            ffn = _moe_ffn(b, normed, il, _Moe())
            shexp = d.shape(pre + "ffn_up_shexp.weight")
            if shexp is not None:  # shared expert, averaged with the routed ones
                ffn = g.op("scale", g.op("add", ffn, b.ffn(normed, shexp[1])))
        elif d.has(pre + "ffn_gate.weight"):
            ffn = b.ffn(normed, d.n_ff[il])
        else:
            ffn = _ffn_no_gate(b, il, normed)
        inp = g.op("add", g.op("add", ffn, inp), cur)
    b.output_head(inp, kind="norm", logit_scale=d.arch != "phi2", norm_is_output=late_rows)


def _graph_talkie(b: _Builder) -> None:
    """src/models/talkie.cpp: RMS-normed embeddings (weightless norms throughout) kept for
    the whole stack: every layer adds them back scaled (a mul that cannot run in place, its
    parent living on), after the usual attention (Q/K normed after RoPE) and SwiGLU FFN."""
    d, g = b.d, b.g
    inp = b.norm(b.inp_embd(), weight=False)
    skip_src = inp
    for il in b.each_layer():
        cur = b.norm(inp, weight=False)
        q, k, v = _qkv(b, il, cur)
        q, k = b.norm(b.rope(q)), b.norm(b.rope(k), weight=False)
        cur = b.attn_kv(il, q, k, v)
        cur, inp, skip = b.last_rows(il, cur, inp, skip_src)
        ffn_inp = g.op("add", cur, inp)
        cur = g.op("add", b.ffn(b.norm(ffn_inp, weight=False), d.n_ff[il]), ffn_inp)
        inp = g.op("add", cur, g.op("mul", skip, g.weight(d.n_embd)))
    b.output_head(inp, logit_scale=True)


def _graph_hrm(b: _Builder) -> None:
    """src/models/hrm-text.cpp: the embeddings (zH) stay live under every stack; each stack
    reads zH + zL (zL starting as a learned vector), runs weightless pre-norm layers whose
    attention has a sigmoid output gate, ends in a weightless norm, and becomes the next
    zL (the last one zH). Rows are selected only for the output head. The cycle counts are
    not in ModelMeta, so every layer is laid out as a stack of its own (test-llama-archs'
    model: one layer per stack, one cycle each)."""
    d, g = b.d, b.g
    z_h = b.inp_embd()
    z_l = g.weight(d.n_embd)
    for il in b.each_layer():
        inp = g.op("add", z_h, z_l)
        cur = b.norm(inp, weight=False)
        q, k, v = _qkv(b, il, cur)
        gate = b.linear(cur, d.n_head[il] * d.head_v)
        cur = b.attn_kv(il, b.rope(q), b.rope(k), v, wo=False)
        cur = g.op("mul", cur, g.op("unary", gate))
        ffn_inp = g.op("add", b.linear(cur, d.n_embd), inp)
        cur = g.op("add", b.ffn(b.norm(ffn_inp, weight=False), d.n_ff[il]), ffn_inp)
        z_l = b.norm(cur, weight=False)
    b.output_head(g.get_rows(z_l, b.out_ids()))


def _graph_gemma(b: _Builder) -> None:
    """src/models/gemma3.cpp and gemma2.cpp: scaled embeddings, Q/K norms (Gemma 3), Q
    scaled before attention, post-attention and post-FFN norms, GELU-gated FFN;
    sliding-window layers on their own cache. Gemma 2 soft-caps the attention scores and the
    logits with scale/tanh/scale (in place)."""
    d, g = b.d, b.g
    softcap = d.arch == "gemma2"
    # Gemma 2 scales the embeddings in the model; Gemma 3 in build_inp_embd (tok_scale)
    inp = g.op("scale", b.inp_embd()) if softcap else b.inp_embd(tok_scale=True)
    for il in b.each_layer():
        cur = b.norm(inp)
        q, k, v = _qkv(b, il, cur)
        q = g.op("scale", b.rope(q))
        cur = b.attn_kv(il, q, b.rope(k), v, softcap=softcap)
        cur, inp = b.last_rows(il, cur, inp)
        sa_out = g.op("add", b.norm(cur), inp)
        cur = b.ffn(b.norm(sa_out), d.n_ff[il], act="geglu")
        inp = g.op("add", b.norm(cur), sa_out)
    b.output_head(inp, softcap=softcap)


def _graph_gpt_oss(b: _Builder) -> None:
    """src/models/openai-moe.cpp: biased Q/K/V, attention sinks, alternating sliding-window
    layers, soft-max-weighted experts with biases and the clamped SwiGLU; output rows are
    selected after the last layer, whose hidden state is kept as an output."""
    g = b.g
    inp = b.inp_embd()
    moe = _Moe(gating="softmax_weight", norm_w=False, biases=True, act="swiglu_oai")
    for il in b.each_layer():
        cur = b.norm(inp)
        q, k, v = _qkv(b, il, cur)
        cur = b.attn_kv(il, b.rope(q), b.rope(k), v, sinks=True, wo_bias=True)
        ffn_inp = g.op("add", cur, inp)
        cur = _moe_ffn(b, b.norm(ffn_inp), il, moe)
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp, keep_hidden=True)


def _deepseek_q(b: _Builder, il: int, x: _T, head: int) -> _T:
    """Q: a LoRA pair with a norm between (V3) or one matmul (V2-Lite)."""
    d = b.d
    pre = f"blk.{il}."
    n_q = d.n_head[il] * head
    if d.has(pre + "attn_q.weight"):
        return b.linear(x, n_q)
    q_a = d.shape(pre + "attn_q_a.weight")
    rank = q_a[1] if q_a else x.ne[0]
    return b.linear(b.norm(b.linear(x, rank)), n_q)


def _deepseek_attn(b: _Builder, il: int, x: _T) -> _T:
    """src/models/deepseek2.cpp, MLA with absorption: Q's no-RoPE part is absorbed into the
    compressed KV space (wk_b), K is the normed compressed KV plus the roped key, V a view
    of the K cache, and wv_b decompresses the attention output (build_attn, K-only cache)."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq = d.n_head[il]
    lora, rope = d.mla_kv_lora, d.mla_rope
    nope = d.mla_head_k - rope
    q = _deepseek_q(b, il, x, d.mla_head_k)  # viewed as [mla_head_k, n_head, n_tokens]
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],))
    k_pe = b.rope(g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1])))
    kv_cmpr = b.norm(kv_cmpr)
    head_row = _row_size("f32", d.mla_head_k)
    q_nope = g.permute(g.view(q, (nope, hq, n_tok), (head_row, head_row * hq)), 0, 2, 1, 3)
    q_pe = b.rope(g.view(q, (rope, hq, n_tok), (head_row, head_row * hq)))
    absorbed = g.permute(g.mul_mat(g.weight(nope, lora, hq), q_nope), 0, 2, 1, 3)
    q_cur = g.concat(absorbed, q_pe, 0)
    v_cur = g.reshape(kv_cmpr, lora, 1, n_tok)
    k_cur = g.concat(v_cur, k_pe, 0)
    for t in (q_cur, v_cur, k_cur):
        g.expand(t)
    inp = b.kv_inputs(False)
    kc = g.cache(d.type_k, lora + rope, inp.n_kv, d.n_stream)
    g.expand(b.store_k(kc, k_cur, inp.k_idxs))
    k, _ = b.cache_views(il, kc, kc, inp.n_kv)
    v = g.view(k, (lora, k.ne[1], k.ne[2], k.ne[3]), (k.nb[1], k.nb[2], k.nb[3]))
    v_mla = g.weight(lora, d.mla_head_v, hq)
    cur = b.attn_mha(q_cur, k, v, inp.mask, v_mla=v_mla)
    return b.linear(cur, d.n_embd)


def _deepseek_attn_mha(b: _Builder, il: int, x: _T) -> _T:
    """src/models/deepseek2.cpp without MLA keys (GGUFs converted before llama.cpp split
    wkv_b): K and V are decompressed per head and cached as plain multi-head attention."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq = d.n_head[il]
    lora, rope, head_k, head_v = d.mla_kv_lora, d.mla_rope, d.head_k, d.head_v
    nope = head_k - rope
    q = g.reshape(_deepseek_q(b, il, x, head_k), head_k, hq, n_tok)
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = b.norm(g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],)))
    k_pe = b.rope(g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1])))
    kv = b.linear(kv_cmpr, hq * (nope + head_v))
    row = _row_size("f32", nope + head_v)
    k_nope = g.view(kv, (nope, hq, n_tok), (row, row * hq))
    v = g.cont(g.view(kv, (head_v, hq, n_tok), (row, row * hq)))
    k = g.concat(k_nope, g.op("repeat", k_pe, ne=(rope, hq, n_tok)), 0)
    return b.attn_kv(il, b.rope(q), k, v)


def _graph_deepseek2(b: _Builder) -> None:
    """src/models/deepseek2.cpp: MLA attention, leading dense FFN layers, then sigmoid-routed
    experts (V3: selection bias, normalized and scaled weights) plus shared experts."""
    d, g = b.d, b.g
    v3 = any(n.endswith("exp_probs_b.bias") for n in d.names)
    moe = _Moe(gating="sigmoid" if v3 else "softmax", norm_w=v3, scale=v3, probs_bias=v3)
    inp = b.inp_embd()
    for il in b.each_layer():
        residual = inp
        attn = _deepseek_attn if d.mla_head_k else _deepseek_attn_mha
        cur = attn(b, il, b.norm(inp))
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = b.ffn(cur, d.n_ff[il])
        else:
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            moe_out = _moe_ffn(b, cur, il, moe)
            if shexp is not None:
                moe_out = g.op("add", moe_out, b.ffn(cur, shexp[1]))
            cur = moe_out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


def _graph_bert(b: _Builder) -> None:
    """src/models/bert.cpp: token + type + position embeddings, layer norms after attention
    and FFN (post-norm), GELU FFN with biases, non-causal attention; then pooling
    (build_pooling)."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    if d.has("token_types.weight"):
        inp = g.op("add", inp, g.view(g.weight(d.n_embd, 2), (d.n_embd,)))
    if d.has("position_embd.weight"):
        inp = g.op("add", g.get_rows(g.weight(d.n_embd, d.n_ctx_train), b.inp_pos()), inp)
    inp = b.norm(inp, kind="norm", bias=True)
    for il in b.each_layer():
        q, k, v = _qkv(b, il, inp)
        cur = _attn_no_cache(b, il, q, k, v)
        cur, inp = b.last_rows(il, cur, inp)
        ffn_inp = b.norm(g.op("add", cur, inp), kind="norm", bias=True)
        up = b.linear(ffn_inp, d.n_ff[il], bias=True)
        cur = b.linear(g.op("unary", up), d.n_embd, bias=True)
        inp = b.norm(g.op("add", cur, ffn_inp), kind="norm", bias=True)
    _pooling(b, inp)


# --- recurrent and hybrid families (src/models/*.cpp) -------------------------------------------


def _shortconv(b: _Builder, il: int, x: _T) -> _T:
    """src/models/lfm2.cpp build_shortconv_block: in_proj to B, C, x; B*x convolved over the
    cached previous tokens (ssm_conv), gated by C, out_proj."""
    d, g = b.d, b.g
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    n_embd = d.n_embd
    d_conv = d.shortconv - 1
    cur = g.reshape(x, n_embd, n_t, n_seqs)
    bcx = b.linear(cur, 3 * n_embd)
    strides = (bcx.nb[1], bcx.nb[2])
    bb = g.view(bcx, (n_embd, n_t, n_seqs), strides)
    c = g.view(bcx, (n_embd, n_t, n_seqs), strides)
    xx = g.view(bcx, (n_embd, n_t, n_seqs), strides)
    bx = g.transpose(g.op("mul", bb, xx))
    conv = g.reshape(b.rs(n_embd * d_conv), d_conv, n_embd, n_seqs)
    bx = g.concat(conv, bx, 0)
    snap = g.view(bx, (d_conv, bx.ne[1], bx.ne[2]), (bx.nb[1], bx.nb[2]))
    state = g.cache("f32", n_embd * d_conv, max(1, n_seqs))
    g.expand(g.cpy(snap, g.view(state, (n_embd * d_conv, n_seqs))))
    conv_out = _T(
        "f32",
        (n_embd, bx.ne[0] - d_conv, n_seqs),
        op="ssm_conv",
        src=(bx, g.weight(d_conv + 1, n_embd)),
    )
    y = b.linear(g.op("mul", c, conv_out), n_embd)
    return g.reshape(y, n_embd, n_t * n_seqs)


def _graph_lfm2(b: _Builder) -> None:
    """src/models/lfm2.cpp: short-convolution layers and attention layers (Q/K norms), each
    followed by a SwiGLU FFN (experts on lfm2moe); residual adds take the residual first."""
    d, g = b.d, b.g
    cur = g.expand(b.inp_embd())
    for il in b.each_layer():
        prev = cur
        cur = b.norm(cur)
        if b.is_recurrent(il):
            cur = _shortconv(b, il, cur)
        else:
            q, k, v = _qkv(b, il, cur)
            cur = b.attn_kv(il, b.rope(q), b.rope(k), v)
        cur, prev = b.last_rows(il, cur, prev)
        cur = g.op("add", prev, cur)
        ffn_in = b.norm(cur)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            bias = d.has(f"blk.{il}.exp_probs_b.bias")
            out = _moe_ffn(b, ffn_in, il, _Moe(gating="sigmoid", probs_bias=bias))
        else:
            out = b.ffn(ffn_in, d.n_ff[il])
        cur = g.op("add", cur, out)
    b.output_head(cur)


def _mamba2(b: _Builder, il: int, x: _T) -> _T:
    """src/models/mamba-base.cpp build_mamba2_layer: in-projection to z, xBC, dt; causal
    conv over cached tokens; selective scan (ssm_scan reads and returns the states);
    y + x*D, gated by z, grouped RMS norm, out-projection."""
    d, g = b.d, b.g
    d_conv, d_inner, d_state, n_group, n_head = d.ssm
    head_dim = d_inner // n_head
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    channels = d_inner + 2 * n_group * d_state
    conv = g.reshape(b.rs((d_conv - 1) * channels), d_conv - 1, channels, n_seqs)
    zxbcdt = b.linear(
        g.reshape(x, x.ne[0], n_t, n_seqs), 2 * d_inner + 2 * n_group * d_state + n_head
    )
    strides = (zxbcdt.nb[1], zxbcdt.nb[2])
    z = g.view(zxbcdt, (head_dim, n_head, n_t, n_seqs), (head_dim * 4, *strides))
    xbc = g.view(zxbcdt, (channels, n_t, n_seqs), strides)
    dt = g.view(zxbcdt, (n_head, n_t, n_seqs), strides)
    conv_x = g.concat(conv, g.transpose(xbc), 0)
    last = g.view(conv_x, (d_conv - 1, channels, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
    r_cache = g.cache("f32", (d_conv - 1) * channels, max(1, n_seqs))
    g.expand(g.cpy(last, g.view(r_cache, ((d_conv - 1) * channels, n_seqs))))
    xbc = _T(
        "f32", (channels, n_t, n_seqs), op="ssm_conv", src=(conv_x, g.weight(d_conv, channels))
    )
    xbc = g.op("unary", g.op("add", xbc, g.weight(channels)))
    xs = g.view(xbc, (head_dim, n_head, n_t, n_seqs), (head_dim * 4, xbc.nb[1], xbc.nb[2]))
    bs = g.view(xbc, (d_state, n_group, n_t, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]))
    cs = g.view(xbc, (d_state, n_group, n_t, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]))
    dt = g.op("add", g.cont(dt), g.weight(n_head))

    def scan(states: _T, ids: _T) -> _T:
        ssm = g.reshape(states, d_state, head_dim, n_head, states.ne[1])
        n = xs.nelements + d_state * head_dim * n_head * ids.ne[0]
        return _T("f32", (n,), op="ssm_scan", src=(ssm, xs, dt, g.weight(1, n_head), bs, cs, ids))

    y_ssm = b.rs(d_state * d_inner, scan)
    s_cache = g.cache("f32", d_state * d_inner, max(1, n_seqs))
    g.expand(
        g.cpy(
            g.view(y_ssm, (d_state * d_inner, n_seqs)), g.view(s_cache, (d_state * d_inner, n_seqs))
        )
    )
    y = g.view(y_ssm, (head_dim, n_head, n_t, n_seqs))
    y = g.op("add", y, g.op("mul", xs, g.weight(1, n_head)))
    y = g.op("swiglu", g.cont(z), y)
    if d.has(f"blk.{il}.ssm_norm.weight"):
        y = b.norm(g.reshape(y, d_inner // n_group, n_group, n_t, n_seqs))
    y = g.reshape(y, d_inner, n_t * n_seqs)
    # the output is reshaped (a view), so the residual scale that follows cannot run in place
    return g.reshape(b.linear(y, d.n_embd), d.n_embd, n_t * n_seqs)


def _graph_mamba2(b: _Builder) -> None:
    """src/models/mamba.cpp (Mamba-2): every layer a Mamba-2 mixer with a residual add."""
    g = b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        cur = _mamba2(b, il, b.norm(inp))
        cur, inp = b.last_rows(il, cur, inp)
        inp = g.op("add", cur, inp)
    b.output_head(inp)


def _graph_granite_hybrid(b: _Builder) -> None:
    """src/models/granite-hybrid.cpp: Mamba-2 layers and attention layers (no RoPE), with
    Granite's embedding, residual and logit scales (in place), SwiGLU or expert FFN."""
    d, g = b.d, b.g
    inp = b.inp_embd(scale=True)
    for il in b.each_layer():
        residual = inp
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = _mamba2(b, il, cur)
        else:
            q, k, v = _qkv(b, il, cur)
            cur = b.attn_kv(il, q, k, v, wo_bias=d.has(f"blk.{il}.attn_output.bias"))
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", g.op("scale", cur), residual)
        cur = b.norm(ffn_inp)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            moe_out = _moe_ffn(b, cur, il, _Moe())
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                moe_out = g.op("add", moe_out, b.ffn(cur, shexp[1]))
            cur = moe_out
        else:
            cur = b.ffn(cur, d.n_ff[il])
        inp = g.op("add", g.op("scale", cur), ffn_inp)
    b.output_head(inp, logit_scale=True)


def _graph_nemotron_h(b: _Builder) -> None:
    """src/models/nemotron-h.cpp: each layer is one of Mamba-2, attention (no RoPE) or a
    squared-ReLU MLP, with a residual add; the final norm is kept as an output and the
    output rows are selected after it."""
    d, g = b.d, b.g
    inp = g.expand(b.inp_embd())
    for il in b.each_layer():
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = _mamba2(b, il, cur)
        elif d.n_ff[il] == 0:
            q, k, v = _qkv(b, il, cur)
            cur = b.attn_kv(il, q, k, v, wo_bias=d.has(f"blk.{il}.attn_output.bias"))
        else:
            up = b.linear(cur, d.n_ff[il], bias=d.has(f"blk.{il}.ffn_up.bias"))
            act = g.op("sqr", g.op("unary", up))
            cur = b.linear(act, d.n_embd, bias=d.has(f"blk.{il}.ffn_down.bias"))
        inp = g.op("add", cur, inp)
    b.output_head(inp, norm_is_output=True)


def _gdn_qkv(b: _Builder, il: int, x: _T) -> tuple[_T, _T]:
    """qwen3next build_qkvz: fused QKV and gate projections, or the legacy mixed one."""
    d, g = b.d, b.g
    _, d_inner, head_k, num_k, num_v = d.ssm
    head_v = d_inner // num_v
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    channels = d_inner + 2 * num_k * head_k
    if d.has(f"blk.{il}.attn_qkv.weight"):
        qkv = g.reshape(b.linear(x, channels), channels, n_t, n_seqs)
        return qkv, b.linear(x, head_v * num_v)
    per_k = 2 * head_k + 2 * head_v * (num_v // num_k)
    mixed = g.reshape(b.linear(x, per_k * num_k), per_k, num_k, n_t, n_seqs)
    strides = (mixed.nb[1], mixed.nb[2], mixed.nb[3])
    width_v = head_v * num_v // num_k
    z = g.cont(g.view(mixed, (width_v, num_k, n_t, n_seqs), strides))
    q = g.cont(g.view(mixed, (head_k, num_k, n_t, n_seqs), strides), head_k * num_k, n_t, n_seqs)
    k = g.cont(g.view(mixed, (head_k, num_k, n_t, n_seqs), strides), head_k * num_k, n_t, n_seqs)
    v = g.cont(g.view(mixed, (width_v, num_k, n_t, n_seqs), strides), head_v * num_v, n_t, n_seqs)
    return g.concat(g.concat(q, k, 0), v, 0), z


def _gdn_layer(b: _Builder, il: int, x: _T) -> _T:
    """src/models/qwen3next.cpp build_layer_attn_linear (+ delta-net-base): QKV through a
    causal conv over cached tokens, L2-normed Q/K (repeated to the value heads), decay and
    beta from a small projection, the fused gated delta net (output + new state in one
    tensor), a gated RMS norm with z, out-projection."""
    d, g = b.d, b.g
    d_conv, d_inner, head_k, num_k, num_v = d.ssm
    head_v = d_inner // num_v
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    channels = d_inner + 2 * num_k * head_k
    qkv, z = _gdn_qkv(b, il, x)
    ba = g.reshape(b.linear(x, 2 * num_v), 2 * num_v // num_k, num_k, n_t, n_seqs)
    ba_strides = (ba.nb[1], ba.nb[2], ba.nb[3])
    beta = g.op("unary", g.cont(g.view(ba, (num_v // num_k, num_k, n_t, n_seqs), ba_strides)))
    alpha = g.cont(g.view(ba, (num_v // num_k, num_k, n_t, n_seqs), ba_strides), num_v, n_t, n_seqs)
    alpha = g.op("unary", g.op("add", alpha, g.weight(num_v)))
    decay = g.reshape(g.op("mul", alpha, g.weight(num_v)), 1, num_v, n_t, n_seqs)
    beta = g.reshape(beta, 1, num_v, n_t, n_seqs)
    conv_states = g.reshape(b.rs((d_conv - 1) * channels), d_conv - 1, channels, n_seqs)
    conv_input = g.concat(conv_states, g.transpose(qkv), 0)
    last = g.view(conv_input, (d_conv - 1, channels, n_seqs), (conv_input.nb[1], conv_input.nb[2]))
    r_cache = g.cache("f32", (d_conv - 1) * channels, max(1, n_seqs))
    g.expand(g.cpy(last, g.view(r_cache, ((d_conv - 1) * channels, n_seqs))))
    state = g.reshape(b.rs(head_v * head_v * num_v), head_v, head_v, num_v, n_seqs)
    conv = _T(
        "f32", (channels, n_t, n_seqs), op="ssm_conv", src=(conv_input, g.weight(d_conv, channels))
    )
    conv = g.op("unary", conv)
    cs = (conv.nb[1], conv.nb[1] * n_t)
    q = g.op("l2_norm", g.view(conv, (head_k, num_k, n_t, n_seqs), (head_k * 4, *cs)))
    k = g.op("l2_norm", g.view(conv, (head_k, num_k, n_t, n_seqs), (head_k * 4, *cs)))
    v = g.view(conv, (head_v, num_v, n_t, n_seqs), (head_v * 4, *cs))
    if num_k != num_v:
        rep = num_v // num_k
        q = g.reshape(
            g.op(
                "repeat",
                g.reshape(q, head_k, 1, num_k, n_t * n_seqs),
                ne=(head_k, rep, num_k, n_t * n_seqs),
            ),
            head_k,
            num_v,
            n_t,
            n_seqs,
        )
        k = g.reshape(
            g.op(
                "repeat",
                g.reshape(k, head_k, 1, num_k, n_t * n_seqs),
                ne=(head_k, rep, num_k, n_t * n_seqs),
            ),
            head_k,
            num_v,
            n_t,
            n_seqs,
        )
    gdn = _T(
        "f32",
        (head_v * num_v, n_t * n_seqs + head_v * n_seqs),
        op="gated_delta_net",
        src=(q, k, v, decay, beta, state),
    )
    out = g.view(gdn, (head_v, num_v, n_t, n_seqs))
    new_state = g.view(gdn, (head_v, head_v, num_v, n_seqs))
    s_cache = g.cache("f32", head_v * head_v * num_v, max(1, n_seqs))
    g.expand(g.cpy(new_state, g.view(s_cache, (head_v * head_v * num_v, n_seqs))))
    gate = g.op("unary", g.reshape(z, head_v, num_v, n_t, n_seqs))
    normed = g.op("mul", b.norm(out), gate)
    cur = b.linear(g.reshape(normed, head_v * num_v, n_t, n_seqs), d.n_embd)
    return g.reshape(cur, d.n_embd, n_t * n_seqs)


def _gated_attn(b: _Builder, il: int, x: _T) -> _T:
    """qwen3next build_layer_attn: Q projection carries a per-head output gate; Q/K norms,
    RoPE, attention without wo, sigmoid(gate) * output, then wo."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq, hkv, hd = d.n_head[il], d.n_head_kv[il], d.head_k
    q_full = g.reshape(b.linear(x, 2 * hd * hq), 2 * hd, hq, n_tok, 1)
    k = g.reshape(b.linear(x, hd * hkv), hd, hkv, n_tok)
    v = g.reshape(b.linear(x, hd * hkv), hd, hkv, n_tok)
    strides = (q_full.nb[1], q_full.nb[2], q_full.nb[3])
    q = g.view(q_full, (hd, hq, n_tok, 1), strides)
    gate = g.view(q_full, (hd, hq, n_tok, 1), strides)
    q = b.rope(b.norm(q))
    k = b.rope(b.norm(k))
    cur = b.attn_kv(il, q, k, v, wo=False)
    gate = g.op("unary", g.cont(gate, hd * hq, n_tok))
    return b.linear(g.op("mul", cur, gate), d.n_embd)


def _graph_qwen3next(b: _Builder) -> None:
    """src/models/qwen3next.cpp: gated delta net layers with a gated full-attention layer
    every `full_attention_interval`; post-attention norm; softmax-routed experts plus a
    sigmoid-gated shared expert; the final norm is kept as an output (MTP input) and the
    output rows are selected after it."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        cur = g.expand(b.norm(inp))
        cur = _gdn_layer(b, il, cur) if b.is_recurrent(il) else _gated_attn(b, il, cur)
        residual = g.op("add", cur, inp)
        cur = b.norm(residual)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            out = _moe_ffn(b, cur, il, _Moe())
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                sh = b.ffn(cur, shexp[1])
                sh_gate = g.op("unary", b.linear(cur, 1))
                out = g.op("add", out, g.op("mul", sh, sh_gate))
        else:
            out = b.ffn(cur, d.n_ff[il])
        inp = g.op("add", out, residual)
    b.output_head(inp, norm_is_output=True)


def _lora_rank(b: _Builder, name: str) -> int:
    shape = b.d.shape(name)
    return shape[1] if shape else 1


def _rwkv7_time_mix(b: _Builder, il: int, cur: _T, x_prev: _T, first_v: list[_T]) -> _T:
    """src/models/rwkv7-base.cpp build_rwkv7_time_mix: the token-shift lerp repeated into
    five or six mixes, LoRA'd decay / in-context rate / value residual / gate, the WKV7 op
    (output + new state in one tensor), a per-head group norm, bonus term, gate, out-proj."""
    d, g = b.d, b.g
    pre = f"blk.{il}.time_mix_"
    n_embd = d.n_embd
    n_seqs = b.s.n_seqs
    n_tok = cur.ne[1] * cur.ne[2]
    hs = d.rwkv_head
    hc = n_embd // hs
    gating = d.has(pre + "g1.weight")
    sx = g.op("sub", x_prev, cur)
    sx = g.op("repeat", sx, ne=(n_embd, cur.ne[1], n_seqs, 6 if gating else 5))
    xxx = g.op("add", g.op("mul", sx, g.weight(n_embd, 1, 1, 6)), cur)
    xr, xw, xk, xv, xa, xg = (g.view(xxx, (n_embd, n_tok), (xxx.nb[1],)) for _ in range(6))
    r = b.linear(xr, n_embd)
    w = b.linear(g.op("unary", b.linear(xw, _lora_rank(b, pre + "w1.weight"))), n_embd)
    w = g.op("unary", g.op("scale", g.op("unary", g.op("add", w, g.weight(n_embd)))))
    k = b.linear(xk, n_embd)
    v = b.linear(xv, n_embd)
    if not first_v:
        first_v.append(v)
    else:
        mix = b.linear(b.linear(xv, _lora_rank(b, pre + "v1.weight")), n_embd)
        mix = g.op("unary", g.op("add", mix, g.weight(n_embd)))
        v = g.op("add", v, g.op("mul", g.op("sub", first_v[0], v), mix))
    gate = None
    if gating:
        gate = b.linear(g.op("unary", b.linear(xg, _lora_rank(b, pre + "g1.weight"))), n_embd)
    a = b.linear(b.linear(xa, _lora_rank(b, pre + "a1.weight")), n_embd)
    a = g.op("unary", g.op("add", a, g.weight(n_embd)))
    kk = g.op("l2_norm", g.reshape(g.op("mul", k, g.weight(n_embd)), hs, hc, n_tok))
    ka = g.op("mul", k, g.weight(n_embd))
    k = g.op("add", k, g.op("sub", g.op("mul", a, ka), ka))
    r3, w3, k3, v3, a3 = (g.reshape(t, hs, hc, n_tok) for t in (r, w, k, v, a))
    state = b.rs(n_embd * hs)
    wkv = _T(
        "f32",
        (n_embd, n_tok + hs * n_seqs),
        op="rwkv_wkv7",
        src=(r3, w3, k3, v3, g.op("unary", kk), g.op("mul", kk, a3), state),
    )
    out = g.view(wkv, (n_embd * n_tok,))
    s_cache = g.cache("f32", n_embd * hs, max(1, n_seqs))
    g.expand(g.cpy(g.view(wkv, (n_embd * hs * n_seqs,)), g.view(s_cache, (n_embd * hs * n_seqs,))))
    if d.has(pre + "ln.weight"):
        out = g.reshape(g.op("norm", g.reshape(out, n_embd // hc, hc, n_tok)), n_embd, n_tok)
        out = g.op("add", g.op("mul", out, g.weight(n_embd)), g.weight(n_embd))
    else:
        out = g.reshape(out, n_embd, n_tok)
    rk = g.op("mul", g.op("mul", k3, r3), g.reshape(g.weight(n_embd), hs, hc))
    rk = g.op("sum_rows", rk, ne=(1, hc, n_tok))
    out = g.op("add", out, g.reshape(g.op("mul", v3, rk), n_embd, n_tok))
    if gate is not None:
        out = g.op("mul", out, gate)
    return g.reshape(b.linear(out, n_embd), n_embd, cur.ne[1], n_seqs)


def _graph_rwkv7(b: _Builder) -> None:
    """src/models/rwkv7.cpp: layer-normed embeddings; per layer the token shift (recurrent
    state r) feeds the time mix and the channel mix (squared-ReLU FFN); state s is the WKV
    matrix; shifts are written back with one copy per layer."""
    d, g = b.d, b.g
    n_embd = d.n_embd
    n_seqs = b.s.n_seqs
    n_t = b.n_tokens // n_seqs
    inp = b.norm(b.inp_embd(), kind="norm", bias=True)
    first_v: list[_T] = []
    for il in b.each_layer():
        inp = g.reshape(inp, n_embd, n_t, n_seqs)
        shift = g.reshape(b.rs(n_embd * 2), n_embd, 2, n_seqs)
        att_shift = g.view(shift, (n_embd, 1, n_seqs), (shift.nb[1], shift.nb[2]))
        ffn_shift = g.view(shift, (n_embd, 1, n_seqs), (shift.nb[1], shift.nb[2]))
        att_norm = b.norm(inp, kind="norm", bias=True)
        head = (att_norm.nb[1], att_norm.nb[2])
        x_prev = g.concat(att_shift, g.view(att_norm, (n_embd, n_t - 1, n_seqs), head), 1)
        cur = _rwkv7_time_mix(b, il, att_norm, x_prev, first_v)
        ffn_inp = g.op("add", cur, inp)
        ffn_norm = b.norm(ffn_inp, kind="norm", bias=True)
        x_prev = g.concat(ffn_shift, g.view(ffn_norm, (n_embd, n_t - 1, n_seqs), head), 1)
        new_shift = g.concat(
            g.view(att_norm, (n_embd, 1, n_seqs), head),
            g.view(ffn_norm, (n_embd, 1, n_seqs), head),
            1,
        )
        r_cache = g.cache("f32", n_embd * 2, max(1, n_seqs))
        g.expand(
            g.cpy(
                g.view(new_shift, (n_embd * n_seqs * 2,)), g.view(r_cache, (n_embd * 2 * n_seqs,))
            )
        )
        ffn_inp, ffn_norm, x_prev = b.last_rows(
            il, *(g.reshape(t, n_embd, n_t * n_seqs) for t in (ffn_inp, ffn_norm, x_prev))
        )
        sx = g.op("sub", x_prev, ffn_norm)
        xk = g.op("add", g.op("mul", sx, g.weight(n_embd, 1, 1)), ffn_norm)
        key = g.op("sqr", g.op("unary", b.linear(xk, d.n_ff[il])))
        inp = g.op("add", b.linear(key, n_embd), ffn_inp)
    b.output_head(inp, kind="norm")


# --- public API ---------------------------------------------------------------------------------


_Build = Callable[[_Builder], None]

# Families whose graphs were compared node by node with the engine's own dump and whose
# totals match every measured launch (tests/core/fixtures/compute).
_VERIFIED: dict[str, _Build] = {
    "llama": _graph_llama,
    "qwen2": _graph_llama,
    "qwen3": _graph_llama,
    "qwen3moe": _graph_llama,
    "gemma2": _graph_gemma,
    "gemma3": _graph_gemma,
    "gpt-oss": _graph_gpt_oss,
    "deepseek2": _graph_deepseek2,
    "bert": _graph_bert,
    "qwen3next": _graph_qwen3next,
    "granitehybrid": _graph_granite_hybrid,
    "lfm2": _graph_lfm2,
    "mamba2": _graph_mamba2,
    "nemotron_h": _graph_nemotron_h,
    "rwkv7": _graph_rwkv7,
}
# Families laid out from b11434's source and dump (test-llama-archs' models), not from the
# test engine's fixtures: they keep the generic margin.
_LAID_OUT: dict[str, _Build] = {
    "phi2": _graph_parallel,
    "command-r": _graph_parallel,
    "cohere2": _graph_parallel,
    "cohere2moe": _graph_parallel,
    "plamo": _graph_parallel,
    "talkie": _graph_talkie,
    "hrm_text": _graph_hrm,
}
# Close relatives laid out as a verified family, not measured here: they get the margin.
_RELATIVES: dict[str, _Build] = {
    "lfm2moe": _graph_lfm2,
    "qwen35": _graph_qwen3next,
    "qwen35moe": _graph_qwen3next,
}
# Architectures the generic layout is known to fall short on: no layout, so the plan charges
# a bound (core.bounds). deepseek4: the generic layout gave 17.10 MiB where b11434 allocated
# 48.85 (docs/accuracy-archs-b11434.md).
_NO_LAYOUT = {"deepseek4": "compressed sparse attention with a lightning indexer"}
# Run on gemma2, gemma3 and gpt-oss (which have layouts of their own), the generic layout
# came out between 0.987 and 1.008 of the measured buffer (test_generic_layout_margin);
# layouts not checked against the engine get this factor on top.
GENERIC_MARGIN = 1.02


def _is_embedding(meta: ModelMeta) -> bool:
    """Whether qmgui launches the model with `--embedding` (embedding and rerank models)."""
    return meta.model_class in (ModelClass.EMBEDDING, ModelClass.RERANK) or (
        meta.pooling != Pooling.NONE
    )


def _outputs_max(r: Resolved, embeddings: bool) -> int:
    """The server reserves one output row per slot; an embedding context one per batch token
    (llama_context: n_outputs_max)."""
    return r.n_batch if embeddings else r.n_seq


def _reserve_shapes(r: Resolved, embeddings: bool) -> list[_Shape]:
    """sched_reserve: the prompt graph, then the one-token-per-slot graph."""
    n_seqs = r.n_seq
    n_tokens = min(r.n_ctx, r.n_ubatch)
    if n_tokens % n_seqs:
        n_tokens = -(-n_tokens // n_seqs) * n_seqs  # graph_reserve rounds to whole sequences
    pp = _Shape(n_tokens, n_seqs, min(n_tokens, _outputs_max(r, embeddings)))
    tg = _Shape(n_seqs, n_seqs, n_seqs)
    return [pp, tg]


# What a graph built from a header's numbers can raise when those numbers contradict each other
# in a way no check foresaw (a zero group count divides a width, a negative shape indexes
# nothing): the plan then charges an upper bound for it (core.bounds), never a crash.
GRAPH_FAULTS = (ArithmeticError, ValueError, IndexError, KeyError)
# The deepest graph replayed: 2x the deepest real model (~130 layers). A replay costs a few ms
# a layer when layers differ, so a header at llama.cpp's 512-layer limit with every layer
# different would take seconds per estimate (and a fit search asks dozens of times); such a
# header gets no compute estimate instead.
MAX_GRAPH_LAYERS = 256


def check_graph_size(meta: ModelMeta) -> None:
    if meta.n_layer > MAX_GRAPH_LAYERS:
        raise SizingError(
            f"{meta.name}: {meta.n_layer} layers, more than the {MAX_GRAPH_LAYERS} a compute "
            "graph is replayed for"
        )


def graph_fault(meta: ModelMeta, e: Exception) -> SizingError:
    return SizingError(
        f"{meta.name}: the header's numbers do not build a {meta.architecture} graph "
        f"({type(e).__name__}: {e})"
    )


def compute_buffer_bytes(
    meta: ModelMeta,
    r: Resolved,
    *,
    backend: str = "CPU",
    embeddings: bool | None = None,
    mixed_batch: bool = False,
) -> int:
    """Bytes of llama-server's `sched_reserve: CPU compute buffer size` for this launch.

    `embeddings`: the context returns embeddings (`--embedding`); None: embedding and rerank
    models do. `mixed_batch`: the engine's graph has the mixed-batch input branch (builds
    from MIXED_BATCH_BUILD on; see _Builder.inp_embd). Raises SizingError for another
    backend, or for an architecture without a layout whose graph the generic one cannot
    stand for (recurrent, MLA, encoder).
    """
    if backend != "CPU":
        raise SizingError(f"the compute buffer is modelled for the CPU backend only, not {backend}")
    if meta.n_layer <= 0 or meta.n_embd <= 0:
        raise SizingError(f"{meta.name}: no layer count or embedding width in the header")
    check_graph_size(meta)
    embd = _is_embedding(meta) if embeddings is None else embeddings
    # the same launch asked again (a slider moved back, a fit search confirming its answer)
    key = (id(meta), r, embd, mixed_batch)
    hit = _BYTES_CACHE.get(key)
    if hit is not None and hit[0] is meta:
        return hit[1]
    build, margin = _layout(meta, mixed_batch=mixed_batch)
    try:
        peak = _reserve_bytes(meta, r, build, embd)
    except GRAPH_FAULTS as e:
        raise graph_fault(meta, e) from e
    result = peak if margin == 1.0 else math.ceil(peak * margin)
    if len(_BYTES_CACHE) >= 64 * _CACHE_KEPT:
        _BYTES_CACHE.clear()
    _BYTES_CACHE[key] = (meta, result)
    return result


def _layout(meta: ModelMeta, *, mixed_batch: bool = False) -> tuple[_Build, float]:
    """The builder for this model and the margin on its result: none where measured; the
    generic margin for relatives, pre-MLA DeepSeek GGUFs, reranker heads and the generic
    layout. `mixed_batch`: the builder as of MIXED_BATCH_BUILD (_mixed_batch)."""
    build, margin = _layout_of(meta)
    return (_mixed_batch(build) if mixed_batch else build), margin


def _mixed_batch(build: _Build) -> _Build:
    """`build` with build_inp_embd's mixed-batch branch (_Builder.mixed_batch). One wrapper
    per family, so the wrapper can key the compiled-walk caches as the family does."""
    hit = _MIXED_BUILDS.get(build)
    if hit is not None:
        return hit

    def wrapped(b: _Builder) -> None:
        b.mixed_batch = True
        build(b)

    _MIXED_BUILDS[build] = wrapped
    return wrapped


_MIXED_BUILDS: dict[_Build, _Build] = {}


def _layout_of(meta: ModelMeta) -> tuple[_Build, float]:
    arch = meta.architecture
    unmeasured = (meta.mla is not None and not meta.mla.key_length_mla) or (
        meta.pooling == Pooling.RANK
    )
    if arch in _VERIFIED:
        return _VERIFIED[arch], GENERIC_MARGIN if unmeasured else 1.0
    if arch in _RELATIVES:
        return _RELATIVES[arch], GENERIC_MARGIN
    if arch in _LAID_OUT:
        return _LAID_OUT[arch], GENERIC_MARGIN
    if arch in _NO_LAYOUT:
        raise SizingError(
            f"{meta.name}: no compute-buffer layout for {arch!r} ({_NO_LAYOUT[arch]})"
        )
    if meta.is_recurrent or meta.ssm or meta.rwkv or meta.mla or not meta.causal:
        raise SizingError(
            f"{meta.name}: no compute-buffer layout for architecture {arch!r} "
            "(recurrent, latent-attention or encoder layers)"
        )
    return _graph_llama, GENERIC_MARGIN


def _reserve_bytes(meta: ModelMeta, r: Resolved, build: _Build, embeddings: bool) -> int:
    """The larger of the prompt and token-generation reservations, as ggml-alloc sizes them.

    Each graph's walk is compiled once per structure (see _Program) and replayed over the
    context's tensor sizes; where that cannot be done exactly, the graph is built and walked
    as _reserve_bytes_plain does."""
    n_kv, n_kv_swa = r.n_ctx_seq, _swa_cells(meta, r)
    if n_kv <= 0 or n_kv_swa <= 0 or n_kv % _CELLS or n_kv_swa % _CELLS:
        return _reserve_bytes_plain(meta, r, build, embeddings)
    u, v = n_kv // _CELLS, n_kv_swa // _CELLS
    # everything the graphs' topology depends on; the contexts only size their tensors
    structure = (
        id(meta),
        build,
        embeddings,
        _replay_layers(meta),
        r.n_stream,
        r.kv_unified,
        r.flash_attn,
        r.cache_type_k,
        r.cache_type_v,
    )
    d: _Dims | None = None
    peak = 0
    for shape in _reserve_shapes(r, embeddings):
        key = (*structure, shape)
        hit = _PROGRAMS.get(key)
        if hit is not None and hit[0] is meta:
            prog = hit[1]
        else:
            if d is None:
                d = _dims(meta, r, embeddings)
            prog = _program(build, d, shape)
            if len(_PROGRAMS) >= 16 * _CACHE_KEPT:
                _PROGRAMS.clear()
            _PROGRAMS[key] = (meta, prog)
        if prog is None:
            if d is None:
                d = _dims(meta, r, embeddings)
            b = _Builder(d, shape)
            build(b)
            peak = max(peak, _peak_bytes(b.g))
        elif prog.bound(u, v) > peak:  # a graph that cannot outgrow the peak is not walked
            peak = max(peak, prog.peak(u, v))
    return peak


def _reserve_bytes_plain(meta: ModelMeta, r: Resolved, build: _Build, embeddings: bool) -> int:
    """_reserve_bytes the plain way: build each graph for this context and walk it."""
    d = _dims(meta, r, embeddings)
    peak = 0
    for shape in _reserve_shapes(r, embeddings):
        b = _Builder(d, shape)
        build(b)
        peak = max(peak, _peak_bytes(b.g))
    return peak


# --- the walk compiled once per graph structure -------------------------------------------------
#
# In the builders above a context (the cells per KV stream, n_kv and n_kv_swa) changes no op,
# source or view of a graph, only the sizes of the tensors that span the KV cache (the KQ
# mask, the cache views, the attention scores), and those linearly. So each graph structure
# (everything but the cells: _reserve_bytes' key) is built once with the cell counts as
# symbols, its ggml-alloc walk recorded as allocations and frees of slots, and each slot's
# size read back as c + a*u + b*v bytes (u, v: cells of the full and the sliding-window
# cache, in units of _CELLS, which makes every size an integer). A new context then costs
# one pass of the best-fit allocator over those events and sizes.
#
# The symbols are large powers of two, so an integer polynomial in them with small
# coefficients shows each coefficient in its own digits: a size that is not affine (a
# product of cell counts) is detected, and so is an in-place decision that some context
# could flip (a layout equal to its parent's at one cell count only). Either makes the
# structure fall back to the plain build for good. A compiled structure is also built at
# the real context that asked for it, and must give the same events, and the same sizes
# from its coefficients, there. test_compute checks it against the plain build on every
# fixture model over many contexts.

_CELLS = 256  # KV cells come in multiples of this (launch.CTX_PAD)
_SYM_U = 1 << 64  # u in the symbolic build
_SYM_V = 1 << 1024  # v in the symbolic build: above u**15, beyond any size's degree in u
_COEF_MAX = 1 << 62  # coefficients are read back only below this


class _NotAffine(Exception):
    """A structure whose walk a context could change: it is built and walked every time."""


def _affine(x: int) -> tuple[int, int, int]:
    """(c, a, b) with x == c + a*_SYM_U + b*_SYM_V, each coefficient small; _NotAffine if
    x is not of that form (a power of u above the first, or a product with v)."""
    c = x % _SYM_U
    if c >= _SYM_U // 2:
        c -= _SYM_U
    rest = (x - c) // _SYM_U
    a = rest % _SYM_U
    if a >= _SYM_U // 2:
        a -= _SYM_U
    rest = x - c - a * _SYM_U
    if rest % _SYM_V:
        raise _NotAffine
    b = rest // _SYM_V
    if not -_COEF_MAX < b < _COEF_MAX:
        raise _NotAffine
    return c, a, b


def _same_layout_symbolic(t: _T, p: _T) -> bool:
    """_same_layout for tensors of the symbolic build: whether it holds at every context.
    _NotAffine if it holds at some contexts only (a shape component that another matches
    at one cell count)."""
    if t.type != p.type:
        return False
    if t.ne == p.ne and t.nb == p.nb:
        return True  # the same polynomials: equal at every context
    for x, y in zip((*t.ne, *t.nb), (*p.ne, *p.nb), strict=True):
        if x != y:
            _, a, b = _affine(x - y)
            if a == 0 and b == 0:
                return False  # a constant apart: different at every context
    raise _NotAffine


def _claim(t: _T, same: Callable[[_T, _T], bool]) -> bool | None:
    """ggml_gallocr_allocate_node's first steps: None when `t` needs no memory of its own
    (external, allocated already, or a view), True when it took over a dying parent's memory
    in place (offset set), False when the caller must allocate it. The layout test `same`
    runs last: the symbolic one raises where a context could change its answer."""
    if t.external or t.allocated or t.view_src is not None:
        return None
    t.allocated = True
    if t.op in _INPLACE_OPS:
        for p in t.src:
            if (
                p.allocated
                and not p.is_output
                and p.n_children == 1
                and p.n_views == 0
                and same(t, p)
            ):
                t.offset = p.offset
                p.allocated = False
                return True
    return False


class _EventWalk:
    """_peak_bytes's walk without an arena: its allocations and frees in order, as slot
    numbers (slot for an allocation, ~slot for a free), and per slot the tensor allocated
    there (an in-place child takes over its parent's slot and frees it with its own size,
    which the same layout makes the same). `same` decides _same_layout."""

    def __init__(self, g: _Graph, same: Callable[[_T, _T], bool]) -> None:
        self.same = same
        self.events: list[int] = []
        self.owners: list[_T] = []
        for leaf in g.leafs:
            self.allocate(leaf)
        for node in g.nodes:
            if node.view_src is not None:
                node.view_src.n_views += 1
            for s in node.src:
                s.n_children += 1
        for node in g.nodes:
            for s in node.src:
                self.allocate(s)
            self.allocate(node)
            for s in node.src:
                self.release(s)

    def allocate(self, t: _T) -> None:
        """_allocate, with the layout test last (the tests are free of side effects)."""
        if _claim(t, self.same) is not False:
            return
        t.offset = len(self.owners)
        self.owners.append(t)
        self.events.append(t.offset)

    def release(self, parent: _T) -> None:
        """_release."""
        parent.n_children -= 1
        if parent.n_children != 0 or parent.n_views != 0:
            return
        if parent.view_src is not None:
            root = parent.view_src
            root.n_views -= 1
            if root.n_views == 0 and root.n_children == 0 and root.allocated:
                self.free(root)
        elif parent.allocated:
            self.free(parent)

    def free(self, t: _T) -> None:
        if not t.is_output:
            self.events.append(~t.offset)
            t.allocated = False


@dataclass(frozen=True)
class _Program:
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
        return _run_best_fit(self.events, sizes)


def _program(build: _Build, d: _Dims, shape: _Shape) -> _Program | None:
    """Compile one graph's walk (None where a context could change more than sizes)."""
    u, v = d.n_kv // _CELLS, d.n_kv_swa // _CELLS
    real = _Builder(d, shape)
    build(real)
    sym = _Builder(replace(d, n_kv=_CELLS * _SYM_U, n_kv_swa=_CELLS * _SYM_V), shape)
    build(sym)
    try:
        walk = _EventWalk(sym.g, _same_layout_symbolic)
        real_walk = _EventWalk(real.g, _same_layout)
        if walk.events != real_walk.events:
            raise _NotAffine
        sizes: list[int] = []
        grows: list[tuple[int, int, int, int]] = []
        total = [0, 0, 0]
        for slot, (t, t_real) in enumerate(zip(walk.owners, real_walk.owners, strict=True)):
            c, a, b = _affine(_nbytes(t))
            if a < 0 or b < 0 or c + a * u + b * v != _nbytes(t_real):
                raise _NotAffine
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
    except _NotAffine:
        return None
    return _Program(tuple(walk.events), tuple(sizes), tuple(grows), (total[0], total[1], total[2]))


def _run_best_fit(  # noqa: C901 - _Arena inlined: the hot loop
    events: Sequence[int], sizes: Sequence[int]
) -> int:
    """_Arena over a compiled walk: its high-water mark. The same best fit and merging as
    _Arena.alloc and _Arena.free, on two parallel lists of free blocks."""
    offsets = [0] * len(sizes)
    starts = [0]  # free blocks as _Arena keeps them; at first one, unbounded
    lens = [1 << 62]
    top = 0
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
        end = offset + size
        for i, start in enumerate(starts):
            if start + lens[i] == offset:
                lens[i] += size
                if i + 1 < len(starts) and start + lens[i] == starts[i + 1]:
                    lens[i] += lens[i + 1]
                    del starts[i + 1]
                    del lens[i + 1]
                break
            if end == start:
                starts[i] = offset
                lens[i] += size
                if i > 0 and starts[i - 1] + lens[i - 1] == offset:
                    lens[i - 1] += lens[i]
                    del starts[i]
                    del lens[i]
                break
        else:  # before the first block at or above it (a freed empty tensor can follow the end)
            i = 0
            while i < len(starts) and starts[i] < offset:
                i += 1
            starts.insert(i, offset)
            lens.insert(i, size)
    return top


_PROGRAMS: dict[tuple[object, ...], tuple[ModelMeta, _Program | None]] = {}


def output_buffer_bytes(meta: ModelMeta, r: Resolved, *, embeddings: bool | None = None) -> int:
    """Bytes of `llama_context: CPU output buffer size` at start-up.

    llama_context::output_reserve sizes it for one output row per slot: f32 logits over the
    vocabulary, plus an f32 embedding row when the context returns embeddings (`--embedding`;
    None: embedding and rerank models do). It grows at run time only if a batch asks for
    more outputs than slots.
    """
    embd = _is_embedding(meta) if embeddings is None else embeddings
    per_row = (meta.vocab_size or 0) + (meta.n_embd if embd else 0)
    return per_row * r.n_seq * 4
