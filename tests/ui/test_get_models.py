"""The "Get models" dialog against the local hub of tests/test_hub.py: search, a repository's
models with their fit (the best that fits selected), a download into a folder with its
progress row, and a refused (gated) repository said in the status line."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.ui.get_models import GetModelsDialog
from tests import test_hub
from tests.test_hub import GATED, REPO, TOKEN, Hub

hub_server = test_hub.hub  # the local hub fixture of tests/test_hub.py, under this name

WAIT_MS = 30_000


@pytest.fixture
def dialog(qtbot, tmp_path: Path):  # type: ignore[no-untyped-def]
    dest = tmp_path / "models"
    dest.mkdir()
    got: list[list[str]] = []
    d = GetModelsDialog(None, folder=str(dest), downloaded=got.append)
    d.got = got  # type: ignore[attr-defined]
    qtbot.addWidget(d)
    d.show()
    yield d
    d.wait()


def test_search_list_and_download(qtbot, dialog: GetModelsDialog, hub_server: Hub) -> None:  # type: ignore[no-untyped-def]
    dialog.query.setText("gguf")
    dialog.search()
    qtbot.waitUntil(lambda: dialog.repos.count() == 2, timeout=WAIT_MS)
    dialog.repos.setCurrentRow(0)
    qtbot.waitUntil(lambda: dialog.models.topLevelItemCount() == 3, timeout=WAIT_MS)
    current = dialog.models.currentItem()
    assert current is not None
    assert current.text(2) in ("fits", "does not fit", "?")
    # pick the Q8_0 model and download it
    row = next(
        dialog.models.topLevelItem(i)
        for i in range(3)
        if dialog.models.topLevelItem(i).text(0) == "Q8_0"
    )
    dialog.models.setCurrentItem(row)
    assert dialog.download_button.isEnabled()
    dialog.download_button.click()
    qtbot.waitUntil(lambda: bool(dialog.got), timeout=WAIT_MS)  # type: ignore[attr-defined]
    dest = Path(dialog.folder.text())
    assert (dest / "Tiny-Q8_0.gguf").read_bytes() == (
        hub_server.root / "Tiny-Q8_0.gguf"
    ).read_bytes()
    assert dialog.bar.value() == 1000
    assert "Downloaded" in dialog.status.text()
    assert not dialog.cancel_button.isEnabled()


def test_a_gated_repository_says_hf_token(qtbot, dialog: GetModelsDialog, hub_server: Hub) -> None:  # type: ignore[no-untyped-def]
    dialog.query.setText("gated")
    dialog.search()
    qtbot.waitUntil(lambda: dialog.repos.count() == 1, timeout=WAIT_MS)
    assert GATED in dialog.repos.item(0).text() and "HF_TOKEN" in dialog.repos.item(0).text()
    dialog.repos.setCurrentRow(0)
    qtbot.waitUntil(lambda: "HF_TOKEN" in dialog.status.text(), timeout=WAIT_MS)
    assert dialog.models.topLevelItemCount() == 0
    assert not dialog.download_button.isEnabled()
    assert REPO and TOKEN  # the module's names, used by its other tests


def test_cancel_keeps_the_part_and_a_second_download_resumes(  # type: ignore[no-untyped-def]
    qtbot, dialog: GetModelsDialog, hub_server: Hub
) -> None:
    _list_tiny(qtbot, dialog)
    row = next(
        dialog.models.topLevelItem(i)
        for i in range(3)
        if dialog.models.topLevelItem(i).text(0) == "Q8_0"
    )
    dialog.models.setCurrentItem(row)
    dest = Path(dialog.folder.text())
    part = dest / "Tiny-Q8_0.gguf.part"
    hub_server.slow_s = 0.1
    dialog.download_button.click()
    assert dialog.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: part.exists() and part.stat().st_size > 0, timeout=WAIT_MS)
    dialog.cancel_button.click()
    qtbot.waitUntil(
        lambda: "resume" in dialog.status.text() and not dialog.getter.busy, timeout=WAIT_MS
    )
    assert part.stat().st_size > 0
    assert not (dest / "Tiny-Q8_0.gguf").exists()
    hub_server.slow_s = 0.0
    dialog.download_button.click()
    qtbot.waitUntil(lambda: bool(dialog.got), timeout=WAIT_MS)  # type: ignore[attr-defined]
    assert (dest / "Tiny-Q8_0.gguf").read_bytes() == (
        hub_server.root / "Tiny-Q8_0.gguf"
    ).read_bytes()
    assert not part.exists()


def _list_tiny(qtbot, dialog: GetModelsDialog) -> None:  # type: ignore[no-untyped-def]
    """Search "tiny", open the one repository, wait for its three models."""
    dialog.query.setText("tiny")
    dialog.search()
    qtbot.waitUntil(lambda: dialog.repos.count() == 1, timeout=WAIT_MS)
    dialog.repos.setCurrentRow(0)
    qtbot.waitUntil(lambda: dialog.models.topLevelItemCount() == 3, timeout=WAIT_MS)


def _pick(dialog: GetModelsDialog, quant: str) -> None:
    row = next(
        dialog.models.topLevelItem(i)
        for i in range(dialog.models.topLevelItemCount())
        if dialog.models.topLevelItem(i).text(0) == quant
    )
    dialog.models.setCurrentItem(row)


def test_a_second_download_is_queued_and_runs_after_the_first(  # type: ignore[no-untyped-def]
    qtbot, dialog: GetModelsDialog, hub_server: Hub
) -> None:
    _list_tiny(qtbot, dialog)
    hub_server.slow_s = 0.02
    _pick(dialog, "Q8_0")
    dialog.download_button.click()
    assert dialog.download_button.text() == "Queue download"
    _pick(dialog, "Q4_K_M")
    dialog.download_button.click()
    assert "Tiny-Q4_K_M.gguf" in dialog.queue_label.text()
    assert dialog.queue_label.isVisibleTo(dialog)
    hub_server.slow_s = 0.0
    qtbot.waitUntil(lambda: len(dialog.got) == 2, timeout=WAIT_MS)  # type: ignore[attr-defined]
    dest = Path(dialog.folder.text())
    for name in ("Tiny-Q8_0.gguf", "Tiny-Q4_K_M.gguf"):
        assert (dest / name).read_bytes() == (hub_server.root / name).read_bytes()
    assert dialog.queue_label.text() == "" and dialog.download_button.text() == "Download"


def test_fit_is_judged_on_the_windows_hardware_choice(  # type: ignore[no-untyped-def]
    qtbot, hub_server: Hub, tmp_path: Path
) -> None:
    """A what-if card far too small for any model: every row says so, and the status names it."""
    from qmgui.core.footprint import Gpu

    tiny_card = ("a 1 MiB card", (Gpu("GPU0", 1 << 20, 1 << 20),))
    d = GetModelsDialog(None, folder=str(tmp_path), hardware=lambda: tiny_card)
    qtbot.addWidget(d)
    d.show()
    try:
        d.query.setText("tiny")
        d.search()
        qtbot.waitUntil(lambda: d.repos.count() == 1, timeout=WAIT_MS)
        d.repos.setCurrentRow(0)
        qtbot.waitUntil(lambda: d.models.topLevelItemCount() == 3, timeout=WAIT_MS)
        fits = {d.models.topLevelItem(i).text(2) for i in range(3)}
        assert fits == {"does not fit"}, fits
        assert "on a 1 MiB card" in d.status.text()
    finally:
        d.wait()
