"""`qmgui export`: plans written as files other tools run.

- `llama-swap`: a config.yaml serving every model on demand behind one endpoint;
- `script`: a bash or PowerShell script that launches one model;
- `models-ini`: a llama.cpp router preset (`llama-server --models-preset models.ini`);
- `vllm-cluster`: one model on several machines with vLLM and Ray (`--node ADDRESS=GPUS`, the
  first node is the Ray head): a bash script with a role per node (head, worker, serve).

Models come from the arguments, or from a scan of the configured roots and stores when none
are given. Each model runs on the engine `qmgui preview` would pick, with the same settings;
a model that cannot be exported is left out and named on stderr. `--out FILE` writes the file
atomically (a temp file beside it, fsync, rename); without it the file goes to stdout.

No byte of a model's name or path, a node address or an extra argument changes a file's
structure, and the value of `--api-key` / `--hf-token` is never written: the file reads it
from an environment variable and says which (docs/architecture.md, "Exports").
Messages on the terminal go through the notifier, which escapes control characters.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import tempfile
from collections.abc import Sequence
from typing import Any, TextIO

from qmgui import notify
from qmgui.cli.plan import add_plan_flags
from qmgui.cli.preview import add_target_flags, request_from
from qmgui.cli.profiles import vllm_values
from qmgui.core.discovery import ModelEntry, entry_for_path, scan
from qmgui.core.emit import EmitError, skipped, split_each
from qmgui.core.errors import SizingError
from qmgui.core.export import PORT_MARK, Export, ExportError, vllm_comment
from qmgui.core.export.llama_swap import SwapModel, render_llama_swap
from qmgui.core.export.models_ini import render_models_ini
from qmgui.core.export.scripts import (
    render_bash_script,
    render_cluster_script,
    render_powershell_script,
)
from qmgui.core.meta import ModelClass
from qmgui.core.profile import extra_args_of, vllm_pins
from qmgui.core.units import parse_size
from qmgui.core.vllm_cluster import Node, plan_cluster
from qmgui.engines.model_ports import choose_port
from qmgui.hw.profiles import lookup
from qmgui.service.launch import (
    DEFAULT_PORT,
    Emitted,
    Request,
    Resolver,
    UsageError,
    emit_model,
    load_quietly,
)
from qmgui.service.profile import profile_of
from qmgui.service.router import preset_model

EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
SOURCE = "export"
FORMATS = ("llama-swap", "script", "models-ini", "vllm-cluster")
SCRIPT_MODE = 0o755  # before the umask: the script is meant to be run


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a llama-swap config, a launch script or a llama.cpp models.ini",
        description="Write the launch plans of MODEL... (default: every model under the "
        "configured roots and stores) as a llama-swap config.yaml, a bash or PowerShell "
        "script (one model), or a llama.cpp router preset file.",
    )
    p.add_argument("format", choices=FORMATS, metavar="FORMAT", help=", ".join(FORMATS))
    p.add_argument("models", nargs="*", metavar="MODEL", help="a .gguf file or a folder")
    add_plan_flags(p)
    add_target_flags(p)
    p.add_argument("--out", metavar="FILE", help="write here (atomically) instead of stdout")
    p.add_argument(
        "--shell",
        choices=("bash", "powershell"),
        default="bash",
        help="the script's language (default bash)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="the script's default port (default: the model's saved port; 8080 for a router)",
    )
    p.add_argument("--ttl", type=int, default=0, help="llama-swap: seconds idle before unload")
    p.add_argument(
        "--windows",
        action="store_true",
        help="llama-swap: quote commands for llama-swap on Windows",
    )
    p.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="ADDRESS=GPUS",
        help="vllm-cluster: a machine and its GPUs (like --gpu: 2x4090, 4x24GiB), e.g. "
        "--node 10.0.0.1=2x3090 --node 10.0.0.2=2x3090; the first is the Ray head. Tensor "
        "parallel = GPUs per node, pipeline parallel = nodes",
    )
    p.set_defaults(func=cmd_export)


def _entries(paths: Sequence[str]) -> list[ModelEntry]:
    if paths:
        return [entry_for_path(p) for p in paths]
    from qmgui.cli.scan import _scan_roots  # noqa: PLC0415 - the same roots as `qmgui scan`

    roots = _scan_roots([])
    if not roots:
        return []
    result = scan(roots)
    for problem in result.problems:
        notify.warning(f"{problem.path}: {problem.reason}", source="scan")
    return [m for m in result.models if m.model_class != ModelClass.PROJECTOR]


def _emit_all(
    entries: Sequence[ModelEntry], resolver: Resolver, req: Request
) -> list[tuple[ModelEntry, Emitted | None, str | None]]:
    """Each model with its emitted command, or with the reason it has none."""
    out: list[tuple[ModelEntry, Emitted | None, str | None]] = []
    for entry in entries:
        if entry.meta is None:
            out.append((entry, None, f"{entry.name}: {entry.error or 'not a model'}"))
            continue
        target = resolver.target(entry)
        if isinstance(target, str):
            out.append((entry, None, target))
            continue
        emitted = emit_model(entry, target, req, resolver.override(entry))
        out.append((entry, emitted, None))
    return out


def _llama_swap(
    items: list[tuple[ModelEntry, Emitted | None, str | None]], args: argparse.Namespace
) -> Export:
    models = []
    for entry, emitted, reason in items:
        command = emitted.command if emitted else skipped(reason or "no command")
        models.append(
            SwapModel(
                id=entry.name,
                command=command,
                check_endpoint=emitted.health if emitted else "/health",
                ttl=args.ttl,
                comments=emitted.comments if emitted else (),
                tools=bool(emitted and emitted.vllm and emitted.vllm.tool_calling),
            )
        )
    return render_llama_swap(
        models, windows=args.windows, header=("llama-swap config written by qmgui",)
    )


def _script(
    items: list[tuple[ModelEntry, Emitted | None, str | None]], args: argparse.Namespace
) -> Export:
    entry, emitted, reason = items[0]
    if emitted is None or not emitted.command.runnable:
        why = emitted.command.warnings if emitted else (reason or "no command",)
        return Export(text="", warnings=tuple(why))
    name = os.path.basename(args.out) if args.out else None
    engine = os.path.basename(emitted.command.argv[0])
    common: dict[str, Any] = {
        "title": f"Launch {entry.name} with {engine}",
        "comments": emitted.comments,
        "default_port": args.port,
    }
    if args.shell == "powershell":
        return render_powershell_script(emitted.command, script_name=name or "launch.ps1", **common)
    return render_bash_script(emitted.command, script_name=name or "launch.sh", **common)


def _models_ini(entries: Sequence[ModelEntry], resolver: Resolver, req: Request) -> Export:
    """The preset file: the llama-server models only (the router is one llama-server)."""
    presets = []
    left_out = []
    builds: set[frozenset[str] | None] = set()
    for entry in entries:
        target = resolver.target(entry) if entry.meta is not None else None
        if target is None or isinstance(target, str) or target.kind != "llama":
            if entry.meta is None:
                why = entry.error or "not a model"
            else:
                why = target if isinstance(target, str) else "not served by llama-server"
            left_out.append(f"{entry.name}: left out of models.ini: {why}")
            continue
        builds.add(target.supported)
        # the same section `qmgui serve --router` writes (qmgui.service.router)
        presets.append(preset_model(entry, target, req, resolver.override(entry)))
    # the router is one build: spell for it when every model resolved to the same one
    result = render_models_ini(
        presets,
        supported_flags=next(iter(builds)) if len(builds) == 1 else None,
        header=("llama.cpp router presets written by qmgui: llama-server --models-preset FILE",),
    )
    return Export(result.text, (*left_out, *result.warnings))


def parse_nodes(texts: Sequence[str]) -> tuple[Node, ...]:
    """`--node ADDRESS=GPUS` values (ValueError with a sentence when unreadable)."""
    nodes = []
    for text in texts:
        address, sep, what = text.strip().partition("=")
        if not sep or not address or not what:
            raise ValueError(f"--node {text}: give ADDRESS=GPUS, e.g. 10.0.0.1=2x4090")
        nodes.append(Node(address, lookup(what)))
    return tuple(nodes)


def _vllm_cluster(
    entries: Sequence[ModelEntry], args: argparse.Namespace, resolver: Resolver
) -> Export:
    entry = entries[0]
    nodes = parse_nodes(args.node)
    if not nodes:
        raise UsageError("vllm-cluster needs the machines: --node ADDRESS=GPUS, the head first")
    profile = profile_of(resolver.override(entry))
    extra = (*extra_args_of(profile), *split_each(args.extra))
    values = {**profile, **vllm_values(args)}
    if args.ctx is not None:
        values["ctx_size"] = args.ctx
    cluster = plan_cluster(
        entry,
        nodes,
        reserve=parse_size(args.reserve, allow_zero=True),
        pins=vllm_pins(values, extra_args=extra),
        executable=args.backend or "vllm",
        port=PORT_MARK,
    )
    name = os.path.basename(args.out) if args.out else "cluster.sh"
    return render_cluster_script(
        cluster,
        title=f"Serve {entry.name} with vLLM on {cluster.nodes} node(s) through Ray: tensor "
        f"parallel {cluster.tensor_parallel} per node, pipeline parallel {cluster.nodes}",
        comments=(vllm_comment(cluster.plan), *cluster.notes),
        default_port=args.port,
        script_name=name,
    )


def write_atomic(path: str, text: str, *, mode: int | None = None) -> None:
    """Write `text` to `path` through a temp file beside it, fsync and rename. `mode` (before
    the umask) for a new file; an existing file keeps its own."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.name != "nt":  # mkstemp makes the file 0600; give it the mode a new file gets
            umask = os.umask(0)
            os.umask(umask)
            if os.path.exists(path) and mode is None:
                os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            else:
                os.chmod(tmp, (mode if mode is not None else 0o666) & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    # the port placeholder no file name can hold: a model named ${PORT}.gguf stays a name
    port = (
        (DEFAULT_PORT if args.port is None else args.port)
        if args.format == "models-ini"
        else PORT_MARK
    )
    try:
        req = request_from(args, port=port, estimate=True)
    except (ValueError, EmitError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    entries = _entries(args.models)
    if not entries:
        notify.error("no models to export: name them, or add a model folder", source=SOURCE)
        return EXIT_NOTHING
    if args.format in ("script", "vllm-cluster") and len(entries) != 1:
        notify.error("a script launches one model: name exactly one MODEL", source=SOURCE)
        return EXIT_USAGE
    resolver = Resolver(
        load_quietly(), backend_arg=args.backend, engine=args.engine, probe=not args.no_probe
    )
    if args.port is None:  # a script serves one model, on its saved port; a router on 8080
        one = args.format in ("script", "vllm-cluster")
        args.port = choose_port(resolver.loaded.settings, entries[0].id) if one else DEFAULT_PORT
    try:
        if args.format == "vllm-cluster":
            result = _vllm_cluster(entries, args, resolver)
        elif args.format == "models-ini":
            result = _models_ini(entries, resolver, req)
        else:
            items = _emit_all(entries, resolver, req)
            result = (
                _llama_swap(items, args) if args.format == "llama-swap" else _script(items, args)
            )
    except (UsageError, EmitError, SizingError, ExportError, ValueError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    for warning in result.warnings:
        notify.warning(warning, source=SOURCE)
    if not result.text:
        return EXIT_NOTHING
    if args.out:
        executable = args.format == "vllm-cluster" or (
            args.format == "script" and args.shell == "bash"
        )
        try:
            write_atomic(args.out, result.text, mode=SCRIPT_MODE if executable else None)
        except OSError as e:
            notify.error(f"could not write {args.out}: {e.strerror or e}", source=SOURCE)
            return EXIT_NOTHING
        notify.info(f"wrote {args.out}", source=SOURCE)
    else:
        out.write(result.text)
    return EXIT_OK
