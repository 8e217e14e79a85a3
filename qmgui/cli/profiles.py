"""Profiles on the command line: `--save` / `--reset` for `plan` and `preview`, and
`qmgui import "COMMAND"`, which reads a llama-server (or `vllm serve`) command line into the
model's profile.

A profile is what `qmgui.core.profile` describes; it is saved with `qmgui.service.profile`
(under the settings lock) and applied on every path through `qmgui.service.launch`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from qmgui import notify
from qmgui.config_paths import settings_path
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import flags_from_probe
from qmgui.core.errors import QmguiError, SettingsError
from qmgui.core.profile import (
    LAUNCH_FIELDS,
    VLLM_FIELDS,
    CommandError,
    ParsedCommand,
    clean,
    command_words,
    describe,
    parse_command,
    probe_aliases,
)
from qmgui.core.safeio import loads_json, read_regular
from qmgui.core.units import parse_size

if TYPE_CHECKING:  # `qmgui plan` imports this module: pydantic and the settings only when used
    from qmgui.settings import ModelOverride, Settings

EXIT_OK = 0
EXIT_USAGE = 2
GIVEN = "given_flags"
MAX_SETTINGS_BYTES = 16 << 20  # the quick look at the settings file reads no more

# argparse dest -> the profile field it sets
DEST_FIELDS = {
    "ctx": "ctx_size",
    "parallel": "parallel",
    "ctk": "cache_type_k",
    "ctv": "cache_type_v",
    "fa": "flash_attn",
    "ngl": "n_gpu_layers",
    "n_cpu_moe": "n_cpu_moe",
    "cpu_moe": "cpu_moe",
    "tensor_split": "tensor_split",
    "devices": "devices",
    "extra": "extra_args",
    "port": "port",
    "backend": "backend_id",
    "gpu_util": "gpu_memory_utilization",
    "tp": "tensor_parallel_size",
    "tokenizer": "tokenizer",
    "tool_call_parser": "tool_call_parser",
    "vllm_budget": "vllm_budget_bytes",
}
# the LaunchSettings fields among them (what `given` keeps from the profile)
_LAUNCH_DESTS = ("ctx", "parallel", "ctk", "ctv", "fa", "ngl", "n_cpu_moe", "cpu_moe",
                 "tensor_split")  # fmt: skip

_TRACKED: dict[type[argparse.Action], type[argparse.Action]] = {}


def _tracked(cls: type[argparse.Action]) -> type[argparse.Action]:
    """`cls` that also records its dest in the namespace's `given_flags` when the flag is on
    the command line (argparse's defaults cannot tell `-ctk f16` from no -ctk)."""
    if cls not in _TRACKED:

        def __call__(
            self: argparse.Action,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: Any,
            option_string: str | None = None,
        ) -> None:
            cls.__call__(self, parser, namespace, values, option_string)
            given = set(getattr(namespace, GIVEN, None) or ())
            given.add(self.dest)
            setattr(namespace, GIVEN, given)

        _TRACKED[cls] = type(f"Given{cls.__name__}", (cls,), {"__call__": __call__})
    return _TRACKED[cls]


def track_given(p: argparse.ArgumentParser) -> None:
    """Make the profile flags of `p` record that they were given (call after adding them)."""
    for action in p._actions:
        if action.dest in DEST_FIELDS and type(action) not in _TRACKED.values():
            action.__class__ = _tracked(type(action))


def given_dests(args: argparse.Namespace) -> frozenset[str]:
    return frozenset(getattr(args, GIVEN, None) or ())


def given_fields(args: argparse.Namespace) -> frozenset[str]:
    """The LaunchSettings fields the command line set explicitly."""
    return frozenset(DEST_FIELDS[d] for d in given_dests(args) if d in _LAUNCH_DESTS)


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    """vLLM values a profile keeps (`plan`, `preview`, `export`, `serve`)."""
    p.add_argument(
        "--gpu-memory-utilization",
        dest="gpu_util",
        type=float,
        default=None,
        metavar="FRACTION",
        help="vLLM: the share of each card it may take (default: derived from the budget)",
    )
    p.add_argument(
        "-tp",
        "--tensor-parallel-size",
        dest="tp",
        type=int,
        default=None,
        help="vLLM: GPUs per model (default: every GPU planned for)",
    )
    p.add_argument("--tokenizer", default=None, help="vLLM: the tokenizer to load")
    p.add_argument(
        "--tool-call-parser",
        dest="tool_call_parser",
        default=None,
        help="vLLM: the tool-call parser (none: no tool calling; default: by model family)",
    )
    p.add_argument(
        "--vllm-budget",
        dest="vllm_budget",
        default=None,
        metavar="SIZE",
        help="vLLM: the VRAM per GPU to size the launch for (default: the card's free memory)",
    )


def vllm_values(args: argparse.Namespace) -> dict[str, Any]:
    """The vLLM values the command line gave (profile field names)."""
    out: dict[str, Any] = {}
    for dest in ("gpu_util", "tp", "tokenizer", "tool_call_parser"):
        value = getattr(args, dest, None)
        if value is not None:
            out[DEST_FIELDS[dest]] = value
    budget = getattr(args, "vllm_budget", None)
    if budget:
        out["vllm_budget_bytes"] = parse_size(budget)
    util = out.get("gpu_memory_utilization")
    if util is not None and not 0 < util <= 1:
        raise ValueError(f"--gpu-memory-utilization {util}: give a fraction above 0, at most 1")
    return out


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--save",
        action="store_true",
        help="save the settings given on this command line as the model's profile (used by "
        "the window and every command for this model from now on)",
    )
    p.add_argument(
        "--reset",
        action="store_true",
        help="clear the model's saved profile first (its port is kept)",
    )


