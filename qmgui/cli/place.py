"""`qmgui place`: several models on several GPUs at once (`core.placement`), printed per model
and per device, as JSON, or as a llama-swap config or a bash script for a headless server.

With `--role ROLE=MODEL[:KEY=VALUE,...]` it plans a role set instead (`core.roles`: chat,
embed, rerank, vision, with replicas): each instance carries its role, replica, cards, context,
slots and the exact argv."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TextIO

from qmgui import notify
from qmgui.cli.plan import (
    add_reserve_flag,
    add_rpc_flag,
    cpu_target_from,
    gpus_from,
    local_machine,
)
from qmgui.cli.profiles import saved_override
from qmgui.core.build_rules import rules_for
from qmgui.core.devices import OS_RESERVE
from qmgui.core.devices import host_budget as devices_host_budget
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import Command, DevicePin, EmitError, skipped
from qmgui.core.emit.llama import emit_llama
from qmgui.core.errors import SizingError
from qmgui.core.export import PORT_MARK, ExportError, unique_name
from qmgui.core.export.llama_swap import placement_comment, render_run_set
from qmgui.core.export.run_set_script import render_run_set_script
from qmgui.core.footprint import Gpu, estimate
from qmgui.core.launch import CACHE_TYPES, LaunchSettings
from qmgui.core.meta import ModelMeta
from qmgui.core.placement import (
    AutoContext,
    Placed,
    Placement,
    Request,
    Unplaced,
    place,
)
from qmgui.core.profile import apply_profile
from qmgui.core.roles import RoleError
from qmgui.core.units import format_bytes, parse_size
from qmgui.hw.host import read_ram
from qmgui.service.launch import Resolver, Target, UsageError, backend_build, load_quietly
from qmgui.service.profile import profile_of
from qmgui.service.projector import projector_meta
from qmgui.service.role_sets import RoleSet, RoleSetOptions, with_projectors

EXIT_OK = 0
EXIT_UNPLACED = 1  # the placement was made, but some model does not fit
EXIT_USAGE = 2
SOURCE = "place"
AUTO = "auto"
SCRIPT_MODE = 0o755  # before the umask: the script is meant to be run

EPILOG = """\
per-model settings: MODEL@KEY=VALUE,KEY=VALUE with llama-server's short names
  c (or ctx)  context in tokens across the slots, or "auto" (the default: at least 4096,
              then grown toward the trained context with the room left at the end)
  np          slots (-np)        ngl    layers on the GPUs (-ngl; default all)
  ctk, ctv    KV cache types     fa     flash attention: on, off, auto
  ncmoe       MoE expert layers kept on the CPU (--n-cpu-moe)
  name        the name the model gets in the output and in the llama-swap config
example: qmgui place a.gguf@c=32768,np=2 b.gguf@ctx=auto,ctk=q8_0,ctv=q8_0 --gpu 4090 --gpu 3090

roles (--role ROLE=MODEL[:KEY=VALUE,...], repeatable; instead of MODEL..., not beside them):
  ROLE        chat, embed, rerank or vision; the search roles (embed, rerank) are placed
              first, then vision, then chat against what is left
  replicas    instances of the role, each on a card of its own; auto: one per card
  ctx         tokens per slot (chat: the target, default 32768 or the trained context;
              embed/rerank: the trained context, at most 4096; batch = context)
  slots       chat: up to 4 by default, as many full windows as the cards hold; embed and
              cross-encoder rerank: 1
  mode        rerank: cross (a rank head, --reranking) or llm (a generative reranker);
              default: from the model
  name, fa, ctk, ctv, ngl   as for MODEL@ settings
  a card left idle widens the context of a model below its target; a vision model without
  its projector is skipped with a warning; chat below the slots or context asked is a warning
example: qmgui place --role embed=bge.gguf --role chat=qwen.gguf:slots=4,ctx=16384 \\
           --role rerank=rr.gguf:replicas=auto --gpu 24GiB --gpu 24GiB --json

