"""`qmgui serve`: run one model's engine under the supervisor until Ctrl-C.

The command is built exactly as `qmgui preview` builds it (same flags, same backend
resolution); it runs on the model's saved port (chosen once from settings' `ports` range
and saved at the first start; `--port` overrides it for this run). A taken port fails, naming
what holds it and the next free one. When the engine is
ready this prints `ready <url>`, then what the plan predicted beside what the engine reports
it allocated, per device, and what NVML says the engine's processes hold per GPU when there
is a reading. The differences (actual − planned per buffer kind) are recorded in the residual
store (`qmgui.engines.residuals`). Engines an earlier run left running are listed at start
(`qmgui engines` stops or adopts them). SIGINT, SIGTERM or SIGHUP (the terminal closed) stops
the engine gracefully (its whole process tree and group), removes it from the run registry and
exits 0. The process becomes a child subreaper (Linux), so a wrapper script's engine stays its
own even when the script dies; if `serve` itself is killed, the engine's group is ended by the
watchdog (`qmgui.engines.runner`).

`--detach` leaves the engine running on its own: it writes its output to its log file (not to
`serve`), has its own session, no parent-death signal and no watchdog, and is recorded in the
run registry as detached (with its model, log file and URL). `serve --detach` prints
`ready <url>` once the engine answers its health check and exits 0; a load that fails exits 1
with the engine's reason, and leaves nothing running. `qmgui engines list|stop` and the
window (which adopts it: state, URL, uptime, its log followed from the file) take it from
there.

An extra `--host` (e.g. `--extra='--host 0.0.0.0'`) is honoured: the engine listens there, with
a warning that it is reachable from the network; `ready` names the loopback URL. `--host
ADDRESS` does the same and, for anything but loopback, passes an API key (generated once,
kept 0600 in the settings folder, printed once; `qmgui.service.exposure`) unless the command
gives one.

`--router MODEL...` serves several models through one endpoint, llama.cpp's router
(`qmgui.cli.serve_router`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import FrameType
from typing import Any, TextIO

from qmgui import notify
from qmgui.cli.plan import add_plan_flags
from qmgui.cli.preview import add_target_flags, prepare
from qmgui.core.build_rules import rules_for
from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import EmitError
from qmgui.core.errors import SettingsError, SizingError
from qmgui.core.footprint import Footprint, estimate
from qmgui.core.readback import parse_llama_log
from qmgui.core.textsafe import redact_argv
from qmgui.core.units import format_bytes
from qmgui.engines.model_ports import port_for_start
from qmgui.engines.registry import RunRegistry
from qmgui.engines.residuals import ResidualStore, engine_pids, readback
from qmgui.engines.runner import become_subreaper
from qmgui.engines.supervisor import EngineSpec, State, Supervisor
from qmgui.hw.host import cpu_target
from qmgui.hw.nvml import read_nvml
from qmgui.service.exposure import expose_spec
from qmgui.service.launch import Request, UsageError, emit_model, engine_spec

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SOURCE = "serve"
PLACEHOLDER_PORT = 8080  # emitted, then replaced by the supervisor's port
# every signal that means "stop": Ctrl-C, a kill, the terminal closing
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run a model's engine until Ctrl-C, and compare its memory with the plan",
        description="Start the engine for MODEL (the command `qmgui preview` shows), wait "
        "until it is ready, print its URL and planned vs actual memory per device, and stop "
        "it on Ctrl-C.",
    )
    p.add_argument("model", metavar="MODEL", help="a .gguf file or a Hugging Face folder")
    p.add_argument(
        "more",
        nargs="*",
        metavar="MODEL",
        help="with --router: more models behind the same endpoint",
    )
    p.add_argument(
        "--router",
        action="store_true",
        help="serve every MODEL through one endpoint: llama-server in router mode, each model "
        "loaded on its first request with the settings of its own launch",
    )
    p.add_argument(
        "--models-max",
        type=int,
        default=None,
        metavar="N",
        help="with --router: models loaded at once (default: the most that fit together)",
    )
    p.add_argument(
        "--host",
        default=None,
        metavar="ADDRESS",
        help="listen on ADDRESS (default 127.0.0.1); any other address needs an API key, "
        "generated once and kept in the settings folder",
    )
    add_plan_flags(p)
    add_target_flags(p)
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="default: the model's saved port (chosen from settings' range at its first start)",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument(
        "--detach",
        action="store_true",
        help="return once the engine is ready (printing its URL) and leave it running; "
        "`qmgui engines stop` stops it",
    )
    p.set_defaults(func=cmd_serve)


def _plan(entry: Any, req: Any) -> Footprint | None:
    if entry.meta is None or entry.format != "gguf":
        return None
    try:  # by the rules of the build that runs (the comparison is with what it allocates)
        rules = replace(rules_for(req.build)[0], cpu=cpu_target(req.build))
        return estimate(entry.meta, req.settings, req.gpus, rules=rules)
    except SizingError as e:
        notify.warning(f"no plan to compare with: {e}", source=SOURCE)
        return None


def _nvml_processes(sup: Supervisor, fp: Footprint | None) -> list[dict[str, object]]:
    """Readback with residuals: record them, and return NVML's per-process GPU figures."""
    text = sup.log.text()
    plan = fp or Footprint(settings=None, n_gpu_layers=0, layer_devices=(), devices=())  # type: ignore[arg-type]
    rb = readback(text, plan, read_nvml(), pids=engine_pids(sup.pid))
    if fp is not None:
        for overrun in rb.overruns():  # the plan was short: said, never silently absorbed
            notify.warning(f"{sup.spec.name}: {overrun}", source=SOURCE)
    if fp is not None and rb.comparable:
        try:
            ResidualStore().record(rb)
        except OSError as e:
            notify.warning(f"the memory residuals could not be recorded: {e}", source=SOURCE)
    return [p.to_json() for p in rb.processes]


