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


def test_hf_folder_arch_reads_as_llama_cpp_names_it(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.synth.factory import PRESETS, write_gguf, write_hf_folder

    write_hf_folder(tmp_path / "m" / "hf-llama", architecture="LlamaForCausalLM")
    write_gguf(tmp_path / "m" / "tiny-llama.gguf", PRESETS["llama"])
    entries = scan([tmp_path / "m"]).models
    m = ModelTableModel()
    m.set_entries(entries)
    arch = {e.name: m.data(m.index(r, _col("arch"))) for r, e in enumerate(m.entries)}
    assert set(arch.values()) == {"llama"}  # one vocabulary: not "LlamaForCausalLM"
    hf = next(r for r, e in enumerate(m.entries) if e.format == "hf")
    assert "LlamaForCausalLM" in m.data(m.index(hf, _col("arch")), Qt.ItemDataRole.ToolTipRole)


def test_window_at_1024x700_shows_name_to_fit_without_scrolling(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path
) -> None:
    from tests.ui.conftest import settle

    w = make_window([str(models)])
    w.resize(1024, 700)
    settle(qtbot, w)
    assert w.table.select_name("tiny-llama")
    settle(qtbot, w)
    qtbot.waitUntil(lambda: w.width() == 1024)
    view = w.table.view
    header = view.horizontalHeader()
    viewport = view.viewport().width()
    fit = _col("fit")
    assert view.horizontalScrollBar().maximum() == 0  # nothing hides behind a scrollbar
    assert header.sectionViewportPosition(0) == 0 and header.sectionSize(0) >= 100  # Name
    right = header.sectionViewportPosition(fit) + header.sectionSize(fit)
    assert header.sectionViewportPosition(fit) > 0 and right <= viewport  # Fit, whole
    for key in ("context", "backend"):
        assert header.sectionViewportPosition(_col(key)) + header.sectionSize(_col(key)) <= viewport
    # the plan beside it scrolls rather than squeezing or clipping its controls
    scroll = w.detail_scroll
    assert scroll.horizontalScrollBar().maximum() == 0
    panel = w.plan_panel
    for box in (panel.ctx_spin, panel.ctk, panel.slots, panel.flash, panel.ngl):
        assert box.height() >= box.minimumSizeHint().height(), box
        assert box.mapTo(scroll.widget(), box.rect().bottomRight()).x() <= scroll.viewport().width()
    assert not panel._flash_inline.isVisible()  # flash attention on a row of its own
    # wider again: the columns come back to their widths, flash attention joins the slots
    w.resize(1920, 1080)
    qtbot.waitUntil(lambda: header.sectionSize(_col("backend")) == 96)
    qtbot.waitUntil(panel._flash_inline.isVisible)