exit status: 0 when every model is placed, 1 when one or more do not fit (each is printed
with the reason and the nearest settings that fit), 2 for a usage error.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "place",
        help="place several models on the GPUs at once: cards, split, context, slots",
        description="Place MODEL... together on the GPUs (and llama.cpp rpc-servers): each on "
        "one card where it fits (the fullest card that holds it), a tensor split only when no "
        "card holds it, every card charged for everything on it. Prints per model the cards, "
        "split, context and slots, and per device each model's bytes and what is left.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("models", nargs="*", metavar="MODEL", help="a .gguf file, with @settings")
    p.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="ROLE=MODEL[:KEY=VALUE,...]",
        help="plan a role set instead of MODEL...: chat, embed, rerank, vision (repeat; see below)",
    )
    p.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="SIZE",
        help="plan for a GPU that need not exist: a size (24GiB) or a card (4090, 2x3090); "
        "repeat for several (default: the NVIDIA GPUs present)",
    )
    add_rpc_flag(p)
    add_reserve_flag(p)
    p.add_argument(
        "--host-memory",
        metavar="SIZE",
        help="host RAM the parts on the CPU may use (default: not checked with GPUs; without "
        "any, the RAM free now less an OS floor of 2 GiB)",
    )
    p.add_argument("-c", "--ctx-size", dest="ctx", default=AUTO, help="every model's context")
    p.add_argument("-np", "--parallel", dest="parallel", type=int, help="every model's slots")
    p.add_argument("-ctk", "--cache-type-k", dest="ctk", default="f16", choices=CACHE_TYPES)
    p.add_argument("-ctv", "--cache-type-v", dest="ctv", default="f16", choices=CACHE_TYPES)
    p.add_argument(
        "-fa",
        "--flash-attn",
        dest="fa",
        choices=("on", "off", "auto"),
        help="every model's flash attention (default auto; roles: per role and backend)",
    )
    p.add_argument("--json", action="store_true", help="print the placement as JSON")
    p.add_argument(
        "--llama-swap",
        metavar="FILE",
        help="also write a llama-swap config serving the placed models together "
        "(- for stdout instead of the table)",
    )
    p.add_argument(
        "--script",
        metavar="FILE",
        help="also write a bash script that starts every placed model at once, each on its "
        "own port from --port (- for stdout instead of the table)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=8080,
        help="the first engine's port in --script and in --json argv; the next ones follow "
        "(default 8080)",
    )
    p.add_argument(
        "--backend",
        metavar="ID|PATH",
        help="the llama-server to place for: its build's allocation rules size the models, "
        "and --llama-swap runs it",
    )
    p.add_argument(
        "--no-probe", action="store_true", help="do not run the engine's --help to check flags"
    )
    p.set_defaults(func=cmd_place)


# --- reading the command line --------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One MODEL argument: the path, its settings and its context rule."""

    path: str
    name: str | None
    settings: LaunchSettings
    context: AutoContext | None
    given: frozenset[str] = frozenset()  # fields set on the command line: the profile keeps off


def _ctx(value: str) -> tuple[int | None, AutoContext | None]:
    if value.strip().lower() == AUTO:
        return None, AutoContext()
    n = int(value)
    if n <= 0:
        raise ValueError(f"a context must be positive, not {value}")
    return n, None


def _choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{key}={value}: one of {', '.join(choices)}")
    return value


def _int(value: str) -> int:
    return int(value)


# MODEL@KEY=VALUE: the LaunchSettings field each key sets and how its value is read
_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "np": ("parallel", _int),
    "ngl": ("n_gpu_layers", _int),
    "ncmoe": ("n_cpu_moe", _int),
    "ctk": ("cache_type_k", lambda v: _choice("ctk", v, CACHE_TYPES)),
    "ctv": ("cache_type_v", lambda v: _choice("ctv", v, CACHE_TYPES)),
    "fa": ("flash_attn", lambda v: _choice("fa", v, ("on", "off", "auto"))),
}


