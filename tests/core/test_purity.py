"""qmgui.core stays pure: no Qt, no processes, no network (DESIGN.md, 'Architecture')."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import qmgui.core

CORE = Path(qmgui.core.__file__).parent
FORBIDDEN = (
    "PySide6",
    "shiboken6",
    "subprocess",
    "socket",
    "http",
    "urllib",
    "requests",
    "httpx",
    "asyncio",
    "multiprocessing",
    "qmgui.ui",
    "qmgui.engines",
    "qmgui.hw",
    "qmgui.settings",
    "qmgui.cache",
)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_core_modules_import_nothing_impure() -> None:
    bad = {
        f"{p.relative_to(CORE)}: {name}"
        for p in CORE.rglob("*.py")
        for name in _imports(p)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad


def test_importing_core_pulls_in_no_qt_or_network() -> None:
    modules = [f"qmgui.core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__"]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(','.join(m for m in ('PySide6', 'socket', 'http.client', 'urllib.request', "
        "'subprocess') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
