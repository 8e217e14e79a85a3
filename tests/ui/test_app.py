"""Starting the window: which invocations get it, and the screenshot mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qmgui.__main__ import display_available, wants_window


def test_window_only_with_a_display_or_its_flags() -> None:
    assert display_available({"DISPLAY": ":0"}, "linux")
    assert display_available({"QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert display_available({}, "win32")
    assert not display_available({}, "linux")
    assert wants_window([], display=True)
    assert not wants_window([], display=False)
    assert not wants_window(["scan"], display=True)
    assert wants_window(["--screenshot", "x.png"], display=False)
    assert not wants_window(["scan", "--models"], display=True)
    assert wants_window(["--theme", "dark"], display=True)


def test_version_answers_without_loading_the_cli(capsys) -> None:  # type: ignore[no-untyped-def]
    import sys

    from qmgui import __version__
    from qmgui.__main__ import main

    loaded = set(sys.modules)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"qmgui {__version__}"
    assert "qmgui.cli.scan" in loaded or "qmgui.cli.scan" not in set(sys.modules) - loaded


def test_screenshot_writes_a_png(tmp_path: Path, models: Path) -> None:
    out = tmp_path / "shot.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-m", "qmgui", "--screenshot", str(out), "--models", str(models),
         "--what-if", "2× RTX 3090", "--select", "tiny-qwen3", "--size", "1024x700"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width == 1024
    # screenshot mode writes no settings
    assert not list(Path(os.environ["QMGUI_CONFIG_DIR"]).glob("*.json"))


def test_screenshot_bad_size(tmp_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-m", "qmgui", "--screenshot", str(tmp_path / "x.png"), "--size", "big"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "WIDTHxHEIGHT" in proc.stderr


def test_screenshot_bad_what_if_fails(tmp_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    shot = tmp_path / "x.png"
    proc = subprocess.run(
        [sys.executable, "-m", "qmgui", "--screenshot", str(shot), "--what-if", "no-such-card"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no GPU profile" in proc.stderr
    assert not shot.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_window_ends_cleanly_on_a_signal(tmp_path: Path, signum: int) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgui", "--theme", "light"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        time.sleep(5)  # the window is up and its loop runs
        assert proc.poll() is None
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "stopping" in out  # its handler ran: the default action would exit with -signum


@pytest.fixture
def dark_app(qapp):  # type: ignore[no-untyped-def]
    """The dark theme on the shared QApplication, put back as it was afterwards."""
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QStyleFactory

    from qmgui.app import apply_theme

    style, palette = qapp.style().name(), QPalette(qapp.palette())
    apply_theme(qapp, "dark")
    yield qapp
    qapp.setStyle(QStyleFactory.create(style))
    qapp.setPalette(palette)


def _spread(image, x0: int, x1: int, y0: int, y1: int) -> int:  # type: ignore[no-untyped-def]
    """The largest lightness difference between two pixels of a region."""
    values = [image.pixelColor(x, y).lightness() for x in range(x0, x1) for y in range(y0, y1)]
    return max(values) - min(values)


def test_dark_theme_draws_visible_radio_and_check_boxes(qtbot, dark_app) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QCheckBox, QMessageBox, QRadioButton, QStyle

    from qmgui.app import dark_palette

    window_colour = dark_palette().color(dark_palette().ColorRole.Window)
    for widget in (QRadioButton("bash"), QCheckBox("GPU 0")):
        qtbot.addWidget(widget)
        widget.resize(widget.sizeHint())
        image = widget.grab().toImage()
        w = widget.style().pixelMetric(QStyle.PixelMetric.PM_IndicatorWidth)
        h = image.height()
        # the unchecked indicator's ring/box stands out of the dark background
        assert _spread(image, 0, w + 2, 0, h) >= 60, type(widget).__name__
        assert image.pixelColor(image.width() - 1, 0).lightness() < 80  # the window is dark
    box = QMessageBox(QMessageBox.Icon.Question, "Quit", "Quit qmgui?")
    qtbot.addWidget(box)
    assert box.palette().color(box.backgroundRole()) == window_colour
    assert box.palette().color(box.foregroundRole()).lightness() > 200
