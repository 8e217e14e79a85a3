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
shapes and views, from src/models/<arch>.cpp and src/llama-graph.cpp): one module per family
in qmgui.core.models, from the blocks they share in qmgui.core.graph. It then runs a port of
ggml-alloc's allocator over it (qmgui.core.ggml.alloc). The context only resizes tensors that
span the KV cache, so each graph's walk is compiled once per structure and replayed per
context over affine sizes (qmgui.core.ggml.compile). The terms that come out on top are

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

import contextlib
import math
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import fields, replace
from typing import TypeVar

from qmgui.core.errors import SizingError
from qmgui.core.ggml.alloc import peak_bytes
from qmgui.core.ggml.compile import (
    CELLS,
    SYM_U,
    SYM_V,
    NotAffine,
    Program,
    compile_walk,
    peak_taped,
    same_graph,
)
from qmgui.core.ggml.graph import Graph
from qmgui.core.graph.builder import Build, Builder
from qmgui.core.graph.dims import (
    CACHE_KEPT,
    Dims,
    Shape,
    dims,
    replay_layers,
    swa_cells,
    tensor_shapes,
)
from qmgui.core.launch import Resolved
from qmgui.core.meta import ModelClass, ModelMeta, Pooling
from qmgui.core.models import family_of, generic

__all__ = ["GENERIC_MARGIN", "compute_buffer_bytes", "is_embedding", "output_buffer_bytes"]


# The first llama.cpp build known to build the mixed token/embedding input branch in
# build_inp_embd (src/llama-graph.cpp: inp_mixed_tokens, inp_mixed_slots, inp_mixed_embd and
# set_rows(dup(inp_mixed_embd), get_rows(tok_embd, inp_mixed_tokens), inp_mixed_slots)) and
# to scale Gemma 3's token rows there (inp_scale_rows). b10435 has neither and b11434 has
# both; the build in between that brought them is not pinned, so this is the measured
# boundary: builds from 10436 to 11433 are predicted as b11434.
MIXED_BATCH_BUILD = 11434


_BYTES_CACHE: dict[tuple[object, ...], tuple[ModelMeta, int]] = {}
P = TypeVar("P")  # a graph's peak: bytes (the CPU's), or (GPU, host) bytes (core.sched)


# Architectures the generic layout is known to fall short on: no layout, so the plan charges
# a bound (core.bounds). (deepseek4, once here, has its own layout: models/deepseek4.py.)
_NO_LAYOUT: dict[str, str] = {}


# Run on gemma2, gemma3 and gpt-oss (which have layouts of their own), the generic layout
# came out between 0.987 and 1.008 of the measured buffer (test_generic_layout_margin);
# layouts not checked against the engine get this factor on top.
GENERIC_MARGIN = 1.02


def is_embedding(meta: ModelMeta) -> bool:
    """Whether qmgui launches the model with `--embedding` (embedding and rerank models)."""
    return meta.model_class in (ModelClass.EMBEDDING, ModelClass.RERANK) or (
        meta.pooling != Pooling.NONE
    )


def _outputs_max(r: Resolved, embeddings: bool) -> int:
    """The server reserves one output row per slot; an embedding context one per batch token
    (llama_context: n_outputs_max)."""
    return r.n_batch if embeddings else r.n_seq