def parse_spec(text: str, base: LaunchSettings, ctx: str) -> Spec:
    """`path@c=8192,np=2`: the settings after the last `@` (when they read as KEY=VALUE)."""
    path, sep, tail = text.rpartition("@")
    if not sep or "=" not in tail:
        path, tail = text, ""
    changes: dict[str, Any] = {}
    name: str | None = None
    given = {"tensor_split"} | ({"ctx_size"} if ctx.strip().lower() != AUTO else set())
    for pair in (p for p in tail.split(",") if p.strip()):
        key, eq, value = (x.strip() for x in pair.partition("="))
        if not eq or not value:
            raise ValueError(f"{text}: write each setting as KEY=VALUE ({pair!r})")
        if key in ("c", "ctx"):
            ctx = value
            given.add("ctx_size")
        elif key == "name":
            name = value
        elif key in _KEYS:
            field, read = _KEYS[key]
            try:
                changes[field] = read(value)
            except ValueError as e:
                why = str(e) if key in ("ctk", "ctv", "fa") else f"{key}={value}: not a number"
                raise ValueError(f"{text}: {why}") from None
        else:
            raise ValueError(f"{text}: unknown setting {key!r} (see qmgui place --help)")
    try:
        ctx_size, auto = _ctx(ctx)
    except ValueError:
        raise ValueError(f"{text}: the context is a number of tokens or 'auto'") from None
    given |= changes.keys()
    return Spec(path, name, replace(base, ctx_size=ctx_size, **changes), auto, frozenset(given))


def _requests(
    specs: list[Spec],
) -> tuple[list[Request], dict[str, ModelEntry], list[Unplaced]]:
    """The requests, the entries by request name, and the models that cannot be placed at all
    (unreadable files, Hugging Face folders)."""
    taken: set[str] = set()
    requests: list[Request] = []
    entries: dict[str, ModelEntry] = {}
    refused: list[Unplaced] = []
    saved = load_quietly().settings
    for spec in specs:
        entry = entry_for_path(spec.path)
        name = unique_name(spec.name or entry.name, taken)
        if entry.meta is None or entry.error:
            refused.append(Unplaced(name, entry.error or "not a model"))
        elif entry.format != "gguf":
            refused.append(
                Unplaced(name, "placement sizes llama-server launches of GGUF files; "
                         "plan this Hugging Face folder for vLLM (qmgui plan --engine vllm)")
            )  # fmt: skip
        else:
            # the model's saved profile fills what the command line did not set
            profile = profile_of(saved_override(saved, entry))
            settings = apply_profile(spec.settings, profile, given=spec.given)
            context = spec.context if settings.ctx_size is None else None
            requests.append(Request(name, entry.meta, settings, context=context))
            entries[name] = entry
    return requests, entries, refused


def _projectors(requests: list[Request], entries: dict[str, ModelEntry]) -> dict[int, ModelMeta]:
    """The projector each model's command loads (`--mmproj`), by its metadata's identity."""
    kept: dict[int, ModelMeta] = {}
    for r in requests:
        proj = projector_meta(entries[r.name])
        if proj is not None:
            kept[id(r.meta)] = proj
    return kept


# --- output --------------------------------------------------------------------------------------


def _row(p: Placed) -> dict[str, Any]:
    r = p.footprint.settings
    return {
        "name": p.name,
        "placed": True,
        "devices": list(p.devices),
        "gpu_indices": list(p.gpu_indices),
        "tensor_split": [int(x) if float(x).is_integer() else x for x in p.settings.tensor_split],
        "context": r.n_ctx,
        "context_per_slot": r.n_ctx_seq,
        "slots": r.n_seq,
        "kv_unified": r.kv_unified,
        "n_gpu_layers": p.footprint.n_gpu_layers,
        "cache_type_k": r.cache_type_k,
        "cache_type_v": r.cache_type_v,
        "bytes": {d.name: d.total for d in p.footprint.devices if d.total},
        "devices_detail": [d.to_json() for d in p.footprint.devices],
        # buffers qmgui cannot model, charged as upper bounds in `bytes` (core.bounds)
        "bounds": [
            {"part": b.part, "device": b.device, "bytes": b.bytes, "why": b.why}
            for b in p.footprint.bounds
        ],
        "notes": list(p.notes),
    }


