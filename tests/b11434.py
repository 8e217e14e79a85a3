"""Where the tests find llama.cpp b11434 (the second build: `llama-server`, `test-llama-archs`):
$QMGUI_TEST_B11434 (scripts/test sets it), else the engine cache as it was before the tests
moved HOME. Tests that need it skip with the reason when it is in neither."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CACHE = Path(
    os.environ.get("QMGUI_ENGINE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qmgui-engines"
)  # read at import: the tests' own HOME is set later, per test
_FOUND = os.environ.get("QMGUI_TEST_B11434") or str(
    _CACHE / "llama-b11434-cpu-all" / "llama-server"
)
SKIP_WHY = (
    "llama.cpp b11434 is not here: scripts/build-llama 11434 --all (or set QMGUI_TEST_B11434)"
)


def b11434_server() -> Path | None:
    p = Path(_FOUND)
    return p if p.is_file() and os.access(p, os.X_OK) else None


def need_b11434() -> Path:
    """The b11434 llama-server, or skip the test with the reason."""
    p = b11434_server()
    if p is None:
        pytest.skip(SKIP_WHY)
    return p
