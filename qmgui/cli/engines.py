"""`qmgui engines list|stop|adopt`: the engines qmgui started that still run.

`list` shows the run registry's running engines, whichever qmgui runs them (this window, a
`qmgui serve` in another terminal) or none (left by a run that is gone: "left running"). An
engine runs while the very process recorded does (same pid and start time, not a zombie) or,
when a wrapper script that started it died, while a member of its process group carries its
token; stale entries are dropped. Each line names the model, pid, port, URL and uptime, and
whether it was detached (`qmgui serve --detach`, "Keep running after quit" or "Leave them
running" in the window). `stop NAME|PID…` (or `--all`) ends each one's whole process tree and
group (a model name stops every engine of that model); `adopt PID` watches one until it exits
or Ctrl-C stops it, printing its log file's lines as they come when it writes one; SIGINT,
SIGTERM and SIGHUP stop it alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import asdict
from types import FrameType
from typing import Any, TextIO

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.core.textsafe import printable
from qmgui.core.units import format_bytes
from qmgui.engines.adopt import Adopted
from qmgui.engines.ports import HOST, connect_host, url_host
from qmgui.engines.registry import RunEntry, RunRegistry
from qmgui.engines.router import RouterModel, is_router, read_router
from qmgui.engines.supervisor import flag_value

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SOURCE = "engines"
# every signal that means "stop": Ctrl-C, a kill, the terminal closing
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "engines",
        help="list (the default), stop or adopt the engines qmgui started that still run",
        description="Engines qmgui started that still run: in this or another qmgui, or left "
        "running by one that is gone.",
    )
    # `qmgui engines` alone lists them, as `qmgui engines list` does
    p.set_defaults(func=cmd_list, json=False)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    ls = verbs.add_parser("list", help="list them")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    st = verbs.add_parser("stop", help="stop them (each one's whole process tree)")
    st.add_argument("pids", metavar="NAME|PID", nargs="*", help="a model name or a pid")
    st.add_argument("--all", action="store_true", help="every survivor")
    st.add_argument("--grace", type=float, default=5.0, help="seconds before SIGKILL")
    st.set_defaults(func=cmd_stop)
    ad = verbs.add_parser("adopt", help="watch one until it exits; Ctrl-C stops it")
    ad.add_argument("pid", metavar="PID", type=int)
    ad.add_argument("--keep", action="store_true", help="on Ctrl-C leave it running")
    ad.set_defaults(func=cmd_adopt)


def _owner_words(e: RunEntry) -> str:
    return f"run by qmgui pid {e.owner}" if e.owner_alive() else "left running"


def url_of(e: RunEntry) -> str | None:
    """Where to reach it from this machine (loopback for a wildcard host)."""
    if e.port is None:
        return None
    return f"http://{url_host(connect_host(flag_value(e.argv, '--host') or HOST))}:{e.port}"


def uptime_s(e: RunEntry) -> float:
    return max(0.0, time.time() - e.create_time)


def uptime_words(seconds: float) -> str:
    s = int(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _describe(e: RunEntry) -> str:
    port = f"port {e.port}" if e.port is not None else "no known port"
    how = "detached" if e.detached else _owner_words(e)
    return printable(
        f"{e.name}  pid {e.pid}  {port}  {url_of(e) or '-'}  up {uptime_words(uptime_s(e))}  "
        f"{how}  {' '.join(e.argv)}"
    )


LOG_TAIL_BYTES = 8 << 20  # a router's log read for its children's buffers


def _router_models(e: RunEntry) -> list[RouterModel] | None:
    """A router's models and their status (None for an engine that is not a router)."""
    url = url_of(e)
    if not is_router(e.argv) or url is None:
        return None
    text = None
    if e.log_path:  # the children's buffers, relayed into the router's log
        with contextlib.suppress(OSError), open(e.log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    return list(read_router(url, e.pid, text).models)


def _loaded_words(models: list[RouterModel]) -> str:
    loaded = [
        m.name + (f" ({format_bytes(m.rss_bytes)})" if m.rss_bytes else "")
        for m in models
        if m.status == "loaded"
    ]
    return printable(f"  models: {len(models)}, loaded: {', '.join(loaded) or 'none'}")


def _running(registry: RunRegistry) -> list[RunEntry] | None:
    try:
        return registry.running()
    except EngineError as e:
        notify.error(str(e), source=SOURCE)
        return None


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    running = _running(RunRegistry())
    if running is None:
        return EXIT_FAILED
    if args.json:
        json.dump(
            [
                {
                    "model": e.name,
                    "model_id": e.model_id,
                    "pid": e.pid,
                    "port": e.port,
                    "url": url_of(e),
                    "uptime_s": round(uptime_s(e), 1),
                    "detached": e.detached,
                    "log": e.log_path,
                    "argv": list(e.argv),
                    "pgid": e.pgid,
                    "owner": e.owner if e.owner_alive() else None,
                    "left_running": not e.owner_alive(),
                    "pids": sorted(p.pid for p in e.members()),
                    "router_models": (
                        None
                        if (models := _router_models(e)) is None
                        else [asdict(m) for m in models]
                    ),
                }
                for e in running
            ],
            out,
            indent=2,
        )
        out.write("\n")
    elif not running:
        print("no engines started by qmgui are running", file=out)
    else:
        for e in running:
            print(_describe(e), file=out)
            models = _router_models(e)
            if models is not None:
                print(_loaded_words(models), file=out)
    return EXIT_OK


def _pick(registry: RunRegistry, names: list[str]) -> tuple[list[RunEntry], list[str]]:
    """The running engines `names` name (a pid, or a model's name or id: every engine of it),
    and the names that name none."""
    running = _running(registry) or []
    found: dict[int, RunEntry] = {}
    unknown: list[str] = []
    for name in names:
        hits = [
            e
            for e in running
            if (name.isdigit() and e.pid == int(name)) or name in (e.model, e.model_id)
        ]
        if not hits:
            unknown.append(name)
        for e in hits:
            found.setdefault(e.pid, e)
    return list(found.values()), unknown


def cmd_stop(args: argparse.Namespace, out: TextIO) -> int:
    registry = RunRegistry()
    unknown: list[str] = []
    if args.all:
        targets = _running(registry) or []
    elif args.pids:
        targets, unknown = _pick(registry, args.pids)
    else:
        notify.error("name the engines to stop (NAME or PID…) or give --all", source=SOURCE)
        return EXIT_USAGE
    for name in unknown:
        notify.error(
            f"{printable(name)} is not an engine qmgui started that still runs; nothing was done",
            source=SOURCE,
        )
    failed = bool(unknown)
    for e in targets:
        try:
            result = registry.stop(e, grace_s=args.grace)
        except EngineError as err:
            notify.error(str(err), source=SOURCE)
            failed = True
            continue
        how = "" if result.graceful else " (it ignored the stop signal and was killed)"
        print(printable(f"stopped {e.pid} ({e.name}){how}"), file=out)
    return EXIT_FAILED if failed else EXIT_OK


def _print_new(eng: Adopted, shown: int, out: TextIO) -> int:
    """Print the log lines that came since the last call (the ring counts them)."""
    lines = eng.log.tail()
    total = eng.log.count
    new = lines[-(total - shown) :] if total > shown else []
    for line in new:
        print(printable(line), file=out)
    if new:
        out.flush()
    return total


def cmd_adopt(args: argparse.Namespace, out: TextIO) -> int:
    registry = RunRegistry()
    found, _ = _pick(registry, [str(args.pid)])
    if not found:
        notify.error(f"{args.pid} is not an engine qmgui started that still runs", source=SOURCE)
        return EXIT_FAILED
    eng = Adopted(found[0], registry=registry)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    handlers = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        eng.start()
        logs = "its log follows" if eng.logs else "no log is available"
        print(f"adopted {eng.pid} {eng.url or '(no known port)'}; {logs}", file=out)
        out.flush()
        shown = 0
        while not stop.wait(0.2) and not eng.state.final:
            shown = _print_new(eng, shown, out)
        if eng.state.final:
            notify.error(str(eng.outcome), source=SOURCE)
            return EXIT_FAILED
        if args.keep:
            print(f"left {eng.pid} running", file=out)
            return EXIT_OK
        notify.info(str(eng.stop()), source=SOURCE)
        return EXIT_OK
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
