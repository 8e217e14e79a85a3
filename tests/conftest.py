"""Shared test harness: every test runs with its own config and cache folders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from qmgui import notify


@pytest.fixture(autouse=True)
def _isolated_dirs(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or writes the developer's own settings or caches."""
    base = tmp_path_factory.mktemp("qmgui-home")
    monkeypatch.setenv("QMGUI_CONFIG_DIR", str(base / "config"))
    monkeypatch.setenv("QMGUI_CACHE_DIR", str(base / "cache"))
    monkeypatch.setenv("HOME", str(base / "home"))
    for var in (
        "HF_HOME",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "OLLAMA_MODELS",
        "XDG_CONFIG_HOME",
    ):
        monkeypatch.delenv(var, raising=False)
    Path(base / "home").mkdir()


@pytest.fixture(autouse=True)
def _fresh_notifier() -> None:
    """Each test starts with no message history and no subscribers left by another."""
    notify.notifier.clear()


@pytest.fixture(autouse=True)
def _no_leaked_children() -> Iterator[None]:
    """A test that starts a child process must also end it."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    leaked = [p for p in me.children(recursive=True) if p.pid not in before]
    for p in leaked:
        p.kill()
    assert not leaked, f"test leaked child processes: {[p.pid for p in leaked]}"
