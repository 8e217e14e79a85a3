"""Open URL… in the window (issue 16, item 1): a remote GGUF's header read over HTTP ranges,
the model planned like a local file (a "[remote]" row, its fit, a command that fetches it),
and Start downloading it into a model folder, where the file replaces the row and keeps the
settings saved for the URL. The server is tests/test_download.py's (ranges, ETags)."""

from __future__ import annotations

from pathlib import Path

from qmgui import notify
from qmgui.settings import ModelOverride
from qmgui.ui.remote_models import is_remote
from tests import test_download
from tests.synth.factory import PRESETS, write_gguf
from tests.test_download import Server
from tests.ui.conftest import settle

server = test_download.server  # the ranged file server of tests/test_download.py

WAIT_MS = 30_000


def errors() -> list[str]:
    return [m.text for m in notify.notifier.history if m.level is notify.Level.ERROR]


def test_open_url_plans_the_remote_model_and_start_downloads_it(  # type: ignore[no-untyped-def]
    qtbot, make_window, server: Server, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_gguf(root / "already-here.gguf", PRESETS["llama"])
    served = write_gguf(server.served.root / "far-llama.gguf", PRESETS["llama"])
    url = f"{server.url}/ranged/far-llama.gguf"
    w = make_window([str(root)])
    settle(qtbot, w)
    assert w.open_url_action.shortcut().toString() == "Ctrl+L"

    w.remote.open(url)
    qtbot.waitUntil(lambda: any(is_remote(e) for e in w.table.model.entries), timeout=WAIT_MS)
    settle(qtbot, w)
    entry = w.table.current_entry()
    assert entry is not None and entry.id == url and entry.name == "far-llama"
    assert "[remote]" in w.table.model.data(w.table.model.index(w.table.model.row_of(url), 0))
    assert "1 remote" in w.count_label.text()
    # planned from the header alone: a verdict, bars and a command that fetches the model
    outcome = w.outcome
    assert outcome is not None and outcome.entry.id == url and outcome.fit is not None
    assert f"-mu {url}" in outcome.bash and " -m " not in outcome.bash
    assert w.table.model.badge(url) is not None
    assert w.start_button.text() == "Download…" and w.start_button.isEnabled()
    # a setting saved for the URL goes with the download
    overrides = {**w.settings.model_overrides, url: ModelOverride(ctx_size=2048)}
    w._store(w.settings.model_copy(update={"model_overrides": overrides}))

    w.start_button.click()  # downloads into the first model folder
    local = str(root / "far-llama.gguf")
    qtbot.waitUntil(
        lambda: (e := w.table.current_entry()) is not None and e.id == local, timeout=WAIT_MS
    )
    assert (root / "far-llama.gguf").read_bytes() == served.read_bytes()
    assert not any(is_remote(e) for e in w.table.model.entries)  # the file replaced the row
    assert w.settings.model_overrides[local].ctx_size == 2048
    settle(qtbot, w)
    assert w.start_button.text() == "Start"
    assert w.outcome is not None and f"-m {local}" in w.outcome.bash


def test_a_bad_url_is_a_sentence_and_no_row(  # type: ignore[no-untyped-def]
    qtbot, make_window, server: Server, tmp_path: Path
) -> None:
    w = make_window([str(tmp_path)])
    settle(qtbot, w)
    w.remote.open("models/far-llama.gguf")
    assert any("is not a URL" in t for t in errors())
    w.remote.open(f"{server.url}/ranged/missing.gguf")
    qtbot.waitUntil(lambda: any("missing.gguf" in t for t in errors()), timeout=WAIT_MS)
    (server.served.root / "notes.gguf").write_bytes(b"not a model at all" * 100)
    w.remote.open(f"{server.url}/ranged/notes.gguf")
    qtbot.waitUntil(lambda: any("notes.gguf" in t for t in errors()), timeout=WAIT_MS)
    settle(qtbot, w)
    assert not w.table.model.entries
    assert w.statusBar().currentMessage().startswith("Error:")  # the reading message ended
