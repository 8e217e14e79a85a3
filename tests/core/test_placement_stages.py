"""Placement for role sets (`core.placement`): replicas on distinct cards (`Request.apart`),
slots grown after the context (`Request.max_slots`), idle cards widening contexts
(`widen_idle`) and stages placed against what the earlier ones left (`place_stages`). Sized
by the toy estimator of test_placement, whose numbers can be checked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qmgui.core.errors import SizingError
from qmgui.core.footprint import CPU, Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.placement import WIDEN_GAIN, AutoContext, Request, place, place_stages
from qmgui.core.units import GIB, MIB
from tests.core.test_placement import N_LAYER, cards, model, req, toy

KV_TOKEN = N_LAYER * 8 * 1024  # the toy's KV bytes per token (7 layers x 8 KiB)


def p_cards(room: int) -> tuple[Gpu, ...]:
    """One card with `room` bytes."""
    return (replace(cards(1)[0], total_bytes=room),)


def replicas(name: str, gib: float, n: int, *, apart: bool = True) -> list[Request]:
    one = req(name, gib)
    return [replace(one, name=f"{name}-{i}", apart=name if apart else None) for i in range(n)]


def test_replicas_never_share_a_card() -> None:
    # both fit on GPU0 (best fit would stack them there); apart puts one on each card
    stacked = place(replicas("e", 2, 2, apart=False), cards(8, 6), reserve=0, estimate=toy)
    assert {x.devices for x in stacked.placed} == {("GPU1",)}
    p = place(replicas("e", 2, 2), cards(8, 6), reserve=0, estimate=toy)
    assert p.fits
    assert sorted(x.devices for x in p.placed) == [("GPU0",), ("GPU1",)]


def test_a_replica_without_a_card_of_its_own_is_unplaced() -> None:
    p = place(replicas("e", 2, 3), cards(8, 6), reserve=0, estimate=toy)
    assert len(p.placed) == 2 and len(p.unplaced) == 1
    assert len({x.devices for x in p.placed}) == 2


def test_slots_grow_after_the_context_each_keeping_the_whole_window() -> None:
    # 1 GiB of weights; a 4096-token window is 224 MiB of KV: 3 windows fit in 1.75 GiB, not 4
    auto = AutoContext(target=4096, minimum=1024)
    r = Request("chat", model(1), LaunchSettings(parallel=1), context=auto, max_slots=4)
    room = GIB + 3 * 4096 * KV_TOKEN + 100 * MIB
    p = place([r], p_cards(room), reserve=0, estimate=toy)
    (x,) = p.placed
    s = x.footprint.settings
    assert (s.n_seq, s.n_ctx_seq, s.n_ctx) == (3, 4096, 3 * 4096)
    # the same request without a slot ceiling keeps one slot
    one = place([replace(r, max_slots=None)], p_cards(room), reserve=0, estimate=toy)
    assert one.placed[0].footprint.settings.n_seq == 1


def test_slots_stay_at_one_when_the_context_fell_short_of_its_target() -> None:
    auto = AutoContext(target=32768, minimum=1024)
    r = Request("chat", model(1), LaunchSettings(parallel=1), context=auto, max_slots=4)
    p = place([r], p_cards(GIB + 8192 * KV_TOKEN), reserve=0, estimate=toy)
    s = p.placed[0].footprint.settings
    assert s.n_seq == 1 and 4096 <= s.n_ctx_seq < 32768


def test_a_slot_share_keeps_the_slots_within_that_share_of_the_card() -> None:
    # 1 GiB of weights, 8192-token windows of 448 MiB: a 4 GiB card holds four of them, half
    # of it (2 GiB, the card less the reserve) two: 1 GiB + 2 x 448 MiB, not 1 GiB + 3 x 448
    auto = AutoContext(target=8192, minimum=1024)
    r = Request("vision", model(1), LaunchSettings(parallel=1), context=auto, max_slots=4)
    gpus = (replace(cards(1)[0], total_bytes=4 * GIB + 256 * MIB),)
    free = place([r], gpus, reserve=256 * MIB, estimate=toy).placed[0]
    assert free.footprint.settings.n_seq == 4
    half = place([replace(r, slot_share=0.5)], gpus, reserve=256 * MIB, estimate=toy)
    s = half.placed[0].footprint.settings
    assert (s.n_seq, s.n_ctx_seq) == (2, 8192)
    assert half.placed[0].bytes_on("GPU0") <= 2 * GIB
    # weights over the share: one slot is still served
    big = replace(r, meta=model(2.5), slot_share=0.5)
    assert (
        place([big], gpus, reserve=256 * MIB, estimate=toy).placed[0].footprint.settings.n_seq == 1
    )


def test_slots_grow_on_a_split_too() -> None:
    # 6 GiB of weights over two 4 GiB cards: split; two full 4096 windows fit, not three
    auto = AutoContext(target=4096, minimum=4096)
    r = Request("chat", model(6), LaunchSettings(parallel=1), context=auto, max_slots=4)
    room = 3 * GIB + 2 * 4096 * KV_TOKEN // 2 + 64 * MIB
    gpus = (replace(cards(1)[0], total_bytes=room), replace(cards(1, 1)[1], total_bytes=room))
    p = place([r], gpus, reserve=0, estimate=toy)
    (x,) = p.placed
    assert x.split
    assert (x.footprint.settings.n_seq, x.footprint.settings.n_ctx_seq) == (2, 4096)


def test_an_idle_card_widens_a_context_below_its_target() -> None:
    # 5 GiB of weights on a 6 GiB card: about 4.5k tokens; the idle 6 GiB card could hold more
    auto = AutoContext(target=32768, minimum=4096)
    r = Request("m", model(5), LaunchSettings(parallel=1), context=auto)
    gpus = cards(6, 6)
    plain = place([r], gpus, reserve=0, estimate=toy)
    wide = place([r], gpus, reserve=0, estimate=toy, widen_idle=True)
    (before,), (after,) = plain.placed, wide.placed
    assert len(before.devices) == 1 and before.footprint.settings.n_ctx < 32768
    assert set(after.devices) == {"GPU0", "GPU1"}
    assert after.footprint.settings.n_ctx > before.footprint.settings.n_ctx
    assert any("widened onto idle" in n for n in after.notes)
    for d in wide.gpus:
        assert d.free is not None and d.free >= 0


def test_an_idle_card_that_adds_little_is_left_alone() -> None:
    # a split costs transfers on every token: a small idle card that adds less than a quarter
    # more context is not worth it
    auto = AutoContext(target=65536, minimum=4096)
    r = Request("m", model(5), LaunchSettings(parallel=1), context=auto)
    small = place([r], cards(6, 0.15), reserve=0, estimate=toy, widen_idle=True)
    assert small.placed[0].devices == ("GPU0",)
    have = small.placed[0].footprint.settings.n_ctx
    assert have * (WIDEN_GAIN - 1) > 0.15 * GIB / KV_TOKEN  # what the small card could add
    big = place([r], cards(6, 1), reserve=0, estimate=toy, widen_idle=True)
    assert len(big.placed[0].devices) == 2
    assert big.placed[0].footprint.settings.n_ctx >= have * WIDEN_GAIN


def test_a_model_at_its_target_leaves_the_idle_card_alone() -> None:
    auto = AutoContext(target=4096, minimum=4096)
    r = Request("m", model(1), LaunchSettings(parallel=1), context=auto)
    p = place([r], cards(6, 6), reserve=0, estimate=toy, widen_idle=True)
    assert len(p.placed[0].devices) == 1


def test_a_card_other_engines_use_is_not_idle() -> None:
    auto = AutoContext(target=32768, minimum=4096)
    r = Request("m", model(5), LaunchSettings(parallel=1), context=auto)
    p = place([r], cards(6, 6), reserve=0, estimate=toy, widen_idle=True,
              occupied={"GPU1": GIB})  # fmt: skip
    assert len(p.placed[0].devices) == 1


def test_stages_place_later_requests_against_what_the_earlier_left() -> None:
    # one 6 GiB card holds a 3 GiB chat or a 4 GiB embedder, not both: in one go the smaller
    # (chat) is admitted first; in stages the search role goes first and chat gets the rest
    one_go = place([req("embed", 4), req("chat", 3)], cards(6), reserve=0, estimate=toy)
    assert one_go.model("chat") is not None and one_go.unplaced_model("embed") is not None
    staged = place_stages([[req("embed", 4)], [req("chat", 3)]], cards(6), reserve=0,
                          estimate=toy)  # fmt: skip
    assert staged.model("embed") is not None and staged.unplaced_model("chat") is not None
    # with room for both, each is charged on its card and the loads list every stage's model
    both = place_stages([[req("embed", 5)], [req("chat", 5)]], cards(6, 6), reserve=0,
                        estimate=toy)  # fmt: skip
    assert both.fits
    assert {x.name: x.devices for x in both.placed} == {"embed": ("GPU0",), "chat": ("GPU1",)}
    loads = {d.device: d for d in both.gpus}
    assert {s.model for s in loads["GPU0"].shares} == {"embed"}
    assert {s.model for s in loads["GPU1"].shares} == {"chat"}
    assert all(d.free is not None and d.free >= 0 for d in both.gpus)


def test_stages_charge_host_memory_across_stages() -> None:
    # no GPU: everything in host memory; the second stage gets what the first left
    host = 6 * GIB
    p = place_stages([[req("embed", 3)], [req("chat", 3)]], (), host_bytes=host,
                     estimate=toy)  # fmt: skip
    assert p.model("embed") is not None
    assert p.unplaced_model("chat") is not None
    assert p.host.used <= host
    assert p.host.shares[0].model == "embed"
    assert sum(s.bytes for s in p.host.shares) == p.model("embed").bytes_on(CPU)  # type: ignore[union-attr]


def test_stages_refuse_a_name_used_twice() -> None:
    with pytest.raises(SizingError, match="same name"):
        place_stages([[req("a", 1)], [req("a", 1)]], cards(8), estimate=toy)
