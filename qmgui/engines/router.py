"""What a running llama.cpp router holds: its models (`GET /models`: each with its status) and,
for each loaded one, the memory of the llama-server child the router started for it (the child
is found by the `--alias NAME` the router gives it): resident memory from psutil, and the
buffers the child logged (the router relays each child's output prefixed with `[PORT] `; the
preset asks for the verbosity that logs them), read back as for any engine
(`core.readback.parse_llama_log`).

Bounded reads for a worker thread (the Engines panel's timer, `qmgui engines list`); nothing
here raises for an engine that went away: the reading is just empty.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from qmgui.core.readback import parse_llama_log

MODELS_PATH = "/models"
RELOAD_QUERY = "?reload=1"  # the router reads its preset file again (llama.cpp b7xxx on)
ROUTER_FLAG = "--models-preset"
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RouterModel:
    name: str
    status: str  # loaded, loading, unloaded, failed… as the router says
    pid: int | None = None  # its llama-server child, when loaded
    rss_bytes: int | None = None
    buffer_bytes: int | None = None  # what its log says it allocated (all devices)


@dataclass(frozen=True)
class RouterReading:
    models: tuple[RouterModel, ...] = ()

    @property
    def loaded(self) -> tuple[RouterModel, ...]:
        return tuple(m for m in self.models if m.status == "loaded")


def is_router(argv: Sequence[str]) -> bool:
    return any(a == ROUTER_FLAG or a.startswith(ROUTER_FLAG + "=") for a in argv)


def child_log(log_text: str, port: int) -> str:
    """The lines the router relayed from its child on `port`, without the prefix."""
    prefix = f"[{port}] "
    return "\n".join(ln[len(prefix) :] for ln in log_text.splitlines() if ln.startswith(prefix))


def _buffer_bytes(log_text: str | None, port: int | None) -> int | None:
    if not log_text or port is None:
        return None
    report = parse_llama_log(child_log(log_text, port))
    return sum(d.total.bytes for d in report.devices) or None


def _children(pid: int | None) -> dict[str, tuple[int, int | None, int | None]]:
    """alias -> (pid, resident bytes, port) of the router's children."""
    out: dict[str, tuple[int, int | None, int | None]] = {}
    if pid is None:
        return out
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return out
    for child in children:
        with contextlib.suppress(psutil.Error):
            argv = child.cmdline()
            if "--alias" in argv[:-1]:
                alias = argv[argv.index("--alias") + 1]
                rss: int | None = None
                with contextlib.suppress(psutil.Error):
                    rss = int(child.memory_info().rss)
                port = argv[argv.index("--port") + 1] if "--port" in argv[:-1] else ""
                out[alias] = (child.pid, rss, int(port) if port.isdigit() else None)
    return out


def read_router(
    url: str, pid: int | None, log_text: str | None = None, *, timeout_s: float = TIMEOUT_S
) -> RouterReading:
    """The router's models and, for the loaded ones, their child's memory (`log_text`: the
    router's log, for the buffers; empty on failure)."""
    try:
        import urllib.request  # noqa: PLC0415 - http at the first reading, not at start

        with urllib.request.urlopen(url + MODELS_PATH, timeout=timeout_s) as r:
            data = json.loads(r.read(1 << 20))
        items = data.get("data", []) if isinstance(data, dict) else []
    except (OSError, ValueError, urllib.error.URLError):
        return RouterReading()
    children = _children(pid)
    models = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        status = item.get("status")
        value = status.get("value") if isinstance(status, dict) else None
        name = item["id"]
        child = children.get(name) if value == "loaded" else None
        models.append(
            RouterModel(
                name,
                value if isinstance(value, str) else "unknown",
                child[0] if child else None,
                child[1] if child else None,
                _buffer_bytes(log_text, child[2]) if child else None,
            )
        )
    return RouterReading(tuple(models))


def reload_presets(url: str, *, timeout_s: float = 10.0) -> bool:
    """Have the router at `url` read its preset file again (`GET /models?reload=1`): a loaded
    model whose section changed is unloaded, and loads with its new arguments at its next
    request. False when the router did not answer (an older build without reloads answers
    the list and ignores the query: the new preset is read at its next start)."""
    try:
        import urllib.request  # noqa: PLC0415

        with urllib.request.urlopen(url + MODELS_PATH + RELOAD_QUERY, timeout=timeout_s) as r:
            r.read(1 << 20)
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return True
