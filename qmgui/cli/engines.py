"""`qmgui engines list|stop|adopt`: the engines qmgui started that still run.

`list` shows the run registry's running engines, whichever qmgui runs them (this window, a
`qmgui serve` in another terminal) or none (left by a run that is gone: "left running"). An
engine runs while the very process recorded does (same pid and start time, not a zombie) or,
when a wrapper script that started it died, while a member of its process group carries its
token; stale entries are dropped. `stop PID…` (or `--all`) ends each one's whole process tree
and group; `adopt PID` watches one until it exits or Ctrl-C stops it (without logs: its output
went to the run that started it); SIGINT, SIGTERM and SIGHUP stop it alike.
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
from qmgui.core.textsafe import printable
from qmgui.engines.adopt import Adopted
from qmgui.engines.registry import RunEntry, RunRegistry

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
    st.add_argument("pids", metavar="PID", type=int, nargs="*")
    st.add_argument("--all", action="store_true", help="every survivor")
    st.add_argument("--grace", type=float, default=5.0, help="seconds before SIGKILL")
    st.set_defaults(func=cmd_stop)
    ad = verbs.add_parser("adopt", help="watch one until it exits; Ctrl-C stops it")
    ad.add_argument("pid", metavar="PID", type=int)
    ad.add_argument("--keep", action="store_true", help="on Ctrl-C leave it running")
    ad.set_defaults(func=cmd_adopt)


def _owner_words(e: RunEntry) -> str:
    return f"run by qmgui pid {e.owner}" if e.owner_alive() else "left running"


def _describe(e: RunEntry) -> str:
    port = f"port {e.port}" if e.port is not None else "no known port"
    return printable(f"{e.pid}  {port}  {_owner_words(e)}  {' '.join(e.argv)}")


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
                    "pid": e.pid,
                    "port": e.port,
                    "argv": list(e.argv),
                    "pgid": e.pgid,
                    "owner": e.owner if e.owner_alive() else None,
                    "left_running": not e.owner_alive(),
                    "pids": sorted(p.pid for p in e.members()),
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
    return EXIT_OK


def _pick(registry: RunRegistry, pids: list[int]) -> tuple[list[RunEntry], list[int]]:
    running = {e.pid: e for e in _running(registry) or []}
    return [running[p] for p in pids if p in running], [p for p in pids if p not in running]


def cmd_stop(args: argparse.Namespace, out: TextIO) -> int:
    registry = RunRegistry()
    unknown: list[int] = []
    if args.all:
        targets = _running(registry) or []
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

    handlers = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
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