def _given_values(
    args: argparse.Namespace, resolve_backend: Callable[[str], bool]
) -> dict[str, Any]:
    """The profile values of the flags given explicitly (ValueError for bad ones)."""
    from qmgui.cli.plan import tensor_split_of  # noqa: PLC0415 - plan imports this module
    from qmgui.cli.preview import parse_devices  # noqa: PLC0415

    out: dict[str, Any] = {}
    for dest in sorted(given_dests(args)):
        key = DEST_FIELDS[dest]
        value = getattr(args, dest, None)
        if dest == "tensor_split":
            value = list(tensor_split_of(value)) if value else None
        elif dest == "devices":
            value = list(parse_devices(value)) or None
        elif dest == "extra":
            value = list(value or [])
        elif dest == "vllm_budget":
            value = parse_size(value) if value else None
        elif dest == "backend" and value and not resolve_backend(value):
            notify.warning(
                f"--backend {value} not saved: the profile pins a registered backend id "
                "(qmgui backends list)",
                source="profile",
            )
            continue
        out[key] = value
    return out


def model_key(entry: ModelEntry) -> str:
    """The key a model's profile is saved under: its id, absolute (as a scan finds it)."""
    return os.path.abspath(entry.id) if entry.source == "folder" else entry.id


def saved_override(settings: Settings, entry: ModelEntry) -> ModelOverride | None:
    """The model's stored override, under its id or its absolute path."""
    from qmgui.service.launch import Resolver  # noqa: PLC0415
    from qmgui.settings import LoadResult  # noqa: PLC0415

    return Resolver(LoadResult(settings), probe=False).override(entry)


def _may_have_profile(entry: ModelEntry) -> bool:
    """A quick look at the settings file: False only when it surely holds no profile for
    `entry` (no file, or a readable one without its key)."""
    path = settings_path()  # where qmgui.settings reads it, without importing pydantic
    if not path.exists():
        return False
    try:  # a regular file only (a FIFO would block), bounded, like the full load
        data = loads_json(read_regular(path, MAX_SETTINGS_BYTES), str(path))
    except (QmguiError, ValueError, RecursionError):
        return True  # the full load reads it and says what is wrong
    overrides = data.get("model_overrides") if isinstance(data, dict) else None
    if not isinstance(overrides, dict):
        return overrides is not None
    return entry.id in overrides or model_key(entry) in overrides


def saved_profile(entry: ModelEntry) -> dict[str, Any]:
    """The model's saved profile, as the settings file holds it now."""
    if not _may_have_profile(entry):
        return {}
    from qmgui.service.launch import load_quietly  # noqa: PLC0415
    from qmgui.service.profile import profile_of  # noqa: PLC0415

    return profile_of(saved_override(load_quietly().settings, entry))


def handle_profile_flags(args: argparse.Namespace, entry: ModelEntry, *, source: str) -> int | None:
    """`--reset` then `--save` for `entry`; None to go on, else the exit status of an error
    (already reported)."""
    key = model_key(entry)
    if not (getattr(args, "reset", False) or getattr(args, "save", False)):
        return None
    from qmgui.service.profile import profile_of, reset_profile, save_profile  # noqa: PLC0415

    try:
        if getattr(args, "reset", False):
            _, cleared = reset_profile(key)
            words = ", ".join(describe(cleared)) or "nothing was saved"
            notify.info(f"{entry.name}: profile cleared ({words})", source=source)
        if getattr(args, "save", False):
            from qmgui.service.launch import load_quietly  # noqa: PLC0415

            ids = {b.id for b in load_quietly().settings.backends}
            values = _given_values(args, lambda v: v in ids)
            if not values:
                notify.info(
                    f"{entry.name}: nothing to save: give the settings to keep (e.g. -c 16384)",
                    source=source,
                )
                return None
            saved = save_profile(key, values, replace=values.keys())
            now = profile_of(saved.settings.model_overrides.get(key))
            notify.info(
                f"{entry.name}: saved {', '.join(describe(values))}"
                f" (profile now: {', '.join(describe(now))})",
                source=source,
            )
    except (ValueError, SettingsError) as e:
        notify.error(f"profile not saved: {_sentence(e)}", source=source)
        return EXIT_USAGE
    return None


def _sentence(e: Exception) -> str:
    text = str(e)
    return text.splitlines()[0] if "validation error" in text else text


