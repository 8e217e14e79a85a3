"""Placement of several models on several GPUs: each rule on hand-made models, mostly sized by a
toy estimator whose numbers can be checked by hand, and the laws as properties."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from qmgui.core.errors import SizingError
from qmgui.core.footprint import (
    CONTEXT_BYTES,
    CPU,
    DeviceFootprint,
    Footprint,
    Gpu,
    estimate,
    layer_device_map,
)
from qmgui.core.launch import LaunchSettings, resolve, row_bytes
from qmgui.core.meta import ModelMeta, TensorEntry
from qmgui.core.placement import (
    DEFAULT_MIN_CONTEXT,
    AutoContext,
    Nearest,
    Pin,
    Placement,
    Request,
    place,
)
from qmgui.core.units import GIB, MIB
from tests.core.test_footprint import make_meta

N_LAYER = 7  # plus the output layer: 8 equal slices of the weights


def toy(meta: ModelMeta, s: LaunchSettings, gpus: Sequence[Gpu]) -> Footprint:
    """Weights: `weight_bytes` in 8 equal slices (7 layers and the output layer) placed by the
    real layer map; KV: `n_embd` bytes per token per layer at f16 (q8_0: 34/64 of that);
    host: `non_layer_bytes` plus the slices left on the CPU. Refuses what the engine refuses."""
    r = resolve(meta, s)
    ngl = meta.n_layer + 1 if s.n_gpu_layers is None or s.n_gpu_layers < 0 else s.n_gpu_layers
    layer_dev = layer_device_map(meta, gpus, ngl, s.tensor_split)
    slice_ = meta.weight_bytes // (meta.n_layer + 1)
    kv_layer = r.n_ctx * meta.n_embd * row_bytes(r.cache_type_k, 64) // 128
    acc = {g.name: [0, 0] for g in gpus}
    acc[CPU] = [meta.non_layer_bytes, 0]
    for il, dev in enumerate(layer_dev):
        acc[dev][0] += slice_
        if il < meta.n_layer:
            acc[dev][1] += kv_layer
    devices = tuple(DeviceFootprint(n, weights=w, kv=kv) for n, (w, kv) in acc.items())
    return Footprint(r, ngl, layer_dev, devices)


def model(
    gib: float,
    *,
    kv: int = 8 * 1024,  # bytes per token per layer: 7 layers x 4096 tokens = 224 MiB
    ctx: int = 32768,
    head: int = 32,
    host: int = 0,
) -> ModelMeta:
    return make_meta(
        n_layer=N_LAYER,
        weight_bytes=int(gib * GIB) // 8 * 8,
        n_embd=kv,
        context_length=ctx,
        head_dim_k=head,
        head_dim_v=head,
        non_layer_bytes=host,
    )


def req(name: str, gib: float, *, ctx: int = 4096, **kw: object) -> Request:
    """A request at a fixed context (one slot), or `auto=AutoContext(...)`."""
    auto = kw.pop("auto", None)
    pin = kw.pop("pin", None)
    s = LaunchSettings(ctx_size=ctx, parallel=1, **kw.pop("settings", {}))  # type: ignore[arg-type]
    return Request(name, model(gib, **kw), s, context=auto, pin=pin)  # type: ignore[arg-type]


def cards(*gib: float, free: Sequence[float] | None = None) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(f"GPU{i}", int(g * GIB), None if free is None else int(free[i] * GIB))
        for i, g in enumerate(gib)
    )


def toy_place(
    requests: Sequence[Request], gpus: Sequence[Gpu], *, reserve: int = 0, grow_context: bool = True
) -> Placement:
    return place(requests, gpus, reserve=reserve, grow_context=grow_context, estimate=toy)


KV_4K = 7 * 4096 * 8 * 1024  # the default toy KV at 4096 tokens: 224 MiB


# --- single card, best fit, largest first ------------------------------------------------------


def test_one_card_best_fit_the_fullest_card_that_holds_it() -> None:
    p = toy_place([req("m", 9)], cards(24, 12))
    m = p.model("m")
    assert m is not None
    assert m.devices == ("GPU1",)
    assert m.gpu_indices == (1,)
    assert m.settings.tensor_split == ()
    assert m.settings.n_gpu_layers == N_LAYER + 1
    assert m.settings.ctx_size == 4096
    assert m.bytes_on("GPU1") == 9 * GIB + KV_4K
    assert not m.split


def test_largest_first_lets_every_model_have_one_card() -> None:
    # smallest first would put c on GPU1 and leave a with only a split
    p = toy_place([req("c", 3.5), req("b", 4.5), req("a", 5.5)], cards(10, 6))
    assert p.fits
    assert [x.name for x in p.placed] == ["a", "b", "c"]
    assert {x.name: x.devices for x in p.placed} == {
        "a": ("GPU1",),
        "b": ("GPU0",),
        "c": ("GPU0",),
    }
    assert not any(x.split for x in p.placed)


def test_ties_are_broken_by_name_and_card_order() -> None:
    p = toy_place([req("b", 7), req("a", 7)], cards(8, 8))
    assert p.model("a").devices == ("GPU0",)  # type: ignore[union-attr]
    assert p.model("b").devices == ("GPU1",)  # type: ignore[union-attr]


def test_co_located_models_are_charged_against_each_other() -> None:
    p = toy_place([req("a", 10), req("b", 8)], cards(24), reserve=GIB)
    gpu = p.gpus[0]
    assert [s.model for s in gpu.shares] == ["a", "b"]
    assert gpu.budget == 23 * GIB
    assert gpu.used == 18 * GIB + 2 * KV_4K
    assert gpu.free == 5 * GIB - 2 * KV_4K
    # three do not fit together: the smallest are admitted first, so the most models run
    third = toy_place([req("a", 10), req("b", 8), req("c", 5)], cards(24), reserve=GIB)
    assert [x.name for x in third.placed] == ["b", "c"]
    assert [x.name for x in third.unplaced] == ["a"]
    assert "GPU0" in third.unplaced[0].reason


def test_occupied_memory_and_the_reserve_are_charged() -> None:
    p = place([req("m", 9)], cards(24, 12), reserve=GIB, occupied={"GPU1": 3 * GIB}, estimate=toy)
    assert p.model("m").devices == ("GPU0",)  # type: ignore[union-attr]
    assert p.gpus[1].occupied == 3 * GIB
    assert p.gpus[1].shares == ()


# --- tensor split --------------------------------------------------------------------------------


def test_split_only_when_no_card_holds_weights_and_a_usable_context() -> None:
    # 11.8 GiB of weights fit a 12 GiB card, with 4096 tokens of KV they do not
    auto = AutoContext(target=8192)
    p = toy_place([req("m", 11.8, auto=auto)], cards(12, 12))
    m = p.model("m")
    assert m is not None
    assert m.split
    assert m.devices == ("GPU0", "GPU1")
    assert m.settings.tensor_split == (12288.0, 12288.0)
    assert "no single card holds it" in m.notes[0]
    small = toy_place([req("m", 10, auto=auto)], cards(12, 12)).model("m")
    assert small is not None
    assert not small.split


def test_split_is_proportional_to_room_with_the_roomiest_card_last() -> None:
    p = toy_place([req("m", 18)], cards(16, 8))
    m = p.model("m")
    assert m is not None
    assert m.devices == ("GPU1", "GPU0")  # GPU0 has the most room: it gets the output layer
    assert m.gpu_indices == (1, 0)
    assert m.settings.tensor_split == (8192.0, 16384.0)
    assert m.footprint.layer_devices[-1] == "GPU0"
    for load in p.gpus:
        assert load.free is not None
        assert load.free >= 0


def test_split_takes_the_fewest_roomiest_cards() -> None:
    p = toy_place([req("m", 15)], cards(4, 10, 10))
    m = p.model("m")
    assert m is not None
    assert sorted(m.devices) == ["GPU1", "GPU2"]


def test_split_with_the_real_footprint_model() -> None:
    """Big synthetic layers sized by footprint.estimate: one 24 MiB card cannot hold them."""
    layer = 8 * MIB
    tens = [TensorEntry("token_embd.weight", "F16", (64, 1000), 128_000, 0)]
    off = 128_000
    for il in range(4):
        tens.append(TensorEntry(f"blk.{il}.ffn_up.weight", "F16", (64, 64), layer, off))
        off += layer
    tens.append(TensorEntry("output.weight", "F16", (64, 1000), 128_000, off))
    meta = make_meta(tensors=tuple(tens))
    r = Request("big", meta, LaunchSettings(ctx_size=256, parallel=1))
    # each card's CUDA context comes first (the proportional split then needs 25 MiB a card:
    # the rebalancing scales by room that includes the context)
    room = CONTEXT_BYTES["cuda"] + 25 * MIB
    gpus = cards(room / GIB, room / GIB)
    p = place([r], gpus, reserve=0)
    m = p.model("big")
    assert m is not None, p.unplaced
    assert m.split
    for d in m.devices:
        assert m.bytes_on(d) <= room
    assert m.footprint == estimate(meta, m.settings, gpus)


# --- host memory, CPU-only, pins -----------------------------------------------------------------


def test_host_memory_is_charged_when_a_host_budget_is_given() -> None:
    partial = {"n_gpu_layers": 4}  # half the slices stay on the CPU
    r = req("m", 8, settings=partial, host=GIB)
    p = place([r], cards(24), reserve=0, host_bytes=10 * GIB, estimate=toy)
    m = p.model("m")
    assert m is not None
    # layers 0-3 stay on the CPU: 4 slices of weights and their KV, plus the fixed host part
    assert m.bytes_on(CPU) == GIB + 4 * GIB + 4 * 4096 * 8 * 1024
    assert p.host.shares[0].bytes == m.bytes_on(CPU)
    tight = place([r], cards(24), reserve=0, host_bytes=4 * GIB, estimate=toy)
    assert not tight.fits
    assert "host memory" in tight.unplaced[0].reason
    unchecked = place([r], cards(24), reserve=0, estimate=toy)
    assert unchecked.fits
    assert unchecked.host.budget is None


def test_a_cpu_only_request_uses_no_gpu() -> None:
    r = req("cpu", 6, settings={"n_gpu_layers": 0})
    p = place([r], cards(8), reserve=0, host_bytes=16 * GIB, estimate=toy)
    m = p.model("cpu")
    assert m is not None
    assert m.devices == ()
    assert p.gpus[0].shares == ()
    assert p.host.shares[0].bytes == 6 * GIB + KV_4K


def test_without_a_gpu_every_model_goes_to_host_memory() -> None:
    """A machine with no GPU (a laptop): models are placed with every layer on the CPU and
    charged against the host budget; one that does not fit there says so in those words."""
    small, big = req("small", 2), req("big", 6)
    p = place([small, big], (), reserve=0, host_bytes=10 * GIB, estimate=toy)
    assert p.fits and {m.name for m in p.placed} == {"small", "big"}
    for m in p.placed:
        assert m.devices == () and m.settings.n_gpu_layers == 0
    assert sum(sh.bytes for sh in p.host.shares) == 8 * GIB + 2 * KV_4K
    tight = place([small, big], (), reserve=0, host_bytes=5 * GIB, estimate=toy)
    assert [m.name for m in tight.placed] == ["small"]
    (left,) = tight.unplaced
    assert left.name == "big" and left.reason.startswith("does not fit in host memory")
    assert "no GPU" not in left.reason


def test_a_pin_is_honoured_even_where_best_fit_would_differ() -> None:
    p = toy_place([req("m", 4, pin=Pin(("GPU0",)))], cards(24, 8))
    assert p.model("m").devices == ("GPU0",)  # type: ignore[union-attr]
    split = toy_place([req("m", 12, pin=Pin(("GPU0", "GPU1"), (1, 3)))], cards(24, 24))
    m = split.model("m")
    assert m is not None
    assert m.settings.tensor_split == (1.0, 3.0)
    assert m.notes == ()
    # 8 slices over 1:3 -> GPU0 takes layers at x < 0.25: two of them
    assert m.footprint.layer_devices.count("GPU0") == 2


@pytest.mark.parametrize(
    ("pin", "words"),
    [
        (Pin(("GPU7",)), "does not match this machine (no GPU7)"),
        (Pin(("GPU0", "GPU1"), (1, 2, 3)), "has 3 values for 2 cards"),
        (Pin(("GPU1",)), "no longer fits"),
        (Pin(("GPU0", "GPU0")), "names a card twice"),
    ],
)
def test_a_saved_placement_that_no_longer_applies_falls_back_with_a_note(
    pin: Pin, words: str
) -> None:
    p = toy_place([req("m", 10, pin=pin)], cards(24, 8))
    m = p.model("m")
    assert m is not None
    assert m.devices == ("GPU0",)
    assert words in m.notes[0]
    assert "placed automatically" in m.notes[0]


def test_pinned_requests_go_first() -> None:
    # without the pin, the larger model would take GPU1 (best fit) and the pinned one fall back
    p = toy_place([req("big", 7), req("small", 2, pin=Pin(("GPU1",)))], cards(8, 8))
    assert p.model("small").devices == ("GPU1",)  # type: ignore[union-attr]
    assert p.model("big").devices == ("GPU0",)  # type: ignore[union-attr]
    assert p.model("small").notes == ()  # type: ignore[union-attr]


# --- automatic context ---------------------------------------------------------------------------


def test_auto_context_grows_into_the_room_left_up_to_its_target() -> None:
    r = req("m", 8, auto=AutoContext(target=16384))
    p = toy_place([r], cards(24))
    m = p.model("m")
    assert m is not None
    assert m.settings.ctx_size == 16384
    capped = toy_place([req("m", 8, ctx=4096, auto=AutoContext())], cards(24))
    # no target: the trained context (32768), which fits
    assert capped.model("m").settings.ctx_size == 32768  # type: ignore[union-attr]
    tight = toy_place([req("m", 8, auto=AutoContext())], cards(9))
    ctx = tight.model("m").settings.ctx_size  # type: ignore[union-attr]
    assert ctx is not None
    assert DEFAULT_MIN_CONTEXT < ctx < 32768
    assert tight.gpus[0].free is not None
    assert 0 <= tight.gpus[0].free < 7 * 256 * 8 * 1024  # less than one more step of 256
    kept = toy_place([req("m", 8, auto=AutoContext())], cards(9), grow_context=False)
    assert kept.model("m").settings.ctx_size == DEFAULT_MIN_CONTEXT  # type: ignore[union-attr]


def test_growing_one_context_never_costs_another_model_its_place() -> None:
    a = req("a", 10, auto=AutoContext())
    b = req("b", 9, auto=AutoContext())
    p = toy_place([a, b], cards(24))
    assert p.fits
    assert p.gpus[0].free is not None
    assert p.gpus[0].free >= 0
    # a was placed first and grew first; b keeps at least its minimum
    assert p.model("b").settings.ctx_size >= DEFAULT_MIN_CONTEXT  # type: ignore[union-attr, operator]
    assert p.model("a").settings.ctx_size > DEFAULT_MIN_CONTEXT  # type: ignore[union-attr, operator]


def test_the_minimum_context_is_configurable() -> None:
    r = req("m", 11.8, auto=AutoContext(minimum=1024))
    m = toy_place([r], cards(12, 12), grow_context=False).model("m")
    assert m is not None
    assert not m.split  # 1024 tokens fit beside the weights on one card
    assert m.settings.ctx_size == 1024


# --- does not fit ------------------------------------------------------------------------------


def test_does_not_fit_is_data_with_the_reason_and_a_shorter_context() -> None:
    p = toy_place([req("m", 7, ctx=32768)], cards(8))
    assert not p.fits
    u = p.unplaced[0]
    assert u.name == "m"
    assert "does not fit with 32768 tokens of context" in u.reason
    assert "GPU0" in u.reason
    kinds = {s.kind: s for s in u.nearest}
    shorter = kinds[Nearest.CONTEXT]
    assert shorter.devices == ("GPU0",)
    n = shorter.settings.ctx_size
    assert n is not None
    assert n < 32768
    fits = toy(r := model(7), shorter.settings, cards(8))
    assert fits.device("GPU0").total <= 8 * GIB
    longer = toy(r, replace(shorter.settings, ctx_size=n + 256), cards(8))
    assert longer.device("GPU0").total > 8 * GIB


def test_a_q8_kv_cache_is_suggested_only_where_the_engine_accepts_it() -> None:
    # 7 GiB + 1.75 GiB of f16 KV at 32768 tokens; q8_0 halves the KV
    accepted = toy_place([req("m", 7, ctx=32768, head=32)], cards(8.3)).unplaced[0]
    kv = next(s for s in accepted.nearest if s.kind is Nearest.KV_CACHE)
    assert kv.settings.cache_type_k == kv.settings.cache_type_v == "q8_0"
    assert kv.settings.flash_attn == "on"
    assert kv.settings.ctx_size == 32768
    # heads of 16 values: q8_0 blocks of 32 do not divide them, so llama.cpp refuses
    refused = toy_place([req("m", 7, ctx=32768, head=16)], cards(8.3)).unplaced[0]
    assert all(s.kind is not Nearest.KV_CACHE for s in refused.nearest)
    assert any(s.kind is Nearest.CONTEXT for s in refused.nearest)


def test_partial_offload_is_suggested_with_the_real_footprint_model() -> None:
    meta = make_meta(context_length=8192)
    r = Request("m", meta, LaunchSettings(ctx_size=8192, parallel=1))
    full = estimate(meta, r.settings, cards(1)).device("GPU0").total
    gpu = (Gpu("GPU0", full - 20_000),)
    u = place([r], gpu, reserve=0).unplaced[0]
    off = next(s for s in u.nearest if s.kind is Nearest.OFFLOAD)
    assert off.devices == ("GPU0",)
    assert off.settings.n_gpu_layers is not None
    assert off.settings.n_gpu_layers < meta.n_layer + 1
    assert estimate(meta, off.settings, gpu).device("GPU0").total <= gpu[0].total_bytes
    assert "layers on the GPU" in off.summary


def test_refused_settings_are_the_reason() -> None:
    r = req("m", 2, settings={"cache_type_v": "q8_0", "flash_attn": "off"})
    u = toy_place([r], cards(8)).unplaced[0]
    assert "flash attention" in u.reason


def test_no_gpu_and_no_room() -> None:
    # no GPU and no host budget: host memory, unchecked (before issue 15: not placed at all)
    assert toy_place([req("m", 2)], ()).placed[0].devices == ()
    full = place([req("m", 2)], cards(8), reserve=0, occupied={"GPU0": 8 * GIB}, estimate=toy)
    assert full.unplaced[0].reason == "no card has any room left"


def test_names_must_be_unique() -> None:
    with pytest.raises(SizingError, match="same name"):
        toy_place([req("m", 2), req("m", 3)], cards(8))
    with pytest.raises(SizingError, match="same name"):
        toy_place([req("m", 2)], (Gpu("GPU0", GIB), Gpu("GPU0", GIB)))


# --- determinism and properties ----------------------------------------------------------------


def test_same_inputs_in_any_order_give_the_same_placement() -> None:
    reqs = [
        req("a", 9, auto=AutoContext()),
        req("b", 9, auto=AutoContext()),
        req("c", 14),
        req("d", 3, pin=Pin(("GPU2",))),
        req("e", 30),
    ]
    gpus = cards(12, 12, 8)
    first = toy_place(reqs, gpus)
    assert first == toy_place(reqs, gpus)
    rng = random.Random(7)
    for _ in range(5):
        shuffled = reqs[:]
        rng.shuffle(shuffled)
        assert toy_place(shuffled, gpus) == first


requests_st = st.lists(
    st.tuples(
        st.integers(1, 40),  # weights, half-GiB
        st.sampled_from([4096, 8192, 16384]),
        st.booleans(),  # automatic context
    ),
    min_size=1,
    max_size=5,
).map(
    lambda xs: [
        req(f"m{i}", w / 2, ctx=c, auto=AutoContext() if a else None)
        for i, (w, c, a) in enumerate(xs)
    ]
)
gpus_st = st.lists(st.integers(4, 48), min_size=1, max_size=4)


def _gpus(sizes: Sequence[int]) -> tuple[Gpu, ...]:
    return tuple(Gpu(f"GPU{i}", n * GIB // 2) for i, n in enumerate(sizes))


@settings(max_examples=60, deadline=None)
@given(
    reqs=requests_st,
    sizes=gpus_st,
    reserve=st.integers(0, 2),
    used=st.integers(0, 8),
    host=st.none() | st.integers(0, 8),
)
def test_a_placement_never_exceeds_any_budget(
    reqs: list[Request], sizes: list[int], reserve: int, used: int, host: int | None
) -> None:
    gpus = _gpus(sizes)
    occupied = {"GPU0": min(used * GIB // 2, max(gpus[0].total_bytes - reserve * GIB // 2, 0))}
    p = place(
        reqs,
        gpus,
        reserve=reserve * GIB // 2,
        occupied=occupied,
        host_bytes=None if host is None else host * GIB,
        estimate=toy,
    )
    assert len(p.placed) + len(p.unplaced) == len(reqs)
    for load in (*p.gpus, p.host):
        if load.budget is not None:
            assert load.used <= max(load.budget, load.occupied)
    by_name = {r.name: r for r in reqs}
    for m in p.placed:
        placed_on = tuple(g for n in m.devices for g in gpus if g.name == n)
        assert toy(by_name[m.name].meta, m.settings, placed_on) == m.footprint


@settings(max_examples=60, deadline=None)
@given(reqs=requests_st, sizes=gpus_st, extra=st.integers(4, 48))
def test_adding_a_gpu_never_unplaces_a_placed_model(
    reqs: list[Request], sizes: list[int], extra: int
) -> None:
    before = toy_place(reqs, _gpus(sizes))
    after = toy_place(reqs, _gpus([*sizes, extra]))
    # the law holds for single-card placements; with splits see the xfail below
    assume(not any(m.split for m in (*before.placed, *after.placed)))
    assert {m.name for m in before.placed} <= {m.name for m in after.placed}


@pytest.mark.xfail(
    strict=True,
    reason="known limitation: a split's shape depends on the cards' room, so with near-equal "
    "sizes an added card can change which split models are admitted",
)
def test_adding_a_gpu_with_splits_can_change_which_models_run() -> None:
    sizes = [(3, 4096), (29, 16384), (30, 4096), (30, 4096)]  # found by hypothesis
    reqs = [req(f"m{i}", w / 2, ctx=c) for i, (w, c) in enumerate(sizes)]
    before = toy_place(reqs, _gpus([14, 30, 30]))
    after = toy_place(reqs, _gpus([14, 30, 30, 4]))
    assert {m.name for m in before.placed} <= {m.name for m in after.placed}


@settings(max_examples=30, deadline=None)
@given(reqs=requests_st, sizes=gpus_st, seed=st.integers(0, 1000))
def test_request_order_does_not_matter(reqs: list[Request], sizes: list[int], seed: int) -> None:
    shuffled = reqs[:]
    random.Random(seed).shuffle(shuffled)
    assert toy_place(shuffled, _gpus(sizes)) == toy_place(reqs, _gpus(sizes))


# --- remote devices (llama.cpp RPC) ------------------------------------------------------------


def test_a_split_lists_remote_devices_first() -> None:
    """llama.cpp puts RPC devices before the local GPUs: the placement's order (and so its
    tensor split) follows, and the output layer stays on a local card."""
    remote = Gpu("RPC0[10.0.0.2:50052]", 16 * GIB, endpoint="10.0.0.2:50052")
    local = Gpu("GPU0", 8 * GIB)
    p = toy_place([req("m", 18)], (local, remote))
    m = p.model("m")
    assert m is not None
    assert m.devices == (remote.name, "GPU0")  # the roomier remote card is not put last
    assert m.gpu_indices == (1, 0)
    assert m.settings.tensor_split == (16384.0, 8192.0)
    assert m.footprint.layer_devices[-1] == "GPU0"
    assert remote.remote and not local.remote