def _reserve_shapes(r: Resolved, embeddings: bool) -> list[Shape]:
    """sched_reserve: the prompt graph, then the one-token-per-slot graph."""
    n_seqs = r.n_seq
    n_tokens = min(r.n_ctx, r.n_ubatch)
    if n_tokens % n_seqs:
        n_tokens = -(-n_tokens // n_seqs) * n_seqs  # graph_reserve rounds to whole sequences
    pp = Shape(n_tokens, n_seqs, min(n_tokens, _outputs_max(r, embeddings)))
    if _PROMPT_ONLY.get():
        return [pp]
    return [pp, Shape(n_seqs, n_seqs, n_seqs)]


# set within prompt_only(): the buffers are sized over the prompt graph alone, a lower bound of
# each (a buffer is the larger of the two graphs' peaks). A fit search settles a candidate
# offload that is over its limit by then without compiling its token-generation graph. Per
# thread (a ContextVar); the result caches keep the two apart
_PROMPT_ONLY: ContextVar[bool] = ContextVar("compute_prompt_only", default=False)


def prompt_only() -> contextlib.AbstractContextManager[None]:
    """Within: compute buffers are the prompt graph's, a lower bound (see _PROMPT_ONLY)."""
    return switched_on(_PROMPT_ONLY)


@contextlib.contextmanager
def switched_on(flag: ContextVar[bool]) -> Iterator[None]:
    """Within: `flag` is True in this thread (and back as it was after)."""
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


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
    from MIXED_BATCH_BUILD on; see Builder.inp_embd). Raises SizingError for another
    backend, or for an architecture without a layout whose graph the generic one cannot
    stand for (recurrent, MLA, encoder).
    """
    if backend != "CPU":
        raise SizingError(f"the compute buffer is modelled for the CPU backend only, not {backend}")
    if meta.n_layer <= 0 or meta.n_embd <= 0:
        raise SizingError(f"{meta.name}: no layer count or embedding width in the header")
    check_graph_size(meta)
    embd = is_embedding(meta) if embeddings is None else embeddings
    # the same launch asked again (a slider moved back, a fit search confirming its answer)
    key = (id(meta), r, embd, mixed_batch, _PROMPT_ONLY.get())
    hit = _BYTES_CACHE.get(key)
    if hit is not None and hit[0] is meta:
        return hit[1]
    build, margin = _layout(meta, mixed_batch=mixed_batch)
    try:
        peak = _reserve_bytes(meta, r, build, embd)
    except GRAPH_FAULTS as e:
        raise graph_fault(meta, e) from e
    result = peak if margin == 1.0 else math.ceil(peak * margin)
    if len(_BYTES_CACHE) >= 64 * CACHE_KEPT:
        _BYTES_CACHE.clear()
    _BYTES_CACHE[key] = (meta, result)
    return result


def _layout(meta: ModelMeta, *, mixed_batch: bool = False) -> tuple[Build, float]:
    """The builder for this model and the margin on its result: none where measured; the
    generic margin for relatives, pre-MLA DeepSeek GGUFs, reranker heads and the generic
    layout. `mixed_batch`: the builder as of MIXED_BATCH_BUILD (_mixed_batch)."""
    build, margin = _layout_of(meta)
    return (_mixed_batch(build) if mixed_batch else build), margin


def _mixed_batch(build: Build) -> Build:
    """`build` with build_inp_embd's mixed-batch branch (Builder.mixed_batch). One wrapper
    per family, so the wrapper can key the compiled-walk caches as the family does."""
    hit = _MIXED_BUILDS.get(build)
    if hit is not None:
        return hit

    def wrapped(b: Builder) -> None:
        b.mixed_batch = True
        build(b)

    _MIXED_BUILDS[build] = wrapped
    return wrapped


_MIXED_BUILDS: dict[Build, Build] = {}


def _layout_of(meta: ModelMeta) -> tuple[Build, float]:
    arch = meta.architecture
    unmeasured = (meta.mla is not None and not meta.mla.key_length_mla) or (
        meta.pooling == Pooling.RANK
    )
    family = family_of(arch)
    if family is not None:
        if arch in family.verified:
            return family.build, GENERIC_MARGIN if unmeasured else 1.0
        return family.build, GENERIC_MARGIN  # laid out, or a close relative
    if arch in _NO_LAYOUT:
        raise SizingError(
            f"{meta.name}: no compute-buffer layout for {arch!r} ({_NO_LAYOUT[arch]})"
        )
    if meta.is_recurrent or meta.ssm or meta.rwkv or meta.mla or not meta.causal:
        raise SizingError(
            f"{meta.name}: no compute-buffer layout for architecture {arch!r} "
            "(recurrent, latent-attention or encoder layers)"
        )
    return generic(), GENERIC_MARGIN


def _reserve_bytes(meta: ModelMeta, r: Resolved, build: Build, embeddings: bool) -> int:
    """The larger of the prompt and token-generation reservations, as ggml-alloc sizes them.

    Each graph's walk is compiled once per structure (see Program) and replayed over the
    context's tensor sizes; where that cannot be done exactly, the graph is built and walked
    as _reserve_bytes_plain does."""
    n_kv, n_kv_swa = r.n_ctx_seq, swa_cells(meta, r)
    if n_kv <= 0 or n_kv_swa <= 0 or n_kv % CELLS or n_kv_swa % CELLS:
        return _reserve_bytes_plain(meta, r, build, embeddings)
    u, v = n_kv // CELLS, n_kv_swa // CELLS
    # everything the graphs' topology depends on; the contexts only size their tensors
    structure = (
        id(meta),
        build,
        embeddings,
        replay_layers(meta),
        r.n_stream,
        r.kv_unified,
        r.flash_attn,
        r.cache_type_k,
        r.cache_type_v,
    )
    d: Dims | None = None
    peak = 0
    for shape in _reserve_shapes(r, embeddings):
        key = (*structure, shape)
        peaks = peaks_of(_PEAKS, meta, key)
        known = peaks.get((u, v))
        if known is not None:  # this graph at this context, sized before
            peak = max(peak, known)
            continue
        hit = _PROGRAMS.get(key)
        if hit is not None and hit[0] is meta:
            prog = hit[1]
        else:
            if d is None:
                d = dims(meta, r, embeddings)
            if not seen_before(meta, key, _SEEN):
                with GRAPHS_LOCK:  # asked once so far: walked plainly (see seen_before)
                    graph = built(meta, build, d, shape).walked()
                    peak = max(peak, kept_peak(peaks, u, v, peak_taped(graph)))
                continue
            prog = _program(meta, build, d, shape)
            if len(_PROGRAMS) >= 16 * CACHE_KEPT:
                _PROGRAMS.clear()
            _PROGRAMS[key] = (meta, prog)
        if prog is None:
            if d is None:
                d = dims(meta, r, embeddings)
            b = Builder(d, shape)
            build(b)
            peak = max(peak, kept_peak(peaks, u, v, peak_taped(b.g)))
        elif prog.bound(u, v) > peak:  # a graph that cannot outgrow the peak is not walked
            peak = max(peak, kept_peak(peaks, u, v, prog.peak(u, v)))
    return peak


def peaks_of(
    cache: dict[tuple[object, ...], tuple[ModelMeta, dict[tuple[int, int], P]]],
    meta: ModelMeta,
    key: tuple[object, ...],
) -> dict[tuple[int, int], P]:
    """Graph `key`'s peaks by cells in `cache` (compute._PEAKS, sched._PEAKS), a new table
    if none: the key is hashed once a shape."""
    kept = cache.get(key)
    if kept is None or kept[0] is not meta:
        if len(cache) >= 16 * CACHE_KEPT:
            cache.clear()
        kept = cache[key] = (meta, {})
    return kept[1]


def kept_peak(peaks: dict[tuple[int, int], P], u: int, v: int, peak: P) -> P:
    """`peak`, kept in a graph's `peaks` as its peak at cells u, v (see peaks_of)."""
    if len(peaks) >= 64:
        peaks.clear()
    peaks[(u, v)] = peak
    return peak


