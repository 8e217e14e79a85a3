"""Run llama-server only as far as its own projection of a launch (`-fit on` prints what each
device would hold before any weight is read), then stop it: `qmgui plan --check`.

The command is the launch's own (the same flags qmgui would run), with `-fit on` and the
verbosity that prints the projection; the process runs in its own session and the whole group
is killed as soon as the projection is printed, the load starts, or the time is up: nothing is
left behind, and no weight is loaded. Not `llama-fit-params`, which plans another graph (it
reserves for 512 outputs where the server reserves for its slots).

`check_launch` sets the projection beside qmgui's plan per device and records the comparison
in the residual store (`qmgui.engines.residuals`, apart from a launch's readbacks): what
`qmgui plan --check` and the window's "Check with the engine" run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qmgui.core.projection import ProjectedDevice, parse_projection
from qmgui.engines.ports import free_port

if TYPE_CHECKING:
    from qmgui.core.footprint import Footprint
    from qmgui.core.meta import ModelMeta
    from qmgui.engines.residuals import EngineCheck, ResidualStore

TIMEOUT_S = 60.0
# the projection is printed (or the load begins: too late for it, stop anyway)
DONE = (
    "common_fit_params: fitting params to free memory took",
    "load_tensors:",
    "llama_model_load:",
)
_MAX_LOG = 4 << 20


@dataclass(frozen=True)
class FitCheck:
    devices: tuple[ProjectedDevice, ...]  # () when the engine printed no projection
    log: str
    error: str = ""  # why there is no projection, in a sentence


def fit_argv(argv: Sequence[str], port: int) -> list[str]:
    """The launch's argv with `-fit on`, `-lv 4` and `port` (whatever it said before)."""
    out: list[str] = []
    skip = False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
            continue
        if tok in ("-fit", "--fit", "-lv", "--verbosity", "--log-verbosity", "--port") and (
            i + 1 < len(argv)
        ):
            skip = True
            continue
        if tok.split("=", 1)[0] in ("--fit", "--verbosity", "--log-verbosity", "--port"):
            continue
        out.append(tok)
    return [*out, "-fit", "on", "-lv", "4", "--port", str(port)]


def run_fit_check(argv: Sequence[str], *, timeout_s: float = TIMEOUT_S) -> FitCheck:
    """The engine's projection for the launch `argv` (its executable first)."""
    cmd = fit_argv(argv, free_port())
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
    except OSError as e:
        return FitCheck((), "", f"{cmd[0]} could not be started: {e.strerror or e}")
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        size = 0
        for line in proc.stdout:
            if size < _MAX_LOG:
                lines.append(line)
                size += len(line)
            if any(mark in line for mark in DONE):
                break
        done.set()

    reader = threading.Thread(target=read, name="qmgui-fit-check", daemon=True)
    reader.start()
    finished = done.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the projection is all it was started for
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    reader.join(2)
    log = "".join(lines)
    devices = parse_projection(log)
    if devices:
        return FitCheck(devices, log)
    if not finished:
        return FitCheck((), log, f"no projection within {timeout_s:.0f} s")
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
    return FitCheck(
        (), log, f"the engine printed no projection (does this build know -fit?): {last[:200]}"
    )


def _model_name(argv: Sequence[str]) -> str | None:
    for i, tok in enumerate(argv[:-1]):
        if tok in ("-m", "--model"):
            return Path(argv[i + 1]).name
    return next((Path(t.split("=", 1)[1]).name for t in argv if t.startswith("--model=")), None)


def check_launch(
    argv: Sequence[str], footprint: Footprint, *, meta: ModelMeta | None = None,
    store: ResidualStore | None = None, record: bool = True, timeout_s: float = TIMEOUT_S,
) -> EngineCheck:  # fmt: skip
    """The engine's projection of the launch `argv` beside the plan `footprint` (per device:
    weights, context, compute in MiB), recorded in the residual store (`store`, else the
    state folder's) unless `record` is False or there was no projection. A store that cannot
    be written is said as a warning; the comparison is returned all the same."""
    from qmgui import notify  # noqa: PLC0415 - with a check only
    from qmgui.engines.residuals import ResidualStore, engine_check  # noqa: PLC0415

    check = engine_check(
        run_fit_check(argv, timeout_s=timeout_s), footprint, meta=meta, model=_model_name(argv)
    )
    if record and check.comparable:
        try:
            (store or ResidualStore()).record_check(check)
        except OSError as e:
            notify.warning(f"the engine check could not be recorded: {e}", source="engines")
    return check
