"""The layers stay apart (DESIGN.md, 'Architecture'): the window and the command line share
`qmgui.service`, never each other; the service layer has no Qt and no argparse."""

from __future__ import annotations

import ast
from pathlib import Path

import qmgui

PACKAGE = Path(qmgui.__file__).parent


def _imports(path: Path) -> list[str]:
    """Every module `path` imports, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(("qmgui", *path.parent.relative_to(PACKAGE).parts))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.append(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.append(node.module)
    return names


def _offences(layer: str, forbidden: tuple[str, ...]) -> set[str]:
    root = PACKAGE / layer
    return {
        f"{p.relative_to(PACKAGE)}: {name}"
        for p in root.rglob("*.py")
        for name in _imports(p)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    }


def test_the_window_imports_nothing_from_the_command_line() -> None:
    assert not _offences("ui", ("qmgui.cli",))


def test_the_service_layer_has_no_qt_no_argparse_and_no_cli() -> None:
    assert not _offences("service", ("qmgui.cli", "qmgui.ui", "PySide6", "argparse"))


def test_the_checker_sees_both_absolute_and_relative_imports() -> None:
    """The check above could pass by reading nothing: it must see both spellings."""
    names = _imports(PACKAGE / "ui" / "main_window.py")
    assert any(n.startswith("qmgui.service") for n in names)
    assert any(n.startswith("PySide6") for n in names)
