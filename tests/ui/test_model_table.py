"""The table model over a plain list, without a view."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt

from qmgui.core.discovery import scan
from qmgui.ui.model_table import COLUMN_KEYS, SORT_ROLE, ModelFilterProxy, ModelTableModel
from qmgui.ui.planning import Badge, BadgeResult


def _col(key: str) -> int:
    return COLUMN_KEYS.index(key)


def test_model_rows_columns_and_roles(qapp, models: Path) -> None:  # type: ignore[no-untyped-def]
    entries = scan([models]).models
    m = ModelTableModel()
    m.set_entries(entries)
    assert m.rowCount() == len(entries) == 4
    assert m.columnCount() == len(COLUMN_KEYS)
    names = [m.data(m.index(r, 0)) for r in range(m.rowCount())]
    assert any("[2 shards]" in n for n in names)
    assert any("[+mmproj]" in n for n in names)

    broken = next(r for r, e in enumerate(entries) if e.error)
    assert m.data(m.index(broken, _col("class"))) == "broken"
    tip = m.data(m.index(broken, 0), Qt.ItemDataRole.ToolTipRole)
    assert entries[broken].error in tip
    assert m.data(m.index(broken, 0), Qt.ItemDataRole.ForegroundRole) is not None

    size_row = max(range(len(entries)), key=lambda r: entries[r].size_bytes)
    assert m.data(m.index(size_row, _col("size")), SORT_ROLE) == entries[size_row].size_bytes
    assert m.data(m.index(0, _col("fit"))) == "…"  # not sized yet


def test_badges_show_and_sort(qapp, models: Path) -> None:  # type: ignore[no-untyped-def]
    entries = scan([models]).models
    m = ModelTableModel()
    m.set_entries(entries)
    changed: list[object] = []
    m.dataChanged.connect(lambda *a: changed.append(a))
    row = next(r for r, e in enumerate(entries) if not e.error)
    m.set_badges({entries[row].id: BadgeResult(Badge.NO_FIT, "needs more")})
    assert changed
    fit = m.index(row, _col("fit"))
    assert "no fit" in m.data(fit)
    assert m.data(fit, Qt.ItemDataRole.ToolTipRole) == "needs more"
    assert m.data(fit, Qt.ItemDataRole.ForegroundRole) is not None
    assert m.data(fit, SORT_ROLE) > m.data(m.index(1 - min(row, 1), _col("fit")), SORT_ROLE) - 5


def test_proxy_filters_every_column(qapp, models: Path) -> None:  # type: ignore[no-untyped-def]
    m = ModelTableModel()
    m.set_entries(scan([models]).models)
    proxy = ModelFilterProxy()
    proxy.setSourceModel(m)
    proxy.setFilterFixedString("QWEN2")  # the architecture column, case-insensitive
    assert proxy.rowCount() == 1
    proxy.setFilterFixedString("")
    assert proxy.rowCount() == 4


def test_names_sort_naturally(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.synth.factory import PRESETS, write_gguf

    for n in (1, 10, 100, 2):
        write_gguf(tmp_path / f"model-{n}.gguf", PRESETS["llama"])
    m = ModelTableModel()
    m.set_entries(scan([tmp_path]).models)
    m.sort(0, Qt.SortOrder.AscendingOrder)
    assert [m.data(m.index(r, 0)) for r in range(4)] == [
        "model-1", "model-2", "model-10", "model-100",
    ]  # fmt: skip
