"""Profiles on the command line: `--save` / `--reset` for `plan` and `preview` (`qmgui import
"COMMAND"` is `qmgui.cli.import_cmd`).

A profile is what `qmgui.core.profile` describes; it is saved with `qmgui.service.profile`
(under the settings lock) and applied on every path through `qmgui.service.launch`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from qmgui import notify
from qmgui.config_paths import settings_path
from qmgui.core.discovery import ModelEntry
from qmgui.core.errors import QmguiError, SettingsError
from qmgui.core.profile import (
    describe,
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
        notify.error(f"profile not saved: {first_sentence(e)}", source=source)
        return EXIT_USAGE
    return None


def first_sentence(e: Exception) -> str:
    text = str(e)
    return text.splitlines()[0] if "validation error" in text else text