def _compare(sup: Supervisor, entry: Any, req: Any) -> dict[str, Any]:
    fp = _plan(entry, req)
    planned: list[dict[str, object]] = [d.to_json() for d in fp.devices] if fp else []
    report = parse_llama_log(sup.log.text())
    actual = [
        {
            "name": d.device,
            "weights": d.model.bytes,
            "kv": d.kv.bytes + d.recurrent.bytes,
            "compute": d.compute.bytes,
            "output": d.output.bytes,
            "repack": d.repack.bytes,
            "total": d.total.bytes,
        }
        for d in report.devices
    ]
    return {
        "url": sup.url,
        "argv": list(redact_argv(sup.argv or ())),
        "planned": planned,
        "actual": actual,
        "nvml": _nvml_processes(sup, fp),
    }


def _repack_text(d: dict[str, Any], *, planned: bool) -> str:
    """Planned: the copies this CPU makes, or the most repacking can copy where the CPU is
    not known ("≤"); actual: what it copied."""
    repack = int(d.get("repack", 0))
    if planned and not repack:
        return "≤ " + format_bytes(int(d.get("repack_bound", 0)))
    return format_bytes(repack)


def _print_compare(data: dict[str, Any], out: TextIO) -> None:
    cols = ("", "DEVICE", "WEIGHTS", "KV", "COMPUTE", "OUTPUT", "REPACK", "TOTAL")
    rows: list[tuple[str, ...]] = [cols]
    for label in ("planned", "actual"):
        for d in data[label]:
            rows.append(
                (
                    label,
                    str(d["name"]),
                    *(
                        format_bytes(int(d.get(k, 0)))
                        for k in ("weights", "kv", "compute", "output")
                    ),
                    _repack_text(d, planned=label == "planned"),
                    format_bytes(int(d["total"])),
                )
            )
    if not data["actual"]:
        rows.append(("actual", "-", "the engine's log names no buffers", "", "", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)
    for p in data.get("nvml", []):
        used = p["used_bytes"]
        held = "an amount NVML cannot say" if used is None else format_bytes(int(used))
        print(
            f"nvml: pid {p['pid']} holds {held} on GPU {p['gpu_index']} ({p['gpu_name']})", file=out
        )


def _list_survivors(registry: RunRegistry) -> None:
    """Say which engines an earlier run left running, and how to stop them."""
    try:
        survivors = registry.survivors()
    except Exception as e:  # the registry is advisory: never a reason not to serve
        notify.warning(f"the run registry could not be read: {e}", source=SOURCE)
        return
    for s in survivors:
        if s.detached:
            continue  # left running on purpose (`--detach`, the window's "keep running")
        where = f"port {s.port}" if s.port is not None else "no known port"
        notify.warning(
            f"an engine from an earlier run still runs: pid {s.pid} ({where}): "
            f"{' '.join(s.argv[:3])}…; stop it with `qmgui engines stop {s.pid}`",
            source=SOURCE,
        )


def launch_spec(
    args: argparse.Namespace, *, source: str = SOURCE, downshift: bool = True
) -> tuple[EngineSpec, ModelEntry, Request] | int:
    """The supervisor's spec for the command `serve` runs for `args` (the model's saved port
    unless `--port`), with the model and the request; or the exit status of an error, already
    reported. `downshift`: retry an out-of-memory llama-server load at a smaller context when
    no context was given (`qmgui bench` measures what it was asked to, and turns it off)."""
    prepared = prepare(args, port=PLACEHOLDER_PORT, source=source)
    if isinstance(prepared, int):
        return prepared
    req, entry, resolver = prepared
    try:
        target = resolver.target(entry)
        if isinstance(target, str):
            notify.error(target, source=source)
            return EXIT_FAILED
        emitted = emit_model(entry, target, req, resolver.override(entry))
    except (UsageError, EmitError, SizingError) as e:
        notify.error(str(e), source=source)
        return EXIT_USAGE
    command = emitted.command
    if not command.runnable:
        for reason in command.warnings:
            notify.error(reason, source=source)
        return EXIT_FAILED
    for warning in command.warnings:
        notify.warning(warning, source=source)
    port = args.port
    if port is None:
        port = port_for_start(entry.id, resolver.loaded.settings, path=resolver.loaded.path)
    spec = engine_spec(
        command, target.kind, entry, port=port,
        downshift=downshift and target.kind == "llama" and args.ctx is None,
    )  # fmt: skip
    return spec, entry, replace(req, build=target.build)


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    if args.router:
        from qmgui.cli.serve_router import cmd_serve_router  # noqa: PLC0415

        return cmd_serve_router(args, out)
    if args.more:
        notify.error(
            "serve runs one model; give --router to serve several through one endpoint",
            source=SOURCE,
        )
        return EXIT_USAGE
    if args.models_max is not None:
        notify.error("--models-max is for --router", source=SOURCE)
        return EXIT_USAGE
    prepared = launch_spec(args)
    if isinstance(prepared, int):
        return prepared
    spec, entry, req = prepared
    # `--host`, or a `--host` in the extra arguments: beyond loopback, an API key
    try:
        spec, exposed = expose_spec(spec, args.host)
    except SettingsError as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_FAILED
    if exposed is not None and exposed.warning:
        notify.warning(exposed.warning, source=SOURCE)
    if exposed is not None and exposed.new_key:  # on stderr: `ready URL` stays first on stdout
        notify.info(f"API key (shown once): {exposed.new_key}", source=SOURCE)
    registry = RunRegistry()
    if args.detach:
        sup = Supervisor(spec, registry=registry, detached=True, model_id=entry.id)
        return _run_detached(sup, out)
    _list_survivors(registry)
    become_subreaper()
    sup = Supervisor(spec, registry=registry)
    return serve_until_stopped(sup, lambda: _report_ready(sup, entry, req, args.json, out))


@contextlib.contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT, SIGTERM or SIGHUP while the block runs (handlers restored)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    handlers = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def _start_until_ready(sup: Supervisor, stop: threading.Event) -> bool:
    """Start and wait: True once it serves, False when it failed or a stop signal came."""
    sup.start()
    while not stop.is_set() and not sup.wait_ready(0.1) and not sup.state.final:
        pass
    return sup.state == State.READY and not stop.is_set()


def _failed(sup: Supervisor) -> int:
    outcome = sup.outcome
    notify.error(
        str(outcome), source=SOURCE, detail="\n".join(outcome.log_tail) if outcome else None
    )
    return EXIT_FAILED


def serve_until_stopped(
    sup: Supervisor,
    on_ready: Callable[[], None],
    every: Callable[[], None] | None = None,
    every_s: float = 2.0,
) -> int:
    """Start, call `on_ready` once it serves, and serve until a stop signal (exit 0) or until
    it fails (exit 1, with its message); whatever happens, it is stopped on the way out.
    `every` is called every `every_s` seconds while it serves (a router follows the profiles)."""
    with _stop_signals() as stop:
        try:
            if _start_until_ready(sup, stop):
                on_ready()
                next_at = time.monotonic() + every_s
                while not stop.wait(0.2) and not sup.state.final:
                    if every is not None and time.monotonic() >= next_at:
                        every()
                        next_at = time.monotonic() + every_s
            if sup.state.final and not stop.is_set():
                return _failed(sup)
            notify.info(str(sup.stop()), source=SOURCE)
            return EXIT_OK
        finally:
            if not sup.state.final:
                sup.stop()


def _run_detached(sup: Supervisor, out: TextIO) -> int:
    """Start, wait until ready, print `ready URL` and let go; a failed load is an error (the
    supervisor stopped what it started). A stop signal while it loads stops it."""
    if not sup.can_detach:
        notify.error(
            f"{sup.spec.name} cannot be detached: its log file {sup.log.path or ''} could not "
            "be created",
            source=SOURCE,
        )
        return EXIT_FAILED
    with _stop_signals() as stop:
        if _start_until_ready(sup, stop):
            left = sup.release()
            with contextlib.suppress(OSError):
                print(f"ready {sup.url}", file=out, flush=True)
            notify.info(str(left), source=SOURCE)
            return EXIT_OK
        if sup.state.final:
            return _failed(sup)
        notify.info(str(sup.stop()), source=SOURCE)
        return EXIT_FAILED


def _report_ready(sup: Supervisor, entry: Any, req: Any, as_json: bool, out: TextIO) -> None:
    """`ready URL` and the comparison; a terminal that went away (EIO, a closed pipe) does
    not stop the engine: the signal that follows does."""
    with contextlib.suppress(OSError):
        print(f"ready {sup.url}", file=out, flush=True)
        data = _compare(sup, entry, req)
        if as_json:
            json.dump(data, out, indent=2)
            out.write("\n")
        else:
            _print_compare(data, out)
        out.flush()
