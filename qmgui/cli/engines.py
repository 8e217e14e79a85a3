"""`qmgui engines list|stop|adopt`: engines an earlier qmgui run started and left running.

`list` shows the run registry's survivors (the very processes recorded: same pid and start
time); `stop PID…` (or `--all`) ends each one's whole process tree; `adopt PID` watches one
until it exits or Ctrl-C stops it (without logs: its output went to the run that started it).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from types import FrameType
from typing import Any, TextIO

from qmgui import notify
from qmgui.core.errors import EngineError
from qmgui.engines.adopt import Adopted
from qmgui.engines.registry import RunEntry, RunRegistry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SOURCE = "engines"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "engines",
        help="list, stop or adopt engines an earlier qmgui run left running",
        description="Engines qmgui started in an earlier run that still run.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="list them")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    st = verbs.add_parser("stop", help="stop them (each one's whole process tree)")
    st.add_argument("pids", metavar="PID", type=int, nargs="*")
    st.add_argument("--all", action="store_true", help="every survivor")
    st.add_argument("--grace", type=float, default=5.0, help="seconds before SIGKILL")
    st.set_defaults(func=cmd_stop)
    ad = verbs.add_parser("adopt", help="watch one until it exits; Ctrl-C stops it")
    ad.add_argument("pid", metavar="PID", type=int)
    ad.add_argument("--keep", action="store_true", help="on Ctrl-C leave it running")
    ad.set_defaults(func=cmd_adopt)


def _describe(e: RunEntry) -> str:
    port = f"port {e.port}" if e.port is not None else "no known port"
    return f"{e.pid}  {port}  {' '.join(e.argv)}"


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    survivors = RunRegistry().survivors()
    if args.json:
        json.dump(
            [{"pid": e.pid, "port": e.port, "argv": list(e.argv)} for e in survivors], out, indent=2
        )
        out.write("\n")
    elif not survivors:
        print("no engines from an earlier run are running", file=out)
    else:
        for e in survivors:
            print(_describe(e), file=out)
    return EXIT_OK


def _pick(registry: RunRegistry, pids: list[int]) -> tuple[list[RunEntry], list[int]]:
    survivors = {e.pid: e for e in registry.survivors()}
    return [survivors[p] for p in pids if p in survivors], [p for p in pids if p not in survivors]


def cmd_stop(args: argparse.Namespace, out: TextIO) -> int:
    registry = RunRegistry()
    unknown: list[int] = []
    if args.all:
        targets = registry.survivors()
    elif args.pids:
        targets, unknown = _pick(registry, args.pids)
    else:
        notify.error("name the engines to stop (PID…) or give --all", source=SOURCE)
        return EXIT_USAGE
    for pid in unknown:
        notify.error(
            f"{pid} is not an engine qmgui started that still runs; nothing was done",
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
        print(f"stopped {e.pid}{how}", file=out)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_adopt(args: argparse.Namespace, out: TextIO) -> int:
    registry = RunRegistry()
    found, _ = _pick(registry, [args.pid])
    if not found:
        notify.error(f"{args.pid} is not an engine qmgui started that still runs", source=SOURCE)
        return EXIT_FAILED
    eng = Adopted(found[0], registry=registry)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        eng.start()
        print(f"adopted {eng.pid} {eng.url or '(no known port)'}; no log is available", file=out)
        out.flush()
        while not stop.wait(0.2) and not eng.state.final:
            pass
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
