"""core.sched's compiled walk against the plain one.

core.sched builds each scheduler structure once with the KV cells as symbols, records the
ggml-alloc walk over its split graph and replays it per context (`_peaks`); `_peaks_plain`
builds and walks the graph for every context, as the scheduler replay did before it was
compiled, and is the reference. They must agree byte for byte, for the GPU and the host
buffer, with each structure compiled at one context and replayed at the others, over every
tiny architecture and the full-size headers: all layers on the GPU, about half (-ngl), none
(-ngl 0), the KV cache in host memory (-nkvo), --cpu-moe and --n-cpu-moe; flash attention on
and off; ubatches above and below the smallest context; one and two slots; F16 and Q8_0 KV
caches; Vulkan (reordering) and CUDA. The
fit searches' shortcut (a candidate over a limit without its compute buffers is not sized
further) must answer as the full check does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from qmgui.core import sched
from qmgui.core.compute import GRAPHS_LOCK, _layout, _reserve_shapes, is_embedding
from qmgui.core.errors import SizingError
from qmgui.core.fit import Budget, _fits, check, gpus_from_sizes
from qmgui.core.ggml.alloc import Arena
from qmgui.core.ggml.tensor import Tensor
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dims import Dims, Shape, dims, replay_layers
from qmgui.core.launch import LaunchSettings, Resolved, resolve
from qmgui.core.meta import ModelMeta, TensorEntry, meta_from_gguf
from qmgui.core.units import GIB
from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf, write_sparse_gguf

_TINY_CELLS = (256, 512, 1280, 4096, 33024)  # per stream: below, at and far above the windows
_FULL_CELLS = (256, 4352, 33024)


@pytest.fixture(scope="module")
def metas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelMeta]:
    root = tmp_path_factory.mktemp("sched-models")
    out: dict[str, ModelMeta] = {}
    for key, spec in PRESETS.items():
        path = write_gguf(root / f"{key}.gguf", spec)
        out[key] = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    for key, spec in FULL_SIZE_PRESETS.items():
        path = write_sparse_gguf(root / f"{key}.gguf", spec)
        out[key] = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    return out


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty compile caches: every structure is compiled in the test that uses it."""
    monkeypatch.setattr(sched, "_PROGRAMS", {})
    monkeypatch.setattr(sched, "_GRAPHS", {})
    monkeypatch.setattr(sched, "_OFFLOAD_GRAPHS", {})
    monkeypatch.setattr(sched, "_CACHE", {})
    monkeypatch.setattr(sched, "_SEEN", {})
    monkeypatch.setattr(sched, "_PEAKS", {})