def _unplaced_row(u: Unplaced) -> dict[str, Any]:
    return {
        "name": u.name,
        "placed": False,
        "reason": u.reason,
        "nearest": [
            {
                "kind": s.kind.value,
                "summary": s.summary,
                "devices": list(s.devices),
                "context": s.settings.ctx_size,
                "n_gpu_layers": s.settings.n_gpu_layers,
                "n_cpu_moe": s.settings.n_cpu_moe,
                "cache_type_k": s.settings.cache_type_k,
                "cache_type_v": s.settings.cache_type_v,
            }
            for s in u.nearest
        ],
        "notes": list(u.notes),
    }


def placement_json(p: Placement, gpus: tuple[Gpu, ...]) -> dict[str, Any]:
    endpoints = {g.name: g.endpoint for g in gpus}
    return {
        "fits": p.fits,
        "models": [_row(x) for x in p.placed] + [_unplaced_row(u) for u in p.unplaced],
        "devices": [
            {
                "name": d.device,
                "endpoint": endpoints.get(d.device),
                "budget": d.budget,
                "occupied": d.occupied,
                "used": d.used,
                "free": d.free,
                "shares": [{"model": s.model, "bytes": s.bytes} for s in d.shares],
            }
            for d in (*p.gpus, p.host)
        ],
    }


def _table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (c.rjust(w) if 0 < i < len(row) - 1 else c.ljust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True)))  # fmt: skip
        print("  ".join(cells).rstrip(), file=out)


def print_placement(p: Placement, out: TextIO) -> None:
    total = len(p.placed) + len(p.unplaced)
    n = len(p.gpus)
    where = f"on {n} device{'' if n == 1 else 's'}" if n else "in host memory (no GPU)"
    print(f"placed {len(p.placed)} of {total} models {where}", file=out)
    if p.placed:
        rows: list[tuple[str, ...]] = [("MODEL", "CONTEXT", "SLOTS", "LAYERS", "SPLIT", "DEVICES")]
        for x in p.placed:
            r = x.footprint.settings
            split = ",".join(f"{v:g}" for v in x.settings.tensor_split) if x.split else "-"
            rows.append(
                (
                    x.name,
                    str(r.n_ctx),
                    str(r.n_seq),
                    str(x.footprint.n_gpu_layers),
                    split,
                    ", ".join(x.devices) or "CPU only",
                )
            )
        print(file=out)
        _table(rows, out)
    for x in p.placed:
        for note in x.notes:
            print(f"note: {x.name}: {note}", file=out)
        for b in x.footprint.bounds:
            print(
                f"bound: {x.name}: {b.part} on {b.device} ≤ {format_bytes(b.bytes)} "
                f"(an upper bound: {b.why})",
                file=out,
            )
    print(file=out)
    loads: list[tuple[str, ...]] = [("DEVICE", "BUDGET", "USED", "FREE", "MODELS")]
    for d in (*p.gpus, p.host):
        shares = ", ".join(f"{s.model} {format_bytes(s.bytes)}" for s in d.shares) or "-"
        if d.occupied:
            shares = f"other {format_bytes(d.occupied)}; {shares}"
        budget = format_bytes(d.budget) if d.budget is not None else "unchecked"
        loads.append((d.device, budget, format_bytes(d.used), format_bytes(d.free), shares))
    _table(loads, out)
    for u in p.unplaced:
        print(f"\nnot placed: {u.name}: {u.reason}", file=out)
        for s in u.nearest:
            names = ", ".join(s.devices)
            where = f" on {names}" if names and names not in s.summary else ""
            print(f"  nearest: {s.summary}{where}", file=out)
        for note in u.notes:
            print(f"  note: {note}", file=out)


# --- llama-swap ----------------------------------------------------------------------------------


def _commands(
    p: Placement, entries: dict[str, ModelEntry], gpus: tuple[Gpu, ...], args: argparse.Namespace
) -> dict[str, Command]:
    resolver = Resolver(
        load_quietly(), backend_arg=args.backend, engine="llama", probe=not args.no_probe
    )
    commands: dict[str, Command] = {}
    for x in p.placed:
        entry = entries[x.name]
        target = resolver.target(entry)
        if isinstance(target, str):
            commands[x.name] = skipped(target)
            continue
        pin = DevicePin.for_devices(x.devices, gpus, target.variant) or _cpu_pin(args, target)
        commands[x.name] = emit_llama(
            entry,
            x.settings,
            executable=target.executable,
            port=PORT_MARK,
            supported_flags=target.supported,
            valueless_flags=target.valueless,
            devices=pin,
        )
    return commands


