"""`qmgui serve --router MODEL... [--port P] [--models-max N] [--detach]`: several models
through one endpoint, llama.cpp's router (`llama-server --models-preset`).

Each model's section holds the settings its own `qmgui serve MODEL` would get (saved profile,
then the command line; `qmgui.service.router`); clients name the model by its section (the
model's name). The router loads a model on its first request and unloads the least recently
used beyond `--models-max` (default: the largest number of these models that fit together on
this machine's cards and RAM). It prints `ready URL`, then one line per model, and runs until
Ctrl-C, which stops it and every model it loaded; `--detach` leaves it running
(`qmgui engines stop` stops it and its models). The port is the router's own, saved like a
model's (under the router's id, the same for the same models).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TextIO

from qmgui import notify
from qmgui.cli.plan import projector_sentence
from qmgui.cli.preview import request_from
from qmgui.cli.serve import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PLACEHOLDER_PORT,
    SOURCE,
    _list_survivors,
    _run_detached,
    serve_until_stopped,
)
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import EmitError
from qmgui.core.errors import SettingsError, SizingError
from qmgui.core.meta import ModelClass
from qmgui.engines.model_ports import port_for_start
from qmgui.engines.registry import RunRegistry
from qmgui.engines.runner import become_subreaper
from qmgui.engines.supervisor import Supervisor
from qmgui.hw.host import read_ram
from qmgui.service.exposure import exposure
from qmgui.service.launch import Resolver, UsageError, load_quietly
from qmgui.service.router import (
    RouterPlan,
    plan_router,
    refresh_preset,
    router_spec,
    write_preset,
)
from qmgui.settings import settings_path


def _entries(args: argparse.Namespace) -> list[ModelEntry] | int:
    entries = []
    for path in (args.model, *args.more):
        entry = entry_for_path(os.path.abspath(path))  # the preset names absolute paths
        if entry.meta is None:
            notify.error(f"{path}: {entry.error or 'not a model'}", source=SOURCE)
            return EXIT_USAGE
        if entry.model_class == ModelClass.PROJECTOR:
            notify.error(projector_sentence(path), source=SOURCE)
            return EXIT_USAGE
        entries.append(entry)
    return entries


def cmd_serve_router(args: argparse.Namespace, out: TextIO) -> int:
    if args.models_max is not None and args.models_max < 1:
        notify.error("--models-max must be at least 1", source=SOURCE)
        return EXIT_USAGE
    try:
        req = request_from(args, port=PLACEHOLDER_PORT, estimate=False)
    except (ValueError, EmitError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    entries = _entries(args)
    if isinstance(entries, int):
        return entries
    resolver = Resolver(
        load_quietly(), backend_arg=args.backend, engine=args.engine, probe=not args.no_probe
    )
    try:
        plan = plan_router(
            entries, resolver, req, host_bytes=read_ram()[1], max_models=args.models_max
        )
    except (UsageError, EmitError, SizingError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_FAILED
    for warning in plan.warnings:
        notify.warning(warning, source=SOURCE)
    host = args.host or "127.0.0.1"
    try:
        exposed = exposure(host)
        preset = write_preset(plan)
    except (SettingsError, OSError) as e:
        notify.error(f"the router could not be prepared: {e}", source=SOURCE)
        return EXIT_FAILED
    if exposed.warning:
        notify.warning(exposed.warning, source=SOURCE)
    if exposed.new_key:  # on stderr: `ready URL` stays the first line of stdout
        notify.info(f"API key (shown once): {exposed.new_key}", source=SOURCE)
    port = args.port
    if port is None:
        port = port_for_start(plan.router_id, resolver.loaded.settings, path=resolver.loaded.path)
    spec = router_spec(plan, preset, port=port, extra=exposed.extra)
    spec = replace(spec, host=host)
    registry = RunRegistry()
    if args.detach:
        sup = Supervisor(spec, registry=registry, detached=True, model_id=plan.router_id)
        code = _run_detached(sup, out)
        if code == EXIT_OK:
            _print_models(plan.models, plan.models_max, out)
        return code
    _list_survivors(registry)
    become_subreaper()
    sup = Supervisor(spec, registry=registry, model_id=plan.router_id)
    follow = _ProfileFollower(resolver, lambda r: plan_router(
        entries, r, req, host_bytes=read_ram()[1], max_models=args.models_max
    ), sup)  # fmt: skip
    return serve_until_stopped(sup, lambda: _report_ready(sup, plan, out), every=follow)


class _ProfileFollower:
    """While the router serves: when the settings file changes (a profile saved by the
    window or `qmgui plan … --save`), plan the preset again and bring it to the router."""

    def __init__(
        self, resolver: Resolver, replan: Callable[[Resolver], RouterPlan], sup: Supervisor
    ) -> None:
        self._resolver, self._replan, self._sup = resolver, replan, sup
        self._path = resolver.loaded.path or settings_path()
        self._stamp = self._read_stamp()

    def _read_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._path) if self._path is not None else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size) if st is not None else None

    def __call__(self) -> None:
        stamp = self._read_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._resolver.loaded = load_quietly()
            said = refresh_preset(self._replan(self._resolver), self._sup.url, self._sup.spec.argv)
        except (UsageError, EmitError, SizingError, SettingsError, OSError) as e:
            notify.warning(f"the preset was not updated: {e}", source=SOURCE)
            return
        if said:
            notify.info(said, source=SOURCE)


def _report_ready(sup: Supervisor, plan: RouterPlan, out: TextIO) -> None:
    with contextlib.suppress(OSError):
        print(f"ready {sup.url}", file=out, flush=True)
    _print_models(plan.models, plan.models_max, out)


def _print_models(models: tuple[str, ...], models_max: int, out: TextIO) -> None:
    with contextlib.suppress(OSError):
        for name in models:
            print(f"model {name}", file=out)
        print(f"models loaded at once: at most {models_max}", file=out, flush=True)