def _offloads(meta: ModelMeta, backend: str) -> list[sched.Offload]:
    n = meta.n_layer
    every = frozenset(range(n))
    half = frozenset(range(n // 2))  # -ngl: the first layers stay in host memory
    out = [
        sched.Offload(backend),
        sched.Offload(backend, host_layers=half, host_caches=half),
        sched.Offload(backend, host_layers=every, host_caches=every, output_on_host=True),
        sched.Offload(backend, host_caches=every),  # -nkvo
    ]
    if meta.is_moe:
        out.append(sched.Offload(backend, host_experts=every))  # --cpu-moe
        out.append(sched.Offload(backend, host_experts=frozenset(range(max(n // 3, 1)))))
    return out


# flash attention, ubatch, slots (None: auto), KV cache type
_Grid = tuple[tuple[str, int, int | None, str], ...]


def _launches(
    meta: ModelMeta, cells: tuple[int, ...], grid: _Grid
) -> Iterator[tuple[tuple[str, int, int | None, str], list[Resolved]]]:
    """Per grid entry: the launch at each cell count per stream."""
    embd = is_embedding(meta)
    for fa, ub, slots, kv in grid:
        runs = []
        for c in cells:
            n = slots or 1
            s = LaunchSettings(
                ctx_size=c * n,
                flash_attn=fa,
                ubatch_size=ub,
                parallel=slots,
                kv_unified=False,
                cache_type_k=kv,
                cache_type_v=kv,
            )
            try:
                runs.append(resolve(meta, s, embeddings=embd))
            except SizingError:
                continue  # a combination the engine refuses
        if runs:
            yield (fa, ub, slots, kv), runs


def _check_model(
    meta: ModelMeta, cells: tuple[int, ...], grid: _Grid, backends: tuple[str, ...]
) -> int:
    build, _ = _layout(meta)
    embd = is_embedding(meta)
    checked = 0
    for backend in backends:
        for offload in _offloads(meta, backend):
            for what, runs in _launches(meta, cells, grid):
                for r in runs:
                    fast = sched._peaks(meta, r, offload, build, embd)
                    plain = sched._peaks_plain(meta, r, offload, build, embd)
                    assert fast == plain, (meta.name, backend, offload, what, r.n_ctx_seq)
                    checked += 1
    progs = [p for m, p in sched._PROGRAMS.values() if m is meta]
    assert progs
    assert all(p is not None for p in progs), f"{meta.name}: a structure fell back"
    # two graphs a launch: compiled once, replayed at the other contexts
    assert len(progs) < 2 * checked
    return checked


@pytest.mark.parametrize("key", sorted(PRESETS))
@pytest.mark.usefixtures("fresh")
def test_compiled_walk_equals_the_plain_one_on_tiny_models(
    metas: dict[str, ModelMeta], key: str
) -> None:
    meta = metas[key]
    try:
        _layout(meta)
    except SizingError:
        pytest.skip("no compute layout")
    grid: _Grid = (
        ("on", 512, None, "f16"),
        ("off", 512, None, "f16"),
        ("on", 64, None, "q8_0"),
        ("off", 32, 2, "f16"),
    )
    assert _check_model(meta, _TINY_CELLS, grid, ("vulkan", "cuda")) > 50


def _boundaries(meta: ModelMeta) -> list[sched.Offload]:
    """Offloads that split the stack into runs: the first k layers (weights and caches, or
    experts) in host memory, k at the head, in the middle and next to the last layer."""
    n = meta.n_layer
    out = []
    for k in sorted({1, 2, 3, n // 3, n // 2, n - 2, n - 1}):
        if 0 < k < n:
            head = frozenset(range(k))
            out.append(sched.Offload("cuda", host_layers=head, host_caches=head))
            out.append(sched.Offload("vulkan", host_layers=head, host_caches=head))
            if meta.is_moe:
                out.append(sched.Offload("cuda", host_experts=head))
    return out


def _runs_replay_as_the_whole_stack(meta: ModelMeta, monkeypatch: pytest.MonkeyPatch) -> int:
    build, _ = _layout(meta)
    embd = is_embedding(meta)
    compressed = sched._layers

    def whole(m: ModelMeta, offload: sched.Offload) -> tuple[int, ...]:
        return tuple(range(m.n_layer))

    checked = 0
    for s in (
        LaunchSettings(ctx_size=4096),
        LaunchSettings(ctx_size=8192, parallel=1, flash_attn="off", ubatch_size=256),
    ):
        try:
            r = resolve(meta, s, embeddings=embd)
        except SizingError:
            continue
        for offload in _boundaries(meta):
            monkeypatch.setattr(sched, "_layers", whole)
            full = sched._peaks_plain(meta, r, offload, build, embd)
            monkeypatch.setattr(sched, "_layers", compressed)
            assert sched._peaks_plain(meta, r, offload, build, embd) == full, (meta.name, offload)
            checked += 1
    return checked


@pytest.mark.parametrize("key", sorted(k for k, spec in PRESETS.items() if spec.n_layer >= 4))
def test_offload_runs_replay_as_the_whole_stack(
    metas: dict[str, ModelMeta], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sched._layers replays each run of layers kept in one place (host or GPU) as
    replay_layers replays the stack, plus the run's last layer: the same peaks, GPU and host,
    as the whole stack built and walked, at every offload boundary."""
    meta = metas[key]
    try:
        _layout(meta)
    except SizingError:
        pytest.skip("no compute layout")
    assert _runs_replay_as_the_whole_stack(meta, monkeypatch) > 0


@pytest.fixture(scope="module")
def deep_hybrid(tmp_path_factory: pytest.TempPathFactory) -> ModelMeta:
    """The tiny qwen3next 24 layers deep: attention every 4th, a period the offload runs
    keep their phase in."""
    path = tmp_path_factory.mktemp("deep-hybrid") / "qwen3next-24.gguf"
    write_gguf(path, replace(PRESETS["qwen3next"], n_layer=24, name="synth-qwen3next-24"))
    return meta_from_gguf(read_gguf_header(path), file_name=path.name)


@pytest.mark.parametrize("key", ["gemma3-12b", "qwen3-30b-a3b", "llama3-8b", "deep hybrid"])
@pytest.mark.usefixtures("fresh")
def test_an_offload_graph_serves_the_next_offload_of_the_same_layer_kinds(
    metas: dict[str, ModelMeta],
    deep_hybrid: ModelMeta,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sched._offload_graph: the graph of one offload's layers, stamped with the next
    offload's layers where their kinds come in the same order (a fit search's neighbouring
    candidates), walks as the next offload's graph built afresh, placed as it walks
    (_walk_arenas, the reference), at every -ngl / --n-cpu-moe boundary of the stack."""
    meta = deep_hybrid if key == "deep hybrid" else metas[key]
    build, _ = _layout(meta)
    r = resolve(meta, LaunchSettings(ctx_size=4096))
    sizes = sched._host_weight_sizes(meta)
    builds: list[Dims] = []

    class Counted(Builder):
        def __init__(self, d: Dims, shape: Shape) -> None:
            builds.append(d)
            super().__init__(d, shape)

    monkeypatch.setattr(sched, "Builder", Counted)
    reused = 0
    for k in range(1, meta.n_layer):
        head = frozenset(range(k))
        offload = (
            sched.Offload("cuda", host_experts=head)
            if meta.is_moe
            else sched.Offload("vulkan", host_layers=head, host_caches=head)
        )
        d = replace(dims(meta, r, False), layers=sched._layers(meta, offload))
        if d.layers == replay_layers(meta):
            continue
        for shape in _reserve_shapes(r, False):
            n = len(builds)
            with GRAPHS_LOCK:
                g = sched._offload_graph(meta, build, d, shape)
                reused += len(builds) == n
                fresh = Builder(d, shape)
                build(fresh)
                # the same graph, stamped alike
                assert [(t.op, t.ne, t.layer) for t in g.nodes + g.leafs] == [
                    (t.op, t.ne, t.layer) for t in fresh.g.nodes + fresh.g.leafs
                ], (meta.name, k, shape)
                got = sched._walk(g, offload, sizes, meta.n_layer)
            want = sched._walk_arenas(fresh.g, offload, sizes, meta.n_layer)
            assert got == want, (meta.name, k, shape)
    assert reused


def test_a_tape_whose_arenas_are_not_apart_places_as_two_arenas() -> None:
    """sched._Tape: a free by the other arena than the one that placed it cannot be run per
    arena; the tape then plays its events, in order, through two Arenas, as the walk placing
    as it goes would have."""
    aligns = (64, 32)
    steps = [(0, 100), (1, 40), (0, 300), ("free", 0, 0), (1, 500), ("free", 1, 2)]
    steps += [(0, 90), (1, 70), ("free", 1, 1), (0, 1000), ("free", 0, 5)]
    tape = sched._Tape(aligns)
    arenas = (Arena(aligns[0]), Arena(aligns[1]))
    placed: list[tuple[Tensor, int]] = []  # per allocation: the tensor (its slot), the offset
    for step in steps:
        if step[0] == "free":
            _, which, i = step
            assert isinstance(which, int) and isinstance(i, int)
            t, offset = placed[i]
            tape.release(which, t)
            arenas[which].free(offset, t.ne[0])
        else:
            which, n = step
            assert isinstance(which, int) and isinstance(n, int)
            t = Tensor("i8", (n,))
            t.offset = tape.alloc(which, n)
            placed.append((t, arenas[which].alloc(n)))
    assert not tape.split
    assert tape.peaks() == (arenas[0].max_size, arenas[1].max_size)
    apart = sched._Tape(aligns)
    x, y = Tensor("i8", (100,)), Tensor("i8", (40,))
    x.offset, y.offset = apart.alloc(0, 100), apart.alloc(1, 40)
    apart.release(0, x)
    apart.alloc(0, 50)
    apart.release(1, y)
    assert apart.split
    assert apart.peaks() == (128, 64)


def _more_bits(il: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers a Q4_K_M file keeps in Q6_K."""
    return il < n // 8 or il >= 7 * n // 8 or (il - n // 8) % 3 == 2


_MIXES = {
    "q4_k_m": _more_bits,
    "one layer in the middle": lambda il, n: il == n // 2,
    "the first layer": lambda il, n: il == 0,
}


def _mixed(meta: ModelMeta, bigger: object) -> ModelMeta:
    """`meta` with the ffn_down / attn_v weights (experts too) of the layers `bigger` picks
    1.46x larger, as Q6_K is to Q4_K: the same shapes, other bytes."""
    assert callable(bigger)

    def bump(t: TensorEntry) -> TensorEntry:
        parts = t.name.split(".", 2)
        if parts[0] != "blk" or not parts[2].startswith(("ffn_down", "attn_v")):
            return t
        return (
            replace(t, nbytes=t.nbytes * 210 // 144) if bigger(int(parts[1]), meta.n_layer) else t
        )

    return replace(meta, tensors=tuple(bump(t) for t in meta.tensors))


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelMeta]:
    """Tiny presets 24 layers deep: deep enough for runs to be replayed in part."""
    root = tmp_path_factory.mktemp("deep-models")
    out: dict[str, ModelMeta] = {}
    for key in ("qwen3moe", "qwen3next", "llama"):
        path = write_gguf(root / f"{key}.gguf", replace(PRESETS[key], n_layer=24))
        out[key] = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    return out


@pytest.mark.parametrize("mix", sorted(_MIXES))
@pytest.mark.parametrize("key", ["qwen3moe", "qwen3next", "llama"])
def test_offload_runs_of_mixed_quantizations_replay_as_the_whole_stack(
    deep: dict[str, ModelMeta], key: str, mix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layers of one signature whose host weights differ in size (a K-quant's Q6_K layers)
    copy different bytes into the GPU's compute buffer: a run holding them is replayed whole,
    and the peaks are the whole stack's."""
    assert _runs_replay_as_the_whole_stack(_mixed(deep[key], _MIXES[mix]), monkeypatch) > 0


@pytest.mark.slow
@pytest.mark.parametrize("mix", sorted(_MIXES))
def test_offload_runs_of_mixed_quantizations_on_a_full_size_header(
    metas: dict[str, ModelMeta], mix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = _mixed(metas["qwen3-30b-a3b"], _MIXES[mix])
    assert _runs_replay_as_the_whole_stack(meta, monkeypatch) > 0


def _fixture_stacks() -> list[str]:
    """The measured fixtures' models deep enough to compress (fixtures/compute/models.json:
    the deeper presets, irregular stacks such as LFM2's included)."""
    from tests.core.test_compute import _models

    return sorted(k for k, m in _models().items() if 6 <= m.n_layer <= 16)


@pytest.mark.parametrize("key", _fixture_stacks())
def test_offload_runs_of_the_measured_models_replay_as_the_whole_stack(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.core.test_compute import _models

    assert _runs_replay_as_the_whole_stack(_models()[key], monkeypatch) > 0


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(FULL_SIZE_PRESETS))
def test_offload_runs_replay_as_the_whole_stack_on_full_size_headers(
    metas: dict[str, ModelMeta], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _runs_replay_as_the_whole_stack(metas[key], monkeypatch) > 0


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(FULL_SIZE_PRESETS))
@pytest.mark.usefixtures("fresh")
def test_compiled_walk_equals_the_plain_one_on_full_size_headers(
    metas: dict[str, ModelMeta], key: str
) -> None:
    grid: _Grid = (("on", 512, None, "f16"), ("off", 512, None, "f16"))
    if key in ("qwen3-4b", "llama3-8b"):  # the smaller headers carry the rest of the grid
        grid += (("on", 256, None, "q8_0"), ("off", 1024, 2, "f16"))
    backends = ("vulkan", "cuda") if key == "qwen3-4b" else ("vulkan",)
    assert _check_model(metas[key], _FULL_CELLS, grid, backends) > 20


@pytest.mark.usefixtures("fresh")
def test_the_public_answer_is_the_plain_one(metas: dict[str, ModelMeta]) -> None:
    """sched_compute_bytes (margin, notes, its result cache) over the compiled walk."""
    meta = metas["qwen3next"]  # gated delta net: notes and the unfused bound on top
    build, margin = _layout(meta)
    every = frozenset(range(meta.n_layer))
    for offload in (sched.Offload("vulkan"), sched.Offload("vulkan", host_caches=every)):
        for c in _TINY_CELLS:
            r = resolve(meta, LaunchSettings(ctx_size=c))
            got = sched.sched_compute_bytes(meta, r, offload)
            gpu, host = sched._peaks_plain(meta, r, offload, build, False)
            extra = sched._unfused_delta_net_bound(meta, r, False) if offload.host_caches else 0
            assert (got.gpu, got.host) == (gpu + extra, host)
            assert margin == 1.0
            assert bool(got.notes) == bool(offload.host_caches)


def _quadratic(b: Builder) -> None:
    """A graph with a tensor n_kv x n_kv: not affine in the cells."""
    g = b.g
    square = g.op("scale", g.input("f32", b.d.n_kv, b.d.n_kv // 256))
    g.expand(g.mul_mat(g.weight(square.ne[0], 8), square))


def _batch_of_cells(b: Builder) -> None:
    """A matmul on a weight whose batch is the cells: where it runs depends on the context
    (offload_op's 32 rows), so its structure cannot be compiled."""
    g = b.g
    x = g.op("scale", g.input("f32", 64, b.d.n_kv // 256))
    g.expand(g.mul_mat(g.weight(64, 8), x))


def _affine_graph(b: Builder) -> None:
    g = b.g
    wide = g.op("scale", g.input("f32", b.d.n_kv, 4))
    g.expand(g.mul_mat(g.weight(b.d.n_kv, 8), g.op("add", wide, wide)))


@pytest.mark.usefixtures("fresh")
def test_structures_a_context_could_change_fall_back_to_the_plain_walk(
    metas: dict[str, ModelMeta],
) -> None:
    meta = metas["llama"]
    offloads = (sched.Offload("vulkan"), sched.Offload("vulkan", host_layers=frozenset({0})))
    for build, compiled in ((_quadratic, False), (_batch_of_cells, False), (_affine_graph, True)):
        for offload in offloads:
            for cells in (256, 1024, 8192, 32768):
                r = resolve(meta, LaunchSettings(ctx_size=cells))
                fast = sched._peaks(meta, r, offload, build, False)
                assert fast == sched._peaks_plain(meta, r, offload, build, False)
        progs = [p for key, (_, p) in sched._PROGRAMS.items() if build in key]
        assert progs
        assert all((p is not None) == compiled for p in progs), build.__name__


@pytest.mark.parametrize("key", ["qwen3-30b-a3b", "gemma3-12b"])
def test_the_fit_shortcut_answers_as_the_full_check(metas: dict[str, ModelMeta], key: str) -> None:
    """fit._fits settles a candidate over a limit without its compute buffers: the searches
    must get the answer check() gives, on both sides of every limit."""
    meta = metas[key]
    n = meta.n_layer
    answers = set()
    for size in (8, 12, 16):
        budget = Budget(gpus=gpus_from_sizes([size * GIB]), host_bytes=24 * GIB)
        for ctx in (4096, 32768):
            base = LaunchSettings(ctx_size=ctx)
            cands = [replace(base, n_gpu_layers=k) for k in range(0, n + 2, 4)]
            if meta.is_moe:
                cands += [replace(base, n_gpu_layers=n + 1, n_cpu_moe=k) for k in range(0, n, 4)]
            for s in cands:
                want = check(meta, s, budget).fits
                assert _fits(meta, s, budget) == want, (size, s)
                answers.add(want)
    assert answers == {True, False}


@pytest.mark.usefixtures("fresh")
def test_a_graph_walked_at_a_context_is_not_walked_again_for_the_prompt_alone(
    metas: dict[str, ModelMeta], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch sized once (walked plainly: its first ask) and then over its prompt graph
    alone at the same context (a fit search's guess, compute.prompt_only) is not walked or
    compiled again (sched._PEAKS), and the prompt graph's peaks are the plain walk's."""
    from qmgui.core import compute

    meta = metas["qwen3next"]
    build, _ = _layout(meta)
    r = resolve(meta, LaunchSettings(ctx_size=2048))
    offload = sched.Offload("vulkan")
    both = sched._peaks(meta, r, offload, build, False)
    assert not sched._PROGRAMS  # asked once: walked plainly
    calls: list[object] = []
    monkeypatch.setattr(sched, "_walk_plain", lambda *a: calls.append(a) or (0, 0))
    monkeypatch.setattr(sched, "_compile", lambda *a, **k: calls.append(a))
    with compute.prompt_only():
        prompt = sched._peaks(meta, r, offload, build, False)
    assert not calls
    monkeypatch.undo()
    with compute.prompt_only():
        assert prompt == sched._peaks_plain(meta, r, offload, build, False)
    assert prompt[0] <= both[0] and prompt[1] <= both[1]
