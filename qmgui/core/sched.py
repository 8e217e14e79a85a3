"""GPU compute buffers: ggml-backend's scheduler replayed over the graphs of `core.compute`.

With a GPU, llama.cpp does not allocate one compute buffer for the graph `core.compute`
replays on the CPU: `ggml_backend_sched` (ggml/src/ggml-backend.cpp) gives every node a
backend, cuts the graph into splits that run on one backend each, copies every tensor a split
reads from another backend into that split's buffer, lets the backend reorder each split
(`graph_optimize`), and then one ggml-alloc walk over that split graph fills one buffer per
backend (`sched_reserve: Vulkan0 compute buffer size`, `Vulkan_Host compute buffer size`).
This module replays those steps for one local GPU and the host:

- pass 1: the graph's inputs (tokens, positions, masks, KV indices...) go to the CPU, a node
  that reads a weight runs where the weight is, except that a GPU takes over ops on host
  weights whose batch is at least 32 rows (`offload_op`: matmuls of CPU layers or of
  `--cpu-moe` experts during a prompt), copying the weight into its compute buffer; a view
  runs with what it views (writes into a host KV cache run on the CPU);
- pass 2: the remaining nodes take the backend of their GPU neighbours, then of any neighbour;
- pass 5: splits at every change of backend, and before a node that needs a copy of another
  host weight (so that the previous weight copy can be freed); each tensor read across
  backends is copied once, at the start of the split that first reads it;
- Vulkan reorders each of its splits (`ggml_vk_graph_optimize`: independent nodes within 20
  of each other run together, fusable chains are kept); CUDA does not by default
  (`GGML_CUDA_GRAPH_OPT=1` turns its reordering on);
- ggml-alloc then walks the split graph: the graph's inputs are allocated first (in host
  memory), each copy when its split starts, everything freed after its last reader.

Checked against a real H200 (Vulkan, 91 launches: docs/accuracy-gpu.md, replayed by
tests/core/test_gpu_replay.py): the GPU and the host buffer come out at the logged sizes to the
printed 0.01 MiB with all layers on the GPU, with `-ngl N`, `--cpu-moe` and `--n-cpu-moe`
(dense, MoE, MLA, sliding-window, hybrid; flash attention on and off; ubatch 256-1024; tiny
models and 4B-30B headers), except a Mamba-2 whose SSM scan has no Vulkan kernel (0.02-0.04
MiB low). A gated-delta-net model (qwen3next, qwen35) with recurrent layers in host memory
makes llama.cpp turn its fused chunked kernel off; the unfused graph it runs instead is not
laid out here, and a bound is added for it (`_unfused_delta_net_bound`).

Like core.compute, each structure's walk is compiled once (the graph built with the KV cells
as symbols, the walk recorded per buffer) and replayed per context in well under a
millisecond; see "the walk compiled once per structure" below. `_peaks_plain` is the walk
built for every context, the reference the compiled one must equal (and the fallback).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from qmgui.core.compute import (
    _PROMPT_ONLY,
    GRAPH_FAULTS,
    GRAPHS_LOCK,
    KeptGraph,
    _layout,
    _reserve_shapes,
    built,
    built_key,
    check_graph_size,
    graph_fault,
    is_embedding,
    kept_peak,
    peaks_of,
    seen_before,
    verified,
)
from qmgui.core.errors import SizingError
from qmgui.core.ggml.alloc import INPLACE_OPS, Arena, same_layout
from qmgui.core.ggml.compile import (
    CELLS,
    COEF_MAX,
    SYM_U,
    SYM_V,
    NotAffine,
    affine,
    claim,
    freed_after_last_read,
    run_best_fit,
    same_layout_symbolic,
    took_parent,
)
from qmgui.core.ggml.graph import Graph
from qmgui.core.ggml.tensor import Tensor, nbytes
from qmgui.core.graph.builder import Build, Builder
from qmgui.core.graph.dims import (
    Dims,
    Shape,
    dims,
    layer_signatures,
    replay_layers,
    replay_period,
    swa_cells,
)
from qmgui.core.launch import Resolved
from qmgui.core.meta import ModelMeta, tensor_places

__all__ = ["Offload", "SchedBytes", "sched_compute_bytes"]

GPU, HOST = 0, 1
# ggml_backend_{cuda,vk}_device_offload_op: a GPU takes over an op on host weights from this
# many rows (op_offload_min_batch_size, GGML_OP_OFFLOAD_MIN_BATCH)
OFFLOAD_MIN_BATCH = 32
# buffer alignments: Vulkan's minStorageBufferOffsetAlignment (16 on NVIDIA, 64 the largest a
# driver reports), CUDA's 128; pinned host buffers (minMemoryMapAlignment) 64
ALIGNMENT = {"vulkan": 64, "cuda": 128}
DEFAULT_ALIGNMENT = 128
HOST_ALIGNMENT = 64

_VIEW_OPS = frozenset({"view", "reshape", "permute", "transpose"})
_EMPTY = _VIEW_OPS | {"none"}


@dataclass(frozen=True)
class Offload:
    """Where one launch keeps its weights and caches, as the scheduler sees it: one GPU (of
    `backend`'s kind) and the host."""

    backend: str = "cuda"
    host_layers: frozenset[int] = frozenset()  # layers whose weights stay in host memory
    host_experts: frozenset[int] = frozenset()  # layers whose expert tensors do
    host_caches: frozenset[int] = frozenset()  # layers whose KV cache / recurrent state do
    output_on_host: bool = False  # the output layer (-ngl 0)

    @property
    def reorders(self) -> bool:
        return self.backend == "vulkan"


@dataclass(frozen=True)
class SchedBytes:
    gpu: int
    host: int
    notes: tuple[str, ...] = field(default=())


def sched_compute_bytes(
    meta: ModelMeta,
    r: Resolved,
    offload: Offload,
    *,
    embeddings: bool | None = None,
    mixed_batch: bool = False,
) -> SchedBytes:
    """The compute buffers of one GPU and of the host for this launch (see the module doc).
    `mixed_batch`: the graph as of `core.compute.MIXED_BATCH_BUILD` (see compute_buffer_bytes).
    Raises SizingError where `core.compute` has no layout for the architecture."""
    if meta.n_layer <= 0 or meta.n_embd <= 0:
        raise SizingError(f"{meta.name}: no layer count or embedding width in the header")
    check_graph_size(meta)
    embd = is_embedding(meta) if embeddings is None else embeddings
    key = (id(meta), r, offload, embd, mixed_batch, _PROMPT_ONLY.get())
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is meta:
        return hit[1]
    build, margin = _layout(meta, mixed_batch=mixed_batch)
    try:
        gpu, host = _peaks(meta, r, offload, build, embd)
        gdn_on_host = meta.architecture in _GDN_ARCHS and bool(
            offload.host_caches & _recurrent_layers(meta)
        )
        extra = _unfused_delta_net_bound(meta, r, embd) if gdn_on_host else 0
    except GRAPH_FAULTS as e:
        raise graph_fault(meta, e) from e
    if margin != 1.0:
        gpu, host = math.ceil(gpu * margin), math.ceil(host * margin)
    notes: list[str] = []
    if gdn_on_host:
        gpu += extra
        notes.append(
            "recurrent layers in host memory: llama.cpp turns its fused gated-delta-net kernel "
            "off; the unfused graph is not laid out, so the GPU compute buffer carries a bound "
            f"of {extra / (1 << 20):.1f} MiB for it"
        )
    result = SchedBytes(gpu, host, tuple(notes))
    if len(_CACHE) >= 256:
        _CACHE.clear()
    _CACHE[key] = (meta, result)
    return result


def _layers(meta: ModelMeta, offload: Offload) -> tuple[int, ...]:
    """The layers the graph is built with: replay_layers' shortcut, per run of layers kept
    in the same place. With anything in host memory the stack splits into runs (the first
    N layers' weights, experts or caches on the host, the rest on the GPU); each run is
    replayed as replay_layers replays the whole stack (its first layers up to two periods
    past the irregular head) plus its own last layer, whose output crosses to the next run
    (a copy that lives until its last reader). The last layer of the stack is kept as ever.
    Against the whole stack built and walked, this matched on every offload boundary of
    the fixtures' models and the full-size presets (tests/core/test_sched_compiled.py:
    test_offload_runs_replay_as_the_whole_stack); it turns a first fit search's dozen
    whole-stack compiles (one per -ngl / --n-cpu-moe candidate) into compiles of ~8 layers.

    Each compressed run is kept on to the phase (of the stack's period) of the layer before
    its last, so that its last layer follows a layer of the same signature as in the stack:
    without that, a larger copy in the run before (a K-quant's Q6_K first layer in host
    memory) left the next run's last layer a state the stack never reaches (0.4 MiB high on
    a 24-layer qwen3next).

    A layer's weights in host memory are copied into the GPU's compute buffer for a prompt's
    matmuls, so their sizes shape the walk: a run whose layers of one signature do not all
    have the same host weights (a K-quant file keeps some layers' ffn_down in Q6_K, the rest
    in Q4_K) is replayed whole. Replaying its first layers alone missed a larger copy further
    down: 50-150 MiB low on full-size MoE and hybrid headers (test_offload_runs_of_mixed_
    quantizations_replay_as_the_whole_stack)."""
    hl, he, hc = offload.host_layers, offload.host_experts, offload.host_caches
    base = replay_layers(meta)
    n = meta.n_layer
    if not (hl or he or hc) or len(base) >= n:
        return base
    key = (id(meta), offload)
    hit = _LAYERS.get(key)
    if hit is not None and hit[0] is meta:
        return hit[1]
    prefix = base[-2] + 1  # replay_layers keeps range(prefix) and the last layer
    period = replay_period(meta)
    place = [(il in hl, il in he, il in hc) for il in range(n)]
    keep = set(base)
    start = 0
    for il in range(1, n + 1):
        if il == n or place[il] != place[start]:
            if _copies_alike(meta, offload, range(start, il)):
                # and on to the phase of the layer before the run's last, so that the state
                # the last layer meets is the one it meets in the whole stack
                align = ((il - 2) - (start + prefix - 1)) % period if period else 0
                keep.update(range(start, min(il, start + prefix + align)))
            else:
                keep.update(range(start, il))
            keep.add(il - 1)
            start = il
    layers = tuple(sorted(keep))
    if len(_LAYERS) >= _PROGRAMS_KEPT:
        _LAYERS.clear()
    _LAYERS[key] = (meta, layers)
    return layers


_LAYERS: dict[tuple[object, ...], tuple[ModelMeta, tuple[int, ...]]] = {}


def _copies_alike(meta: ModelMeta, offload: Offload, run: range) -> bool:
    """Whether the run's layers of one signature all keep the same weights (their shapes and
    bytes) in host memory, whose copies shape the walk."""
    sig = layer_signatures(meta)
    per_layer = _host_weight_sizes(meta).per_layer
    first: dict[int, object] = {}
    for il in run:
        weights = per_layer.get(il, ())
        if il in offload.host_layers:
            copied = weights
        elif il in offload.host_experts:
            copied = tuple(w for w in weights if w[0])
        else:
            copied = ()
        if first.setdefault(sig[il], copied) != copied:
            return False
    return True


def _peaks_plain(
    meta: ModelMeta, r: Resolved, offload: Offload, build: Build, embeddings: bool
) -> tuple[int, int]:
    """(GPU, host) peaks over the reserve graphs, the plain way: build each graph for this
    context and walk it. The reference the compiled walk (_peaks) must equal."""
    d = replace(dims(meta, r, embeddings), layers=_layers(meta, offload))
    sizes = _host_weight_sizes(meta)
    gpu = host = 0
    for shape in _reserve_shapes(r, embeddings):
        b = Builder(d, shape)
        build(b)
        g_peak, h_peak = _walk_arenas(b.g, offload, sizes, meta.n_layer)
        gpu, host = max(gpu, g_peak), max(host, h_peak)
    return gpu, host


_CACHE: dict[tuple[object, ...], tuple[ModelMeta, SchedBytes]] = {}
_GDN_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})
_CHUNK = 64  # build_delta_net_chunking's chunk size (16 for KDA, not used by these models)


