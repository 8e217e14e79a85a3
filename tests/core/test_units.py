"""Numbers as people read them, and names sorted as people expect."""

from __future__ import annotations

from qmgui.core.units import format_count, natural_key


def test_counts_read_like_model_cards() -> None:
    assert format_count(268_098_176) == "268M"
    assert format_count(7_615_616_512) == "7.6B"
    assert format_count(12_345) == "12.3K"
    assert format_count(999) == "999"
    assert format_count(None) == "-"


def test_natural_order() -> None:
    names = ["model-100", "Model-2", "model-10", "model-1", "model-1b", "alpha"]
    assert sorted(names, key=natural_key) == [
        "alpha", "model-1", "model-1b", "Model-2", "model-10", "model-100",
    ]  # fmt: skip
