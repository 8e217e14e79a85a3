"""GUI tests run offscreen, with small synthetic models, and join every worker before ending."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from qmgui.settings import LoadResult, Settings
from qmgui.ui.main_window import MainWindow
from tests.synth._mmproj import write_mmproj
from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf, write_split

SETTLE_MS = 30_000


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """Two architectures, a split set, a model with a projector and one truncated file."""
    d = tmp_path / "models"
    write_gguf(d / "tiny-llama.gguf", PRESETS["llama"])
    write_gguf(d / "vision" / "tiny-qwen3.gguf", PRESETS["qwen3"])
    write_mmproj(d / "vision" / "mmproj-tiny-qwen3.gguf")
    write_split(d / "split", PRESETS["qwen2"], n_shards=2)
    good = (d / "tiny-llama.gguf").read_bytes()
    (d / "broken.gguf").write_bytes(good[: len(good) // 2])
    return d


@pytest.fixture
def big_model(tmp_path: Path) -> Path:
    """A full-size (sparse: megabytes on disk) Llama 3 8B, for plans that do not fit."""
    d = tmp_path / "big"
    write_gguf(d / "llama3-8b.gguf", FULL_SIZE_PRESETS["llama3-8b"], sparse=True)
    return d


@pytest.fixture
def make_window(qtbot) -> Iterator[Callable[..., MainWindow]]:  # type: ignore[no-untyped-def]
    """Builds started windows (no engine --help probe) and closes them, joining workers."""
    made: list[MainWindow] = []

    def make(roots: list[str] | None = None, **kw: object) -> MainWindow:
        loaded = LoadResult(Settings(model_roots=roots or []))
        kw.setdefault("tray", False)  # tests of the tray build their own
        w = MainWindow(loaded, probe=False, **kw)  # type: ignore[arg-type]
        qtbot.addWidget(w)
        w.resize(1280, 800)
        w.show()
        w.start()
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
        w.shutdown()


def settle(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    qtbot.waitUntil(window.is_settled, timeout=SETTLE_MS)


@pytest.fixture(autouse=True, scope="session")
def _gui_switch_interval() -> Iterator[None]:
    """The window runs with the app's GIL switch interval (qmgui.app.make_application)."""
    import sys

    from qmgui.app import GUI_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    sys.setswitchinterval(GUI_SWITCH_INTERVAL_S)
    yield
    sys.setswitchinterval(before)
