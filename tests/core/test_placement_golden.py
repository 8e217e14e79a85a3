"""Golden placements on 1, 2, 4 and 8 mismatched GPUs, worked out by hand from the rules in
`qmgui.core.placement`'s docstring.

Every model is sized by the toy estimator of tests/core/test_placement.py: its weights in 8
equal slices (7 layers and the output layer) and 32 MiB of KV per layer at the 4096 tokens
each asks for, so a model of W GiB needs W GiB + 224 MiB on one card. No reserve. The
expectations below are derived in the comments, not copied from what the code printed.
"""

from __future__ import annotations

from qmgui.core.placement import Placement
from qmgui.core.units import GIB, MIB
from tests.core.test_placement import cards, req, toy_place

KV = 224 * MIB  # 7 layers x 32 MiB at 4096 tokens


def where(p: Placement) -> dict[str, tuple[str, ...]]:
    return {m.name: m.devices for m in p.placed}


def free(p: Placement) -> dict[str, int | None]:
    return {d.device: d.free for d in p.gpus}


def test_one_gpu_runs_the_most_models() -> None:
    """24 GiB; models of 10, 8, 5 and 3 GiB (10.2 + 8.2 + 5.2 + 3.2 = 26.9 GiB in all).
    Admitted smallest first: 3, 5 and 8 (16.7 GiB) pack; the 10 does not fit the 7.3 GiB
    left, so three models run rather than two."""
    p = toy_place([req("a", 10), req("b", 8), req("c", 5), req("d", 3)], cards(24))
    assert where(p) == {"b": ("GPU0",), "c": ("GPU0",), "d": ("GPU0",)}
    assert free(p) == {"GPU0": 24 * GIB - 16 * GIB - 3 * KV}
    (a,) = p.unplaced
    assert a.name == "a"
    assert "needs 10.2 GiB on GPU0, 2.9 GiB more than the 7.3 GiB left" in a.reason


def test_two_gpus_best_fit_largest_first() -> None:
    """24 and 12 GiB; models of 14, 9, 6 and 2 GiB. Largest first, each on the card it fills
    most: 14 only fits GPU0 (9.8 GiB left); 9 fills GPU0 better (0.56 GiB left) than GPU1
    (2.8); 6 goes to GPU1 (5.8 left); 2 no longer fits GPU0, so GPU1 (3.6 left)."""
    p = toy_place([req("a", 14), req("b", 9), req("c", 6), req("d", 2)], cards(24, 12))
    assert p.fits
    assert where(p) == {"a": ("GPU0",), "b": ("GPU0",), "c": ("GPU1",), "d": ("GPU1",)}
    assert [m.name for m in p.placed] == ["a", "b", "c", "d"]
    assert free(p) == {"GPU0": 1 * GIB - 2 * KV, "GPU1": 4 * GIB - 2 * KV}
    assert not any(m.split for m in p.placed)


def test_four_gpus_split_only_the_model_no_card_holds() -> None:
    """24, 16, 12 and 8 GiB; models of 30, 11, 7 and 4 GiB. 30 GiB fits no card and waits
    for the splits; 11 fills GPU2 (0.78 left), 7 fills GPU3 (0.78 left), 4 fits only GPU1
    and GPU0 and fills GPU1 better. Then 30 is split over the two roomiest cards, GPU0 (24576
    MiB) and GPU1 (16384 - 4096 - 224 = 12064 MiB), in proportion to that room, the roomiest
    last: 12064:24576 gives GPU1 the layers below 12064/36640 = 0.33 of the 8 slices, i.e.
    layers 0-2 (11.25 GiB + 96 MiB of KV), and GPU0 layers 3-6 and the output layer."""
    p = toy_place([req("big", 30), req("m", 11), req("s", 7), req("t", 4)], cards(24, 16, 12, 8))
    assert p.fits
    assert where(p) == {
        "big": ("GPU1", "GPU0"),
        "m": ("GPU2",),
        "s": ("GPU3",),
        "t": ("GPU1",),
    }
    big = p.model("big")
    assert big is not None
    assert big.settings.tensor_split == (12064.0, 24576.0)
    assert big.footprint.layer_devices == ("GPU1",) * 3 + ("GPU0",) * 5
    assert big.bytes_on("GPU1") == 3 * 30 * GIB // 8 + 3 * 32 * MIB
    assert big.bytes_on("GPU0") == 5 * 30 * GIB // 8 + 4 * 32 * MIB
    assert [m.name for m in p.placed] == ["m", "s", "t", "big"]  # splits come last


def test_eight_gpus_a_rig_of_mismatched_cards() -> None:
    """24, 24, 16, 12, 12, 8, 8 and 6 GiB; models of 20, 18, 15, 12, 11, 10, 7, 5.5 and 100
    GiB. 100 GiB fits nowhere. Largest first, best fit:
    A 20 -> GPU0 (ties with GPU1, the lower index wins; 3.78 left), B 18 -> GPU1 (5.78),
    C 15 -> GPU2 (0.78), J 12 (12.22 with KV) fits no card left and waits, D 11 -> GPU3
    (0.78, ties with GPU4), E 10 -> GPU4 (1.78), F 7 -> GPU5 (0.78, ties with GPU6),
    G 5.5 -> GPU1 (0.06 left, better than GPU7's 0.28 or GPU6's 2.28).
    J is then split over the two roomiest, GPU6 (8 GiB) and GPU7 (6 GiB), GPU7 first:
    6144:8192 puts layers 0-3 on GPU7 (6 GiB + 128 MiB > 6144 MiB), so the split is
    rebalanced once by room over need (6144/6272 and 8192/6240, rescaled to the same sum):
    5144:9192, layers 0-2 on GPU7 (4704 MiB) and the rest on GPU6 (7808 MiB)."""
    reqs = [
        req("A", 20),
        req("B", 18),
        req("C", 15),
        req("D", 11),
        req("E", 10),
        req("F", 7),
        req("G", 5.5),
        req("J", 12),
        req("Z", 100),
    ]
    p = toy_place(reqs, cards(24, 24, 16, 12, 12, 8, 8, 6))
    assert where(p) == {
        "A": ("GPU0",),
        "B": ("GPU1",),
        "C": ("GPU2",),
        "D": ("GPU3",),
        "E": ("GPU4",),
        "F": ("GPU5",),
        "G": ("GPU1",),
        "J": ("GPU7", "GPU6"),
    }
    j = p.model("J")
    assert j is not None
    assert j.settings.tensor_split == (5144.0, 9192.0)
    assert j.bytes_on("GPU7") == 4704 * MIB
    assert j.bytes_on("GPU6") == 7808 * MIB
    left = free(p)
    assert left["GPU0"] == 4 * GIB - KV
    assert left["GPU6"] == 384 * MIB
    assert left["GPU7"] == 1440 * MIB
    assert all(x is not None and x >= 0 for x in left.values())
    (z,) = p.unplaced
    assert z.name == "Z"
    assert z.reason.startswith("does not fit with 4096 tokens of context")
