"""`qmgui preview`: the command one launch runs, as argv and as bash and PowerShell lines.

The engine comes from `--backend` (a registry id, or an executable's path), else from the
backend registry (the model's pin, the ★ default of its class, the first entry that serves
it), else from the model itself (llama-server for a GGUF, vLLM for a Hugging Face folder,
sd-server for an image model, whisper-server for speech). A llama-server build is probed
(`--help`, bounded) so the command uses the flags that build knows. The model's stored
overrides fill the settings the command line leaves at their defaults, and its extra arguments
come before those given with `--extra`.

Resolving the engine and emitting one model live in `qmgui.service.launch` (the window uses
them too); the flags and the request built from a command line live here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any, TextIO

from qmgui import notify
from qmgui.cli.plan import add_plan_flags, gpus_from, launch_settings_from, projector_sentence
from qmgui.cli.profiles import (
    add_profile_flags,
    given_dests,
    given_fields,
    handle_profile_flags,
    track_given,
    vllm_values,
)
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import EmitError, skipped, split_each
from qmgui.core.errors import SizingError
from qmgui.core.meta import ModelClass
from qmgui.core.shell import quote_bash, quote_powershell
from qmgui.core.textsafe import redact_argv, redact_env
from qmgui.core.units import parse_size
from qmgui.engines.model_ports import choose_port
from qmgui.service.launch import (
    DEFAULT_PORT,
    Request,
    Resolver,
    UsageError,
    emit_model,
    load_quietly,
)

EXIT_OK = 0
EXIT_NO_COMMAND = 1
EXIT_USAGE = 2
SOURCE = "preview"

# --- the command ---------------------------------------------------------------------------------


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """--backend, --devices, --extra, --no-probe: shared with `qmgui export`."""
    p.add_argument(
        "--backend",
        metavar="ID|PATH",
        help="a backend id from the registry, or the engine's executable (default: the "
        "registry's choice for the model, else llama-server / vllm / sd-server / "
        "whisper-server)",
    )
    p.add_argument(
        "--devices",
        metavar="LIST",
        help="run on these GPUs only, e.g. 0,1 (numbered as the backend's variant numbers "
        "them; CUDA when unknown)",
    )
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="ARGS",
        help="more engine arguments, appended last, split as a shell does: --extra "
        "'--jinja --temp 0.7' (the next word is taken even when it starts with a dash, so "
        "--extra --jinja works); repeat for more",
    )
    p.add_argument(
        "--no-probe", action="store_true", help="do not run the engine's --help to check flags"
    )
    track_given(p)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="show the command that launches a model, for bash and PowerShell",
        description="Write the command that serves MODEL with these settings: the argv, and "
        "one line each for bash and PowerShell that run exactly that argv.",
    )
    p.add_argument("model", metavar="MODEL", help="a .gguf file or a Hugging Face folder")
    add_plan_flags(p)
    add_target_flags(p)
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="default: the model's saved port (the one its first start will save)",
    )
    p.add_argument(
        "--show-secrets",
        action="store_true",
        help="print the values of --api-key, --hf-token and *_TOKEN variables (default: "
        "<redacted>, so the output can be shared)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"argv": [...], "env": {...}, "backend": {...}, "warnings": [...]}',
    )
    add_profile_flags(p)
    track_given(p)
    p.set_defaults(func=cmd_preview)


def parse_devices(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(
            f"--devices {text}: give GPU numbers separated by commas, e.g. 0,1"
        ) from None


def request_from(args: argparse.Namespace, *, port: int | str, estimate: bool) -> Request:
    """The shared request of a `preview` or `export` command line (ValueError when bad).
    What it gives explicitly wins over the model's saved profile (`Request.given`)."""
    given = set(given_fields(args))
    dests = given_dests(args)
    if "devices" in dests:
        given.add("devices")
    if "extra" in dests and getattr(args, "save", False):
        given.add("extra_args")  # saved just now: not twice
    return Request(
        settings=launch_settings_from(args),
        gpus=gpus_from(args),
        reserve=parse_size(args.reserve, allow_zero=True),
        port=port,
        extra=split_each(args.extra),
        devices=parse_devices(args.devices),
        estimate=estimate,
        given=frozenset(given),
        vllm=vllm_values(args),
    )


def prepare(
    args: argparse.Namespace, *, port: int | str, source: str
) -> tuple[Request, ModelEntry, Resolver] | int:
    """The launch request, the model and the backend resolver a command line asks for, or the
    exit status of a usage error (already reported through the notifier)."""
    try:
        req = request_from(args, port=port, estimate=False)
    except (ValueError, EmitError) as e:
        notify.error(str(e), source=source)
        return EXIT_USAGE
    entry = entry_for_path(args.model)
    if entry.meta is None:
        notify.error(f"{args.model}: {entry.error or 'not a model'}", source=source)
        return EXIT_USAGE
    if entry.model_class == ModelClass.PROJECTOR:
        notify.error(projector_sentence(args.model), source=source)
        return EXIT_USAGE
    code = handle_profile_flags(args, entry, source=source)
    if code is not None:
        return code
    resolver = Resolver(
        load_quietly(), backend_arg=args.backend, engine=args.engine, probe=not args.no_probe
    )
    return req, entry, resolver


def cmd_preview(args: argparse.Namespace, out: TextIO) -> int:
    prepared = prepare(args, port=DEFAULT_PORT if args.port is None else args.port, source=SOURCE)
    if isinstance(prepared, int):
        return prepared
    req, entry, resolver = prepared
    if args.port is None:
        req = replace(req, port=choose_port(resolver.loaded.settings, entry.id))
    try:
        target = resolver.target(entry)
        if isinstance(target, str):
            emitted = None
            command = skipped(target)
        else:
            emitted = emit_model(entry, target, req, resolver.override(entry))
            command = emitted.command
    except (UsageError, EmitError, SizingError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    if not args.show_secrets:
        command = replace(command, argv=redact_argv(command.argv), env=redact_env(command.env))
    if args.json:
        backend = emitted.target.to_json() if emitted else None
        data = {**command.to_json(), "backend": backend}
        json.dump({k: data[k] for k in ("argv", "env", "backend", "warnings")}, out, indent=2)
        out.write("\n")
    if not command.runnable:
        for reason in command.warnings:
            notify.error(reason, source=SOURCE)
        return EXIT_NO_COMMAND
    for warning in command.warnings:
        notify.warning(warning, source=SOURCE)
    if not args.json:
        print("# bash", file=out)
        print(quote_bash(command.argv, command.env), file=out)
        print("# PowerShell", file=out)
        print(quote_powershell(command.argv, command.env), file=out)
    return EXIT_OK
