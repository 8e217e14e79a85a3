"""`qmgui import "COMMAND"`: read a llama-server (or `vllm serve`) command line into the profile
of the model it names (the parsing is `qmgui.core.command_import`; saving, `qmgui.service.
profile`). Its own module so that `qmgui plan` never imports the command-line reader.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any, TextIO

from qmgui import notify
from qmgui.cli.profiles import EXIT_OK, EXIT_USAGE, first_sentence, model_key
from qmgui.core.command_import import (
    CommandError,
    ParsedCommand,
    command_words,
    parse_command,
    probe_aliases,
)
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import flags_from_probe
from qmgui.core.errors import QmguiError, SettingsError
from qmgui.core.profile import LAUNCH_FIELDS, VLLM_FIELDS, clean, describe

COMMAND = "import"  # what the user types (a Python keyword, so not this module's name)


def register(sub: Any) -> None:
    p = sub.add_parser(
        COMMAND,
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
            notify.error(f"profile not saved: {first_sentence(e)}", source="import")
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