def seen_before(
    meta: ModelMeta, key: tuple[object, ...], seen: dict[tuple[object, ...], tuple[ModelMeta, None]]
) -> bool:
    """Whether a graph structure (`key`) was asked before, noting it in `seen` if not.
    Compiling a structure's walk costs about two plain walks plus the symbolic graph's build
    and its check against the real one (verified), so a structure asked once (a single
    estimate: the window opening a model, a library's fit badges) is walked plainly over
    the graph built at its context, which the scheduler's first walk shares (built), and
    compiled when asked again (a slider moved, a second estimate). Within `searching()` (a
    search, which asks again) every structure is compiled at its first ask."""
    if _SEARCHING.get():
        return True
    hit = seen.get(key)
    if hit is not None and hit[0] is meta:
        return True
    if len(seen) >= 16 * CACHE_KEPT:
        seen.clear()
    seen[key] = (meta, None)
    return False


# set while a search that asks each structure again runs (core.fit.max_context: the top
# context, then its steps): its first ask compiles at once rather than walk plainly first.
# Per thread (a ContextVar): a worker's search leaves the others' asks as they are
_SEARCHING: ContextVar[bool] = ContextVar("compute_searching", default=False)


def searching() -> contextlib.AbstractContextManager[None]:
    """Within: every structure is compiled at its first ask (see seen_before)."""
    return switched_on(_SEARCHING)


def _reserve_bytes_plain(meta: ModelMeta, r: Resolved, build: Build, embeddings: bool) -> int:
    """_reserve_bytes the plain way: build each graph for this context and walk it."""
    d = dims(meta, r, embeddings)
    peak = 0
    for shape in _reserve_shapes(r, embeddings):
        b = Builder(d, shape)
        build(b)
        peak = max(peak, peak_bytes(b.g))
    return peak


def _program(meta: ModelMeta, build: Build, d: Dims, shape: Shape) -> Program | None:
    """Compile one graph's walk (None where a context could change more than sizes)."""
    with GRAPHS_LOCK:
        sym = verified(meta, build, d, shape)
        if sym is None:
            return None
        return compile_walk(sym.walked())