def _unfused_delta_net_bound(meta: ModelMeta, r: Resolved, embeddings: bool) -> int:
    """What the unfused chunked delta net (llm_build_delta_net_base::build_delta_net_chunking,
    which llama.cpp runs when a recurrent layer's state is in host memory) can add to the
    fused graph's peak: every intermediate of one layer at once. Per prompt graph, with
    H = value heads x sequences, T = tokens per sequence padded to chunks of 64: 7 square
    chunk matrices (decay mask, K·Kβ, K·Q, the triangular solve's inputs and result; 64 x 64 x
    chunks x H F32), 10 head-wide rows (padded Q, K, V, Kβ, Vβ, cumulative decay products,
    transposes; head x T x H) and, per chunk, 5 head x 64 and 2 head x head blocks. On the H200
    the tiny qwen3next came out 0.8-0.9 MiB above the fused graph where this adds 2.7-5.4 MiB:
    a bound, not a measurement."""
    ssm = meta.ssm
    if ssm is None:
        return 0
    n_v = max(ssm.time_step_rank or 1, 1)
    head = max(ssm.inner_size // n_v, ssm.state_size)
    pp = _reserve_shapes(r, embeddings)[0]
    h = n_v * pp.n_seqs
    per_seq = -(-pp.n_tokens // pp.n_seqs)
    chunks = -(-per_seq // _CHUNK)
    square = _CHUNK * _CHUNK * chunks * h * 4
    rows = head * chunks * _CHUNK * h * 4
    per_chunk = (5 * head * _CHUNK + 2 * head * head) * h * 4
    return 7 * square + 10 * rows + chunks * per_chunk


def _recurrent_layers(meta: ModelMeta) -> frozenset[int]:
    return frozenset(il for il, rec in enumerate(meta.recurrent_layers) if rec)


# --- what a copy of a host weight costs ---------------------------------------------------------


@dataclass(frozen=True)
class _Sizes:
    """Bytes of each weight in the file's own types, by (layer, expert?, shape): the replayed
    graph knows its weights by layer and shape only; where a shape is missing (an
    architecture's optional tensors), the largest weight of its kind in that layer."""

    by_shape: dict[tuple[int, bool, tuple[int, ...]], int]
    largest: dict[tuple[int, bool], int]
    # per layer, (expert, shape, bytes) of each of its weights, sorted
    per_layer: dict[int, tuple[tuple[bool, tuple[int, ...], int], ...]]

    def of(self, t: Tensor) -> int:
        n = self.by_shape.get((t.layer, t.expert, _shape(t.ne)))
        return n if n is not None else self.largest.get((t.layer, t.expert), 0) or nbytes(t)


def _shape(ne: Sequence[int]) -> tuple[int, ...]:
    out = list(ne)
    while len(out) > 1 and out[-1] == 1:
        out.pop()
    return tuple(out)


_SIZES: dict[int, tuple[ModelMeta, _Sizes]] = {}


def _host_weight_sizes(meta: ModelMeta) -> _Sizes:
    hit = _SIZES.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    by_shape: dict[tuple[int, bool, tuple[int, ...]], int] = {}
    largest: dict[tuple[int, bool], int] = {}
    n = meta.n_layer
    weights = list(zip(tensor_places(meta), meta.tensors, strict=True))
    if meta.tied_embeddings:  # the output matmul reads a tied token_embd: the output layer's
        weights += [((n, False), t) for t in meta.tensors if t.name == "token_embd.weight"]
    for place, t in weights:
        shape, size = t.shape, t.nbytes
        if len(shape) > 1 and shape[-1] == 1:  # the graph's shapes end without ones
            shape = _shape(shape)
        k = (*place, shape)
        if by_shape.get(k, -1) < size:
            by_shape[k] = size
        if largest.get(place, -1) < size:
            largest[place] = size
    rows: dict[int, list[tuple[bool, tuple[int, ...], int]]] = {}
    for (layer, expert, shape), size in by_shape.items():
        rows.setdefault(layer, []).append((expert, shape, size))
    sizes = _Sizes(by_shape, largest, {il: tuple(sorted(r)) for il, r in rows.items()})
    if len(_SIZES) >= 32:
        _SIZES.clear()
    _SIZES[id(meta)] = (meta, sizes)
    return sizes


# --- pass 1 to 5 --------------------------------------------------------------------------------


def _batch(t: Tensor) -> int:
    """get_op_batch_size (ggml-cuda.cu, ggml-vulkan.cpp): the rows an op works on."""
    if t.op == "get_rows":
        return 0
    if t.op == "mul_mat":
        return t.ne[1]
    if t.op in ("mul_mat_id", "rope"):
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]


def _external_backend(t: Tensor, o: Offload, n_layer: int) -> int:
    """Where a weight or cache lives: token embeddings on the host, the output layer on the
    GPU unless -ngl 0, a layer's weights (its experts) and caches as the launch placed them."""
    if t.is_weight:
        if t.layer < 0:
            return HOST
        if t.layer >= n_layer:
            return HOST if o.output_on_host else GPU
        if t.layer in o.host_layers or (t.expert and t.layer in o.host_experts):
            return HOST
        return GPU
    return HOST if t.layer in o.host_caches else GPU


def _supported(t: Tensor, b: int, o: Offload) -> bool:
    """ggml_backend_supports_op where it matters here: Vulkan's SSM scan has kernels for
    states of 128 and 256 only (ggml_vk_op_get_pipeline); the CPU runs everything."""
    if b == HOST or o.backend != "vulkan":
        return True
    return not (t.op == "ssm_scan" and t.src[0].ne[0] not in (128, 256))


def _assign(g: Graph, o: Offload, n_layer: int) -> None:
    """Passes 1-4 of ggml_backend_sched_split_graph: a backend for every tensor of `g`
    (Tensor.backend, where ggml's scheduler keeps a table by tensor)."""
    for leaf in g.leafs:  # graph inputs go to the CPU ("1.inp")
        leaf.backend = _external_backend(leaf, o, n_layer) if leaf.external else HOST
    real = _pass1(g, o, n_layer)
    # nodes the GPU cannot run (Vulkan's odd SSM scans): passes 2 and 3 leave them alone
    no_gpu = [t for t in real if not _supported(t, GPU, o)] if o.backend == "vulkan" else []
    back = real[::-1]
    left = sum(1 for t in real if t.backend < 0)  # what pass 2 may assign
    no_gpu_ids = frozenset(id(t) for t in no_gpu)
    for order, gpu_only in ((real, True), (back, True), (real, False), (back, False)):
        if not left:  # nothing left to assign: the sweeps after change nothing
            break
        left -= _expand(order, no_gpu_ids, gpu_only=gpu_only)
    for t in no_gpu:  # pass 3: what no neighbour could take runs where it is supported
        if t.backend < 0:
            t.backend = HOST
    for t in g.nodes:  # pass 4: views with what they view; anything left (no GPU node) on the CPU
        if t.backend < 0:
            root = t.view_src
            b = root.backend if root is not None else HOST
            t.backend = b if b >= 0 else HOST


def _pass1(g: Graph, o: Offload, n_layer: int) -> list[Tensor]:
    """Pass 1 (ggml_backend_sched_backend_id_from_cur): the nodes it decides get their
    backend, the others none (-1). Returns the nodes but views, which passes 2 and 3 walk."""
    real: list[Tensor] = []
    for t in g.nodes:
        t.backend = -1
        root = t.view_src
        if root is not None:  # "1.vsrc": views of weights and caches, writes into caches
            if root.external:
                t.backend = _external_backend(root, o, n_layer)
            if t.op in _VIEW_OPS:
                continue
        elif t.op not in _ROPE_OPS:
            for s in t.src:
                if s.external and s.is_weight:
                    b = _by_weight(t, s, o, n_layer)
                    if b is not None:
                        t.backend = b
                    break
        real.append(t)
    return real


_ROPE_OPS = frozenset({"rope", "flash_attn_ext"})  # their small weights do not choose


def _by_weight(t: Tensor, s: Tensor, o: Offload, n_layer: int) -> int | None:
    """Pass 1 for a node whose first weight source is `s`: where the weight is, if that
    backend runs the op (nobody else can read it), or the GPU for a large batch ("1.off":
    the GPU copies the weight and runs the op)."""
    wb = _external_backend(s, o, n_layer)
    if wb == HOST and _batch(t) >= OFFLOAD_MIN_BATCH and _supported(t, GPU, o):
        wb = GPU
    return wb if _supported(t, wb, o) else None


def _expand(order: Sequence[Tensor], no_gpu: frozenset[int], *, gpu_only: bool) -> int:
    """Pass 2: unassigned nodes take the backend of the node before them in `order` (the
    GPU only, skipping CPU nodes, in the first two sweeps); `no_gpu`: nodes (by id) the GPU
    cannot run (the CPU runs everything). Returns how many it assigned."""
    cur = -1
    n = 0
    for t in order:
        b = t.backend
        if b != -1:
            cur = -1 if gpu_only and b == HOST else b
        elif cur != -1 and not (cur == GPU and no_gpu and id(t) in no_gpu):
            t.backend = cur
            n += 1
    return n


@dataclass
class _Split:
    backend: int
    start: int
    end: int = 0
    inputs: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # (source, its copy)


def _split(g: Graph, sizes: _Sizes) -> list[_Split]:
    """Pass 5: splits, and one copy of every tensor read from the other backend, made at the
    start of the first split that reads it (the readers are rewired to the copy). Counts
    each node's readers and views as it goes (ggml_gallocr_alloc_graph_impl's first pass;
    _sequence counts the copies' source dependencies)."""
    nodes = g.nodes
    splits: list[_Split] = []
    copies: dict[tuple[int, int], Tensor] = {}
    cur: _Split | None = None
    for i, t in enumerate(nodes):
        root = t.view_src
        if root is not None:
            root.n_views += 1  # every node is an op: none of them is an input_dep
        if t.op in _VIEW_OPS:
            for s in t.src:
                s.n_children += 1
            continue
        b = t.backend
        # the sources read from the other backend (most nodes: none, found without a list);
        # each source counted as read (a copy read instead is counted in its place below)
        far = False
        for s in t.src:
            s.n_children += 1
            if s.backend != b:
                far = True
        across = [j for j, s in enumerate(t.src) if s.backend != b] if far else []
        new = cur is None or b != cur.backend
        if not new and cur is not None and cur.inputs and across:
            # a weight from the other backend: a new split frees the previous weight copies
            new = any(t.src[j].is_weight for j in across)
        if new:
            if cur is not None:
                cur.end = i
            cur = _Split(b, i if splits else 0)
            splits.append(cur)
        if across:
            assert cur is not None
            _read_copies(g, t, across, cur, copies=copies, sizes=sizes)
    if cur is not None:
        cur.end = len(nodes)
    return splits


def _read_copies(
    g: Graph,
    t: Tensor,
    across: Sequence[int],
    split: _Split,
    *,
    copies: dict[tuple[int, int], Tensor],
    sizes: _Sizes,
) -> None:
    """`t` rewired to read copies of its sources `across` (by index) on its own backend:
    each copy made once per backend, an input of the split that first reads it."""
    b = t.backend
    srcs = list(t.src)
    for j in across:
        s = srcs[j]
        s.n_children -= 1  # counted as read by _split: the copy is read instead
        cp = copies.get((id(s), b))
        if cp is None:
            cp = _copy_of(s, t, sizes)
            cp.backend = b
            copies[(id(s), b)] = cp
            split.inputs.append((s, cp))
        srcs[j] = cp
        cp.n_children += 1
    g.rewired.append((t, t.src))
    t.src = tuple(srcs)


def _copy_of(s: Tensor, reader: Tensor, sizes: _Sizes) -> Tensor:
    """ggml_dup_tensor_layout of a source read across backends: a weight in its file type,
    anything else in its own layout."""
    if s.is_weight:
        # matrices in their file type; norm weights and biases are F32 vectors
        n = sizes.of(s) if reader.op in ("mul_mat", "mul_mat_id") else s.nelements * 4
        return Tensor("i8", (n,))
    return Tensor(s.type, s.ne, "none", (), None, s.nb)


# --- ggml_vk_graph_optimize ---------------------------------------------------------------------

# fusion patterns the reordering keeps together (ggml-vulkan.cpp, topk_moe_* and snake)
_PATTERNS = (
    ("soft_max", "reshape", "argsort", "view", "get_rows", "reshape", "sum_rows", "clamp", "div",
     "reshape"),
    ("unary", "reshape", "add", "argsort", "view", "get_rows", "reshape", "sum_rows", "clamp",
     "div", "reshape"),
    ("unary", "sqrt", "reshape", "add", "argsort", "view", "get_rows", "reshape", "sum_rows",
     "clamp", "div", "reshape"),
    ("soft_max", "reshape", "argsort", "view", "get_rows"),
    ("argsort", "view", "get_rows", "reshape", "soft_max", "reshape"),
    ("mul", "sin", "sqr", "mul", "add"),
)  # fmt: skip
# a node may follow its source at once when the two fuse
_FUSE = frozenset(
    {
        ("rms_norm", "mul"),
        ("mul_mat", "add"),
        ("mul_mat_id", "add_id"),
        ("mul_mat_id", "mul"),
        ("add", "add"),
        ("ssm_conv", "add"),
        ("ssm_conv", "unary"),
    }
)
_WINDOW = 20


def _is_src_of(dst: Tensor, src: Tensor) -> bool:
    if any(s is src for s in dst.src):
        return True
    return (dst.view_src or dst) is (src.view_src or src)  # views of the same tensor


def _vk_reorder(nodes: Sequence[Tensor]) -> list[Tensor]:  # noqa: C901 - one loop, as upstream
    """ggml_vk_graph_optimize: from the first unscheduled node, pull forward the nodes within
    the next 20 that depend on nothing unscheduled (or only on the node before them when the
    two fuse), with the RoPE and KV-cache write that follow a norm, then the views whose
    sources are scheduled."""
    n = len(nodes)
    used = [False] * n
    done: set[int] = set()
    out: list[Tensor] = []

    def match(p: tuple[str, ...], at: int) -> bool:
        return at + len(p) <= n and all(
            nodes[at + k].op == p[k] and not used[at + k] for k in range(len(p))
        )

    first = 0
    while first < n:
        kept = next((p for p in _PATTERNS if match(p, first)), None)
        if kept is not None:
            for k in range(first, first + len(kept)):
                out.append(nodes[k])
                done.add(id(nodes[k]))
                used[k] = True
            while first < n and used[first]:
                first += 1
            continue
        cur = [first]
        end = min(first + _WINDOW, n)
        for j in range(first + 1, end):
            t = nodes[j]
            if used[j] or t.op in _EMPTY or any(match(p, j) for p in _PATTERNS):
                continue
            if any(
                not used[c]
                and _is_src_of(t, nodes[c])
                and not (j == c + 1 and c == cur[-1] and (nodes[c].op, t.op) in _FUSE)
                for c in range(first, j)
            ):
                continue
            cur.append(j)
            _pull_followers(nodes, j, cur, used, done)
        if nodes[cur[-1]].op != "add":
            for j in range(first + 1, end):
                if used[j] or nodes[j].op not in _EMPTY:
                    continue
                if not any(
                    not used[c] and _is_src_of(nodes[j], nodes[c]) and c not in cur
                    for c in range(first, j)
                ):
                    cur.append(j)
        for c in cur:
            out.append(nodes[c])
            done.add(id(nodes[c]))
            used[c] = True
        while first < n and used[first]:
            first += 1
    return out


def _pull_followers(
    nodes: Sequence[Tensor], j: int, cur: list[int], used: list[bool], done: set[int]
) -> None:
    """The nodes ggml_vk_graph_optimize schedules right after node j when it fuses with
    them: the RoPE of a normed Q/K and its KV-cache write, the bias add and scale of an
    expert matmul, a second add, the activation of a biased SSM conv."""
    n = len(nodes)
    t = nodes[j]

    def pull(k: int) -> None:
        cur.append(k)
        used[k] = True

    def find(test: Callable[[Tensor], bool], stop: int, start: int = j + 1) -> int:
        return next((k for k in range(start, min(stop, n)) if test(nodes[k])), -1)

    k_rope = j
    if t.op == "mul" and nodes[j - 1].op == "rms_norm":
        k = find(
            lambda x: (
                x.op == "rope"
                and x.src[0] is t
                and x.src[1].op == "none"
                and (len(x.src) < 3 or x.src[2].op == "none")
            ),
            j + 15,
        )
        if k != -1:
            k_rope = k
            pull(k)
    if nodes[k_rope].op == "rope":
        rope = nodes[k_rope]
        k_view = find(lambda x: x.op == "view" and x.src[0] is rope, k_rope + 10, k_rope + 1)
        if k_view != -1:
            view = nodes[k_view]
            k_set = find(lambda x: x.op == "set_rows" and x.src[0] is view, k_rope + 10, k_view + 1)
            if k_set != -1:
                pull(k_view)
                pull(k_set)
    follow = {"add_id": ("mul_mat_id", "mul"), "add": ("mul_mat", "add")}.get(t.op)
    if follow is not None and nodes[j - 1].op == follow[0]:
        k = find(
            lambda x: (
                x.op == follow[1]
                and x.src[0] is t
                and (x.src[1].op == "none" or id(x.src[1]) in done)
            ),
            j + 15,
        )
        if k != -1:
            pull(k)
    if t.op == "add" and nodes[j - 1].op == "ssm_conv":
        k = find(lambda x: x.op == "unary" and x.src[0] is t, j + 15)
        if k != -1:
            pull(k)


# --- ggml-alloc over the split graph ------------------------------------------------------------


def _walk(g: Graph, o: Offload, sizes: _Sizes, n_layer: int) -> tuple[int, int]:
    """(GPU, host) high-water marks of ggml_gallocr_alloc_graph_impl over the split graph:
    the walk's allocations and frees taped, then each arena's best fit run over its own
    (run_best_fit: Arena's placement on two flat lists, a bisection per free), or, where a
    tape does not split into two independent arenas, the tape played through two Arenas.
    _walk_arenas (the reference of the tests) plays every tape through the Arenas."""
    tape = _Tape((_gpu_alignment(o), HOST_ALIGNMENT))
    _run_walk(g, o, sizes, n_layer, tape=tape, same=same_layout)
    return tape.peaks()


def _walk_arenas(g: Graph, o: Offload, sizes: _Sizes, n_layer: int) -> tuple[int, int]:
    """_walk's tape placed by two Arenas in the walk's order (ggml-alloc's placement, the
    reference run_best_fit must equal)."""
    tape = _Tape((_gpu_alignment(o), HOST_ALIGNMENT))
    _run_walk(g, o, sizes, n_layer, tape=tape, same=same_layout)
    return tape.played()


class _Tape:
    """Both arenas' allocations and frees in the walk's order, recorded instead of placed: an
    allocation takes a new slot (its size kept as asked: a number, or in the compiled walk a
    polynomial in the symbols), a free names the slot (the tensor's offset is its slot; its
    size is the slot's, since an in-place child has its parent's layout)."""

    def __init__(self, aligns: tuple[int, int]) -> None:
        self.aligns = aligns
        self.sizes: list[int] = []  # per slot, as asked
        self.owner: list[int] = []  # per slot, the arena that placed it
        self.seq: list[int] = []  # both arenas' events in order: slot, or ~slot (a free)
        # frees by the arena that did not place the slot, by their place in seq: the arena
        # and the bytes freed. None of them: the two arenas are independent, and each one's
        # events alone are its walk
        self.across: dict[int, tuple[int, int]] = {}

    @property
    def split(self) -> bool:
        return not self.across

    @property
    def events(self) -> tuple[list[int], list[int]]:
        """Each arena's events in order (of a split tape)."""
        owner = self.owner
        gpu: list[int] = []
        host: list[int] = []
        for e in self.seq:
            (gpu if owner[e if e >= 0 else ~e] == GPU else host).append(e)
        return gpu, host

    def alloc(self, which: int, size: int) -> int:
        """`size` bytes placed by arena `which`: the new slot (the tensor's offset)."""
        slot = len(self.sizes)
        self.sizes.append(size)
        self.owner.append(which)
        self.seq.append(slot)
        return slot

    def release(self, which: int, t: Tensor) -> None:
        """`t`'s slot freed by arena `which`."""
        slot = t.offset
        if self.owner[slot] != which:
            self.across[len(self.seq)] = (which, nbytes(t))
        self.seq.append(~slot)

    def place(self, seq: Sequence[Tensor], same: Callable[[Tensor, Tensor], bool]) -> None:
        """ggml_gallocr_alloc_graph_impl's node loop over the scheduler's sequence, recorded:
        each node's unplaced sources and the node placed in its backend's arena, then the
        sources it read last freed (a view's root once nothing reads or views it), each in
        its own backend's. ggml-alloc's allocate and release inline where they return at
        once (most sources are placed already and keep readers, and weights and caches are
        never placed), and the tape's allocations and frees (alloc, release) inline too: a
        walk makes thousands."""
        sizes, owner, events, across = self.sizes, self.owner, self.seq, self.across
        for t in seq:
            srcs = t.src
            b = t.backend
            for s in srcs:
                if not (s.external or s.allocated or s.view_src is not None):
                    s.allocated = True  # claim
                    if not (s.op in INPLACE_OPS and took_parent(s, same)):
                        s.offset = slot = len(sizes)
                        sizes.append(nbytes(s))
                        owner.append(b)
                        events.append(slot)
            if not (t.external or t.allocated or t.view_src is not None):
                t.allocated = True
                if not (t.op in INPLACE_OPS and took_parent(t, same)):
                    t.offset = slot = len(sizes)
                    sizes.append(nbytes(t))
                    owner.append(b)
                    events.append(slot)
            for p in srcs:
                p.n_children -= 1
                if p.n_children or p.n_views or p.external or (p.op == "none" and p.view_src):
                    continue
                dead = freed_after_last_read(p)
                if dead is not None:
                    slot = dead.offset
                    if owner[slot] != dead.backend:
                        across[len(events)] = (dead.backend, nbytes(dead))
                    events.append(~slot)
                    dead.allocated = False

    def peaks(self) -> tuple[int, int]:
        """Each arena's high-water mark: its best fit run over its events, or, where the
        arenas are not apart, the tape played through two Arenas in order."""
        aligns = self.aligns
        if self.split:
            padded = [
                -(-n // aligns[w]) * aligns[w] for n, w in zip(self.sizes, self.owner, strict=True)
            ]
            gpu, host = self.events
            return run_best_fit(gpu, padded), run_best_fit(host, padded)
        return self.played()

    def played(self) -> tuple[int, int]:
        """Each arena's high-water mark, the tape played in order through two Arenas."""
        aligns = self.aligns
        arenas = (Arena(aligns[GPU]), Arena(aligns[HOST]))
        offsets = [0] * len(self.sizes)
        owner, across = self.owner, self.across
        for i, e in enumerate(self.seq):
            if e >= 0:
                offsets[e] = arenas[owner[e]].alloc(self.sizes[e])
            else:
                which, n = across.get(i, (owner[~e], self.sizes[~e]))
                arenas[which].free(offsets[~e], n)
        return arenas[GPU].max_size, arenas[HOST].max_size


def _gpu_alignment(o: Offload) -> int:
    return ALIGNMENT.get(o.backend, DEFAULT_ALIGNMENT)


def _run_walk(
    g: Graph,
    o: Offload,
    sizes: _Sizes,
    n_layer: int,
    *,
    tape: _Tape,
    same: Callable[[Tensor, Tensor], bool],
) -> None:
    """Passes 1-5, the reordering and ggml-alloc's walk over the split graph, recorded into
    `tape`; `same` decides same_layout (the compiled walk's decides it for every context)."""
    _assign(g, o, n_layer)
    seq = _sequence(g, _split(g, sizes), o)
    for leaf in g.leafs:  # weights and caches are not in the compute buffers
        if not leaf.external and claim(leaf, same) is False:
            leaf.offset = tape.alloc(leaf.backend, nbytes(leaf))
    tape.place(seq, same)


def _sequence(g: Graph, splits: Sequence[_Split], o: Offload) -> list[Tensor]:
    """The scheduler's graph copy: per split, each input's source dependency and its copy,
    then the split's nodes (reordered on Vulkan)."""
    seq: list[Tensor] = []
    for sp in splits:
        for src, cp in sp.inputs:
            # input_dep keeps the source alive until it is copied (a GGML_OP_NONE view of it)
            dep = Tensor(src.type, src.ne, "none", (src,), src, src.nb)
            dep.backend = src.backend
            src.n_children += 1  # read by the dependency (a view of op none: no view counted)
            seq += (dep, cp)
        part = g.nodes[sp.start : sp.end]
        seq += _vk_reorder(part) if sp.backend == GPU and o.reorders else part
    return seq


# --- the walk compiled once per structure -------------------------------------------------------
#
# As in core.ggml.compile (the walk compiled once per graph structure), a context changes no op,
# source or view of the graphs, only the sizes of the tensors that span the KV cache, and
# those linearly in u and v (cells of the full and the sliding-window cache, in units of
# CELLS). Nothing the scheduler decides reads those sizes: where a node runs depends on
# where its weights and caches are and on its batch (rows of tokens, not cells), the splits
# and the copies on the backends alone, Vulkan's reordering on ops and sources. So each
# structure (everything but the cells, plus the offload) is built once with u and v as
# symbols (core.ggml.compile's SYM_U and SYM_V), walked once with arenas that record instead of
# place, and each later context costs one best-fit pass per arena over the recorded events
# and the sizes read back as c + a*u + b*v.
#
# Guards, each falling back to the plain build and walk (_peaks_plain) for that structure for
# good: a size that is not affine; an in-place decision a context could flip
# (same_layout_symbolic); a batch or SSM state that depends on the cells where the scheduler
# compares it; a tensor freed in another arena than the one that placed it. The symbolic
# graph must also be the graph built at the real context that first asked for it: the same
# ops, sources, views and flags, and every shape and stride the symbolic one evaluated there.
# tests/core/test_sched_compiled.py checks the compiled walk against the plain one over
# contexts, offloads, flash attention and ubatch on tiny and full-size headers.


def _peaks(
    meta: ModelMeta, r: Resolved, offload: Offload, build: Build, embeddings: bool
) -> tuple[int, int]:
    """(GPU, host) peaks over the reserve graphs: _peaks_plain's result, from the compiled
    walk where the structure allows it."""
    n_kv, n_kv_swa = r.n_ctx_seq, swa_cells(meta, r)
    if n_kv <= 0 or n_kv_swa <= 0 or n_kv % CELLS or n_kv_swa % CELLS:
        return _peaks_plain(meta, r, offload, build, embeddings)
    u, v = n_kv // CELLS, n_kv_swa // CELLS
    layers = _layers(meta, offload)
    # everything the graphs depend on but the cells (core.compute._reserve_bytes' key)
    structure = (
        id(meta),
        build,
        embeddings,
        layers,
        r.n_stream,
        r.kv_unified,
        r.flash_attn,
        r.cache_type_k,
        r.cache_type_v,
    )
    gpu = host = 0
    d: Dims | None = None
    for shape in _reserve_shapes(r, embeddings):
        graph_key = (*structure, shape)
        key = (*graph_key, offload)
        peaks = peaks_of(_PEAKS, meta, key)
        known = peaks.get((u, v))
        if known is not None:  # this graph at this context, sized before
            gpu, host = max(gpu, known[0]), max(host, known[1])
            continue
        hit = _PROGRAMS.get(key)
        prog: _Program | None = None
        if hit is not None and hit[0] is meta:
            prog = hit[1]
        elif _seen_before(meta, graph_key):
            prog = _compile(
                meta,
                r,
                offload,
                build=build,
                embeddings=embeddings,
                graph_key=graph_key,
                shape=shape,
            )
            if len(_PROGRAMS) >= _PROGRAMS_KEPT:
                _PROGRAMS.clear()
            _PROGRAMS[key] = (meta, prog)
        exact = prog is None or gpu == host == 0  # peaks() skips an arena below its floor
        if prog is None:
            if d is None:
                d = replace(dims(meta, r, embeddings), layers=layers)
            g_peak, h_peak = _walk_plain(meta, build, d, shape, offload)
        else:
            g_peak, h_peak = prog.peaks(u, v, gpu, host)
        if exact:
            kept_peak(peaks, u, v, (g_peak, h_peak))
        gpu, host = max(gpu, g_peak), max(host, h_peak)
    return gpu, host


def _walk_plain(
    meta: ModelMeta, build: Build, d: Dims, shape: Shape, offload: Offload
) -> tuple[int, int]:
    """_walk over the graph built at d: core.compute's (kept) for the replayed layers."""
    sizes = _host_weight_sizes(meta)
    with GRAPHS_LOCK:
        if d.layers != replay_layers(meta):
            g = _offload_graph(meta, build, d, shape)
        else:
            g = built(meta, build, d, shape).walked()
        return _walk(g, offload, sizes, meta.n_layer)


def _offload_graph(meta: ModelMeta, build: Build, d: Dims, shape: Shape) -> Graph:
    """The graph over an offload's layers (d.layers, from _layers), to walk. Two offloads'
    layers of the same signatures in the same order (a fit search's neighbouring candidates:
    _layers keeps each run on the stack's phase) are built alike (as _layers' runs stand for
    the stack), so the graph built for one serves the next, its weights and caches stamped
    with the new layers. Call with GRAPHS_LOCK held."""
    sig = layer_signatures(meta)
    last = meta.n_layer - 1  # the last layer keeps only the output rows: apart from its kind
    pattern = tuple(-1 if il == last else sig[il] for il in d.layers)
    key = (*built_key(meta, build, replace(d, layers=()), shape), pattern)
    hit = _OFFLOAD_GRAPHS.get(key)
    if hit is None or hit[0] is not meta:
        b = Builder(d, shape)
        build(b)
        pos = {il: k for k, il in enumerate(d.layers)}
        stamps = tuple((t, pos[t.layer]) for t in b.g.leafs if t.external and t.layer in pos)
        if len(_OFFLOAD_GRAPHS) >= _OFFLOAD_GRAPHS_KEPT:
            _OFFLOAD_GRAPHS.clear()
        kept = KeptGraph(b.g)
        _OFFLOAD_GRAPHS[key] = (meta, kept, stamps)
        return kept.walked()  # stamped as built
    _, kept, stamps = hit
    layers = d.layers
    for t, k in stamps:
        t.layer = layers[k]
    return kept.walked()


# offload graphs by their layers' signatures (_offload_graph): a search's last few, each with
# its weights and caches and their positions among the layers, to stamp
_OFFLOAD_GRAPHS: dict[
    tuple[object, ...], tuple[ModelMeta, KeptGraph, tuple[tuple[Tensor, int], ...]]
] = {}
_OFFLOAD_GRAPHS_KEPT = 4  # a candidate's two reserve graphs, and the one before


def _seen_before(meta: ModelMeta, graph_key: tuple[object, ...]) -> bool:
    """Whether a graph structure was asked before (compute.seen_before: a structure asked
    once is walked plainly, over the graph built at its context, and compiled when asked
    again), or its symbolic graph is built already. With every layer on the GPU the plain
    walk shares core.compute's graph of the same context. An offload's structure (its own
    layers, _layers) is as a rule asked once by a fit search over -ngl or --n-cpu-moe (each
    candidate at the one context asked): compiling it at once cost its symbolic build, the
    check of the replayed layers' symbolic graphs against the real ones and the program
    (~80 M instructions of a hybrid's first offload search, ~16%) for a replay never made."""
    hit = _GRAPHS.get(graph_key)
    if hit is not None and hit[0] is meta:
        return True
    return seen_before(meta, graph_key, _SEEN)


@dataclass(frozen=True)
class _Program:
    """One structure's walk over the split graph: per arena (GPU, host) its events (slot:
    allocate, ~slot: free), and per slot its padded size, constant or, for `grows` (slot, c,
    a, b, alignment), c + a*u + b*v bytes before padding."""

    events: tuple[tuple[int, ...], tuple[int, ...]]
    sizes: tuple[int, ...]
    grows: tuple[tuple[int, int, int, int, int], ...]
    totals: tuple[tuple[int, int, int], tuple[int, int, int]]  # per arena, a bound (c, a, b)

    def peaks(self, u: int, v: int, gpu_floor: int = 0, host_floor: int = 0) -> tuple[int, int]:
        """Each arena's high-water mark at u, v; 0 for an arena whose bound (no placement ends
        beyond all its allocations together) cannot exceed its floor: it is not walked."""
        need = [
            c + a * u + b * v > floor
            for (c, a, b), floor in zip(self.totals, (gpu_floor, host_floor), strict=True)
        ]
        if not any(need):
            return 0, 0
        sizes = list(self.sizes)
        for slot, c, a, b, align in self.grows:
            sizes[slot] = -(-(c + a * u + b * v) // align) * align
        gpu = run_best_fit(self.events[GPU], sizes) if need[GPU] else 0
        host = run_best_fit(self.events[HOST], sizes) if need[HOST] else 0
        return gpu, host


_PROGRAMS_KEPT = 256  # a full-size MoE stack: ~0.1 MB a program
_PROGRAMS: dict[tuple[object, ...], tuple[ModelMeta, _Program | None]] = {}
# symbolic graphs, by structure and shape: one per structure serves every offload (a fit
# search tries many), restored between walks; None where it cannot stand for every context
_GRAPHS_KEPT = 8  # a full-size MoE stack: ~1.5 MB a graph
_GRAPHS: dict[tuple[object, ...], tuple[ModelMeta, KeptGraph | None]] = {}
_SEEN: dict[tuple[object, ...], tuple[ModelMeta, None]] = {}  # structures walked plainly once
# per graph (structure, shape and offload) and cells: its (GPU, host) peaks where sized
# exactly (compute._PEAKS: a fit candidate's prompt graph alone, then both graphs)
_PEAKS: dict[tuple[object, ...], tuple[ModelMeta, dict[tuple[int, int], tuple[int, int]]]] = {}
# a symbolic graph is walked in place (sources rewired, counters set), and the replayed
# layers' graphs are core.compute's too (compute.built): one walk at a time
_COMPILING = GRAPHS_LOCK


def _compile(
    meta: ModelMeta,
    r: Resolved,
    offload: Offload,
    *,
    build: Build,
    embeddings: bool,
    graph_key: tuple[object, ...],
    shape: Shape,
) -> _Program | None:
    """Compile one structure's walk (None where a context could change more than sizes)."""
    with _COMPILING:
        hit = _GRAPHS.get(graph_key)
        if hit is not None and hit[0] is meta:
            graph = hit[1]
        else:
            graph = _sym_graph(
                meta, r, build, embeddings=embeddings, layers=_layers(meta, offload), shape=shape
            )
            if len(_GRAPHS) >= _GRAPHS_KEPT:
                _GRAPHS.clear()
            _GRAPHS[graph_key] = (meta, graph)
        if graph is None:
            return None
        tape = _Tape((_gpu_alignment(offload), HOST_ALIGNMENT))
        g = graph.walked()  # restored: core.compute or another offload may have walked it since
        try:
            sizes_of = _host_weight_sizes(meta)
            _run_walk(g, offload, sizes_of, meta.n_layer, tape=tape, same=same_layout_symbolic)
            if not tape.split:
                raise NotAffine  # not a walk two independent best-fit arenas can replay
            return _program(tape)
        except NotAffine:
            return None


def _program(tape: _Tape) -> _Program:
    """A compiled walk's tape as a program: each slot's size read back as c + a*u + b*v."""
    sizes, arena_of, aligns = tape.sizes, tape.owner, tape.aligns
    fixed: list[int] = []
    grows: list[tuple[int, int, int, int, int]] = []
    totals = [[0, 0, 0], [0, 0, 0]]
    for slot, (size, which) in enumerate(zip(sizes, arena_of, strict=True)):
        c, a, b = affine(size)
        align = aligns[which]
        total = totals[which]
        if a or b:
            if a < 0 or b < 0 or c + a + b < 0:
                raise NotAffine  # a size that shrinks with the context
            grows.append((slot, c, a, b, align))
            fixed.append(0)
            total[0] += c + align - 1
            total[1] += a
            total[2] += b
        else:
            padded = -(-c // align) * align
            fixed.append(padded)
            total[0] += padded
    g, h = totals
    gpu_events, host_events = tape.events
    return _Program(
        (tuple(gpu_events), tuple(host_events)),
        tuple(fixed),
        tuple(grows),
        ((g[0], g[1], g[2]), (h[0], h[1], h[2])),
    )


def _sym_graph(
    meta: ModelMeta,
    r: Resolved,
    build: Build,
    *,
    embeddings: bool,
    layers: tuple[int, ...],
    shape: Shape,
) -> KeptGraph | None:
    """The graph built with the cells as symbols, if it stands for every context: it must be
    the graph built at this context (shapes and strides evaluated), and the scheduler must
    not compare anything that grows with the cells. Called with GRAPHS_LOCK held; the
    replayed layers' graphs are core.compute's (compute.built)."""
    d = replace(dims(meta, r, embeddings), layers=layers)
    base = replay_layers(meta)
    if layers == base:
        sym = verified(meta, build, d, shape)
        if sym is None:
            return None
        ok = _SCHEDULABLE.get(sym)
        if ok is None:
            sym.restore()  # its sources as built (a walk may have rewired them)
            ok = _SCHEDULABLE[sym] = _schedulable(sym.g)
        return sym if ok else None
    # an offload's layers (_layers) are runs of the base's layers: each of them is built as a
    # layer of the same signature in the base graph is, so the base graph standing for every
    # context (checked once per structure: compute.verified, _schedulable) stands for this one
    if _sym_graph(meta, r, build, embeddings=embeddings, layers=base, shape=shape) is None:
        return None
    b_sym = Builder(replace(d, n_kv=CELLS * SYM_U, n_kv_swa=CELLS * SYM_V), shape)
    build(b_sym)
    return KeptGraph(b_sym.g)


# per verified symbolic graph of the replayed layers: whether the scheduler compares nothing
# that grows with the cells in it (_schedulable), asked once per graph
_SCHEDULABLE: weakref.WeakKeyDictionary[KeptGraph, bool] = weakref.WeakKeyDictionary()


def _schedulable(g: Graph) -> bool:
    """Whether the scheduler's decisions on `g` hold at every context: no SSM scan's state
    and no batch of an op on a weight (what _supported and _by_weight compare) grows with the
    cells."""
    for t in g.nodes:
        if t.op == "ssm_scan" and not _small(t.src[0].ne[0]):
            return False
        if (
            t.op not in ("rope", "flash_attn_ext")
            and any(s.external and s.is_weight for s in t.src)
            and not _small(_batch(t))
        ):
            return False
    return True


def _small(x: int) -> bool:
    """Free of the symbols: a value every context shares."""
    return -COEF_MAX < x < COEF_MAX
