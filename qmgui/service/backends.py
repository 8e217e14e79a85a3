"""Backend registry steps both `qmgui backends` and the window's Backends dialog take: checking a
new entry, storing its executable, warning when it will not start."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace

from qmgui.core.backends import (
    CLASSES,
    CUSTOM,
    KINDS,
    Backend,
    canonical_kind,
    find_backend,
    kind_classes,
    sort_classes,
)
from qmgui.core.build_rules import build_number
from qmgui.core.probe import ProbeResult

PROBE_TIMEOUT_S = 10.0  # per run of --version/--help/--list-devices


def new_backend_problem(
    backends: Sequence[Backend],
    *,
    backend_id: str,
    kind: str,
    exe: str,
    classes: Sequence[str],
    default_for: Sequence[str] = (),
) -> str | None:
    """Why a backend cannot be added as asked (`qmgui backends add`, the Backends dialog's
    form), or None."""
    if not backend_id.strip():
        return "a backend id must not be blank"
    if find_backend(backends, backend_id) is not None:
        return (
            f"a backend with the id {backend_id!r} already exists; "
            "remove it first or pick another id"
        )
    kind = canonical_kind(kind)
    if kind not in KINDS:
        return f"unknown kind {kind!r}; one of {', '.join(KINDS)}"
    if not exe.strip():
        return "the executable must not be blank"
    unknown = [c for c in [*classes, *default_for] if c not in CLASSES]
    if unknown:
        return f"unknown model class {unknown[0]!r}; one of {', '.join(CLASSES)}"
    if kind == CUSTOM and not classes:
        return "a custom backend needs the classes it serves: --class CLASS ..."
    if kind != CUSTOM and classes:
        served = ", ".join(sort_classes(kind_classes(kind)))
        return f"--class is for custom backends only; a {kind} backend serves {served}"
    return None


def stored_executable(exe: str) -> str:
    """A path is stored absolute (the engine is launched from another folder); a bare name
    stays a name, looked up on PATH when the engine starts."""
    path = os.path.expanduser(exe)
    if os.sep in path or (os.altsep and os.altsep in path):
        return os.path.abspath(path)
    return exe


def executable_warning(exe: str) -> str | None:
    """Why `exe` will probably not start, or None; only a warning, since the user may be
    setting up a backend before installing it."""
    if exe == os.path.basename(exe):
        if shutil.which(exe) is None:
            return f"{exe} was not found on PATH; the backend will not start until it is"
        return None
    if not os.path.exists(exe):
        return f"{exe} does not exist; the backend will not start until it does"
    if os.path.isdir(exe):
        return f"{exe} is a folder, not an executable"
    if not os.access(exe, os.X_OK):
        return f"{exe} is not executable; the backend will not start until it is (chmod +x)"
    return None


def with_probe(b: Backend, result: ProbeResult) -> Backend:
    """`b` with what a successful probe found: version, the llama.cpp build (bNNNN, from the
    version line: `core.build_rules.build_number`), variant (the user's wins) and capabilities.
    A failed probe leaves `b` as it was."""
    if not result.ok:
        return b
    build = build_number(result.build, result.commit)
    return replace(
        b,
        version=result.version or b.version,
        build=build if build is not None else b.build,
        variant=b.variant or result.variant,
        capabilities={**b.capabilities, **result.capabilities()},
    )