# --- qmgui import ----------------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "import",
        help="read a llama-server or vllm serve command line into the model's profile",
        description="Read COMMAND (a llama-server or `vllm serve` command line, quoted as one "
        "argument) into the profile of the model it names (-m/--model, or vLLM's model "
        "argument): every flag qmgui knows becomes a saved setting, the rest is kept as "
        "extra arguments. --host and verbosity flags are dropped (qmgui sets them).",
        epilog="exit status: 0 saved; 2 the command cannot be read or its model is not found",
    )
    p.add_argument("command_line", metavar="COMMAND", help='the command, e.g. "llama-server '
                   '-m model.gguf -c 16384 -ngl 99"')  # fmt: skip
    p.add_argument("--model", metavar="PATH", help="the model (instead of the command's)")
    p.add_argument("--dry-run", action="store_true", help="show what would be saved; save nothing")
    p.add_argument("--no-probe", action="store_true", help="do not run the engine's --help")
    p.add_argument("--json", action="store_true", help="print what was read as JSON")
    p.set_defaults(func=cmd_import)


def _probe_flags(
    engine: str, executable: str | None
) -> tuple[frozenset[str] | None, frozenset[str], dict[str, str]]:
    """The flags a llama-server build lists (None when it cannot be probed), those it lists
    as switches, and its other spellings of the flags qmgui reads."""
    if engine != "llama" or not executable:
        return None, frozenset(), {}
    from qmgui.engines.probe import probe  # noqa: PLC0415 - only when probing

    result = probe(executable, kind="llama", commands=[("--help",)], timeout_s=10.0)
    known, valueless = flags_from_probe(result)
    groups = [g.spellings for g in result.flag_groups if not g.removed]
    return known, valueless, probe_aliases(groups)


def import_command(
    text: str, *, model: str | None = None, probe: bool = True
) -> tuple[ParsedCommand, ModelEntry]:
    """Read `text` and find its model (QmguiError with a sentence when it cannot)."""
    parsed = parse_command(text)
    if probe:
        exe = _executable(text)
        known, valueless, aliases = _probe_flags(parsed.engine, exe)
        if known is not None:
            parsed = parse_command(text, known_flags=known, valueless=valueless, aliases=aliases)
    path = model or parsed.model
    if not path:
        raise CommandError(
            "the command names no model: give it with -m PATH (vLLM: the model argument), "
            "or --model PATH"
        )
    entry = entry_for_path(os.path.expanduser(path))
    if entry.meta is None or entry.error:
        raise CommandError(
            f"{path}: {entry.error or 'not a model'}; the profile belongs to a model qmgui can "
            "read (give it with --model PATH)"
        )
    return parsed, entry


def _executable(text: str) -> str | None:
    try:
        words = command_words(text)
    except CommandError:
        return None
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    if not words or words[0].startswith("-"):
        return None
    exe = os.path.expanduser(words[0])
    return exe if os.path.isfile(exe) else shutil.which(exe)


def report_lines(parsed: ParsedCommand, entry: ModelEntry) -> list[str]:
    """What `import` read, for people."""
    lines = [f"model: {entry.name} ({entry.path})", f"engine: {parsed.engine}"]
    stored = describe(parsed.values)
    lines.append("settings: " + (", ".join(stored) if stored else "none"))
    if parsed.extra_args:
        lines.append("kept as extra arguments: " + " ".join(parsed.extra_args))
    lines += [f"note: {n}" for n in parsed.notes]
    return lines


def cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    from qmgui.service.profile import profile_of, save_profile  # noqa: PLC0415

    try:
        parsed, entry = import_command(args.command_line, model=args.model, probe=not args.no_probe)
    except QmguiError as e:
        notify.error(str(e), source="import")
        return EXIT_USAGE
    key = model_key(entry)
    profile = parsed.profile()
    if profile.get("mmproj"):  # relative to where the command runs: this folder
        profile["mmproj"] = os.path.abspath(os.path.expanduser(profile["mmproj"]))
    now: Mapping[str, Any] = profile
    if not args.dry_run:
        try:
            # the command is the whole launch: what it does not set is no longer pinned
            whole = [*LAUNCH_FIELDS, *VLLM_FIELDS, "devices", "extra_args"]
            saved = save_profile(key, profile, replace=whole)
        except (ValueError, SettingsError) as e:
            notify.error(f"profile not saved: {_sentence(e)}", source="import")
            return EXIT_USAGE
        now = profile_of(saved.settings.model_overrides.get(key))
    if args.json:
        data = {
            "model": entry.path,
            "id": key,
            "engine": parsed.engine,
            "values": parsed.values,
            "extra_args": list(parsed.extra_args),
            "notes": list(parsed.notes),
            "saved": not args.dry_run,
            "profile": clean(now),
        }
        json.dump(data, out, indent=2)
        out.write("\n")
        return EXIT_OK
    for line in report_lines(parsed, entry):
        print(line, file=out)
    verb = "would save" if args.dry_run else "saved"
    print(f"{verb}: {', '.join(describe(now)) or 'nothing'}", file=out)
    return EXIT_OK
