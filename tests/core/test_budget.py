"""The VRAM budget policy: which running models to stop so a new one fits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui.core.budget import EXHAUSTIVE_LIMIT, Resident, plan_start
from qmgui.core.footprint import CPU, DeviceFootprint, Footprint, Gpu
from qmgui.core.launch import LaunchSettings, resolve
from qmgui.core.placement import AutoContext, place
from qmgui.core.units import GIB
from tests.core.test_footprint import make_meta
from tests.core.test_placement import KV_4K, cards, req, toy


def held(
    name: str, per_device: Mapping[str, int], last_used: float, *, pinned: bool = False
) -> Resident:
    devices = tuple(DeviceFootprint(d, weights=n) for d, n in per_device.items())
    fp = Footprint(resolve(make_meta(), LaunchSettings()), 0, (), (*devices, DeviceFootprint(CPU)))
    return Resident(name, fp, last_used, pinned)


def start(new_gib: float, residents: Sequence[Resident], gpus: Sequence[Gpu], **kw: object):  # type: ignore[no-untyped-def]
    return plan_start(req("new", new_gib), residents, gpus, reserve=0, estimate=toy, **kw)  # type: ignore[arg-type]


def test_nothing_is_stopped_when_it_fits() -> None:
    plan = start(4, [held("a", {"GPU0": 10 * GIB}, 1.0)], cards(24))
    assert plan.fits
    assert plan.stop == ()
    assert plan.placement.model("new") is not None
    assert plan.placement.gpus[0].occupied == 10 * GIB


def test_the_least_recently_used_is_stopped_first() -> None:
    residents = [held("new-ish", {"GPU0": 10 * GIB}, 5.0), held("old", {"GPU0": 10 * GIB}, 1.0)]
    plan = start(8, residents, cards(24))
    assert plan.fits
    assert plan.stop == ("old",)
    assert plan.placement.gpus[0].occupied == 10 * GIB


def test_a_pinned_model_is_never_stopped() -> None:
    residents = [
        held("old", {"GPU0": 10 * GIB}, 1.0, pinned=True),
        held("recent", {"GPU0": 10 * GIB}, 5.0),
    ]
    plan = start(8, residents, cards(24))
    assert plan.stop == ("recent",)


def test_the_fewest_are_stopped() -> None:
    # stopping the two oldest small ones is not enough; the one big one alone is
    residents = [
        held("small1", {"GPU0": 2 * GIB}, 1.0),
        held("small2", {"GPU0": 2 * GIB}, 2.0),
        held("big", {"GPU0": 12 * GIB}, 3.0),
    ]
    plan = start(10, residents, cards(24))
    assert plan.stop == ("big",)


def test_only_residents_on_the_cards_that_matter_are_stopped() -> None:
    residents = [held("elsewhere", {"GPU1": 7 * GIB}, 1.0), held("here", {"GPU0": 7 * GIB}, 2.0)]
    # the new model needs a whole card: stopping either resident frees one, and "elsewhere"
    # is the older
    plan = start(7, residents, cards(8, 8))
    assert plan.stop == ("elsewhere",)
    assert plan.placement.model("new").devices == ("GPU1",)


def test_no_fit_even_after_stopping_every_unpinned_model() -> None:
    residents = [
        held("pinned", {"GPU0": 20 * GIB}, 1.0, pinned=True),
        held("x", {"GPU0": GIB}, 2.0),
    ]
    plan = start(8, residents, cards(24))
    assert not plan.fits
    assert plan.stop == ()
    assert plan.reason is not None
    assert "even with 1 running models stopped, 1 pinned kept running" in plan.reason
    assert "GPU0" in plan.reason
    only_pinned = start(8, residents[:1], cards(24))
    assert only_pinned.reason is not None
    assert "are pinned" in only_pinned.reason


def test_a_restart_replaces_its_own_earlier_launch() -> None:
    plan = start(20, [held("new", {"GPU0": 20 * GIB}, 1.0, pinned=True)], cards(24))
    assert plan.fits
    assert plan.stop == ()
    assert plan.notes == ("replaces the running new",)


def test_the_new_model_grows_its_context_into_the_freed_room() -> None:
    r = req("new", 8, auto=AutoContext())
    plan = plan_start(r, [held("old", {"GPU0": 16 * GIB}, 1.0)], cards(24), reserve=0, estimate=toy)
    assert plan.stop == ("old",)
    ctx = plan.placement.model("new").settings.ctx_size  # type: ignore[union-attr]
    assert ctx == 32768  # the trained context: 8 GiB + 1.75 GiB of KV fit once "old" stops


def test_host_memory_counts_too() -> None:
    residents = [held("ram", {CPU: 6 * GIB}, 1.0)]
    r = req("new", 4, settings={"n_gpu_layers": 0})
    plan = plan_start(r, residents, cards(8), reserve=0, host_bytes=8 * GIB, estimate=toy)
    assert plan.stop == ("ram",)
    assert plan.placement.host.shares[0].bytes == 4 * GIB + KV_4K


def test_many_residents_stop_the_oldest_and_give_back_the_needless() -> None:
    """Past EXHAUSTIVE_LIMIT the search stops the oldest in turn, then keeps running any
    whose stop turned out not to be needed."""
    small = [held(f"r{i:02d}", {"GPU0": GIB}, float(i)) for i in range(2, EXHAUSTIVE_LIMIT + 2)]
    residents = [held("r00", {"GPU0": GIB // 2}, 0.0), held("r01", {"GPU0": 5 * GIB}, 1.0), *small]
    assert len(residents) > EXHAUSTIVE_LIMIT
    # 15.5 GiB held on 16: r00 alone frees too little, r01 is enough, and then r00 is not needed
    plan = start(4, residents, cards(16))
    assert plan.fits
    assert plan.stop == ("r01",)


# --- properties --------------------------------------------------------------------------------

resident_st = st.lists(
    st.tuples(st.integers(0, 1), st.integers(1, 12), st.booleans()),  # card, GiB, pinned
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(rs=resident_st, new=st.integers(1, 20), order=st.permutations(range(6)))
def test_lru_never_stops_a_pinned_model_and_stops_the_fewest_oldest(
    rs: list[tuple[int, int, bool]], new: int, order: list[int]
) -> None:
    gpus = cards(16, 16)
    residents = [
        held(f"r{i}", {f"GPU{c}": n * GIB}, float(order[i]), pinned=p)
        for i, (c, n, p) in enumerate(rs)
    ]
    plan = start(new, residents, gpus)
    by_name = {r.name: r for r in residents}
    assert not any(by_name[n].pinned for n in plan.stop)
    lru = sorted((r for r in residents if not r.pinned), key=lambda r: (r.last_used, r.name))

    def fits(stopped: Sequence[Resident]) -> bool:
        names = {r.name for r in stopped}
        used: dict[str, int] = {}
        for r in residents:
            if r.name not in names:
                for d in r.footprint.devices:
                    used[d.name] = used.get(d.name, 0) + d.total
        p = place([req("new", new)], gpus, reserve=0, occupied=used, estimate=toy)
        return p.fits

    if not plan.fits:
        assert plan.stop == ()
        assert not fits(lru)
        return
    assert plan.placement.fits
    stopped = [by_name[n] for n in plan.stop]
    assert stopped == sorted(stopped, key=lambda r: (r.last_used, r.name))  # oldest first
    # no fewer stops would do, and no set as small of older models would
    for k in range(len(stopped)):
        assert not any(fits(c) for c in combinations(lru, k))
    first = next(c for c in combinations(lru, len(stopped)) if fits(c))
    assert list(first) == stopped
    for load in plan.placement.gpus:
        if load.shares:  # the new model's cards (residents alone may overcommit the others)
            assert load.free is not None
            assert load.free >= 0