def _cpu_pin(args: argparse.Namespace, target: Target) -> DevicePin | None:
    """`--device none` when this machine's engine offered GPUs and every one was refused."""
    if args.gpu or not local_machine(args).refused_all:
        return None
    return DevicePin.none(target.variant)


def _write(path: str, text: str, out: TextIO, *, mode: int | None = None) -> int:
    from qmgui.cli.export import write_atomic  # noqa: PLC0415 - export imports this package

    if path == "-":
        out.write(text)
        return EXIT_OK
    try:
        write_atomic(path, text)
        if mode is not None:
            os.chmod(path, mode & ~_umask())
    except OSError as e:
        notify.error(f"could not write {path}: {e.strerror or e}", source=SOURCE)
        return EXIT_USAGE
    notify.info(f"wrote {path}", source=SOURCE)
    return EXIT_OK


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_exports(
    p: Placement, commands: dict[str, Command], args: argparse.Namespace, out: TextIO
) -> int:
    """The llama-swap config and the run-set script the command line asked for."""
    if args.llama_swap:
        result = render_run_set(
            p,
            commands,
            header=("llama-swap config written by qmgui place: the run set, preloaded together",),
        )
        for warning in result.warnings:
            notify.warning(warning, source=SOURCE)
        code = _write(args.llama_swap, result.text, out)
        if code != EXIT_OK:
            return code
    if args.script:
        script = render_run_set_script(
            [(x.name, commands[x.name]) for x in p.placed if x.name in commands],
            title="run set written by qmgui place: every placed engine at once",
            comments=[f"{x.name}: {placement_comment(x)}" for x in p.placed],
            base_port=args.port,
        )
        for warning in script.warnings:
            notify.warning(warning, source=SOURCE)
        if not script.text:
            notify.error("no placed model has a command to run", source=SOURCE)
            return EXIT_UNPLACED
        return _write(args.script, script.text, out, mode=SCRIPT_MODE)
    return EXIT_OK


def _backend_build(args: argparse.Namespace, entries: dict[str, ModelEntry]) -> int | None:
    """The llama.cpp build of `--backend` (probed: its --version), None without it."""
    if not args.backend or not entries:
        return None
    entry = next(iter(entries.values()))
    return backend_build(args.backend, entry, probe=not args.no_probe, source=SOURCE)


OS_FLOOR = OS_RESERVE  # RAM left to the system when models are placed in host memory


def host_budget(available: int | None = None) -> int | None:
    """Host memory for models on a machine without a card of its own (no GPU, or only
    unified memory: Apple Silicon, an iGPU): the RAM available now less the OS floor, the
    reserve capped at a quarter of the RAM (None when it cannot be read: not checked)."""
    total, free = read_ram()
    return devices_host_budget(free if available is None else available, total, OS_FLOOR)


def cmd_place(args: argparse.Namespace, out: TextIO) -> int:
    try:
        gpus = gpus_from(args)
        reserve = parse_size(args.reserve, allow_zero=True)
        host = parse_size(args.host_memory) if args.host_memory else None
        if host is None and not gpus:
            host = host_budget()  # a machine without a GPU: the models go to host memory
        base = LaunchSettings(
            parallel=args.parallel,
            cache_type_k=args.ctk,
            cache_type_v=args.ctv,
            flash_attn=args.fa or AUTO,
        )
        if args.role:
            return _roles(args, out, gpus, (reserve, host), base)
        if not args.models:
            raise ValueError("name a MODEL to place, or a role set with --role ROLE=MODEL")
        specs = [parse_spec(text, base, args.ctx) for text in args.models]
    except ValueError as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    requests, entries, refused = _requests(specs)
    try:
        rules, rules_note = rules_for(_backend_build(args, entries))
        if rules_note:
            notify.info(rules_note, source=SOURCE)
        # the CPU repacks weights by its features (this machine's, or --backend's probed ones)
        rules = replace(rules, cpu=cpu_target_from(args, rules.build))
        # the build's rules (core.build_rules), each model with the projector loaded beside it
        sizing = with_projectors(partial(estimate, rules=rules), _projectors(requests, entries))
        p = place(requests, gpus, reserve=reserve, host_bytes=host, estimate=sizing)
    except (SizingError, ValueError) as e:  # ValueError: a --backend that cannot be used
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    if refused:
        p = replace(p, unplaced=(*p.unplaced, *refused))
    if args.llama_swap or args.script:
        try:
            commands = _commands(p, entries, gpus, args)
            code = _write_exports(p, commands, args, out)
        except (UsageError, EmitError, ExportError) as e:
            notify.error(str(e), source=SOURCE)
            return EXIT_USAGE
        if code != EXIT_OK or "-" in (args.llama_swap, args.script):
            return code
    if args.json:
        json.dump(placement_json(p, gpus), out, indent=2)
        out.write("\n")
    else:
        print_placement(p, out)
    return EXIT_OK if p.fits else EXIT_UNPLACED