def verified(meta: ModelMeta, build: Build, d: Dims, shape: Shape) -> KeptGraph | None:
    """`build`'s graph over `d` and `shape` with the cells as symbols, if it is the graph
    built at d's cells (ggml.compile.same_graph): then it stands for every context, for the
    CPU's walk here and the scheduler's (core.sched). None if not. Checked once per
    structure (the verdict kept apart from the graphs, which _BUILT may drop). Call with
    GRAPHS_LOCK held, and walk it through walked()."""
    d_sym = replace(d, n_kv=CELLS * SYM_U, n_kv_swa=CELLS * SYM_V)
    key = built_key(meta, build, d_sym, shape)
    hit = _VERIFIED.get(key)
    ok = hit[1] if hit is not None and hit[0] is meta else None
    if ok is False:
        return None
    sym = built(meta, build, d_sym, shape)
    if ok is None:
        real = built(meta, build, d, shape)
        sym.restore()
        real.restore()
        try:
            ok = same_graph(sym.g, real.g, d.n_kv // CELLS, d.n_kv_swa // CELLS)
        except NotAffine:
            ok = False
        if len(_VERIFIED) >= 16 * CACHE_KEPT:
            _VERIFIED.clear()
        _VERIFIED[key] = (meta, ok)
    return sym if ok else None


class KeptGraph:
    """A built graph kept for more walks, and what a walk changes in it, to restore. A walk
    takes the graph through walked(); whoever reads it otherwise restore()s it first (a
    no-op where nothing walked it since)."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.dirty = False  # walked since it was built or restored

    def walked(self) -> Graph:
        """The graph as built, to walk (and restore before its next use)."""
        self.restore()
        self.dirty = True
        return self.g

    def restore(self) -> None:
        """The graph as built: no counters, nothing placed, the sources it was built with."""
        if not self.dirty:
            return
        self.dirty = False
        g = self.g
        for t, src in g.rewired:  # core.sched's copies read instead of their sources
            t.src = src
        g.rewired.clear()
        for t in g.leafs:
            t.n_children = t.n_views = t.offset = 0
            t.allocated = False
        for t in g.nodes:
            t.n_children = t.n_views = t.offset = 0
            t.allocated = False


# The graphs of a launch's replayed layers, at its context and with the cells as symbols:
# core.compute compiles the CPU's walk over them and core.sched, with every layer on the GPU,
# walks or compiles the scheduler's over the same ones, so a model's first estimate builds
# each once. Walks change them (counters, placements, core.sched's copies as sources): a
# walk holds GRAPHS_LOCK and restores the graph first.
_BUILT: dict[tuple[object, ...], tuple[ModelMeta, KeptGraph]] = {}
_BUILT_KEPT = 8  # two structures of two shapes, real and symbolic: one launch's graphs
GRAPHS_LOCK = threading.Lock()
_DIMS_HASHED = tuple(f.name for f in fields(Dims) if f.name != "shapes")  # shapes: a dict


def built(meta: ModelMeta, build: Build, d: Dims, shape: Shape) -> KeptGraph:
    """`build`'s graph over `d` and `shape`, built once (see _BUILT). Call with GRAPHS_LOCK
    held, and walk it through walked()."""
    key = built_key(meta, build, d, shape)
    hit = _BUILT.get(key)
    if hit is not None and hit[0] is meta:
        return hit[1]
    b = Builder(d, shape)
    build(b)
    kept = KeptGraph(b.g)
    if len(_BUILT) >= _BUILT_KEPT:
        _BUILT.clear()
    _BUILT[key] = (meta, kept)
    return kept


def built_key(meta: ModelMeta, build: Build, d: Dims, shape: Shape) -> tuple[object, ...]:
    """What `build`'s graph over `d` and `shape` depends on: the key of the graphs kept."""
    # the model's own shapes (dims' are): named by the model, whose id is in the key
    shapes = d.shapes
    own = shapes is tensor_shapes(meta)
    return (
        id(meta),
        build,
        shape,
        "model's" if own else tuple(sorted(shapes.items())),
        *(getattr(d, name) for name in _DIMS_HASHED),
    )


# per symbolic graph (its _BUILT key): whether it is the real graph (verified)
_VERIFIED: dict[tuple[object, ...], tuple[ModelMeta, bool]] = {}
_PROGRAMS: dict[tuple[object, ...], tuple[ModelMeta, Program | None]] = {}
_SEEN: dict[tuple[object, ...], tuple[ModelMeta, None]] = {}  # structures walked plainly once
# per graph (structure and shape) and cells: its peak, where it was sized exactly. A fit
# search sizes a context's prompt graph alone first (prompt_only) and then both graphs, or
# the reverse: the graph sized once either way
_PEAKS: dict[tuple[object, ...], tuple[ModelMeta, dict[tuple[int, int], int]]] = {}


def output_buffer_bytes(meta: ModelMeta, r: Resolved, *, embeddings: bool | None = None) -> int:
    """Bytes of `llama_context: CPU output buffer size` at start-up.

    llama_context::output_reserve sizes it for one output row per slot: f32 logits over the
    vocabulary, plus an f32 embedding row when the context returns embeddings (`--embedding`;
    None: embedding and rerank models do). It grows at run time only if a batch asks for
    more outputs than slots.
    """
    embd = is_embedding(meta) if embeddings is None else embeddings
    per_row = (meta.vocab_size or 0) + (meta.n_embd if embd else 0)
    return per_row * r.n_seq * 4
