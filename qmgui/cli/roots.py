"""`qmgui roots`: list, add and remove the model folders (settings' `model_roots`).

Every change is a read-modify-write of settings.json through `update_settings` (under the
settings lock, applied to the file as it is now), so a window or another command changing the
settings at the same time keeps its change. Adding a folder another root already covers adds
nothing; adding a parent of roots replaces them (`qmgui.roots.plan_add`)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from qmgui import notify
from qmgui.core.errors import SettingsError
from qmgui.roots import Addition, covering_root, find_root, plan_add
from qmgui.settings import LoadResult, Settings, load_settings, update_settings

SOURCE = "roots"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def register(sub: Any) -> None:
    p = sub.add_parser(
        "roots",
        help="list, add and remove the folders qmgui scans for models",
        description="The model folders (roots) qmgui scans, besides the LM Studio, Ollama and "
        "Hugging Face stores it finds by itself. Without an action: list them.",
    )
    p.set_defaults(func=cmd_list, json=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    ls = actions.add_parser("list", help="show the model folders")
    ls.add_argument(
        "--json", action="store_true", help='print a JSON list of {"path", "exists"} objects'
    )
    ls.set_defaults(func=cmd_list)

    add = actions.add_parser(
        "add",
        help="add model folders",
        description="Add folders (or single .gguf files) to scan. A folder inside a model "
        "folder is scanned already and is not added; a folder holding model folders replaces "
        "them.",
    )
    add.add_argument("paths", nargs="+", metavar="DIR")
    add.set_defaults(func=cmd_add)

    rm = actions.add_parser(
        "remove",
        help="stop scanning model folders",
        description="Remove model folders, named as listed or by any path to them. The files "
        "are not touched.",
    )
    rm.add_argument("paths", nargs="+", metavar="DIR")
    rm.set_defaults(func=cmd_remove)


class _Refused(Exception):
    """A change the roots as they are on disk now do not allow (a usage error)."""


def _load() -> LoadResult:
    loaded = load_settings()
    for message in loaded.messages:
        notify.warning(message, source="settings")
    return loaded


def _save(change: Callable[[list[str]], list[str]]) -> int:
    """Apply `change` to the roots in the file now, under the settings lock; an exit status."""

    def mutate(settings: Settings) -> Settings:
        return settings.model_copy(update={"model_roots": change(list(settings.model_roots))})

    try:
        saved = update_settings(mutate)
    except _Refused as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    except SettingsError as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_FAILED
    for message in saved.messages:  # the file was unusable: moved aside, ours written
        notify.warning(message, source="settings")
    return EXIT_OK


# --- list -----------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    roots = _load().settings.model_roots
    if args.json:
        rows = [{"path": r, "exists": os.path.exists(os.path.expanduser(r))} for r in roots]
        json.dump(rows, out, indent=2)
        out.write("\n")
        return EXIT_OK
    if not roots:
        print("No model folders configured; add one with `qmgui roots add DIR`.", file=out)
        return EXIT_OK
    for r in roots:
        missing = "" if os.path.exists(os.path.expanduser(r)) else "  (not found)"
        print(f"{r}{missing}", file=out)
    return EXIT_OK


# --- add ------------------------------------------------------------------------------------


def _problem(path: Path) -> str | None:
    """Why `path` cannot be a model root, or None."""
    if not path.exists():
        return f"{path}: not found"
    if path.is_dir():
        return None
    if path.is_file() and path.name.lower().endswith(".gguf"):
        return None
    kind = "a file" if path.is_file() else "not a folder"
    return f"{path} is {kind}, not a folder of models (nor a .gguf file); nothing was added"


def cmd_add(args: argparse.Namespace, out: TextIO) -> int:
    paths = [Path(p).expanduser().resolve() for p in args.paths]
    problems = [p for p in (_problem(path) for path in paths) if p]
    if problems:
        for problem in problems:
            notify.error(problem, source=SOURCE)
        return EXIT_USAGE
    wanted = list(dict.fromkeys(str(p) for p in paths))
    done: list[Addition] = []

    def change(roots: list[str]) -> list[str]:
        addition = plan_add(roots, wanted)
        done[:] = [addition]
        return addition.roots

    status = _save(change)
    if status != EXIT_OK:
        return status
    addition = done[0]
    for path in addition.added:
        print(f"added {path}", file=out)
    for message in addition.messages():
        notify.info(message, source=SOURCE)
    return EXIT_OK


# --- remove ---------------------------------------------------------------------------------


def cmd_remove(args: argparse.Namespace, out: TextIO) -> int:
    removed: list[str] = []

    def change(roots: list[str]) -> list[str]:
        found = {p: find_root(roots, p) for p in args.paths}
        unknown = [p for p, r in found.items() if r is None]
        if unknown:
            listed = "; ".join(roots) if roots else "none are configured"
            names = ", ".join(unknown)
            inside = [(p, covering_root(roots, p)) for p in unknown]
            hints = "".join(f"; {p} is inside {r}, which is scanned whole" for p, r in inside if r)
            raise _Refused(
                f"{names}: not a model folder, so nothing was removed{hints} (the model "
                f"folders: {listed})"
            )
        gone = {r for r in found.values() if r is not None}
        removed[:] = [r for r in roots if r in gone]
        return [r for r in roots if r not in gone]

    status = _save(change)
    if status != EXIT_OK:
        return status
    for root in removed:
        print(f"removed {root}", file=out)
    return EXIT_OK