# --- role sets -----------------------------------------------------------------------------------


def _role_options(
    args: argparse.Namespace, gpus: tuple[Gpu, ...], budget: tuple[int, int | None],
    base: LaunchSettings,
) -> RoleSetOptions:  # fmt: skip
    """The command line as the service's options; `--device none` where every GPU this
    machine's engine offered was refused (as `_cpu_pin` for the plain placement)."""
    reserve, host = budget
    device_none = not args.gpu and local_machine(args).refused_all
    return RoleSetOptions(
        gpus=gpus, reserve=reserve, host_bytes=host, base=base, fa=args.fa,
        backend=args.backend, probe=not args.no_probe, device_none=device_none, source=SOURCE,
    )  # fmt: skip


def _print_roles(
    roles: RoleSet, p: Placement, commands: dict[str, Command], port: int, out: TextIO
) -> None:
    print_placement(p, out)
    print(file=out)
    for i, x in enumerate(p.placed):
        inst = roles.by_name[x.name]
        argv = shlex.join(commands[x.name].argv) or "(no command)"
        print(f"{x.name} ({inst.spec.role.value}, replica {inst.replica}) on port {port + i}: "
              f"{argv}", file=out)  # fmt: skip
    for r in roles.remote:
        print(f"{r.name} ({r.role}): served by {r.endpoint}, no local server", file=out)


def _roles(
    args: argparse.Namespace, out: TextIO, gpus: tuple[Gpu, ...], budget: tuple[int, int | None],
    base: LaunchSettings,
) -> int:  # fmt: skip
    """`qmgui place --role ...`: the role set on the GPUs (`budget`: the reserve, host RAM),
    planned by `service.role_sets` (the window's role sets run the same code)."""
    if args.models:
        raise ValueError("--role plans a role set: give the models as ROLE=MODEL, not beside it")
    try:
        roles = RoleSet(args.role, _role_options(args, gpus, budget, base))
    except RoleError as e:
        raise ValueError(str(e)) from None
    for missing in roles.not_installed:
        notify.warning(missing.sentence, source=SOURCE)
    for m in roles.skipped:
        notify.warning(m.skipped or "", source=SOURCE)
    try:
        p, warnings = roles.place()
    except (SizingError, ValueError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    for w in warnings:
        notify.warning(w, source=SOURCE)
    try:
        if args.llama_swap or args.script:
            code = _write_exports(p, roles.commands(p, lambda _: PORT_MARK), args, out)
            if code != EXIT_OK or "-" in (args.llama_swap, args.script):
                return code
        commands = roles.commands(p, lambda i: args.port + i)
    except (UsageError, EmitError, ExportError) as e:
        notify.error(str(e), source=SOURCE)
        return EXIT_USAGE
    if args.json:
        doc = placement_json(p, gpus)
        roles.annotate(doc, commands, {x.name: args.port + i for i, x in enumerate(p.placed)})
        doc["warnings"] = [*(m.sentence for m in roles.not_installed),
                           *(m.skipped or "" for m in roles.skipped), *warnings]  # fmt: skip
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        _print_roles(roles, p, commands, args.port, out)
    return EXIT_OK if p.fits and not roles.not_installed else EXIT_UNPLACED
